//! Regression: kernel specializations are memoised by their specialized name, so a `func` template value must
//! name its kfunc unambiguously. Two kfuncs called `@f` in different modules once rendered as the same `F=@f`,
//! and the second dispatch silently reused the kernel specialized with the first kfunc.

use loom_compiler::Catalog;

const A: &str = r#"
module @ma {
  export kfunc @f<S: shape>(%x: tile<S, f32>) -> tile<S, f32> {
    %y = mul %x, 2.0
    return %y
  }
}
"#;

const B: &str = r#"
module @mb {
  kfunc @f<S: shape>(%x: tile<S, f32>) -> tile<S, f32> {
    %y = mul %x, 3.0
    return %y
  }

  export kernel @map<N: i64, F: func(f32) -> f32>
      grid(1)
      (%x: buffer<f32, [N]> read, %y: buffer<f32, [N]> write)
  {
    %r = tile.range 0, N
    %yt = call F(tile.load(%x[%r], 0.0))
    tile.store %y[%r], %yt
  }

  export stage @both<N: i64 = 4>
      (%x: buffer<f32, [N]> input, %local: buffer<f32, [N]> output, %other: buffer<f32, [N]> output)
  {
    dispatch @map<N = N, F = @f>(%x, %local)
    dispatch @map<N = N, F = @ma.f>(%x, %other)
  }
}
"#;

#[test]
fn same_named_kfuncs_of_two_modules_give_two_kernels() {
    let mut cat = Catalog::new();
    cat.add_source("a.loom", A)
        .unwrap_or_else(|e| panic!("{e}"));
    cat.add_source("b.loom", B)
        .unwrap_or_else(|e| panic!("{e}"));
    let mb = cat.find("mb").expect("module mb");
    let stage = loom_kernel::specialize_stage(&cat, mb, "both", &[])
        .unwrap_or_else(|e| panic!("{}", e.join("")));
    let names: Vec<&str> = stage.kernels.iter().map(|k| k.name.as_str()).collect();
    assert_eq!(names, ["mb.map<N=4,F=@f>", "mb.map<N=4,F=@ma.f>"]);
    let x: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut outs = loom_reference::alloc_outputs(&stage).unwrap();
    loom_reference::run_stage(&stage, &[&x], &[], &mut outs).unwrap();
    let f = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    assert_eq!(f(&outs[0]), [3.0, 6.0, 9.0, 12.0], "local @f");
    assert_eq!(f(&outs[1]), [2.0, 4.0, 6.0, 8.0], "@ma.f");
}
