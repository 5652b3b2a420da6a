//! HAL conformance: every HAL plugin found in this build's target directory (`target/<profile>/deps/` or
//! `target/<profile>/`, `libhal_*.so`; `hal-cpu` is built because it is a dev-dependency) is loaded through `loom-plugins` and checked against the HAL
//! contract of `loom-plugin-api`: allocation, write/read, copy and fill, a compiled motif stage against
//! `loom-reference`, fence ordering and joins, failure propagation with the kernel contract's error text, and
//! buffers kept alive after `free` until the submission using them retires; and, on the CPU device, lanes (one
//! timeline's work in order, other timelines' not held up by it, no deadlock between lanes sharing buffers). The loader's rejection lines (a
//! junk `.so`, a non-loom `.so`) are checked next to a real plugin. `hal-cpu` and `hal-vulkan` (lavapipe in CI)
//! must load; `hal-cuda` must load where `LOOM_REQUIRE_CUDA=1` and is otherwise checked to be reported absent in
//! one line.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use loom_compiler::Catalog;
use loom_ir::TValue;
use loom_ir::kernel::Stage;
use loom_ir::kernel_codec::encode_stage;
use loom_plugin_api::abi_stable::std_types::{RBoxError, RResult, RSlice, RVec};
use loom_plugin_api::abi_stable::std_types::{ROption, RStr};
use loom_plugin_api::{
    BufferId, Command, FileId, FileOpenFlags, FileRead, FileReadSubmission, HalDeviceBox,
    HalFilesBox, MAX_FILE_READS, PluginKind, Submission, TimelineId, TimelinePoint, WaitStatus,
};
use loom_plugins::{LoadedPlugin, Rejection};

const WAIT_NS: u64 = 30_000_000_000;

// ---- plugins ----------------------------------------------------------------------------------------------

/// `target/<profile>`: the test binary is `target/<profile>/deps/integration-<hash>`.
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

fn lib_name(stem: &str) -> String {
    format!(
        "{}{stem}.{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_EXTENSION
    )
}

/// Every `libhal_*` library of this build. A dev-dependency's cdylib is built into `target/<profile>/deps/`
/// (only `cargo build -p` uplifts it to `target/<profile>/`, where it may be stale), so `deps/` comes first; the
/// first found per name wins.
fn hal_libraries() -> Vec<PathBuf> {
    let prefix = format!("{}hal_", std::env::consts::DLL_PREFIX);
    let suffix = format!(".{}", std::env::consts::DLL_EXTENSION);
    let mut found: Vec<PathBuf> = Vec::new();
    for dir in [profile_dir().join("deps"), profile_dir()] {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut names: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(&suffix))
            })
            .collect();
        names.sort();
        for p in names {
            if !found.iter().any(|q| q.file_name() == p.file_name()) {
                found.push(p);
            }
        }
    }
    found
}

/// What loading every `libhal_*` of this build gave: the plugins, and the files whose probe answered "absent".
struct Loaded {
    plugins: Vec<LoadedPlugin>,
    absent: Vec<(PathBuf, String)>,
}

/// A plugin whose device may legitimately be missing: CUDA (no GPU in CI). `LOOM_REQUIRE_CUDA=1` (set by
/// `scripts/gpu-conformance.sh`) makes its absence a failure. Vulkan is never optional: CI runs it on lavapipe.
fn may_be_absent(path: &Path) -> bool {
    path.file_name()
        .is_some_and(|n| *n == *lib_name("hal_cuda"))
        && std::env::var("LOOM_REQUIRE_CUDA").map_or(true, |v| v != "1")
}

fn loaded() -> &'static Loaded {
    static LOADED: OnceLock<Loaded> = OnceLock::new();
    LOADED.get_or_init(|| {
        let libs = hal_libraries();
        for want in ["hal_cpu", "hal_vulkan", "hal_cuda"] {
            assert!(
                libs.iter()
                    .any(|p| p.file_name().is_some_and(|n| *n == *lib_name(want))),
                "lib{want} is not in {} (is it a dev-dependency of tests/?): {libs:?}",
                profile_dir().display()
            );
        }
        let mut plugins = Vec::new();
        let mut absent = Vec::new();
        for p in &libs {
            match loom_plugins::load_file(p) {
                Ok(pl) if pl.kind == PluginKind::HAL => plugins.push(pl),
                Ok(_) => {}
                Err(Rejection::DeviceAbsent(d)) if may_be_absent(p) => absent.push((p.clone(), d)),
                Err(e) => panic!(
                    "{}: {e} (Vulkan needs libvulkan1 and mesa-vulkan-drivers: scripts/test.sh installs them)",
                    p.display()
                ),
            }
        }
        Loaded { plugins, absent }
    })
}

/// The loaded plugin `id` (e.g. `cpu-0001`).
pub(crate) fn plugin(id: &str) -> &'static LoadedPlugin {
    plugins()
        .iter()
        .find(|p| p.id == id)
        .unwrap_or_else(|| panic!("plugin {id} did not load"))
}

/// Every HAL plugin of this build that found its device, loaded once.
fn plugins() -> &'static [LoadedPlugin] {
    &loaded().plugins
}

/// Runs `check` on device 0 of every HAL plugin.
fn each_device(check: impl Fn(&str, &HalDeviceBox)) {
    for p in plugins() {
        let driver = p.hal().unwrap_or_else(|e| panic!("{e}"));
        assert!(!driver.devices().is_empty(), "{}: no devices", p.id);
        let dev = ok(&p.id, driver.open(0));
        check(&p.id, &dev);
    }
}

fn ok<T>(what: &str, r: RResult<T, RBoxError>) -> T {
    r.into_result().unwrap_or_else(|e| panic!("{what}: {e}"))
}

fn err<T: std::fmt::Debug>(r: RResult<T, RBoxError>) -> String {
    r.into_result().expect_err("an error").to_string()
}

fn point(timeline: TimelineId, value: u64) -> TimelinePoint {
    TimelinePoint { timeline, value }
}

fn submit(
    dev: &HalDeviceBox,
    commands: Vec<Command>,
    wait: &[TimelinePoint],
    signal: TimelinePoint,
) {
    ok(
        "submit",
        dev.submit(Submission {
            commands: RVec::from(commands),
            wait: RVec::from(wait.to_vec()),
            signal,
        }),
    );
}

fn reached(dev: &HalDeviceBox, p: TimelinePoint) {
    assert_eq!(
        ok("wait", dev.timeline_wait(p, WAIT_NS)),
        WaitStatus::Reached
    );
}

/// Runs `exe` (one input, one output, no parameters or workspace) on a new timeline and waits for it.
fn dispatch_once(
    id: &str,
    dev: &HalDeviceBox,
    exe: loom_plugin_api::ExecutableId,
    input: BufferId,
    output: BufferId,
) {
    let t = ok(id, dev.timeline_create());
    submit(
        dev,
        vec![Command::Dispatch {
            exe,
            inputs: RVec::from(vec![input]),
            params: RVec::new(),
            outputs: RVec::from(vec![output]),
            workspace: RVec::new(),
        }],
        &[],
        point(t, 1),
    );
    reached(dev, point(t, 1));
}

fn upload(dev: &HalDeviceBox, data: &[u8]) -> BufferId {
    let b = ok("alloc", dev.alloc(data.len() as u64));
    ok("write", dev.write(b, 0, RSlice::from_slice(data)));
    b
}

