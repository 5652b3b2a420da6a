//! The finite contract's protocol records (`docs/serving/finite.md`), as bytes: what the built-in HTTP routes
//! and HTTP profile plugins both hand to a model, defined once here. Plain Rust functions: nothing of this
//! crosses the plugin boundary (profiles return the bytes in `RVec`s, which is the ABI's part).

/// Embeddings record kind: the payload is UTF-8 text.
pub const EMBED_TEXT: i32 = 0;
/// Embeddings record kind: the payload is little-endian i32 token ids.
pub const EMBED_IDS: i32 = 1;

/// An embeddings input record: `kind` (i32), a reserved i32 (0), then the payload.
pub fn embedding_record(kind: i32, payload: &[u8]) -> Vec<u8> {
    let mut r = Vec::with_capacity(8 + payload.len());
    r.extend_from_slice(&kind.to_le_bytes());
    r.extend_from_slice(&0i32.to_le_bytes());
    r.extend_from_slice(payload);
    r
}

/// An embeddings record of text.
pub fn text_record(text: &str) -> Vec<u8> {
    embedding_record(EMBED_TEXT, text.as_bytes())
}

/// An embeddings record of token ids; `None` names the first id outside `0..=i32::MAX` (by index).
pub fn ids_record(ids: impl IntoIterator<Item = i64>) -> Result<Vec<u8>, usize> {
    let mut p = Vec::new();
    for (i, id) in ids.into_iter().enumerate() {
        let id = i32::try_from(id).ok().filter(|v| *v >= 0).ok_or(i)?;
        p.extend_from_slice(&id.to_le_bytes());
    }
    Ok(embedding_record(EMBED_IDS, &p))
}

/// A decision record: choice count (i32), instruction length (i32), instruction bytes, then per choice its
/// length (i32) and bytes.
pub fn decision_record(instructions: &str, choices: &[String]) -> Vec<u8> {
    let mut r = Vec::new();
    r.extend_from_slice(&(choices.len() as i32).to_le_bytes());
    r.extend_from_slice(&(instructions.len() as i32).to_le_bytes());
    r.extend_from_slice(instructions.as_bytes());
    for c in choices {
        r.extend_from_slice(&(c.len() as i32).to_le_bytes());
        r.extend_from_slice(c.as_bytes());
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_have_the_documented_layout() {
        assert_eq!(text_record("hi"), [0, 0, 0, 0, 0, 0, 0, 0, b'h', b'i']);
        assert_eq!(
            ids_record([7, 258]).unwrap(),
            [1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 2, 1, 0, 0]
        );
        assert_eq!(ids_record([1, -1]), Err(1));
        assert_eq!(ids_record([1 << 31]), Err(0));
        assert_eq!(
            decision_record("q", &["a".into(), "bc".into()]),
            [
                2, 0, 0, 0, 1, 0, 0, 0, b'q', 1, 0, 0, 0, b'a', 2, 0, 0, 0, b'b', b'c'
            ]
        );
    }
}
