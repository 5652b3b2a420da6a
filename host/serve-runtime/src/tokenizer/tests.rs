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
