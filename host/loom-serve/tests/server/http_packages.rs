//! What a hostile server-local package cannot do: abort the server with huge declared memory caps, or read
//! (and echo in its errors) files outside the operator's package roots, through `..`, symlinks or a
//! symlinked checkpoint; and errors never show the server's own paths.

use crate::support::{TestServer, copy_dir};
use serde_json::json;
use std::path::Path;

/// A copy of packages/arith-embed at `dir`, with `edit` applied to its model.json.
fn arith_copy(s: &TestServer, dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    copy_dir(&s.dir.join("arith-embed"), dir);
    let mut doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.json")).unwrap()).unwrap();
    edit(&mut doc);
    std::fs::write(dir.join("model.json"), doc.to_string()).unwrap();
}

/// Makes the package's cold preparation ask for a terabyte (before, with a huge declared cap, the server
/// aborted: "memory allocation of ... failed").
fn terabyte_prepare(base: &Path) {
    let prep = std::fs::read_to_string(base.join("prepare.loom")).unwrap();
    let prep = prep.replacen(
        "export func @prepare(%asset_root: str, %options: str) -> (i64, i64, i64, i64, str, str, !opaque) {",
        "export func @prepare(%asset_root: str, %options: str) -> (i64, i64, i64, i64, str, str, !opaque) {\n    %huge = buffer.new 1099511627776\n    %huge_len = buffer.len %huge\n    assert cmp.ge(%huge_len, 1), \"the buffer exists\"",
        1,
    );
    assert!(
        prep.contains("%huge"),
        "the fixture's prepare has the expected header"
    );
    std::fs::write(base.join("prepare.loom"), prep).unwrap();
}

fn still_serving(s: &TestServer) {
    s.healthy();
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "arith-embed", "input": [[1, 2, 3]]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// Asserts `text` leaks neither the server's package directory nor the line of a system file.
fn no_leak(s: &TestServer, text: &str) {
    let dir = s.dir.canonicalize().unwrap();
    assert!(!text.contains(&dir.display().to_string()), "{text}");
    assert!(!text.contains(&s.dir.display().to_string()), "{text}");
    assert!(!text.contains("root:"), "{text}");
    assert!(!text.contains("/bin/"), "{text}");
}

#[test]
fn huge_declared_memory_caps_are_refused_before_anything_runs() {
    let s = TestServer::start("pkg-caps", &[]);
    let base = s.dir.join("huge");
    arith_copy(&s, &base, |d| {
        d["memory"]["invocation_bytes"] = json!(1u64 << 50);
        d["memory"]["state_bytes"] = json!(1u64 << 50);
    });
    terabyte_prepare(&base);
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "huge", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let m = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        m.contains("memory.invocation_bytes")
            && m.contains("over this server's limit of 1073741824 bytes"),
        "{m}"
    );
    // Within the limit, the allocation is the program's trap, not the server's end.
    arith_copy(&s, &base, |d| {
        d["memory"]["invocation_bytes"] = json!(64u64 << 20);
    });
    terabyte_prepare(&base);
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "huge", "base": base.display().to_string()}),
    );
    assert!(r.status == 400 || r.status == 422, "{}", r.text());
    assert!(r.text().contains("memory"), "{}", r.text());
    no_leak(&s, &r.text());
    still_serving(&s);
    // An operator may lower the limit.
    drop(s);
    let s = TestServer::start("pkg-caps-low", &["--max-invocation-bytes", "1000000"]);
    let list = s.request("GET", "/v1/models", b"").json();
    let failed: Vec<_> = list["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["status"] == "failed")
        .map(|m| m["error"].as_str().unwrap().to_string())
        .collect();
    assert!(
        !failed.is_empty() && failed.iter().all(|e| e.contains("memory.invocation_bytes")),
        "{failed:?}"
    );
}

