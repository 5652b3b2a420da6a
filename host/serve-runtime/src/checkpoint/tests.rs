use super::*;

fn tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("loom-ckpt-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn safetensors(tensors: &[(&str, &str, &[u64], &[u8])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let b = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [b, data.len()]}),
        );
    }
    let h = serde_json::Value::Object(header).to_string();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&data);
    out
}

#[test]
fn safetensors_index_and_read() {
    let w: Vec<u8> = (0..24u8).collect();
    let p = tmp("a.safetensors", &safetensors(&[("w", "F32", &[2, 3], &w)]));
    let s = Source::open(&[p]).unwrap();
    let e = &s.entries["w"];
    assert_eq!(e.dtype, Some(DType::F32));
    assert_eq!(e.shape, vec![2, 3]);
    let mut buf = [0u8; 8];
    s.read(e, 4, &mut buf).unwrap();
    assert_eq!(buf, [4, 5, 6, 7, 8, 9, 10, 11]);
    assert!(s.read(e, 20, &mut buf).is_err());
}

#[test]
fn shards_and_duplicates() {
    let a = tmp(
        "s1.safetensors",
        &safetensors(&[("a", "F32", &[1], &[0; 4])]),
    );
    let b = tmp(
        "s2.safetensors",
        &safetensors(&[("b", "F16", &[2], &[0; 4])]),
    );
    let s = Source::open(&[a.clone(), b]).unwrap();
    assert_eq!(s.entries["b"].file, 1);
    let err = Source::open(&[a.clone(), a]).unwrap_err();
    assert!(err.contains("also in an earlier shard"), "{err}");
}

#[test]
fn bad_safetensors_are_errors() {
    let mut f = safetensors(&[("w", "F32", &[4], &[0; 16])]);
    f.truncate(f.len() - 1);
    let err = Source::open(&[tmp("t.safetensors", &f)]).unwrap_err();
    assert!(err.contains("data_offsets"), "{err}");
    let err = Source::open(&[tmp(
        "j.safetensors",
        b"\xff\xff\xff\xff\xff\xff\xff\x7fjunk",
    )])
    .unwrap_err();
    assert!(err.contains("header length"), "{err}");
    let err = Source::open(&[tmp(
        "m.safetensors",
        &safetensors(&[("w", "F32", &[5], &[0; 16])]),
    )])
    .unwrap_err();
    assert!(err.contains("needs 20 bytes"), "{err}");
    let err =
        Source::open(&[std::env::temp_dir().join("no-such-checkpoint.safetensors")]).unwrap_err();
    assert!(err.contains("no-such-checkpoint"), "{err}");
}

fn gguf_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// A GGUF v3 file written by hand from the format description: one Q8_0 [2, 32] tensor and one F32 [3].
fn gguf() -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend_from_slice(&3u32.to_le_bytes());
    out.extend_from_slice(&2u64.to_le_bytes()); // tensors
    out.extend_from_slice(&2u64.to_le_bytes()); // kv
    gguf_string(&mut out, "general.architecture");
    out.extend_from_slice(&8u32.to_le_bytes());
    gguf_string(&mut out, "llama");
    gguf_string(&mut out, "tokens");
    out.extend_from_slice(&9u32.to_le_bytes());
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&2u64.to_le_bytes());
    gguf_string(&mut out, "a");
    gguf_string(&mut out, "b");
    // tensor infos
    gguf_string(&mut out, "q");
    out.extend_from_slice(&2u32.to_le_bytes());
    out.extend_from_slice(&32u64.to_le_bytes());
    out.extend_from_slice(&2u64.to_le_bytes());
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    gguf_string(&mut out, "f");
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&3u64.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&96u64.to_le_bytes());
    while !out.len().is_multiple_of(32) {
        out.push(0);
    }
    out.extend((0..68u8).map(|i| i.wrapping_mul(3)));
    out.extend_from_slice(&[0u8; 28]);
    out.extend_from_slice(&[1u8; 12]);
    out
}

#[test]
fn gguf_index_and_read() {
    let s = Source::open(&[tmp("m.gguf", &gguf())]).unwrap();
    let q = &s.entries["q"];
    assert_eq!(q.dtype, Some(DType::Q8_0));
    assert_eq!(q.shape, vec![2, 32]);
    assert_eq!(q.len, 68);
    let f = &s.entries["f"];
    assert_eq!((f.dtype, f.len), (Some(DType::F32), 12));
    let mut b = [0u8; 3];
    s.read(q, 0, &mut b).unwrap();
    assert_eq!(b, [0, 3, 6]);
    s.read(f, 0, &mut b).unwrap();
    assert_eq!(b, [1, 1, 1]);
    assert_eq!(s.meta["general.architecture"], Meta::Str("llama".into()));
    assert_eq!(
        s.meta["tokens"],
        Meta::Array(vec![Meta::Str("a".into()), Meta::Str("b".into())])
    );
}

#[test]
fn truncated_gguf_is_an_error() {
    let g = gguf();
    for cut in [5, 20, 60, g.len() - 1] {
        let err = Source::open(&[tmp(&format!("c{cut}.gguf"), &g[..cut])]).unwrap_err();
        assert!(
            err.contains("truncated") || err.contains("do not fit"),
            "{cut}: {err}"
        );
    }
}
