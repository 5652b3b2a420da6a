//! The deployment's tokenizer behind the `input` module (`input.encode` / `input.decode`).
//!
//! Loaded from the asset cold `prepare` names (a `model.json` asset key or a package-relative path) with the
//! `tokenizers` crate (`tokenizer.json`). Two instances are kept: one that matches special tokens in the text
//! and one that encodes them as ordinary text (`NO_SPECIAL_TOKEN_MATCHING`), because that switch is a
//! property of a `tokenizers::Tokenizer`, not of one call. Every call is independent (no state carries over,
//! including leading-space handling).

use std::fmt;

/// `input.encode` flag: add the tokenizer's special tokens (e.g. `[CLS] ... [SEP]`).
pub const ADD_SPECIAL_TOKENS: i32 = 4;
/// `input.encode` flag: special-token text in the input is ordinary text.
pub const NO_SPECIAL_TOKEN_MATCHING: i32 = 8;
/// `input.decode` flag: drop special tokens from the text.
pub const SKIP_SPECIAL_TOKENS: i32 = 1;

/// A loaded tokenizer.
pub struct Tokenizer {
    matching: tokenizers::Tokenizer,
    literal: tokenizers::Tokenizer,
    /// The added (special) tokens' ids (`tokenizers` hands out a copy of its map on every call).
    added: std::collections::HashSet<u32>,
    /// Whether the decoder is byte-level (GPT-2's byte-to-character table).
    byte_level: bool,
    /// Where it came from, for messages.
    pub source: String,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tokenizer({})", self.source)
    }
}

impl Tokenizer {
    /// Parses `tokenizer.json` bytes.
    pub fn from_bytes(source: &str, bytes: &[u8]) -> Result<Tokenizer, String> {
        // The source owns truncation and padding (`input.encode`'s capacity, zero padding): a tokenizer.json's own
        // `truncation` / `padding` settings would silently cut or pad every input, so they are switched off.
        let load = || {
            let mut t = tokenizers::Tokenizer::from_bytes(bytes)
                .map_err(|e| format!("{source}: not a loadable tokenizer.json: {e}"))?;
            t.with_padding(None);
            t.with_truncation(None)
                .map_err(|e| format!("{source}: {e}"))?;
            Ok::<_, String>(t)
        };
        let matching = load()?;
        let mut literal = load()?;
        literal.set_encode_special_tokens(true);
        let added = matching.get_added_tokens_decoder().into_keys().collect();
        let byte_level = matches!(
            matching.get_decoder(),
            Some(tokenizers::DecoderWrapper::ByteLevel(_))
        );
        Ok(Tokenizer {
            matching,
            literal,
            added,
            byte_level,
            source: source.to_string(),
        })
    }

    /// Encodes `text` with `flags`; returns the ids.
    pub fn encode(&self, text: &str, flags: i32) -> Result<Vec<u32>, String> {
        if flags & !(ADD_SPECIAL_TOKENS | NO_SPECIAL_TOKEN_MATCHING) != 0 {
            return Err(format!(
                "input.encode: unknown flags {flags:#x} (ADD_SPECIAL_TOKENS = 4, NO_SPECIAL_TOKEN_MATCHING = 8)"
            ));
        }
        let t = if flags & NO_SPECIAL_TOKEN_MATCHING != 0 {
            &self.literal
        } else {
            &self.matching
        };
        t.encode(text, flags & ADD_SPECIAL_TOKENS != 0)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| format!("input.encode: {e}"))
    }

    /// Decodes `ids` with `flags`.
    pub fn decode(&self, ids: &[u32], flags: i32) -> Result<String, String> {
        if flags & !SKIP_SPECIAL_TOKENS != 0 {
            return Err(format!(
                "input.decode: unknown flags {flags:#x} (SKIP_SPECIAL_TOKENS = 1)"
            ));
        }
        let vocab = self.matching.get_vocab_size(true) as u32;
        if let Some(bad) = ids.iter().find(|&&i| i >= vocab) {
            return Err(format!(
                "input.decode: token id {bad} is outside the vocabulary of {vocab}"
            ));
        }
        self.matching
            .decode(ids, flags & SKIP_SPECIAL_TOKENS != 0)
            .map_err(|e| format!("input.decode: {e}"))
    }
}

impl Tokenizer {
    /// The vocabulary's size, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.matching.get_vocab_size(true)
    }

    /// The bytes token `id` stands for, for streaming text out token by token (a byte-level BPE token may
    /// hold part of a character, which `decode` of that token alone would turn into U+FFFD): an added
    /// (special) token's content; a byte-level token's bytes through GPT-2's byte-to-character table; else
    /// the token decoded alone. `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let tok = self.matching.id_to_token(id)?;
        if self.added.contains(&id) {
            return Some(tok.into_bytes());
        }
        if self.byte_level {
            let table = byte_level_table();
            let bytes: Option<Vec<u8>> = tok.chars().map(|c| table.get(&c).copied()).collect();
            if let Some(b) = bytes {
                return Some(b);
            }
        }
        self.matching
            .decode(&[id], false)
            .ok()
            .map(String::into_bytes)
    }
}

/// GPT-2's byte-level alphabet, inverted: the character each byte is written as in a byte-level BPE vocabulary
/// -> the byte. Printable Latin-1 bytes stand for themselves; the other 68 are mapped to U+0100 onwards.
fn byte_level_table() -> &'static std::collections::HashMap<char, u8> {
    static T: std::sync::OnceLock<std::collections::HashMap<char, u8>> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut m = std::collections::HashMap::new();
        let mut next = 256u32;
        for b in 0u32..256 {
            let printable = (0x21..=0x7e).contains(&b)
                || (0xa1..=0xac).contains(&b)
                || (0xae..=0xff).contains(&b);
            let c = if printable {
                b
            } else {
                next += 1;
                next - 1
            };
            m.insert(char::from_u32(c).expect("a valid code point"), b as u8);
        }
        m
    })
}

#[cfg(test)]
mod tests;
