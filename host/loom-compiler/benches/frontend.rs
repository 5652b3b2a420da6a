//! Front-end throughput: parse, compile (lower + type check), and bytecode decode + verify, in MB/s of source
//! text (and of bytecode for decode), on a generated module of many realistic functions. The reference point
//! measured in the same run is a plain byte scan (`memchr`-like newline count) over the same text, so the ratio
//! says how many times slower than just reading the bytes the front end is.
//!
//! Run: `cargo bench -p loom-compiler --bench frontend`

use std::hint::black_box;
use std::time::{Duration, Instant};

/// A module with `n` functions shaped like package control code: loops over range records, nested ops,
/// ifs, calls.
fn generate(n: usize) -> String {
    let mut s = String::from(
        "module @bench.frontend {\n  type @Range = record { offset: i64, length: i64 }\n\n",
    );
    for i in 0..n {
        s.push_str(&format!(
            "  export func @f{i}(%ranges: buffer, %count: i64, %ids: buffer) -> (buffer, i64) {{
    %out = buffer.new mul(mul(%count, 128), 4)
    %total = for %r = 0 to %count iter(%acc = 0 : i64) -> i64 {{
      %off = buffer.load.field %ranges, %r, @Range.offset
      %len = buffer.load.field %ranges, %r, @Range.length
      %n = min %len, 128
      for %t = 0 to %n {{
        %tok = buffer.load.i32 %ids, mul(add(%off, %t), 4)
        buffer.store.i32 %out, mul(add(mul(%r, 128), %t), 4), %tok
      }}
      %big = cmp.gt %len, 128
      %clipped = if %big -> i64 {{
        yield 128
      }} else {{
        yield %len
      }}
      yield add(%acc, %clipped)
    }}
    assert cmp.ge(%total, 0), \"negative total in f{i}\"
    return %out, %total
  }}

"
        ));
    }
    s.push_str("}\n");
    s
}

fn median_time(mut f: impl FnMut(), min_total: Duration) -> Duration {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < min_total && times.len() < 50) {
        let t = Instant::now();
        f();
        times.push(t.elapsed());
    }
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let text = generate(400);
    let mb = text.len() as f64 / 1e6;
    let budget = Duration::from_secs(2);

    let scan = median_time(
        || {
            black_box(
                black_box(text.as_bytes())
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count(),
            );
        },
        budget,
    );
    let parse = median_time(
        || {
            black_box(loom_syntax::parse(black_box(&text)));
        },
        budget,
    );
    let compile = median_time(
        || {
            let (m, d) = loom_compiler::compile_text("bench.loom", black_box(&text));
            assert!(m.is_some(), "{d:?}");
            black_box(m);
        },
        budget,
    );
    let module = loom_compiler::compile_text("bench.loom", &text)
        .0
        .expect("the generated module compiles");
    let bytes = loom_ir::bytecode::encode(&module);
    let decode_verify = median_time(
        || {
            let m = loom_ir::bytecode::decode(black_box(&bytes)).expect("decodes");
            loom_ir::verify::verify_module(&m).expect("verifies");
            black_box(m);
        },
        budget,
    );
    let bc_mb = bytes.len() as f64 / 1e6;

    println!(
        "workload: generated module, 400 functions, {:.2} MB of .loom text, {:.2} MB of .loombc",
        mb, bc_mb
    );
    println!("| step | time (ms) | MB/s | slowdown vs byte scan |");
    println!("|---|---:|---:|---:|");
    let row = |name: &str, t: Duration, size: f64| {
        let secs = t.as_secs_f64();
        println!(
            "| {name} | {:.2} | {:.1} | {:.1}x |",
            secs * 1e3,
            size / secs,
            secs / scan.as_secs_f64()
        );
    };
    row("byte scan (reference)", scan, mb);
    row("parse", parse, mb);
    row("parse + compile + type check", compile, mb);
    row("decode + verify (.loombc)", decode_verify, bc_mb);
}
