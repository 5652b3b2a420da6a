//! `static.for`: compile-time repetition in stage bodies and `params` blocks, families `%h[INDEX]` and key
//! templates `"layer.{%l}.w"`. A stage written with loops specializes to exactly the stage its unrolled text
//! gives (compared as encoded bytes, from the source and from the canonical text), and every misuse is a
//! specialization error naming what is wrong.

use loom_compiler::Catalog;
use loom_ir::TValue;
use loom_ir::kernel_codec::encode_stage;

/// The kernels both versions dispatch; kept first so their source positions (part of the IR) agree.
const KERNELS: &str = r#"module @m {
  export kernel @lin<N: i64>
      grid(1)
      (%x: buffer<f32, [N]> read, %w: buffer<f32, [N]> read, %b: buffer<f32, [N]> read,
       %y: buffer<f32, [N]> write)
  {
    %r = tile.range 0, N
    %v = add mul(tile.load(%x[%r], 0.0), tile.load(%w[%r], 0.0)), tile.load(%b[%r], 0.0)
    tile.store %y[%r], %v
  }

  export kernel @copy<N: i64>
      grid(1)
      (%x: buffer<f32, [N]> read, %y: buffer<f32, [N]> write)
  {
    %r = tile.range 0, N
    tile.store %y[%r], tile.load(%x[%r], 0.0)
  }
"#;

const UNROLLED: &str = r#"
  export stage @s<N: i64 = 4, L: i64 = 3>
      (%x: buffer<f32, [N]> input, %y: buffer<f32, [N]> output)
      params @p(inputs: 1) {
        %emb: f32[N] = weights(0, "embed.4")
        %w0: f32[N] = weights(0, "layer.0.w")
        %b0: f32[N] = weights(0, "layer.0.b") layout(transpose)
        %w1: f32[N] = weights(0, "layer.1.w")
        %b1: f32[N] = weights(0, "layer.1.b") layout(transpose)
        %w2: f32[N] = weights(0, "layer.2.w")
        %b2: f32[N] = weights(0, "layer.2.b") layout(transpose)
        %g0: f32[N] = weights(0, "g.0.0")
        %g1: f32[N] = weights(0, "g.0.1")
        %g2: f32[N] = weights(0, "g.1.0")
        %g3: f32[N] = weights(0, "g.1.1")
        %e0: f32[N] = weights(0, "even.{{0}}")
        %e2: f32[N] = weights(0, "even.{{2}}")
      }
  {
    %h0 = alloc f32[N]
    dispatch @copy<N = N>(%x, %h0)
    %t0 = alloc f32[N]
    dispatch @lin<N = N>(%h0, %w0, %b0, %t0)
    %h1 = alloc f32[N]
    dispatch @lin<N = N>(%t0, %g0, %e0, %h1)
    %t1 = alloc f32[N]
    dispatch @lin<N = N>(%h1, %w1, %b1, %t1)
    %h2 = alloc f32[N]
    dispatch @copy<N = N>(%t1, %h2)
    %t2 = alloc f32[N]
    dispatch @lin<N = N>(%h2, %w2, %b2, %t2)
    %h3 = alloc f32[N]
    dispatch @lin<N = N>(%t2, %g0, %e0, %h3)
    dispatch @lin<N = N>(%h3, %g3, %e2, %y)
  }
}
"#;

const LOOPED: &str = r#"
  export stage @s<N: i64 = 4, L: i64 = 3>
      (%x: buffer<f32, [N]> input, %y: buffer<f32, [N]> output)
      params @p(inputs: 1) {
        %emb: f32[N] = weights(0, "embed.{N}")
        static.for %l = 0 to L {
          %w[%l]: f32[N] = weights(0, "layer.{%l}.w")
          %b[%l]: f32[N] = weights(0, "layer.{%l}.b") layout(transpose)
        }
        static.for %i = 0 to 2 {
          static.for %j = 0 to 2 { %g[2 * %i + %j]: f32[N] = weights(0, "g.{%i}.{%j}") }
        }
        static.for %k = 0 to 2 * L - 2 step 2 {
          %e[%k]: f32[N] = weights(0, "even.{{{%k}}}")
        }
      }
  {
    %h[0] = alloc f32[N]
    dispatch @copy<N = N>(%x, %h[0])
    static.for %l = 0 to L {
      %t[%l] = alloc f32[N]
      dispatch @lin<N = N>(%h[%l], %w[%l], %b[%l], %t[%l])
      %h[add(%l, 1)] = alloc f32[N]
      static.match %l {
        case 1 { dispatch @copy<N = N>(%t[%l], %h[%l + 1]) }
        default { dispatch @lin<N = N>(%t[%l], %g0, %e[0], %h[%l + 1]) }
      }
    }
    dispatch @lin<N = N>(%h[L], %g[3], %e2, %y)
  }
}
"#;

