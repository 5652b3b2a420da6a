//! Turning generated tokens into the text a client sees, incrementally: [`Utf8Stream`] joins token bytes into
//! whole characters (a byte-level BPE token may end inside a character), and [`StopMatcher`] finds stop
//! strings across token boundaries, holding back only the text that could still begin one. Streamed and
//! non-streamed responses are built from the same two, so they are equal by construction.

/// Joins byte chunks into UTF-8 text, holding back an incomplete trailing character until its bytes arrive.
/// Bytes that can never form a character become U+FFFD (as `String::from_utf8_lossy` would).
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// The text completed by `bytes`.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // SAFETY-free: the prefix is valid UTF-8 by `valid_up_to`.
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                        None => {
                            // An incomplete character at the end: wait for more bytes.
                            self.pending.drain(..good);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Whatever is held back, at the end of the sequence (an incomplete character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// What [`StopMatcher::push`] decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// Text that is final and may be sent.
    pub text: String,
    /// The index of the stop string that ended the sequence: the first to complete (the text before it is in
    /// `text`; the stop string itself and everything after are dropped, as OpenAI does).
    pub stopped: Option<usize>,
}

/// Finds the first occurrence of any stop string in generated text that arrives in pieces.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

impl StopMatcher {
    /// Empty stop strings are ignored.
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds `text`; returns what can be released and whether a stop string was found. After a stop, the
    /// matcher should not be fed again.
    pub fn push(&mut self, text: &str) -> Step {
        self.held.push_str(text);
        if self.stops.is_empty() {
            return Step {
                text: std::mem::take(&mut self.held),
                stopped: None,
            };
        }
        // The match that completes first (the smallest end), as if the text had arrived one character at a
        // time, so that the result does not depend on how it was split into pieces; at one end the longest
        // (earliest start), then the stop listed first.
        let mut hit: Option<(usize, usize, usize)> = None;
        for (i, s) in self.stops.iter().enumerate() {
            if let Some(at) = self.held.find(s.as_str()) {
                let key = (at + s.len(), at, i);
                if hit.is_none_or(|h| key < h) {
                    hit = Some(key);
                }
            }
        }
        if let Some((_, at, i)) = hit {
            let text = self.held[..at].to_string();
            self.held.clear();
            return Step {
                text,
                stopped: Some(i),
            };
        }
        // Hold back the longest suffix that is a proper prefix of some stop string: any later match must start
        // there, since no match starts earlier (none was found, and released text never could).
        let mut keep_from = self.held.len();
        for (at, _) in self.held.char_indices() {
            let tail = &self.held[at..];
            if self.stops.iter().any(|s| s.starts_with(tail)) {
                keep_from = at;
                break;
            }
        }
        let text = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        Step {
            text,
            stopped: None,
        }
    }

    /// The held-back text, at the end of the sequence (no stop string completed).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces`, returns the released text and the stop index.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, Option<usize>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for p in pieces {
            let s = m.push(p);
            out.push_str(&s.text);
            if s.stopped.is_some() {
                return (out, s.stopped);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn stops_across_piece_boundaries() {
        assert_eq!(
            run(&["\nUser:"], &["Hello", " there\n", "Us", "er: hi"]),
            ("Hello there".to_string(), Some(0))
        );
        assert_eq!(
            run(&["abc"], &["xxab", "xab", "cyy"]),
            ("xxabx".to_string(), Some(0))
        );
        // A partial match that fails is released in full.
        assert_eq!(
            run(&["abc"], &["ab", "d", "ab"]),
            ("abdab".to_string(), None)
        );
        // The stop that completes first wins, however the text was split.
        assert_eq!(
            run(&["world", "lo w"], &["hello world"]),
            ("hel".to_string(), Some(1))
        );
        for pieces in [&["abcd"][..], &["ab", "cd"], &["a", "b", "c", "d"]] {
            assert_eq!(run(&["abcd", "c"], pieces), ("ab".to_string(), Some(1)));
        }
        // Multi-byte characters in stops and text.
        assert_eq!(
            run(&["é!"], &["caf", "é", "!", "x"]),
            ("caf".to_string(), Some(0))
        );
        assert_eq!(run(&[], &["a", "b"]), ("ab".to_string(), None));
    }

    /// Against the definition: for random texts split at random points, the released text is the text up to
    /// the stop that completes first (or all of it), whatever the split.
    #[test]
    fn matches_the_definition_on_random_splits() {
        let mut x = 0x2545_F491_4F6C_DD1Du64;
        let mut rnd = |n: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % n
        };
        let alpha = ['a', 'b', 'c', 'é', '\n'];
        for _ in 0..2000 {
            let text: String = (0..rnd(30)).map(|_| alpha[rnd(5) as usize]).collect();
            let stops: Vec<String> = (0..1 + rnd(3))
                .map(|_| (0..1 + rnd(3)).map(|_| alpha[rnd(5) as usize]).collect())
                .collect();
            // The definition: the first prefix of the text (by characters) that contains a stop; in it, the
            // earliest occurrence, then the stop listed first.
            let mut want = (text.clone(), None);
            for (end, c) in text.char_indices() {
                let prefix = &text[..end + c.len_utf8()];
                let found = stops
                    .iter()
                    .enumerate()
                    .filter_map(|(i, s)| prefix.find(s.as_str()).map(|at| (at, i)))
                    .min();
                if let Some((at, i)) = found {
                    want = (text[..at].to_string(), Some(i));
                    break;
                }
            }
            let chars: Vec<char> = text.chars().collect();
            let mut pieces = Vec::new();
            let mut i = 0;
            while i < chars.len() {
                let n = 1 + rnd(4) as usize;
                pieces.push(
                    chars[i..(i + n).min(chars.len())]
                        .iter()
                        .collect::<String>(),
                );
                i += n;
            }
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            let srefs: Vec<&str> = stops.iter().map(String::as_str).collect();
            let got = run(&srefs, &refs);
            assert_eq!(got, want, "text {text:?} stops {stops:?} pieces {pieces:?}");
        }
    }

    #[test]
    fn utf8_stream_joins_split_characters() {
        let text = "aé中😀b";
        let bytes = text.as_bytes();
        for split in 0..=bytes.len() {
            let mut s = Utf8Stream::default();
            let mut out = s.push(&bytes[..split]);
            out.push_str(&s.push(&bytes[split..]));
            out.push_str(&s.finish());
            assert_eq!(out, text, "split at {split}");
        }
        // One byte at a time releases each character once complete.
        let mut s = Utf8Stream::default();
        let pieces: Vec<String> = bytes.iter().map(|b| s.push(&[*b])).collect();
        assert_eq!(pieces.concat(), text);
        assert_eq!(pieces[2], "é");
        // Invalid bytes become U+FFFD; an incomplete tail at the end too.
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(b"a\xffb"), "a\u{FFFD}b");
        assert_eq!(s.push(b"\xe4\xb8"), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }
}