fn read_all(dev: &HalDeviceBox, b: BufferId, len: usize) -> Vec<u8> {
    ok("read", dev.read(b, 0, len as u64)).into_vec()
}

// ---- motifs -----------------------------------------------------------------------------------------------

pub(crate) fn catalog() -> &'static Catalog {
    loom_testkit::motif_catalog()
}

fn specialize(stage: &str, cfg: &[(&str, i64)]) -> Stage {
    let (module, name) = stage.rsplit_once('.').expect("MODULE.STAGE");
    let cat = catalog();
    let cfg: Vec<(String, TValue)> = cfg
        .iter()
        .map(|(k, v)| (k.to_string(), TValue::I64(*v)))
        .collect();
    loom_kernel::specialize_stage(cat, cat.find(module).expect("module"), name, &cfg)
        .unwrap_or_else(|e| panic!("{stage}: {}", e.join("")))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn floats(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

// ---- conformance ------------------------------------------------------------------------------------------

#[test]
fn hal_alloc_write_read_copy_fill() {
    each_device(|id, dev| {
        let limits = dev.limits();
        assert!(limits.max_buffer_bytes >= 1 << 20, "{id}: {limits:?}");
        let a = ok(id, dev.alloc(64));
        assert_eq!(
            read_all(dev, a, 64),
            vec![0u8; 64],
            "{id}: alloc is zero-filled"
        );
        let data: Vec<u8> = (0..40u8).collect();
        ok(id, dev.write(a, 8, RSlice::from_slice(&data)));
        assert_eq!(
            ok(id, dev.read(a, 8, 40)).into_vec(),
            data,
            "{id}: round trip"
        );
        assert!(
            err(dev.write(a, 60, RSlice::from_slice(&data))).contains("outside"),
            "{id}"
        );
        assert!(
            dev.read(a, 0, 65).into_result().is_err(),
            "{id}: read past the end"
        );
        assert!(
            dev.read(BufferId(u64::MAX), 0, 1).into_result().is_err(),
            "{id}: unknown buffer"
        );

        let b = ok(id, dev.alloc(64));
        let t = ok(id, dev.timeline_create());
        assert_eq!(ok(id, dev.timeline_value(t)), 0);
        submit(
            dev,
            vec![
                Command::Fill {
                    dst: b,
                    offset: 0,
                    len: 64,
                    byte: 0xab,
                },
                Command::Copy {
                    src: a,
                    src_offset: 8,
                    dst: b,
                    dst_offset: 16,
                    len: 40,
                },
                Command::Copy {
                    src: b,
                    src_offset: 16,
                    dst: b,
                    dst_offset: 0,
                    len: 8,
                },
            ],
            &[],
            point(t, 1),
        );
        reached(dev, point(t, 1));
        assert_eq!(ok(id, dev.timeline_value(t)), 1);
        let mut want = vec![0xabu8; 64];
        want[16..56].copy_from_slice(&data);
        want.copy_within(16..24, 0);
        assert_eq!(
            read_all(dev, b, 64),
            want,
            "{id}: fill then copies, in order"
        );
        ok(id, dev.free(a));
        ok(id, dev.free(b));
        assert!(dev.free(a).into_result().is_err(), "{id}: double free");
    });
}

#[test]
fn hal_dispatch_of_a_motif_stage_matches_the_reference() {
    let (r, c) = (13usize, 37usize);
    let stage = specialize(
        "motifs.softmax.softmax",
        &[("R", r as i64), ("C", c as i64)],
    );
    let x: Vec<f32> = (0..r * c)
        .map(|i| ((i * 7919) % 1601) as f32 / 100.0 - 8.0)
        .collect();
    let xb = f32_bytes(&x);
    let mut want = loom_reference::alloc_outputs(&stage).expect("outputs");
    loom_reference::run_stage(&stage, &[&xb], &[], &mut want).expect("reference");
    let want = floats(&want[0]);
    let bytes = encode_stage(&stage);
    each_device(|id, dev| {
        let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
        assert!(
            dev.compile(RSlice::from_slice(&bytes[..bytes.len() - 1]))
                .into_result()
                .is_err(),
            "{id}: a truncated stage compiles"
        );
        let input = upload(dev, &xb);
        let output = ok(id, dev.alloc((r * c * 4) as u64));
        dispatch_once(id, dev, exe, input, output);
        let got = floats(&read_all(dev, output, r * c * 4));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-6 * w.abs() + 1e-9,
                "{id}: element {i}: {g} vs reference {w}"
            );
        }
    });
}

#[test]
fn hal_fences_order_and_join_submissions() {
    each_device(|id, dev| {
        let n = 1 << 16;
        let a = ok(id, dev.alloc(n));
        let b = ok(id, dev.alloc(n));
        let host = ok(id, dev.timeline_create());
        let t1 = ok(id, dev.timeline_create());
        let t2 = ok(id, dev.timeline_create());
        // First: gated on a host signal; fills `a`. Second: waits for the first's point, copies a -> b.
        submit(
            dev,
            vec![Command::Fill {
                dst: a,
                offset: 0,
                len: n,
                byte: 7,
            }],
            &[point(host, 1)],
            point(t1, 1),
        );
        submit(
            dev,
            vec![Command::Copy {
                src: a,
                src_offset: 0,
                dst: b,
                dst_offset: 0,
                len: n,
            }],
            &[point(t1, 1)],
            point(t2, 5),
        );
        assert_eq!(
            ok(id, dev.timeline_wait(point(t2, 5), 20_000_000)),
            WaitStatus::TimedOut,
            "{id}: ran before its wait point"
        );
        assert_eq!(ok(id, dev.timeline_value(t1)), 0);
        ok(id, dev.timeline_signal(point(host, 1)));
        assert!(
            dev.timeline_signal(point(host, 1)).into_result().is_err(),
            "{id}: signal must increase"
        );
        reached(dev, point(t2, 5));
        reached(dev, point(t2, 3));
        assert_eq!(ok(id, dev.timeline_value(t1)), 1);
        assert!(
            read_all(dev, b, n as usize).iter().all(|&x| x == 7),
            "{id}: copy saw the fill"
        );
    });
}