fn catalog(text: &str) -> Result<Catalog, String> {
    let mut cat = Catalog::new();
    cat.add_source("m.loom", text).map_err(|e| e.to_string())?;
    Ok(cat)
}

fn specialize(text: &str, stage: &str, cfg: &[(&str, TValue)]) -> Result<Vec<u8>, String> {
    let cat = catalog(text)?;
    let m = cat.find("m").expect("module m");
    let cfg: Vec<(String, TValue)> = cfg
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let st = loom_kernel::specialize_stage(&cat, m, stage, &cfg).map_err(|e| e.join(""))?;
    Ok(encode_stage(&st))
}

/// `.loom -> .loombc -> text`: the canonical text of a source, which must be a fixed point.
fn canonical(text: &str) -> String {
    let module = |t: &str| {
        let cat = catalog(t).unwrap_or_else(|e| panic!("{e}\n{t}"));
        let m = cat.find("m").expect("module m");
        let bytes = loom_ir::bytecode::encode(&cat.entries()[m].module);
        loom_ir::print::print_module(&loom_ir::bytecode::decode(&bytes).expect("decodes"))
    };
    let once = module(text);
    assert_eq!(module(&once), once, "the canonical text is a fixed point");
    once
}

#[test]
fn a_looped_stage_is_the_unrolled_stage_byte_for_byte() {
    let unrolled = format!("{KERNELS}{UNROLLED}");
    let looped = format!("{KERNELS}{LOOPED}");
    let a = specialize(&unrolled, "s", &[]).unwrap_or_else(|e| panic!("{e}"));
    let b = specialize(&looped, "s", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a, b, "the looped stage differs from the unrolled one");
    // From the canonical text (what .loombc carries and the server specializes) too.
    let (cu, cl) = (canonical(&unrolled), canonical(&looped));
    assert!(cl.contains("static.for %l = 0 to L {"), "{cl}");
    assert!(cl.contains(r#"weights(0, "layer.{%l}.w")"#), "{cl}");
    let a2 = specialize(&cu, "s", &[]).unwrap_or_else(|e| panic!("{e}"));
    let b2 = specialize(&cl, "s", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(a2, b2, "from the canonical text");
}

#[test]
fn keys_and_names_follow_the_index() {
    let cat = catalog(&format!("{KERNELS}{LOOPED}")).unwrap();
    let m = cat.find("m").unwrap();
    let st = loom_kernel::specialize_stage(&cat, m, "s", &[("L".into(), TValue::I64(5))])
        .unwrap_or_else(|e| panic!("{}", e.join("")));
    let keys: Vec<(&str, &str)> = st
        .params
        .iter()
        .map(|p| (p.name.as_str(), p.key.as_str()))
        .collect();
    assert_eq!(keys[0], ("emb", "embed.4"));
    assert_eq!(keys[9], ("w4", "layer.4.w"));
    assert_eq!(keys[10], ("b4", "layer.4.b"));
    assert_eq!(
        keys[11..15],
        [
            ("g0", "g.0.0"),
            ("g1", "g.0.1"),
            ("g2", "g.1.0"),
            ("g3", "g.1.1")
        ]
    );
    let evens: Vec<_> = keys[15..].to_vec();
    assert_eq!(
        evens,
        [
            ("e0", "even.{0}"),
            ("e2", "even.{2}"),
            ("e4", "even.{4}"),
            ("e6", "even.{6}")
        ]
    );
    let ws: Vec<&str> = st.workspace.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(ws[..4], ["h0", "t0", "h1", "t1"]);
    assert_eq!(ws.len(), 1 + 2 * 5);
    assert_eq!(st.dispatches.len(), 1 + 2 * 5 + 1);
    // No layers: the loops run zero times (%h[L] is %h[0]), and %e2 is not defined.
    let st = loom_kernel::specialize_stage(&cat, m, "s", &[("L".into(), TValue::I64(0))]);
    let e = st.err().map(|e| e.join("")).unwrap_or_default();
    assert!(e.contains("unknown value %e2"), "{e}");
}

/// Specializes stage `@s` with `params` and `body` (its kernels are `@lin` and `@copy`); the errors.
fn err(params: &str, body: &str) -> String {
    let text = format!(
        "{KERNELS}\n  export stage @s<N: i64 = 4, L: i64 = 3, S: str = \"x\">\n      (%x: buffer<f32, [N]> input, %y: buffer<f32, [N]> output)\n      params @p(inputs: 1) {{\n{params}\n      }}\n  {{\n{body}\n  }}\n}}\n"
    );
    match specialize(&text, "s", &[]) {
        Ok(_) => panic!("specialized:\n{text}"),
        Err(e) => e,
    }
}

const CHAIN: &str = "    %h[0] = alloc f32[N]\n    dispatch @copy<N = N>(%x, %h[0])";

#[test]
fn bad_bounds_are_errors() {
    for (bound, want) in [
        (
            "0 to S",
            "the upper bound of `static.for %l` must be a compile-time integer, found the string \"x\"",
        ),
        (
            "1.5 to L",
            "the lower bound of `static.for %l` must be a compile-time integer, found the float 1.5",
        ),
        ("%x to L", "expected a compile-time constant"),
        (
            "0 to L step 0",
            "the step of `static.for %l` must be positive, found 0",
        ),
        ("0 to zz", "unknown name `zz`"),
    ] {
        let e = err(
            "",
            &format!("{CHAIN}\n    static.for %l = {bound} {{\n    }}"),
        );
        assert!(e.contains(want), "{bound}: {e}");
    }
}

#[test]
fn trip_counts_are_bounded() {
    let e = err(
        "",
        &format!("{CHAIN}\n    static.for %l = 0 to 5000 {{\n    }}"),
    );
    assert!(
        e.contains("`static.for %l = 0 to 5000` would run 5000 iterations; the limit is 4096"),
        "{e}"
    );
    // In a params block too; 4096 itself is allowed.
    let e = err(
        "        static.for %l = -4096 to 1 { }",
        &format!("{CHAIN}\n    static.for %l = 0 to 4096 {{\n    }}"),
    );
    assert!(e.contains("would run 4097 iterations"), "{e}");
    // Nested loops multiply: the stage's total is bounded as well.
    let e = err(
        "",
        &format!(
            "{CHAIN}\n    static.for %i = 0 to 17 {{\n      static.for %j = 0 to 4096 {{\n      }}\n    }}"
        ),
    );
    assert!(
        e.contains("unroll to more than 65536 iterations in all"),
        "{e}"
    );
}

#[test]
fn indices_out_of_a_familys_range_are_errors() {
    // after the loop: %h has members 0..=3
    let e = err(
        "",
        &format!(
            "{CHAIN}\n    static.for %l = 0 to L {{\n      %h[%l + 1] = alloc f32[N]\n      dispatch @copy<N = N>(%h[%l], %h[%l + 1])\n    }}\n    dispatch @copy<N = N>(%h[L + 1], %y)"
        ),
    );
    assert!(
        e.contains("`%h[4]` is not defined (%h is defined here for indices 0..=3)"),
        "{e}"
    );
    // a use before its definition, inside the loop
    let e = err(
        "",
        &format!(
            "{CHAIN}\n    static.for %l = 0 to L {{\n      dispatch @copy<N = N>(%h[%l + 1], %y)\n      %h[%l + 1] = alloc f32[N]\n    }}"
        ),
    );
    assert!(
        e.contains("`%h[1]` is not defined (%h is defined here for indices 0)"),
        "{e}"
    );
    // a family with no member at all, and a negative index
    let e = err(
        "",
        &format!("{CHAIN}\n    dispatch @copy<N = N>(%q[0], %y)"),
    );
    assert!(
        e.contains("`%q[0]` is not defined (no member of the family %q is defined here)"),
        "{e}"
    );
    let e = err(
        "",
        &format!("{CHAIN}\n    dispatch @copy<N = N>(%h[-1], %y)"),
    );
    assert!(
        e.contains("the index of `%h[...]` must be a non-negative compile-time integer, found the integer -1"),
        "{e}"
    );
    // parameter families too
    let e = err(
        "        static.for %l = 0 to L { %w[%l]: f32[N] = weights(0, \"w.{%l}\") }",
        &format!("{CHAIN}\n    dispatch @lin<N = N>(%h[0], %w[3], %w[0], %y)"),
    );
    assert!(
        e.contains("`%w[3]` is not defined (%w is defined here for indices 0..=2)"),
        "{e}"
    );
}

#[test]
fn values_defined_in_a_loop_must_be_indexed() {
    let e = err(
        "",
        &format!("{CHAIN}\n    static.for %l = 0 to L {{\n      %t = alloc f32[N]\n    }}"),
    );
    assert!(
        e.contains("%t is defined twice (values are SSA; a value defined in a `static.for` body is defined once per iteration: index it by the loop variable, `%t[%l]`)"),
        "{e}"
    );
    // a member is the value with the index's digits: %h[1] and %h1 are one value
    let e = err(
        "",
        &format!("{CHAIN}\n    %h1 = alloc f32[N]\n    %h[1] = alloc f32[N]"),
    );
    assert!(
        e.contains("`%h[1]` (the value %h1) is defined twice"),
        "{e}"
    );
    let e = err(
        "",
        &format!("{CHAIN}\n    %g1[10] = alloc f32[N]\n    %g11[0] = alloc f32[N]"),
    );
    assert!(
        e.contains("`%g11[0]` (the value %g110) is defined twice, already defined as `%g1[10]`"),
        "{e}"
    );
    // the loop variable is not redefined, by a nested loop or a value
    let e = err(
        "",
        &format!(
            "{CHAIN}\n    static.for %l = 0 to L {{\n      static.for %l = 0 to 2 {{\n      }}\n    }}"
        ),
    );
    assert!(e.contains("the loop variable %l is already defined"), "{e}");
    let e = err(
        "",
        &format!("{CHAIN}\n    static.for %x = 0 to 2 {{\n    }}"),
    );
    assert!(e.contains("the loop variable %x is already defined"), "{e}");
}

#[test]
fn key_templates_name_known_integers() {
    for (key, want) in [
        (
            "w.{%m}",
            "the checkpoint key names `{%m}`, which is not defined here",
        ),
        (
            "w.{Q}",
            "the checkpoint key names `{Q}`, which is not defined here",
        ),
        (
            "w.{S}",
            "`{S}` in the checkpoint key is the string \"x\", not an integer",
        ),
        ("w.{%x}", "`{%x}` in the checkpoint key is a buffer"),
    ] {
        let e = err(
            &format!("        static.for %l = 0 to L {{ %w[%l]: f32[N] = weights(0, \"{key}\") }}"),
            CHAIN,
        );
        assert!(e.contains(want), "{key}: {e}");
    }
    // malformed templates are parse errors
    for (key, want) in [
        ("w.{%l", "an unclosed `{` in the checkpoint key"),
        ("w.%l}", "a lone `}` in the checkpoint key"),
        (
            "w.{}",
            "`{}` in a checkpoint key: a hole names a compile-time integer",
        ),
        ("w.{l + 1}", "`{l + 1}` in a checkpoint key"),
    ] {
        let e = err(
            &format!("        static.for %l = 0 to L {{ %w[%l]: f32[N] = weights(0, \"{key}\") }}"),
            CHAIN,
        );
        assert!(e.contains(want), "{key}: {e}");
    }
}

#[test]
fn static_for_is_a_stage_construct() {
    let text = format!(
        "{KERNELS}\n  export kernel @k<N: i64 = 4> grid(1) (%y: buffer<f32, [N]> write) {{\n    static.for %l = 0 to 2 {{\n    }}\n  }}\n}}\n"
    );
    let cat = catalog(&text).unwrap();
    let m = cat.find("m").unwrap();
    let e = loom_kernel::specialize_kernel(&cat, m, "k", &[])
        .err()
        .map(|e| e.join(""))
        .unwrap_or_default();
    assert!(
        e.contains("`static.for` is a stage statement (kernels loop with `for`)"),
        "{e}"
    );
    // malformed loops
    for (src, want) in [
        (
            "static.for l = 0 to 2 { }",
            "expected the loop variable '%l'",
        ),
        ("static.for %l = 0 until 2 { }", "expected 'to'"),
        ("static.for %l = 0 to 2", "expected the loop body"),
    ] {
        let e = err("", &format!("{CHAIN}\n    {src}"));
        assert!(e.contains(want), "{src}: {e}");
        let e = err(&format!("        {src}"), CHAIN);
        assert!(e.contains(want), "params: {src}: {e}");
    }
}
