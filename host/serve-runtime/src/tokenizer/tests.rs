//! Against ids worked out by hand from the fixture's 20-word WordPiece vocabulary (BERT normaliser and
//! pre-tokeniser, `[CLS] $A [SEP]` template).

use super::*;

fn tok() -> Tokenizer {
    let bytes = include_bytes!("../../tests/fixtures/wordpiece-tokenizer.json");
    Tokenizer::from_bytes("wordpiece-tokenizer.json", bytes).unwrap()
}

#[test]
fn encode_with_and_without_special_tokens() {
    let t = tok();
    // hello=5 world=6 ,=14 !=13 cat=8 ##s=12 [UNK]=1
    assert_eq!(t.encode("Hello, world!", 0).unwrap(), vec![5, 14, 6, 13]);
    assert_eq!(
        t.encode("Hello, world!", ADD_SPECIAL_TOKENS).unwrap(),
        vec![2, 5, 14, 6, 13, 3]
    );
    assert_eq!(t.encode("cats zebra", 0).unwrap(), vec![8, 12, 1]);
}

#[test]
fn special_token_text_is_matched_unless_asked_not_to() {
    let t = tok();
    assert_eq!(t.encode("the [MASK] sat", 0).unwrap(), vec![7, 4, 9]);
    let literal = t
        .encode("the [MASK] sat", NO_SPECIAL_TOKEN_MATCHING)
        .unwrap();
    assert!(!literal.contains(&4), "{literal:?}");
    assert_eq!(literal[0], 7);
    assert_eq!(*literal.last().unwrap(), 9);
}

#[test]
fn decode_and_bad_ids() {
    let t = tok();
    assert_eq!(
        t.decode(&[2, 5, 6, 3], SKIP_SPECIAL_TOKENS).unwrap(),
        "hello world"
    );
    assert_eq!(t.decode(&[2, 5, 3], 0).unwrap(), "[CLS] hello [SEP]");
    assert_eq!(t.decode(&[17, 18, 19], 0).unwrap(), "loom server");
    assert!(
        t.decode(&[20], 0)
            .unwrap_err()
            .contains("outside the vocabulary")
    );
    assert!(t.encode("x", 1).unwrap_err().contains("unknown flags"));
}

#[test]
fn the_files_own_truncation_and_padding_are_ignored() {
    let mut v: serde_json::Value = serde_json::from_slice(include_bytes!(
        "../../tests/fixtures/wordpiece-tokenizer.json"
    ))
    .unwrap();
    v["truncation"] = serde_json::json!({"direction": "Right", "max_length": 3, "strategy": "LongestFirst", "stride": 0});
    v["padding"] = serde_json::json!({"strategy": {"Fixed": 8}, "direction": "Right", "pad_to_multiple_of": null,
        "pad_id": 0, "pad_type_id": 0, "pad_token": "[PAD]"});
    let t = Tokenizer::from_bytes("t.json", v.to_string().as_bytes()).unwrap();
    assert_eq!(
        t.encode("hello world the cat", 0).unwrap(),
        vec![5, 6, 7, 8]
    );
}

/// A byte-level BPE vocabulary whose tokens split a character: `Ã` and `©` are the two bytes of "é" (0xC3 0xA9)
/// in GPT-2's byte alphabet, `Ġ` is a space.
const BYTE_LEVEL: &str = r#"{
  "version": "1.0", "truncation": null, "padding": null,
  "added_tokens": [{"id": 6, "content": "<|end|>", "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
  "post_processor": null,
  "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
  "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": {"h": 0, "i": 1, "Ġ": 2, "Ã": 3, "©": 4, "Ã©": 5},
            "merges": ["Ã ©"]}
}"#;

#[test]
fn token_bytes_are_the_bytes_each_token_stands_for() {
    let t = Tokenizer::from_bytes("bl.json", BYTE_LEVEL.as_bytes()).unwrap();
    assert_eq!(t.encode("hi é", 0).unwrap(), vec![0, 1, 2, 5]);
    assert_eq!(t.token_bytes(2).unwrap(), b" ");
    assert_eq!(t.token_bytes(5).unwrap(), "é".as_bytes());
    // Half a character: the byte itself (decode would give U+FFFD).
    assert_eq!(t.token_bytes(3).unwrap(), vec![0xC3]);
    assert_eq!(t.token_bytes(4).unwrap(), vec![0xA9]);
    assert_eq!(t.token_bytes(6).unwrap(), b"<|end|>");
    assert_eq!(t.token_bytes(7), None);
    assert_eq!(t.vocab_size(), 7);
}