#[test]
fn hal_failure_propagates_with_the_kernel_error_text() {
    let (r, h, v) = (4usize, 8usize, 10usize);
    let stage = specialize(
        "motifs.embed.embed",
        &[("R", r as i64), ("H", h as i64), ("V", v as i64)],
    );
    let ids: Vec<i32> = vec![1, 2, v as i32, 3];
    let idb: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
    let table: Vec<f32> = (0..v * h).map(|i| i as f32).collect();
    let tb = f32_bytes(&table);
    let mut out = loom_reference::alloc_outputs(&stage).expect("outputs");
    let want = loom_reference::run_stage(&stage, &[&idb], &[&tb], &mut out)
        .expect_err("out-of-vocabulary id")
        .to_string();
    assert!(want.contains("checked load from"), "{want}");
    let bytes = encode_stage(&stage);
    each_device(|id, dev| {
        let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
        let ids_buf = upload(dev, &idb);
        let table_buf = upload(dev, &tb);
        let output = ok(id, dev.alloc((r * h * 4) as u64));
        let spare = ok(id, dev.alloc(4));
        let t1 = ok(id, dev.timeline_create());
        let t2 = ok(id, dev.timeline_create());
        submit(
            dev,
            vec![Command::Dispatch {
                exe,
                inputs: RVec::from(vec![ids_buf]),
                params: RVec::from(vec![table_buf]),
                outputs: RVec::from(vec![output]),
                workspace: RVec::new(),
            }],
            &[],
            point(t1, 1),
        );
        // Depends on the failed point: does not run, fails its own point with the same error.
        submit(
            dev,
            vec![Command::Fill {
                dst: spare,
                offset: 0,
                len: 4,
                byte: 1,
            }],
            &[point(t1, 1)],
            point(t2, 1),
        );
        let e1 = err(dev.timeline_wait(point(t1, 1), WAIT_NS));
        assert_eq!(
            e1, want,
            "{id}: the failed point carries the kernel contract's error"
        );
        let e2 = err(dev.timeline_wait(point(t2, 1), WAIT_NS));
        assert_eq!(
            e2, want,
            "{id}: the dependent point fails with the same error"
        );
        assert_eq!(
            err(dev.timeline_wait(point(t1, 7), WAIT_NS)),
            want,
            "{id}: later waits"
        );
        assert_eq!(err(dev.timeline_value(t1)), want);
        assert_eq!(
            read_all(dev, spare, 4),
            vec![0; 4],
            "{id}: the dependent submission ran"
        );
        // The device still works after a failure.
        let t3 = ok(id, dev.timeline_create());
        submit(
            dev,
            vec![Command::Fill {
                dst: spare,
                offset: 0,
                len: 4,
                byte: 2,
            }],
            &[],
            point(t3, 1),
        );
        reached(dev, point(t3, 1));
        assert_eq!(read_all(dev, spare, 4), vec![2; 4]);
        // Unknown ids are rejected when the submission is accepted.
        let bad = dev.submit(Submission {
            commands: RVec::from(vec![Command::Fill {
                dst: BufferId(u64::MAX),
                offset: 0,
                len: 1,
                byte: 0,
            }]),
            wait: RVec::new(),
            signal: point(t3, 2),
        });
        assert!(err(bad).contains("unknown buffer"), "{id}");
    });
}

/// Runs a one-dispatch stage on every device and checks that the dispatch fails with `want` (the reference's
/// text) on its signal point.
fn each_device_fails_like_the_reference(stage: &Stage, inputs: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = inputs.iter().map(|b| b.as_slice()).collect();
    let mut out = loom_reference::alloc_outputs(stage).expect("outputs");
    let want = loom_reference::run_stage(stage, &refs, &[], &mut out)
        .expect_err("the reference fails")
        .to_string();
    let bytes = encode_stage(stage);
    each_device(|id, dev| {
        let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
        let ins: Vec<BufferId> = inputs.iter().map(|b| upload(dev, b)).collect();
        let outs: Vec<BufferId> = out
            .iter()
            .map(|o| ok(id, dev.alloc(o.len() as u64)))
            .collect();
        let t = ok(id, dev.timeline_create());
        submit(
            dev,
            vec![Command::Dispatch {
                exe,
                inputs: RVec::from(ins),
                params: RVec::new(),
                outputs: RVec::from(outs),
                workspace: RVec::new(),
            }],
            &[],
            point(t, 1),
        );
        assert_eq!(
            err(dev.timeline_wait(point(t, 1), WAIT_NS)),
            want,
            "{id}: the failed point carries the kernel contract's error"
        );
    });
}

#[test]
fn hal_division_by_zero_fails_with_the_kernel_error_text() {
    use loom_ir::kernel::{BufRef, DType};
    use loom_testkit::{KB, buf, i, i32_bytes, stage};
    let mut kb = KB::new("div", [1, 1, 1]);
    let pa = kb.param("a", DType::I32, &[8], loom_ir::kernel::Access::Read);
    let pb = kb.param("b", DType::I32, &[8], loom_ir::kernel::Access::Read);
    let po = kb.param("o", DType::I32, &[8], loom_ir::kernel::Access::Write);
    let r = kb.range(i(0), 8);
    let a = kb.load(pa, vec![r.clone()], None);
    let b = kb.load(pb, vec![r.clone()], None);
    let q = kb.div(a, b);
    kb.store(po, vec![r], q);
    let s = stage(
        "div",
        vec![buf("a", DType::I32, &[8]), buf("b", DType::I32, &[8])],
        vec![buf("o", DType::I32, &[8])],
        vec![],
        vec![kb.finish()],
        vec![(
            0,
            vec![BufRef::Input(0), BufRef::Input(1), BufRef::Output(0)],
        )],
    );
    let a = i32_bytes(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let b = i32_bytes(&[1, 1, 1, 1, 1, 0, 1, 1]);
    each_device_fails_like_the_reference(&s, &[a, b]);
}

#[test]
fn hal_non_positive_loop_step_fails_with_the_kernel_error_text() {
    use loom_ir::kernel::{Access, BufRef, DType};
    use loom_testkit::{KB, buf, i, i64_bytes, stage};
    let mut kb = KB::new("steps", [1, 1, 1]);
    let ps = kb.param("s", DType::I64, &[1], Access::Read);
    let po = kb.param("o", DType::I64, &[1], Access::Write);
    let step = kb.load(ps, vec![i(0)], None);
    let sum = kb.for_(i(0), i(4), step, vec![i(0)], |kb, iv, it| {
        vec![kb.add(it[0].clone(), iv)]
    });
    kb.store(po, vec![i(0)], sum[0].clone());
    let s = stage(
        "steps",
        vec![buf("s", DType::I64, &[1])],
        vec![buf("o", DType::I64, &[1])],
        vec![],
        vec![kb.finish()],
        vec![(0, vec![BufRef::Input(0), BufRef::Output(0)])],
    );
    each_device_fails_like_the_reference(&s, &[i64_bytes(&[-2])]);
}

/// Random GGUF blocks of `dtype` (`blocks` of them): every byte random, except the f16 scales, which are finite
/// values of either sign between 2^-6 and 2^1 (random bits could be NaN or infinite).
fn random_blocks(dtype: loom_ir::kernel::DType, blocks: usize, seed: u64) -> Vec<u8> {
    use loom_ir::kernel::DType;
    let (_, size) = dtype.block().expect("a block type");
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut out = Vec::new();
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..size).map(|_| next() as u8).collect();
        let f16_at: &[usize] = match dtype {
            DType::Q8_0 | DType::Q4_0 => &[0],
            DType::Q4_1 | DType::Q4K => &[0, 2],
            DType::Q6K => &[208],
            _ => &[],
        };
        for &o in f16_at {
            let r = next();
            // sign, exponent 9..=16 (2^-6 .. 2^1), random mantissa
            let h = ((r & 1) << 15) as u16
                | (((9 + (r >> 1) % 8) as u16) << 10)
                | ((r >> 8) as u16 & 0x3ff);
            b[o..o + 2].copy_from_slice(&h.to_le_bytes());
        }
        out.extend(b);
    }
    out
}

