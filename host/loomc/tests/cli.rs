//! `loomc` end to end: the real binary on the example programs and on broken inputs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn loomc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_loomc"))
        .args(args)
        .current_dir(repo())
        .env_clear()
        .output()
        .expect("loomc runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loomc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

#[test]
fn run_prints_and_returns() {
    let out = loomc(&["run", "packages/examples/fib.loom", "--entry", "main", "20"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // 6765 printed by the program through the test module, then the result.
    assert_eq!(text(&out.stdout), "6765\n=> i64 6765\n");
}

#[test]
fn pack_example_pads_and_truncates() {
    let out = loomc(&["run", "packages/examples/pack.loom", "--entry", "main"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // An independent oracle: rows [100, 101], [102..=106] truncated to 4, [] padded to 4 i32 each.
    let rows: [&[i32]; 3] = [&[100, 101], &[102, 103, 104, 105, 106], &[]];
    let mut want = Vec::new();
    for r in rows {
        for t in 0..4 {
            want.extend(r.get(t).copied().unwrap_or(0).to_le_bytes());
        }
    }
    let hex: String = want.iter().map(|b| format!("{b:02x}")).collect();
    assert!(
        text(&out.stdout).ends_with(&format!("=> buffer {hex}\n")),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn endless_loop_stops_out_of_fuel() {
    let out = loomc(&[
        "run",
        "packages/examples/spin.loom",
        "--entry",
        "main",
        "--fuel",
        "5000",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("trap (OutOfFuel): packages/examples/spin.loom:"),
        "{err}"
    );
    assert!(err.contains("fuel used: 5000,"), "{err}");
}

#[test]
fn build_then_dis_matches_source_disassembly() {
    let bc = tmp("pack.loombc");
    let out = loomc(&[
        "build",
        "packages/examples/pack.loom",
        "-o",
        bc.to_str().expect("utf-8 path"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let from_bc = loomc(&["dis", bc.to_str().expect("utf-8 path")]);
    let from_src = loomc(&["dis", "packages/examples/pack.loom"]);
    assert!(from_bc.status.success() && from_src.status.success());
    assert_eq!(text(&from_bc.stdout), text(&from_src.stdout));
    assert!(text(&from_bc.stdout).starts_with("module @examples.pack {\n"));
    // Bytecode runs exactly like source.
    let run = loomc(&["run", bc.to_str().expect("utf-8 path"), "--entry", "main"]);
    assert!(run.status.success(), "{}", text(&run.stderr));
}

#[test]
fn corrupted_and_truncated_bytecode_is_rejected_not_run() {
    let bc = tmp("fib.loombc");
    let p = bc.to_str().expect("utf-8 path");
    assert!(
        loomc(&["build", "packages/examples/fib.loom", "-o", p])
            .status
            .success()
    );
    let good = std::fs::read(&bc).expect("bytecode written");
    let cases = [
        ("flipped", {
            let mut b = good.clone();
            let mid = b.len() / 2;
            b[mid] ^= 0x40;
            b
        }),
        ("truncated", good[..good.len() - 7].to_vec()),
        ("empty", Vec::new()),
    ];
    for (name, bytes) in cases {
        let f = tmp(&format!("{name}.loombc"));
        std::fs::write(&f, bytes).expect("write");
        let out = loomc(&[
            "run",
            f.to_str().expect("utf-8 path"),
            "--entry",
            "main",
            "5",
        ]);
        assert_eq!(out.status.code(), Some(1), "{name}");
        let err = text(&out.stderr);
        assert!(err.contains("invalid bytecode"), "{name}: {err}");
        // Nothing ran: the program would have printed 5.
        assert!(out.stdout.is_empty(), "{name}: {}", text(&out.stdout));
    }
}

#[test]
fn diagnostics_name_file_line_and_column() {
    let out = loomc(&["check", "tests/golden/compile/err_types.loom"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "tests/golden/compile/err_types.loom:7:10: error: add: operands must have the same type"
        ),
        "{err}"
    );
    assert!(err.contains("7 |     %x = add %a, %b\n"), "{err}");
}

#[test]
fn capability_not_granted_to_role_is_rejected() {
    let out = loomc(&[
        "check",
        "tests/golden/link/not_granted/main.loom",
        "--role",
        "prepare",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr)
            .contains("capability module \"runner\" is not granted to the prepare role")
    );
    // `run` grants only the test module.
    let out = loomc(&[
        "run",
        "tests/golden/compile/canonical_basics.loom",
        "--entry",
        "tokens",
        "00",
        "5",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("capability module \"input\" is not granted to the test role"),
        "{}",
        text(&out.stderr)
    );
    // Only the closure of the requested root is linked: `arith` needs no capability, and its checked i32
    // arithmetic traps with the source location.
    let out = loomc(&[
        "run",
        "tests/golden/compile/canonical_basics.loom",
        "--entry",
        "arith",
        "1",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("trap (IntegerOverflow): tests/golden/compile/canonical_basics.loom:18:5: in @golden.basics.arith"), "{err}");
}

#[test]
fn libraries_link_from_source_and_bytecode() {
    let bc = tmp("bc_lib.loombc");
    let p = bc.to_str().expect("utf-8 path");
    assert!(
        loomc(&[
            "build",
            "tests/golden/link/bytecode_lib/bc_lib.loom",
            "-o",
            p
        ])
        .status
        .success()
    );
    for lib in [p, "tests/golden/link/bytecode_lib/bc_lib.loom"] {
        let out = loomc(&[
            "run",
            "tests/golden/link/bytecode_lib/main.loom",
            "--lib",
            lib,
            "--entry",
            "main",
            "5",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        // twice<N = 7>(5) = 5 * 2 + 7
        assert_eq!(text(&out.stdout), "17\n=> i64 17\n");
    }
}

#[test]
fn report_shows_layouts() {
    let out = loomc(&["report", "tests/golden/compile/records_consts.loom"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("record @Mixed: 24 bytes { a: i1 @0, b: i32 @4, c: f32 @8, d: i64 @16 }"),
        "{s}"
    );
}

#[test]
fn report_lists_device_items_and_reflects_a_stage() {
    let out = loomc(&[
        "report",
        "packages/motifs/gemm.loom",
        "--stage",
        "dense",
        "--config",
        "M=100",
        "--config",
        "ACT=gelu_tanh",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("  export kernel @gemm_bias<M, N, K, EPI, BM = 32, BN = 32, BK = 32>"),
        "{s}"
    );
    assert!(s.contains("  input %x: f32[100, 64] (25600 bytes)"), "{s}");
    assert!(
        s.contains(
            "dispatch 0: grid [4, 2, 1] motifs.gemm.gemm_bias<M=100,N=64,K=64,EPI=@gelu_tanh"
        ),
        "{s}"
    );
    assert!(s.contains(" us"), "{s}");
    // a wrong config is a diagnostic, not a crash
    let out = loomc(&[
        "report",
        "packages/motifs/gemm.loom",
        "--stage",
        "dense",
        "--config",
        "M=x",
    ]);
    assert!(!out.status.success());
}
