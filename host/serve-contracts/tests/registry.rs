//! Registry transitions with the real finite contract on the built-in CPU HAL: register, a failed
//! re-registration that keeps the old version serving, unregister while work is in flight, deactivate and
//! activate, and package validation by contract and role. Results are checked against the arithmetic
//! embedding's formula (`packages/arith-embed/kernel.loom`), computed here in f64.

use loom_plugin_api::records;
use serve_contracts::finite::FiniteService;
use serve_runtime::device::{BuiltinHal, Devices};
use serve_runtime::model::Overrides;
use serve_runtime::package::{OperatorLimits, PackageFiles};
use serve_runtime::registry::{Registry, Status};
use serve_runtime::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};

fn packages() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packages")
}

fn registry() -> Registry {
    let cpu = BuiltinHal {
        id: hal_cpu::PLUGIN_ID.into(),
        backend: "cpu".into(),
        driver: hal_cpu::driver(),
        open_with_files: hal_cpu::open_with_files,
        open_parts: Some(hal_cpu::open_parts),
    };
    let (devices, _) = Devices::open(&[], &[cpu]);
    // Packages are read from the repository's packages/ and from the temporary copies.
    let roots = [packages(), std::env::temp_dir()]
        .iter()
        .map(|p| p.canonicalize().unwrap())
        .collect();
    Registry::new(Arc::new(devices), serve_contracts::builtin()).with_limits(OperatorLimits {
        package_roots: roots,
        ..OperatorLimits::default()
    })
}

/// A copy of `packages/NAME` in a fresh temporary directory (`edit` may change its `model.json`).
fn package(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> (PathBuf, PackageFiles) {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "loom-registry-{}-{}-{name}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(packages().join(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.json")).unwrap()).unwrap();
    edit(&mut doc);
    std::fs::write(dir.join("model.json"), doc.to_string()).unwrap();
    (dir.clone(), PackageFiles::Dir(dir))
}

fn arith(values: &[i64], dims: usize) -> Vec<f64> {
    let n = values.len() as f64;
    (0..dims)
        .map(|j| {
            let s: f64 = values
                .iter()
                .enumerate()
                .map(|(t, &v)| v as f64 * 64.0 / (64.0 + ((t + 1) * (j + 1)) as f64))
                .sum();
            s / (256.0 * n)
        })
        .collect()
}

fn finite(reg: &Registry, name: &str) -> Result<Arc<FiniteService>> {
    Ok(reg
        .service(name)?
        .as_any()
        .downcast::<FiniteService>()
        .expect("a finite service"))
}

/// Submits token ids and waits for the embedding.
fn embed(svc: &FiniteService, ids: &[i64]) -> Result<Vec<f32>> {
    let (tx, rx) = mpsc::channel();
    svc.submit(
        records::ids_record(ids.iter().copied()).unwrap(),
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    )?;
    let rows = rx.recv().expect("every accepted request is answered")?;
    Ok(rows.into_iter().next().unwrap_or_default())
}

fn assert_embeds(svc: &FiniteService, ids: &[i64]) {
    let got = embed(svc, ids).unwrap();
    let want = arith(ids, 64);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert!(
            ((*g as f64) - w).abs() <= 1e-5 * w.abs().max(1.0),
            "{got:?} vs {want:?}"
        );
    }
}

#[test]
fn register_serves_and_a_failed_reregistration_keeps_the_old_version() {
    let reg = registry();
    let (first_dir, files) = package("arith-embed", |_| {});
    let info = reg
        .register("m", files, Overrides::default())
        .expect("registers");
    assert_eq!(info.source, first_dir.display().to_string());
    assert_eq!(info.status, Status::Ready);
    assert_eq!(
        (info.contract.as_str(), info.role.as_str()),
        ("finite", "embeddings")
    );
    assert!(info.device_bytes > 0 || info.stages > 0);
    let old = finite(&reg, "m").unwrap();
    assert_embeds(&old, &[5, 70000, 3]);

    // A broken package (a program that does not exist) under the same name.
    let (broken_dir, broken) = package("arith-embed", |d| {
        d["programs"]["control"] = "missing.loom".into();
    });
    let e = reg.register("m", broken, Overrides::default()).unwrap_err();
    assert!(e.to_string().contains("missing.loom"), "{e}");
    let info = reg.get("m").unwrap();
    assert_eq!(info.status, Status::Ready, "the old version keeps serving");
    assert!(info.error.as_deref().unwrap_or("").contains("missing.loom"));
    // The detail names where the serving version came from, and separately the attempt that failed.
    assert_eq!(info.source, first_dir.display().to_string());
    assert_eq!(
        info.failed_source.as_deref(),
        Some(broken_dir.display().to_string().as_str())
    );
    let now = finite(&reg, "m").unwrap();
    assert!(Arc::ptr_eq(&old, &now), "the same service still serves");
    assert_embeds(&now, &[1, 2, 3, 4]);

    // A good re-registration replaces it; the old one is drained (refuses new work).
    let (third_dir, files) = package("arith-embed", |_| {});
    let info = reg.register("m", files, Overrides::default()).unwrap();
    assert_eq!(info.source, third_dir.display().to_string());
    assert!(info.error.is_none() && info.failed_source.is_none());
    let new = finite(&reg, "m").unwrap();
    assert!(!Arc::ptr_eq(&old, &new));
    assert!(matches!(
        embed(&old, &[1]).unwrap_err(),
        Error::NotReady { .. }
    ));
    assert_embeds(&new, &[7]);
}