#[test]
fn hal_quantised_loads_match_the_reference() {
    use loom_ir::kernel::DType;
    // Two blocks of 256 (eight of 32) per row, 3 rows: [2, 96] tiles straddle block boundaries, the last column
    // tile and the last row tile are partly outside (masked).
    let (r, c) = (3usize, 512usize);
    for (name, dtype) in [
        ("q8_0", DType::Q8_0),
        ("q4_0", DType::Q4_0),
        ("q4_1", DType::Q4_1),
        ("q4_k", DType::Q4K),
        ("q6_k", DType::Q6K),
    ] {
        let stage = loom_testkit::dequant_stage(
            name,
            &[("R", r as i64), ("C", c as i64), ("BR", 2), ("BC", 96)],
        );
        let (per, _) = dtype.block().expect("block");
        let w = random_blocks(dtype, r * c / per as usize, 0x9e37_79b9_7f4a_7c15 ^ per);
        let mut want = loom_reference::alloc_outputs(&stage).expect("outputs");
        loom_reference::run_stage(&stage, &[&w], &[], &mut want).expect("reference");
        let want = floats(&want[0]);
        let big = want.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(big > 0.0 && want.iter().all(|x| x.is_finite()), "{name}");
        let bytes = encode_stage(&stage);
        each_device(|id, dev| {
            let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
            let input = upload(dev, &w);
            // Poisoned: an element the kernel does not write stays NaN and fails the comparison.
            let output = upload(dev, &vec![0xFF; r * c * 4]);
            dispatch_once(id, dev, exe, input, output);
            let got = floats(&read_all(dev, output, r * c * 4));
            // ggml's f32 operations in ggml's order; a device may contract `d1 * q - m1` into one fma, which
            // moves the result by at most an ulp of the block's largest magnitude. A wrong nibble, scale or
            // sign is off by at least one quantisation step (>= 2^-6 here).
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 2e-7 * big,
                    "{id}: {name} element {i} (row {}, column {}): {g} vs reference {w}",
                    i / c,
                    i % c
                );
            }
            ok(id, dev.free(input));
            ok(id, dev.free(output));
        });
    }
}

#[test]
fn hal_freed_buffer_lives_until_its_submission_retires() {
    each_device(|id, dev| {
        let data: Vec<u8> = (0..=255u8).cycle().take(4096).collect();
        let src = upload(dev, &data);
        let dst = ok(id, dev.alloc(4096));
        let host = ok(id, dev.timeline_create());
        let t = ok(id, dev.timeline_create());
        submit(
            dev,
            vec![Command::Copy {
                src,
                src_offset: 0,
                dst,
                dst_offset: 0,
                len: 4096,
            }],
            &[point(host, 1)],
            point(t, 1),
        );
        ok(id, dev.free(src));
        assert!(
            dev.read(src, 0, 1).into_result().is_err(),
            "{id}: freed id still readable"
        );
        ok(id, dev.timeline_signal(point(host, 1)));
        reached(dev, point(t, 1));
        assert_eq!(
            read_all(dev, dst, 4096),
            data,
            "{id}: the copy read the freed buffer's data"
        );
    });
}

// ---- queued file reads (ABI 1.3) ---------------------------------------------------------------------------

/// Runs `check` on device 0 of every HAL plugin that queues file reads (`hal_files`); the others are named
/// on stderr (the host reads files for them) and must answer without panicking.
fn each_device_with_files(check: impl Fn(&str, &HalDeviceBox, &HalFilesBox)) {
    let mut checked = Vec::new();
    for p in plugins() {
        match p.hal_files(0) {
            Some(Ok(d)) => match d.files {
                ROption::RSome(files) => {
                    check(&p.id, &d.device, &files);
                    checked.push(p.id.as_str());
                }
                ROption::RNone => eprintln!("{}: device 0 has no queued file reads", p.id),
            },
            Some(Err(e)) => eprintln!(
                "{}: no queued file reads ({e}); the host reads for it",
                p.id
            ),
            None => eprintln!("{}: built before ABI 1.3, no queued file reads", p.id),
        }
    }
    for must in ["cpu-0001", "vulkan-0001"] {
        assert!(
            plugins().iter().all(|p| p.id != must) || checked.contains(&must),
            "{must} must queue file reads (checked: {checked:?})"
        );
    }
}

/// A file of `len` bytes, byte `i` being `(i * 7 + 3) % 251`, in the temporary directory.
fn pattern_file(name: &str, len: usize) -> (PathBuf, std::fs::File, Vec<u8>) {
    let data: Vec<u8> = (0..len).map(|i| ((i * 7 + 3) % 251) as u8).collect();
    let path = std::env::temp_dir().join(format!("loom-{name}-{}.bin", std::process::id()));
    std::fs::write(&path, &data).expect("write the pattern file");
    let f = std::fs::File::open(&path).expect("open the pattern file");
    (path, f, data)
}

fn open_file(
    files: &HalFilesBox,
    f: &std::fs::File,
    path: &Path,
    flags: FileOpenFlags,
) -> RResult<loom_plugin_api::FileInfo, RBoxError> {
    use std::os::fd::AsRawFd;
    let p = path.display().to_string();
    files.file_open(f.as_raw_fd(), RStr::from_str(&p), flags)
}

fn read(file: FileId, file_offset: u64, len: u64, dst: BufferId, dst_offset: u64) -> FileRead {
    FileRead {
        file,
        file_offset,
        len,
        dst,
        dst_offset,
    }
}

fn submit_reads(
    files: &HalFilesBox,
    reads: Vec<FileRead>,
    wait: &[TimelinePoint],
    signal: TimelinePoint,
) {
    ok(
        "submit_reads",
        files.submit_reads(FileReadSubmission {
            reads: RVec::from(reads),
            wait: RVec::from(wait.to_vec()),
            signal,
        }),
    );
}

/// The failure text of `p` (the point must fail).
fn failed(dev: &HalDeviceBox, p: TimelinePoint) -> String {
    dev.timeline_wait(p, WAIT_NS)
        .into_result()
        .expect_err("the point fails")
        .to_string()
}

