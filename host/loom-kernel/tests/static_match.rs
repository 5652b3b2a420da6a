//! `static.match`: a compile-time choice among cases in kernels (with results) and stages; the first case equal
//! to the scrutinee is taken, `default` otherwise, and a value no case matches is an error naming it and the
//! cases (never a stage that silently dispatches nothing).

use loom_compiler::Catalog;
use loom_ir::TValue;

const SRC: &str = r#"
module @m {
  export kernel @scale<N: i64, OP: str, D: dtype = f32>
      grid(1)
      (%x: buffer<D, [N]> read, %y: buffer<D, [N]> write)
  {
    %r = tile.range 0, N
    %t = tile.load %x[%r], 0.0
    %u = static.match OP -> (tile<[N], D>) {
      case "double", "twice" {
        %d = mul %t, 2.0
        yield %d
      }
      case "negate" {
        %n = neg %t
        yield %n
      }
      default {
        yield %t
      }
    }
    tile.store %y[%r], %u
  }

  export stage @pick<N: i64 = 4, ACT: str = "double">
      (%x: buffer<f32, [N]> input, %y: buffer<f32, [N]> output)
  {
    static.match ACT {
      case "double" { dispatch @scale<N = N, OP = "double">(%x, %y) }
      case "negate" {
        dispatch @scale<N = N, OP = "negate">(%x, %y)
      }
    }
  }

  export stage @mixed<N: i64 = 4>
      (%x: buffer<f32, [N]> input, %y: buffer<f32, [N]> output)
  {
    static.match N {
      case 4 { dispatch @scale<N = N, OP = "x">(%x, %y) }
      case "four" { dispatch @scale<N = N, OP = "x">(%x, %y) }
    }
  }

  export stage @twice<N: i64 = 4>
      (%x: buffer<f32, [N]> input, %y: buffer<f32, [N]> output)
  {
    static.match N {
      case 4 { dispatch @scale<N = N, OP = "x">(%x, %y) }
      case 2, 4 { dispatch @scale<N = N, OP = "x">(%x, %y) }
    }
  }
}
"#;

fn catalog() -> Catalog {
    let mut cat = Catalog::new();
    cat.add_source("m.loom", SRC)
        .unwrap_or_else(|e| panic!("{e}"));
    cat
}

fn run(stage: &str, cfg: &[(&str, TValue)]) -> Result<Vec<f32>, String> {
    let cat = catalog();
    let m = cat.find("m").expect("module m");
    let cfg: Vec<(String, TValue)> = cfg
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let st = loom_kernel::specialize_stage(&cat, m, stage, &cfg).map_err(|e| e.join(""))?;
    let x: Vec<u8> = [1.0f32, -2.0, 3.0, 4.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut outs = loom_reference::alloc_outputs(&st).unwrap();
    loom_reference::run_stage(&st, &[&x], &[], &mut outs).unwrap();
    Ok(outs[0]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn s(v: &str) -> TValue {
    TValue::Str(v.into())
}

#[test]
fn the_matching_case_is_taken_in_stages_and_kernels() {
    assert_eq!(run("pick", &[]).unwrap(), [2.0, -4.0, 6.0, 9.0]);
    assert_eq!(
        run("pick", &[("ACT", s("negate"))]).unwrap(),
        [-1.0, 2.0, -3.0, -4.5]
    );
}

#[test]
fn a_value_no_case_matches_is_an_error_naming_it_and_the_cases() {
    let e = run("pick", &[("ACT", s("gelu"))]).unwrap_err();
    assert!(
        e.contains("the string \"gelu\" matches no case")
            && e.contains("cases: the string \"double\", the string \"negate\"")
            && e.contains("no `default`"),
        "{e}"
    );
}

#[test]
fn cases_of_another_kind_or_repeated_are_errors() {
    let e = run("mixed", &[]).unwrap_err();
    assert!(
        e.contains("`static.match` on the integer 4: this case is the string \"four\""),
        "{e}"
    );
    let e = run("twice", &[]).unwrap_err();
    assert!(
        e.contains("the integer 4 is matched by an earlier case"),
        "{e}"
    );
}

#[test]
fn malformed_matches_are_parse_errors() {
    for (src, want) in [
        ("static.match N { }", "needs at least one `case`"),
        (
            "static.match N { case 1 { } default { } default { } }",
            "a second `default`",
        ),
        (
            "static.match N { when 1 { } }",
            "`case VALUE { ... }` or `default { ... }`",
        ),
    ] {
        let text = format!(
            "module @p {{\n  export stage @s<N: i64 = 1>(%x: buffer<f32, [N]> input) {{\n    {src}\n  }}\n}}\n"
        );
        let mut cat = Catalog::new();
        let e = match cat.add_source("p.loom", &text) {
            Err(e) => e.to_string(),
            Ok(_) => {
                let m = cat.find("p").expect("module p");
                loom_kernel::specialize_stage(&cat, m, "s", &[])
                    .err()
                    .map(|e| e.join(""))
                    .unwrap_or_default()
            }
        };
        assert!(e.contains(want), "{src}: {e}");
    }
}