#[test]
fn a_failed_first_registration_is_listed_as_failed_and_holds_nothing() {
    let reg = registry();
    let (_d, files) = package("arith-embed", |d| {
        d["programs"]["prepare"] = "nope.loom".into();
    });
    assert!(reg.register("f", files, Overrides::default()).is_err());
    let info = reg.get("f").unwrap();
    assert_eq!(info.status, Status::Failed);
    assert_eq!(info.device_bytes, 0);
    assert!(matches!(
        reg.service("f").unwrap_err(),
        Error::NotReady { .. }
    ));
    assert_eq!(reg.devices.devices[0].allocated(), 0);
}

#[test]
fn unregister_during_work_answers_every_accepted_request() {
    let reg = registry();
    let (_d, files) = package("arith-embed", |_| {});
    reg.register("u", files, Overrides::default()).unwrap();
    let svc = finite(&reg, "u").unwrap();
    let (tx, rx) = mpsc::channel();
    let n = 64;
    for i in 0..n {
        let tx = tx.clone();
        svc.submit(
            records::ids_record([i, i + 1]).unwrap(),
            Box::new(move |r| {
                let _ = tx.send((i, r));
            }),
        )
        .unwrap();
    }
    drop(tx);
    reg.unregister("u").unwrap();
    // Every accepted request was answered, correctly, before unregister returned.
    let mut answered = 0;
    while let Ok((i, r)) = rx.try_recv() {
        let got = r.unwrap().remove(0);
        let want = arith(&[i, i + 1], 64);
        assert!(((got[3] as f64) - want[3]).abs() < 1e-5, "request {i}");
        answered += 1;
    }
    assert_eq!(answered, n);
    assert!(matches!(
        reg.service("u").unwrap_err(),
        Error::UnknownModel(_)
    ));
    assert!(reg.get("u").is_none());
    drop(svc);
    assert_eq!(
        reg.devices.devices[0].allocated(),
        0,
        "its memory is released"
    );
}

#[test]
fn deactivate_releases_parameters_and_activate_serves_again() {
    let reg = registry();
    // The weighted variant has parameters (a checkpoint) to release and stream again; it names programs of
    // its sibling package, so it registers from the repository.
    let files = PackageFiles::Dir(packages().join("arith-embed-weighted"));
    let ready = reg.register("w", files, Overrides::default()).unwrap();
    assert!(ready.device_bytes > 0);
    let before = embed(&finite(&reg, "w").unwrap(), &[9, 8, 7]).unwrap();
    let off = reg.deactivate("w").unwrap();
    assert_eq!(off.status, Status::Deactivated);
    assert!(off.device_bytes < ready.device_bytes, "parameters released");
    assert!(matches!(
        reg.service("w").unwrap_err(),
        Error::NotReady { .. }
    ));
    // Deactivating twice, or registering over a deactivated model, is refused.
    assert!(reg.deactivate("w").is_err());
    let on = reg.activate("w").unwrap();
    assert_eq!(on.status, Status::Ready);
    assert_eq!(on.device_bytes, ready.device_bytes);
    let after = embed(&finite(&reg, "w").unwrap(), &[9, 8, 7]).unwrap();
    assert_eq!(before, after, "the same parameters, bit for bit");
    assert!(
        reg.activate("w").is_err(),
        "activate needs a deactivated model"
    );
}

#[test]
fn packages_are_validated_by_contract_and_role() {
    let reg = registry();
    let (_d, files) = package("arith-embed", |d| d["contract"] = "recognition".into());
    let e = reg.register("c", files, Overrides::default()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "model.json: field `contract`: expected one of [\"finite\", \"retained\", \"sequence\"] (the contracts this server serves), found \"recognition\""
    );
    let (_d, files) = package("arith-embed", |d| d["role"] = "chat".into());
    let e = reg.register("r", files, Overrides::default()).unwrap_err();
    assert!(
        e.to_string()
            .contains("field `role`: a finite package's role is one of [\"embeddings\", \"decisions\"], found \"chat\""),
        "{e}"
    );
    let (_d, files) = package("arith-embed", |d| d["capacities"]["max_queue"] = 0.into());
    let e = reg.register("q", files, Overrides::default()).unwrap_err();
    assert!(e.to_string().contains("capacities.max_queue"), "{e}");
    let (_d, files) = package("arith-embed", |d| d["fuel"]["bogus"] = 1.into());
    let e = reg.register("u", files, Overrides::default()).unwrap_err();
    assert!(e.to_string().contains("bogus"), "{e}");
    // A bad model name is refused before anything is read.
    let (_d, files) = package("arith-embed", |_| {});
    assert!(matches!(
        reg.register("../x", files, Overrides::default())
            .unwrap_err(),
        Error::BadRequest(_)
    ));
}