#[test]
fn hal_file_reads_land_at_their_offsets_in_timeline_order() {
    each_device_with_files(|id, dev, files| {
        let (path, f, data) = pattern_file("reads", 65536);
        let info = ok(id, open_file(files, &f, &path, FileOpenFlags::BUFFERED));
        assert_eq!((info.len, info.direct_alignment), (65536, 0), "{id}");
        // The host may close its descriptor once the device has the file.
        drop(f);
        let dst = ok(id, dev.alloc(16384));
        let host = ok(id, dev.timeline_create());
        let t = ok(id, dev.timeline_create());
        submit(
            dev,
            vec![Command::Fill {
                dst,
                offset: 0,
                len: 16384,
                byte: 0xAA,
            }],
            &[],
            point(t, 1),
        );
        // The reads wait for a host point; the copy after them waits for the reads.
        submit_reads(
            files,
            vec![
                read(info.file, 100, 50, dst, 0),
                read(info.file, 60000, 1000, dst, 5000),
                read(info.file, 0, 0, dst, 16384),
            ],
            &[point(host, 1)],
            point(t, 2),
        );
        submit(
            dev,
            vec![Command::Copy {
                src: dst,
                src_offset: 0,
                dst,
                dst_offset: 10000,
                len: 50,
            }],
            &[point(t, 2)],
            point(t, 3),
        );
        reached(dev, point(t, 1));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert_eq!(
            ok(id, dev.timeline_value(t)),
            1,
            "{id}: reads ran before their wait"
        );
        assert_eq!(
            ok(id, dev.read(dst, 0, 50)).into_vec(),
            vec![0xAA; 50],
            "{id}"
        );
        ok(id, dev.timeline_signal(point(host, 1)));
        reached(dev, point(t, 3));
        let got = read_all(dev, dst, 16384);
        let mut want = vec![0xAAu8; 16384];
        want[..50].copy_from_slice(&data[100..150]);
        want[5000..6000].copy_from_slice(&data[60000..61000]);
        want[10000..10050].copy_from_slice(&data[100..150]);
        assert!(got == want, "{id}: file reads landed at the wrong offsets");
        // Work that waits for a read may be submitted before the read (reads are on a transfer queue ordered
        // by points only): the fill below must not block the read it waits for.
        let t2 = ok(id, dev.timeline_create());
        submit(
            dev,
            vec![Command::Fill {
                dst,
                offset: 0,
                len: 10,
                byte: 0x55,
            }],
            &[point(t2, 1)],
            point(t2, 2),
        );
        submit_reads(
            files,
            vec![read(info.file, 0, 20, dst, 0)],
            &[],
            point(t2, 1),
        );
        reached(dev, point(t2, 2));
        let got = read_all(dev, dst, 20);
        assert_eq!(&got[..10], &[0x55; 10], "{id}");
        assert_eq!(&got[10..], &data[10..20], "{id}");
        ok(id, files.file_close(info.file));
        assert!(files.file_close(info.file).into_result().is_err(), "{id}");
        let e = err(files.submit_reads(FileReadSubmission {
            reads: RVec::from(vec![read(info.file, 0, 1, dst, 0)]),
            wait: RVec::new(),
            signal: point(t, 4),
        }));
        assert!(e.contains("unknown file"), "{id}: {e}");
        let _ = std::fs::remove_file(&path);
    });
}

#[test]
fn hal_file_read_failures_fail_the_point_naming_the_range() {
    each_device_with_files(|id, dev, files| {
        let (path, f, _) = pattern_file("read-fail", 10000);
        let info = ok(id, open_file(files, &f, &path, FileOpenFlags::BUFFERED));
        let dst = ok(id, dev.alloc(4096));
        // A short read: the range passes the end of the file.
        let t = ok(id, dev.timeline_create());
        submit_reads(
            files,
            vec![read(info.file, 9000, 2000, dst, 0)],
            &[],
            point(t, 1),
        );
        let e = failed(dev, point(t, 1));
        assert!(
            e.contains("offset 9000 length 2000") && e.contains("short read"),
            "{id}: {e}"
        );
        // A destination outside the buffer.
        let t = ok(id, dev.timeline_create());
        submit_reads(
            files,
            vec![read(info.file, 0, 100, dst, 4000)],
            &[],
            point(t, 1),
        );
        let e = failed(dev, point(t, 1));
        assert!(
            e.contains("offset 0 length 100") && e.contains("outside"),
            "{id}: {e}"
        );
        // A failed read fails the points that wait on it, with the same text.
        let t2 = ok(id, dev.timeline_create());
        submit(
            dev,
            vec![Command::Fill {
                dst,
                offset: 0,
                len: 1,
                byte: 1,
            }],
            &[point(t, 1)],
            point(t2, 1),
        );
        assert_eq!(failed(dev, point(t2, 1)), e, "{id}");
        // Checked when accepted: unknown buffers, too many reads, unknown timelines.
        let t = ok(id, dev.timeline_create());
        let e = err(files.submit_reads(FileReadSubmission {
            reads: RVec::from(vec![read(info.file, 0, 1, BufferId(u64::MAX), 0)]),
            wait: RVec::new(),
            signal: point(t, 1),
        }));
        assert!(e.contains("unknown buffer"), "{id}: {e}");
        let e = err(files.submit_reads(FileReadSubmission {
            reads: RVec::from(vec![read(info.file, 0, 1, dst, 0); MAX_FILE_READS + 1]),
            wait: RVec::new(),
            signal: point(t, 1),
        }));
        assert!(e.contains(&MAX_FILE_READS.to_string()), "{id}: {e}");
        let e = err(files.submit_reads(FileReadSubmission {
            reads: RVec::new(),
            wait: RVec::new(),
            signal: point(TimelineId(u64::MAX), 1),
        }));
        assert!(e.contains("unknown timeline"), "{id}: {e}");
        // The device still works after the failures.
        submit_reads(
            files,
            vec![read(info.file, 0, 4096, dst, 0)],
            &[],
            point(t, 1),
        );
        reached(dev, point(t, 1));
        let _ = std::fs::remove_file(&path);
    });
}

#[test]
fn hal_direct_file_reads_need_aligned_ranges() {
    each_device_with_files(|id, dev, files| {
        let (path, f, data) = pattern_file("direct", 65536);
        let info = match open_file(files, &f, &path, FileOpenFlags::DIRECT).into_result() {
            Ok(i) => i,
            Err(e) if e.to_string().contains("refuses direct I/O") => {
                eprintln!(
                    "{id}: SKIPPED direct I/O: the file system of {} refuses O_DIRECT ({e})",
                    path.display()
                );
                return;
            }
            Err(e) => panic!("{id}: {e}"),
        };
        let a = info.direct_alignment;
        assert!(a >= 512 && a.is_power_of_two(), "{id}: alignment {a}");
        let dst = ok(id, dev.alloc(4 * a));
        let t = ok(id, dev.timeline_create());
        submit_reads(
            files,
            vec![
                read(info.file, a, 2 * a, dst, a),
                read(info.file, 8 * a, a, dst, 3 * a),
            ],
            &[],
            point(t, 1),
        );
        reached(dev, point(t, 1));
        let got = read_all(dev, dst, 4 * a as usize);
        let a = a as usize;
        assert!(got[..a].iter().all(|&b| b == 0), "{id}");
        assert!(got[a..3 * a] == data[a..3 * a], "{id}: aligned direct read");
        assert!(
            got[3 * a..] == data[8 * a..9 * a],
            "{id}: aligned direct read"
        );
        let a = a as u64;
        for (off, len, dst_off) in [(100, a, 0), (a, 100, 0), (0, a, 8)] {
            let t = ok(id, dev.timeline_create());
            submit_reads(
                files,
                vec![read(info.file, off, len, dst, dst_off)],
                &[],
                point(t, 1),
            );
            let e = failed(dev, point(t, 1));
            let want =
                format!("direct I/O needs {a}-byte aligned ranges: offset {off} length {len}");
            assert!(e.contains(&want), "{id}: {e}");
        }
        eprintln!("{id}: direct I/O checked on {}", path.display());
        let _ = std::fs::remove_file(&path);
    });
}

