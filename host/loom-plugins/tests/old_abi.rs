//! A plugin built against ABI 1.1 (its root module has `codec` but no `profile` field) still loads under 1.2:
//! abi_stable refuses it against the current root-module type, so the loader checks it against
//! `abi_1_1::LoomPlugin`, reads `codec` through that shape and the appended `profile` as absent. Likewise a
//! profile built against ABI 1.3 (no `profile_events` field) loads through `abi_1_3::LoomPlugin`, and a HAL built
//! against ABI 1.4 (no `hal_open` field: no run-time bounds) through `abi_1_4::LoomPlugin`. (The ABI
//! 1.0 plugin is checked by `tests/integration/codec_conformance.rs`.)

use loom_plugin_api::PluginKind;
use std::path::PathBuf;

/// `target/<profile>/deps/lib{stem}.so`, where cargo builds a dev-dependency's cdylib (the test binary lives
/// in the same `deps/`).
fn library(stem: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let name = format!(
        "{}{stem}.{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_EXTENSION
    );
    let p = exe.parent().expect("deps dir").join(&name);
    assert!(
        p.is_file(),
        "{} is missing (a dev-dependency?)",
        p.display()
    );
    p
}

#[test]
fn abi_1_1_plugins_still_load_without_a_profile_factory() {
    let p = loom_plugins::load_file(&library("loom_test_plugin_abi11"))
        .unwrap_or_else(|e| panic!("an ABI 1.1 plugin is rejected: {e}"));
    assert_eq!(
        (p.id.as_str(), p.kind, p.abi),
        ("abi11-0001", PluginKind::CODEC, (1, 1))
    );
    assert!(p.has_codec_factory());
    assert!(!p.has_profile_factory());
    // Its codec factory is called through the 1.1 shape and answers.
    let codec = p.codec().unwrap_or_else(|e| panic!("{e}"));
    let e = codec.audio().into_result().err().expect("no audio codec");
    assert_eq!(e.to_string(), "abi11-0001 has no audio codec");
    let e = p.profile().err().expect("a codec").to_string();
    assert_eq!(
        e,
        "plugin `abi11-0001` is a codec plugin, not an HTTP profile"
    );
}

#[test]
fn abi_1_3_profiles_still_load_without_streamed_routes() {
    let p = loom_plugins::load_file(&library("loom_test_plugin_abi13"))
        .unwrap_or_else(|e| panic!("an ABI 1.3 plugin is rejected: {e}"));
    assert_eq!(
        (p.id.as_str(), p.kind, p.abi),
        ("abi13-0001", PluginKind::PROFILE, (1, 3))
    );
    assert!(p.has_profile_factory());
    assert!(p.profile_events().is_none());
    // Its profile is called through the 1.3 shape and answers.
    let profile = p.profile().unwrap_or_else(|e| panic!("{e}"));
    let routes = profile.routes();
    assert_eq!(routes.len(), 1);
    assert_eq!(routes[0].path.as_str(), "/old");
    let e = profile
        .parse(
            0,
            "".into(),
            (&[][..]).into(),
            loom_plugin_api::ParseContext { max_inputs: 1 },
        )
        .into_result()
        .expect_err("refuses");
    assert_eq!(e.message.as_str(), "abi13 parses nothing");
}

#[test]
fn abi_1_4_hals_still_load_without_a_control() {
    let p = loom_plugins::load_file(&library("loom_test_plugin_abi14"))
        .unwrap_or_else(|e| panic!("an ABI 1.4 plugin is rejected: {e}"));
    assert_eq!(
        (p.id.as_str(), p.kind, p.abi),
        ("abi14-0001", PluginKind::HAL, (1, 4))
    );
    // `hal_open` (ABI 1.5) reads as absent: the host opens its devices without run-time bounds.
    assert!(p.hal_open(0).is_none());
    // Its driver is reached through the 1.4 shape and answers.
    let driver = p.hal().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(driver.devices().len(), 1);
    let e = driver
        .open(0)
        .into_result()
        .err()
        .expect("cannot be opened");
    assert_eq!(e.to_string(), "abi14-0001 has no device 0");
    let e = p.hal_files(0).expect("a 1.4 plugin has the 1.3 field");
    assert!(e.is_err());
}