#[test]
fn package_files_stay_inside_the_package_roots() {
    let s = TestServer::start("pkg-roots", &[]);
    let try_register = |name: &str, base: &Path| {
        s.post_json(
            "/v1/models",
            &json!({"name": name, "base": base.display().to_string()}),
        )
    };
    // `..` out of every root to a system file: refused, and nothing of the file comes back.
    let dotdot = s.dir.join("dotdot");
    arith_copy(&s, &dotdot, |d| {
        d["programs"]["prepare"] = json!("../../../../../../../../../../etc/passwd");
    });
    let r = try_register("dotdot", &dotdot);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("programs.prepare"), "{}", r.text());
    assert!(
        r.text().contains("outside the package roots"),
        "{}",
        r.text()
    );
    no_leak(&s, &r.text());

    // A symlinked program pointing out of the roots.
    let link = s.dir.join("linked");
    arith_copy(&s, &link, |d| d["programs"]["control"] = json!("evil.loom"));
    std::os::unix::fs::symlink("/etc/passwd", link.join("evil.loom")).unwrap();
    let r = try_register("linked", &link);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("outside the package roots"),
        "{}",
        r.text()
    );
    no_leak(&s, &r.text());

    // A symlinked checkpoint pointing out of the roots is not opened (its header bytes once leaked).
    let ck = s.dir.join("ck");
    copy_dir(&s.dir.join("arith-embed-weighted"), &ck);
    std::fs::remove_file(ck.join("weights.safetensors")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", ck.join("weights.safetensors")).unwrap();
    let r = try_register("ck", &ck);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text()
            .contains("checkpoint weights.safetensors: resolves outside"),
        "{}",
        r.text()
    );
    no_leak(&s, &r.text());

    // A package directory outside the roots is refused as a whole.
    let outside = std::env::temp_dir().join(format!("loom-outside-roots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&outside);
    arith_copy(&s, &outside, |_| {});
    let r = try_register("outside", &outside);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("outside the package roots"),
        "{}",
        r.text()
    );
    let _ = std::fs::remove_dir_all(&outside);

    // A missing program is named by its package path, never by the server's.
    let missing = s.dir.join("missing");
    arith_copy(&s, &missing, |d| {
        d["programs"]["control"] = json!("nope.loom")
    });
    let r = try_register("missing", &missing);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.text().contains("nope.loom: no such file or directory"),
        "{}",
        r.text()
    );
    no_leak(&s, &r.text());
    still_serving(&s);
}

/// Fuel bounds bulk work: a `prepare_request` that copies a megabyte 40,000 times (40 GB of copying, which
/// one fuel unit per copy let run for many seconds on the HTTP worker) now runs out of fuel after a few
/// copies, and the server keeps answering.
#[test]
fn bulk_copies_are_charged_by_their_bytes() {
    let s = TestServer::start("pkg-bulk", &[]);
    let base = s.dir.join("bulk");
    arith_copy(&s, &base, |_| {});
    let ctl = std::fs::read_to_string(base.join("control.loom")).unwrap();
    let head =
        "export func @prepare_request(%state: !opaque, %input: buffer) -> (buffer, i64, i64) {";
    assert!(
        ctl.contains(head),
        "the fixture's control has the expected entry"
    );
    let ctl = ctl.replacen(
        head,
        &format!(
            "{head}\n    %big = buffer.new 1048576\n    %dst = buffer.new 1048576\n    \
             for %k = 0 to 40000 {{\n      buffer.copy %dst, 0, %big, 0, 1048576\n    }}"
        ),
        1,
    );
    std::fs::write(base.join("control.loom"), ctl).unwrap();
    let r = s.post_json(
        "/v1/models",
        &json!({"name": "bulk", "base": base.display().to_string()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post_json(
        "/v1/embeddings",
        &json!({"model": "bulk", "input": [[1, 2, 3]]}),
    );
    assert!(r.status == 400 || r.status == 422, "{}", r.text());
    assert!(r.text().contains("out of fuel"), "{}", r.text());
    still_serving(&s);
}