// ---- loader -----------------------------------------------------------------------------------------------

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("loom-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// A system library that is certainly not a loom plugin.
fn system_library() -> Option<PathBuf> {
    [
        "/lib/x86_64-linux-gnu/libm.so.6",
        "/usr/lib/x86_64-linux-gnu/libm.so.6",
        "/lib/aarch64-linux-gnu/libm.so.6",
        "/usr/lib64/libm.so.6",
        "/lib64/libm.so.6",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.is_file())
}

#[test]
fn loader_rejects_junk_and_foreign_libraries_with_one_line_each() {
    let dir = temp_dir("plugins");
    let hal = hal_libraries()
        .into_iter()
        .find(|p| p.file_name().is_some_and(|n| *n == *lib_name("hal_cpu")))
        .expect("libhal_cpu");
    std::fs::copy(&hal, dir.join(lib_name("hal_cpu"))).expect("copy hal-cpu");
    // Deterministic "random" bytes (xorshift).
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    let junk: Vec<u8> = (0..4096)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    std::fs::write(dir.join(lib_name("x")), junk).expect("junk");
    let foreign = system_library();
    if let Some(m) = &foreign {
        std::fs::copy(m, dir.join(lib_name("m"))).expect("copy libm");
    }
    let report = loom_plugins::load_all(std::slice::from_ref(&dir));
    let lines: Vec<String> = report.rejected.iter().map(|r| r.to_string()).collect();
    assert_eq!(report.plugins.len(), 1, "{lines:?}");
    assert_eq!(report.plugins[0].id, "cpu-0001");
    assert_eq!(report.plugins[0].kind, PluginKind::HAL);
    assert_eq!(
        report.rejected.len(),
        1 + usize::from(foreign.is_some()),
        "{lines:?}"
    );
    for (r, line) in report.rejected.iter().zip(&lines) {
        assert!(matches!(r.reason, Rejection::NotAPlugin(_)), "{line}");
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains("not a loom plugin"), "{line}");
    }
    assert!(
        lines.iter().any(|l| l.contains(&lib_name("x"))),
        "{lines:?}"
    );
    // The loaded copy works.
    let driver = report.plugins[0].hal().expect("driver");
    let dev = ok("open", driver.open(0));
    let b = upload(&dev, b"hello");
    assert_eq!(read_all(&dev, b, 5), b"hello");
    assert!(driver.open(1).into_result().is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn hal_cpu_and_vulkan_are_both_under_test() {
    let ids: Vec<&str> = plugins().iter().map(|p| p.id.as_str()).collect();
    assert!(ids.contains(&"cpu-0001"), "{ids:?}");
    assert!(
        ids.contains(&"vulkan-0001"),
        "the Vulkan plugin did not load: {ids:?}"
    );
}

/// Without an NVIDIA driver, the CUDA plugin's probe says why in one line and the loader keeps going: the CPU
/// plugin next to it in the same directory loads and works. With a driver (`LOOM_REQUIRE_CUDA=1`), it loads.
#[test]
fn loader_reports_an_absent_cuda_device_in_one_line_and_keeps_going() {
    let dir = temp_dir("cuda-absent");
    for name in ["hal_cpu", "hal_cuda"] {
        let lib = hal_libraries()
            .into_iter()
            .find(|p| p.file_name().is_some_and(|n| *n == *lib_name(name)))
            .unwrap_or_else(|| panic!("lib{name}"));
        std::fs::copy(&lib, dir.join(lib_name(name))).expect("copy plugin");
    }
    let report = loom_plugins::load_all(std::slice::from_ref(&dir));
    let lines: Vec<String> = report.rejected.iter().map(|r| r.to_string()).collect();
    let ids: Vec<&str> = report.plugins.iter().map(|p| p.id.as_str()).collect();
    assert!(ids.contains(&"cpu-0001"), "{ids:?} {lines:?}");
    let required = std::env::var("LOOM_REQUIRE_CUDA").is_ok_and(|v| v == "1");
    if ids.contains(&"cuda-0001") {
        // A machine with an NVIDIA driver and NVRTC.
        assert!(report.rejected.is_empty(), "{lines:?}");
    } else {
        assert!(
            !required,
            "LOOM_REQUIRE_CUDA=1 but the CUDA plugin did not load: {lines:?}"
        );
        assert_eq!(ids, ["cpu-0001"], "{lines:?}");
        assert_eq!(report.rejected.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert!(
            matches!(report.rejected[0].reason, Rejection::DeviceAbsent(_)),
            "absent, not failed or panicked: {line}"
        );
        assert_eq!(line.lines().count(), 1, "{line}");
        assert!(line.contains(&lib_name("hal_cuda")), "{line}");
        assert!(line.contains("device absent"), "{line}");
        assert!(
            line.contains("libcuda") || line.contains("NVRTC") || line.contains("CUDA driver"),
            "the line says why: {line}"
        );
        assert_eq!(loaded().absent.len(), 1, "the suite saw it absent too");
    }
    let driver = report.plugins[0].hal().expect("driver");
    let dev = ok("open", driver.open(0));
    let b = upload(&dev, b"still running");
    assert_eq!(read_all(&dev, b, 13), b"still running");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- run-time bounds and released executables (ABI 1.5) ---------------------------------------------------------

/// Runs `check` on device 0 of every HAL plugin that has a control (`hal_open`); cpu and vulkan must.
fn each_device_with_control(check: impl Fn(&str, &HalDeviceBox, &loom_plugin_api::HalControlBox)) {
    let mut checked = Vec::new();
    for p in plugins() {
        match p.hal_open(0) {
            Some(Ok(d)) => match d.control {
                ROption::RSome(control) => {
                    check(&p.id, &d.device, &control);
                    checked.push(p.id.as_str());
                }
                ROption::RNone => eprintln!("{}: device 0 has no control", p.id),
            },
            Some(Err(e)) => eprintln!("{}: no control ({e})", p.id),
            None => eprintln!("{}: no control (before ABI 1.5)", p.id),
        }
    }
    for must in ["cpu-0001", "vulkan-0001"] {
        assert!(
            plugins().iter().all(|p| p.id != must) || checked.contains(&must),
            "{must} must have a control (checked: {checked:?})"
        );
    }
}

/// The counted-loop stage of `loom_testkit::corpus` over `grid` instances.
fn counted_stage(grid: u64) -> Stage {
    use loom_ir::kernel::{BufRef, DType};
    use loom_testkit::{buf, stage};
    stage(
        "bounded",
        vec![buf("n", DType::I64, &[1])],
        vec![buf("y", DType::F32, &[grid])],
        vec![],
        vec![loom_testkit::corpus::counted_loop(grid)],
        vec![(0, vec![BufRef::Input(0), BufRef::Output(0)])],
    )
}

/// Submits one bounded dispatch of `exe` and returns the point's outcome (the output on success).
fn bounded_run(
    dev: &HalDeviceBox,
    control: &loom_plugin_api::HalControlBox,
    exe: loom_plugin_api::ExecutableId,
    trips: i64,
    out_len: usize,
    bounds: loom_plugin_api::DispatchBounds,
) -> Result<Vec<u8>, String> {
    let input = upload(dev, &trips.to_le_bytes());
    let output = ok("alloc", dev.alloc(out_len as u64));
    let t = ok("timeline", dev.timeline_create());
    ok(
        "submit_bounded",
        control.submit_bounded(
            Submission {
                commands: RVec::from(vec![Command::Dispatch {
                    exe,
                    inputs: RVec::from(vec![input]),
                    params: RVec::new(),
                    outputs: RVec::from(vec![output]),
                    workspace: RVec::new(),
                }]),
                wait: RVec::new(),
                signal: point(t, 1),
            },
            bounds,
        ),
    );
    dev.timeline_wait(point(t, 1), WAIT_NS)
        .into_result()
        .map(|_| read_all(dev, output, out_len))
        .map_err(|e| e.to_string())
}

#[test]
fn hal_bounded_dispatches_stop_at_their_budget_with_the_reference_text() {
    use loom_plugin_api::{CancelId, DispatchBounds};
    let s = counted_stage(4);
    let bytes = encode_stage(&s);
    let reference = |trips: i64, steps: u64| {
        let input = trips.to_le_bytes();
        let mut out = loom_reference::alloc_outputs(&s).unwrap();
        let b = loom_ir::kernel::RunBounds {
            steps,
            cancel: None,
        };
        loom_reference::run_stage_bounded(&s, &[&input], &[], &mut out, &b)
            .map(|_| out.remove(0))
            .map_err(|e| e.to_string())
    };
    let bounds = |steps| DispatchBounds {
        steps,
        cancel: CancelId(0),
    };
    each_device_with_control(|id, dev, control| {
        let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
        // 4 instances of 1 + 100 steps: exactly the budget runs, one step less fails.
        let got = bounded_run(dev, control, exe, 100, 16, bounds(404));
        assert_eq!(got, reference(100, 404), "{id}");
        assert_eq!(floats(&got.unwrap()), [100.0; 4], "{id}");
        let e = bounded_run(dev, control, exe, 100, 16, bounds(403)).unwrap_err();
        assert_eq!(Err(e.clone()), reference(100, 403), "{id}");
        assert_eq!(
            e, "kernel `count` of stage `bounded` exceeded its budget of 403 steps",
            "{id}"
        );
        // A runaway (2^31 - 1 iterations: the largest count WGSL's i32 emulation of i64 reads) stops at its
        // budget; unbounded it would run for minutes.
        let t0 = std::time::Instant::now();
        let e = bounded_run(dev, control, exe, i64::from(i32::MAX), 16, bounds(8000)).unwrap_err();
        assert_eq!(
            e, "kernel `count` of stage `bounded` exceeded its budget of 8000 steps",
            "{id}"
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "{id}");
        // A grid larger than the budget does not run.
        let e = bounded_run(dev, control, exe, 1, 16, bounds(3)).unwrap_err();
        assert_eq!(
            e, "kernel `count` of stage `bounded` exceeded its budget of 3 steps",
            "{id}"
        );
    });
}

#[test]
fn hal_cancelled_dispatches_fail_and_released_executables_are_refused() {
    use loom_plugin_api::DispatchBounds;
    let s = counted_stage(2);
    let bytes = encode_stage(&s);
    each_device_with_control(|id, dev, control| {
        let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
        let flag = ok(id, control.cancel_create());
        let with_flag = DispatchBounds {
            steps: 0,
            cancel: flag,
        };
        let got = bounded_run(dev, control, exe, 10, 8, with_flag).expect("not cancelled yet");
        assert_eq!(floats(&got), [10.0; 2], "{id}");
        ok(id, control.cancel_signal(flag));
        let e = bounded_run(dev, control, exe, 10, 8, with_flag).unwrap_err();
        assert_eq!(e, "kernel `count` of stage `bounded` was cancelled", "{id}");
        ok(id, control.cancel_destroy(flag));
        assert!(
            err(control.cancel_signal(flag)).contains("unknown cancellation flag"),
            "{id}"
        );
        // Released: the id is gone, later submissions naming it are refused.
        ok(id, control.release(exe));
        let t = ok(id, dev.timeline_create());
        let input = upload(dev, &1i64.to_le_bytes());
        let output = ok(id, dev.alloc(8));
        let e = err(dev.submit(Submission {
            commands: RVec::from(vec![Command::Dispatch {
                exe,
                inputs: RVec::from(vec![input]),
                params: RVec::new(),
                outputs: RVec::from(vec![output]),
                workspace: RVec::new(),
            }]),
            wait: RVec::new(),
            signal: point(t, 1),
        }));
        assert!(e.contains("unknown executable"), "{id}: {e}");
        assert!(
            err(control.release(exe)).contains("unknown executable"),
            "{id}"
        );
    });
}

/// A point the host fails fails only itself: a submission waiting on it fails with the host's message without
/// running (its output keeps its bytes), and the timeline goes on past it.
#[test]
fn hal_failed_points_fail_their_waiters_without_running_them() {
    let s = counted_stage(2);
    let bytes = encode_stage(&s);
    each_device_with_control(|id, dev, control| {
        let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
        let host = ok(id, dev.timeline_create());
        let work = ok(id, dev.timeline_create());
        let input = upload(dev, &4i64.to_le_bytes());
        let output = upload(dev, &f32_bytes(&[-1.0, -1.0]));
        let dispatch = || Command::Dispatch {
            exe,
            inputs: RVec::from(vec![input]),
            params: RVec::new(),
            outputs: RVec::from(vec![output]),
            workspace: RVec::new(),
        };
        // A dispatch waiting on host point 1, which the host fails.
        submit(dev, vec![dispatch()], &[point(host, 1)], point(work, 1));
        ok(
            id,
            control.timeline_fail(point(host, 1), "the read of rows 3..5 failed".into()),
        );
        assert_eq!(
            failed(dev, point(host, 1)),
            "the read of rows 3..5 failed",
            "{id}"
        );
        assert!(
            failed(dev, point(work, 1)).contains("the read of rows 3..5 failed"),
            "{id}"
        );
        assert_eq!(
            floats(&read_all(dev, output, 8)),
            [-1.0, -1.0],
            "{id}: it did not run"
        );
        // Point 2 of the host timeline is independent of the failed point 1.
        let work2 = ok(id, dev.timeline_create());
        submit(dev, vec![dispatch()], &[point(host, 2)], point(work2, 1));
        ok(id, dev.timeline_signal(point(host, 2)));
        reached(dev, point(work2, 1));
        assert_ne!(
            floats(&read_all(dev, output, 8)),
            [-1.0, -1.0],
            "{id}: it ran"
        );
        // A reached point cannot be failed.
        assert!(
            err(control.timeline_fail(point(host, 2), "late".into())).contains("already reached"),
            "{id}"
        );
    });
}

// ---- lanes: the CPU device -------------------------------------------------------------------------------
// Submissions of one timeline run in submission order; submissions of different timelines are ordered only by
// their wait points (the contract allows it; the CPU device does it, so one model's work blocked or running
// long does not hold up another's); jobs of different lanes that share buffers never deadlock.

/// Device 0 of the CPU plugin.
fn cpu_device() -> HalDeviceBox {
    let p = plugins()
        .iter()
        .find(|p| p.id == "cpu-0001")
        .expect("the CPU plugin is built (a dev-dependency)");
    ok(&p.id, p.hal().unwrap_or_else(|e| panic!("{e}")).open(0))
}

fn fill(dst: BufferId, byte: u8) -> Command {
    Command::Fill {
        dst,
        offset: 0,
        len: 64,
        byte,
    }
}

/// Every device (the GPU plugins run timelines on lanes too): work of a timeline blocked on its wait point does
/// not hold up another timeline's.
#[test]
fn a_blocked_timeline_does_not_hold_up_another() {
    each_device(|id, dev| {
        let host = ok(id, dev.timeline_create());
        let (t1, t2) = (ok(id, dev.timeline_create()), ok(id, dev.timeline_create()));
        let (a, b) = (ok(id, dev.alloc(64)), ok(id, dev.alloc(64)));
        // t1's work waits for the host; t2's, submitted after it, waits for nothing.
        submit(dev, vec![fill(a, 1)], &[point(host, 1)], point(t1, 1));
        submit(dev, vec![fill(b, 2)], &[], point(t2, 1));
        assert_eq!(
            ok(id, dev.timeline_wait(point(t2, 1), WAIT_NS)),
            WaitStatus::Reached,
            "{id}: t2's work waited behind t1's"
        );
        assert_eq!(read_all(dev, b, 64), vec![2; 64]);
        assert_eq!(
            ok(id, dev.timeline_value(t1)),
            0,
            "{id}: t1's work ran before its wait point"
        );
        assert_eq!(read_all(dev, a, 64), vec![0; 64]);
        ok(id, dev.timeline_signal(point(host, 1)));
        reached(dev, point(t1, 1));
        assert_eq!(read_all(dev, a, 64), vec![1; 64]);
    });
}

#[test]
fn one_timeline_runs_in_submission_order() {
    each_device(|id, dev| {
        let host = ok(id, dev.timeline_create());
        let t = ok(id, dev.timeline_create());
        let a = ok(id, dev.alloc(64));
        // The first waits for the host; the second, on the same timeline, waits for nothing but must run after
        // it.
        submit(dev, vec![fill(a, 1)], &[point(host, 1)], point(t, 1));
        submit(dev, vec![fill(a, 2)], &[], point(t, 2));
        assert_eq!(
            ok(id, dev.timeline_wait(point(t, 2), 100_000_000)),
            WaitStatus::TimedOut,
            "{id}: the second job of a timeline ran before the first"
        );
        assert_eq!(read_all(dev, a, 64), vec![0; 64]);
        ok(id, dev.timeline_signal(point(host, 1)));
        reached(dev, point(t, 2));
        assert_eq!(
            read_all(dev, a, 64),
            vec![2; 64],
            "{id}: the later fill landed last"
        );
    });
}

#[test]
fn lanes_sharing_buffers_do_not_deadlock() {
    // Two timelines copy between the same two buffers in opposite directions, many times, while a third fills
    // both: every job locks both buffers, so without one lock order they would deadlock sooner or later.
    let dev = cpu_device();
    let n = 1 << 20;
    let a = ok("alloc", dev.alloc(n));
    let b = ok("alloc", dev.alloc(n));
    ok(
        "write",
        dev.write(a, 0, RSlice::from_slice(&vec![5u8; n as usize])),
    );
    let lanes: Vec<TimelineId> = (0..3)
        .map(|_| ok("timeline", dev.timeline_create()))
        .collect();
    let copy = |src, dst| Command::Copy {
        src,
        src_offset: 0,
        dst,
        dst_offset: 0,
        len: n,
    };
    let rounds = 400;
    for v in 1..=rounds {
        submit(&dev, vec![copy(a, b)], &[], point(lanes[0], v));
        submit(&dev, vec![copy(b, a)], &[], point(lanes[1], v));
        submit(&dev, vec![copy(a, b), copy(b, a)], &[], point(lanes[2], v));
    }
    for &t in &lanes {
        assert_eq!(
            ok("wait", dev.timeline_wait(point(t, rounds), WAIT_NS)),
            WaitStatus::Reached,
            "a lane did not finish"
        );
    }
    // Only copies of 5s ever ran.
    assert!(read_all(&dev, b, n as usize).iter().all(|&x| x == 5));
}

#[test]
fn a_failure_stays_on_its_timeline() {
    let dev = cpu_device();
    let (t1, t2) = (
        ok("timeline", dev.timeline_create()),
        ok("timeline", dev.timeline_create()),
    );
    let a = ok("alloc", dev.alloc(64));
    // Out of range: fails t1's point; t2's work is not affected.
    submit(
        &dev,
        vec![Command::Fill {
            dst: a,
            offset: 60,
            len: 64,
            byte: 9,
        }],
        &[],
        point(t1, 1),
    );
    submit(&dev, vec![fill(a, 3)], &[], point(t2, 1));
    assert!(
        dev.timeline_wait(point(t1, 1), WAIT_NS)
            .into_result()
            .is_err()
    );
    reached(&dev, point(t2, 1));
    assert_eq!(read_all(&dev, a, 64), vec![3; 64]);
}

/// A parameter buffer rewritten between two dispatches: the second dispatch computes with the new bytes on
/// every device. (The CPU HAL keeps weight tiles derived from a parameter's bytes between dispatches,
/// `loom_cpu::ParamCache`; a write must drop them.) `y = W x` row form, Q4_1 weights, both results within
/// `1e-4 * sum |w x|` of the reference for the weights the parameter held (the CPU's tiled path quantises the
/// activations to 22 bits, far inside that).
#[test]
fn hal_parameter_writes_reach_the_next_dispatch() {
    use loom_ir::kernel::DType;
    let (m, n, k) = (2u64, 48u64, 256u64);
    let stage = loom_testkit::matvec_rows_param_stage(DType::Q4_1, m, n, k);
    let xs: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.37).sin()).collect();
    let x = f32_bytes(&xs);
    let blocks = (n * k / 32) as usize;
    let ws = [
        random_blocks(DType::Q4_1, blocks, 0x1234_5678),
        random_blocks(DType::Q4_1, blocks, 0x8765_4321),
    ];
    let check = |id: &str, w: &[u8], got: &[f32]| {
        let mut want = loom_reference::alloc_outputs(&stage).expect("outputs");
        loom_reference::run_stage(&stage, &[&x], &[w], &mut want).expect("reference");
        let want = floats(&want[0]);
        let wd = loom_reference::dequantize(DType::Q4_1, w).expect("dequantize");
        for (idx, (g, e)) in got.iter().zip(&want).enumerate() {
            let (r, c) = (idx / n as usize, idx % n as usize);
            let s: f64 = wd[c * k as usize..(c + 1) * k as usize]
                .iter()
                .zip(&xs[r * k as usize..(r + 1) * k as usize])
                .map(|(a, b)| f64::from(a * b).abs())
                .sum();
            assert!(
                f64::from((g - e).abs()) <= 1e-4 * s,
                "{id}: y[{r}, {c}] = {g}, reference {e}"
            );
        }
    };
    let bytes = encode_stage(&stage);
    each_device(|id, dev| {
        let exe = ok(id, dev.compile(RSlice::from_slice(&bytes)));
        let (xb, wb) = (upload(dev, &x), upload(dev, &ws[0]));
        let yb = ok("alloc", dev.alloc(m * n * 4));
        let t = ok(id, dev.timeline_create());
        let mut results = Vec::new();
        for (round, w) in ws.iter().enumerate() {
            if round > 0 {
                ok("write", dev.write(wb, 0, RSlice::from_slice(w)));
            }
            let p = point(t, round as u64 + 1);
            submit(
                dev,
                vec![Command::Dispatch {
                    exe,
                    inputs: RVec::from(vec![xb]),
                    params: RVec::from(vec![wb]),
                    outputs: RVec::from(vec![yb]),
                    workspace: RVec::new(),
                }],
                &[],
                p,
            );
            reached(dev, p);
            let got = floats(&read_all(dev, yb, (m * n * 4) as usize));
            check(id, w, &got);
            results.push(got);
        }
        assert_ne!(results[0], results[1], "{id}");
        for b in [xb, wb, yb] {
            ok(id, dev.free(b));
        }
    });
}
