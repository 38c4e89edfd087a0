//! Turning a growing list of generated ids into text deltas: the ids are
//! decoded incrementally ([`Detokenizer`]: a few tokens per step, not the
//! whole sequence), incomplete UTF-8 is held back until the bytes that
//! complete it arrive, and so is any tail of the text that could be the start
//! of a stop string, so a stop string split across tokens is found and never
//! sent ([`TextStream`]).

use fucina_llm::{LlmError, Tokenizer};

/// The text of a sequence's generated ids, decoded a few tokens at a time.
///
/// Text that ends in U+FFFD waits for up to 4 ids (the bytes that may
/// complete its last character), then goes out as it decodes.
///
/// Decoding the ids from a token in the middle can differ from the whole
/// sequence's text at its start (a tokenizer may drop the leading space of the
/// first token it decodes), so each step decodes the ids from `prefix` twice,
/// without and with the ids not yet turned into text, and appends the
/// difference; `prefix` moves up once the new text is whole characters.
#[derive(Debug, Default)]
pub(crate) struct Detokenizer {
    ids: Vec<u32>,
    /// The first id of the window decoded each step.
    prefix: usize,
    /// The first id whose text is not in `text` yet.
    read: usize,
    text: String,
}

impl Detokenizer {
    /// Appends `id` and returns the text decoded so far (special tokens left
    /// out). Text that ends in an incomplete UTF-8 character waits for the
    /// next ids, unless `last`.
    pub(crate) fn push(
        &mut self,
        tokenizer: &Tokenizer,
        id: Option<u32>,
        last: bool,
    ) -> Result<&str, LlmError> {
        self.ids.extend(id);
        if self.read < self.ids.len() {
            let before = tokenizer.decode(&self.ids[self.prefix..self.read], true)?;
            let after = tokenizer.decode(&self.ids[self.prefix..], true)?;
            // A character is at most 4 bytes: after 4 unsettled ids a
            // trailing U+FFFD is invalid bytes, not a character in progress.
            let whole = !after.ends_with('\u{FFFD}') || self.ids.len() - self.read >= 4;
            if after.len() > before.len() && after.is_char_boundary(before.len()) && (whole || last)
            {
                self.text.push_str(&after[before.len()..]);
                self.prefix = self.read;
                self.read = self.ids.len();
            } else if last && after.len() > before.len() {
                // A decoder that rewrote the window's start: keep what it
                // says now.
                self.text
                    .push_str(&String::from_utf8_lossy(&after.as_bytes()[before.len()..]));
            }
        }
        Ok(&self.text)
    }
}

/// The text state of one sequence: how much of its decoded text was sent, and
/// the stop strings it watches for.
#[derive(Debug)]
pub(crate) struct TextStream {
    stops: Vec<String>,
    /// Bytes of the decoded text already sent.
    sent: usize,
}

/// What [`TextStream::advance`] found in the text decoded so far.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Advance {
    /// Text that can be sent now (possibly empty).
    More(String),
    /// A stop string was found: the text before it that was not sent yet; the
    /// sequence ends.
    Stopped(String),
}

impl TextStream {
    pub(crate) fn new(stops: Vec<String>) -> TextStream {
        TextStream { stops, sent: 0 }
    }

    /// The next delta of `full`, the whole text decoded so far (each call's
    /// `full` extends the previous one). With `last` (the sequence ends for
    /// another reason), everything not sent is released, incomplete UTF-8 and
    /// stop-string prefixes included.
    pub(crate) fn advance(&mut self, full: &str, last: bool) -> Advance {
        if !full.is_char_boundary(self.sent.min(full.len())) || full.len() < self.sent {
            // The decoded text changed under what was sent (a decoder that
            // rewrites earlier characters): send nothing until it settles.
            return Advance::More(String::new());
        }
        // A stop string may start in the part already sent (its first bytes
        // were held back, never sent) only within the hold-back window; search
        // from the earliest place a stop string that ends in the new part can
        // start.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(longest);
        while !full.is_char_boundary(from) {
            from -= 1;
        }
        let found = self
            .stops
            .iter()
            .filter_map(|s| full[from..].find(s.as_str()).map(|p| from + p))
            .min();
        if let Some(at) = found {
            let at = at.max(self.sent);
            let out = full[self.sent..at].to_string();
            self.sent = at;
            return Advance::Stopped(out);
        }
        let mut end = full.len();
        if !last {
            // Hold back the longest tail that begins a stop string.
            let tail = self
                .stops
                .iter()
                .map(|s| longest_prefix_suffix(&full[..end], s))
                .max()
                .unwrap_or(0);
            end -= tail;
        }
        if end <= self.sent {
            return Advance::More(String::new());
        }
        let out = full[self.sent..end].to_string();
        self.sent = end;
        Advance::More(out)
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of
/// `stop` (ending on a character boundary of both).
fn longest_prefix_suffix(text: &str, stop: &str) -> usize {
    let max = stop.len().saturating_sub(1).min(text.len());
    (1..=max)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n)
                && stop.is_char_boundary(n)
                && text.ends_with(&stop[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `pieces` one at a time (each call sees their concatenation) and
    /// returns what was sent and whether a stop string ended it.
    fn run(stops: &[&str], pieces: &[&str]) -> (String, bool) {
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect());
        let (mut full, mut out) = (String::new(), String::new());
        for (i, p) in pieces.iter().enumerate() {
            full.push_str(p);
            match s.advance(&full, i + 1 == pieces.len()) {
                Advance::More(t) => out.push_str(&t),
                Advance::Stopped(t) => {
                    out.push_str(&t);
                    return (out, true);
                }
            }
        }
        (out, false)
    }

    #[test]
    fn text_passes_through_without_stops() {
        assert_eq!(
            run(&[], &["Hel", "lo", " world"]),
            ("Hello world".into(), false)
        );
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_found_and_not_sent() {
        assert_eq!(
            run(&["\n\n"], &["one", "\n", "\n", "two"]),
            ("one".into(), true)
        );
        assert_eq!(run(&["END"], &["abcE", "N", "Dxyz"]), ("abc".into(), true));
        // A stop string inside one token.
        assert_eq!(run(&["stop"], &["go", "xstopy"]), ("gox".into(), true));
        // The earliest of several stop strings wins.
        assert_eq!(run(&["b", "a"], &["xyab"]), ("xy".into(), true));
    }

    #[test]
    fn a_held_prefix_is_released_when_the_text_goes_elsewhere() {
        let mut s = TextStream::new(vec!["END".into()]);
        assert_eq!(s.advance("abE", false), Advance::More("ab".into()));
        assert_eq!(s.advance("abEN", false), Advance::More(String::new()));
        assert_eq!(s.advance("abENx", false), Advance::More("ENx".into()));
        // At the end, a held tail is released.
        assert_eq!(s.advance("abENxE", true), Advance::More("E".into()));
    }

    #[test]
    fn the_detokenizer_waits_for_whole_characters_and_keeps_leading_spaces() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../fucina-llm/tests/fixtures/llama_f32/tokenizer.json");
        let tok = Tokenizer::from_file(path).unwrap();
        let id = |s: &str| tok.token_to_id(s).unwrap();
        // "a", " b", then "é" as its two byte tokens (0xC3 0xA9), then " b".
        let ids = [id("a"), id("Ġb"), id("Ã"), id("©"), id("Ġb")];
        let mut d = Detokenizer::default();
        let mut seen = Vec::new();
        for (i, &t) in ids.iter().enumerate() {
            seen.push(
                d.push(&tok, Some(t), i + 1 == ids.len())
                    .unwrap()
                    .to_string(),
            );
        }
        assert_eq!(seen, ["a", "a b", "a b", "a bé", "a bé b"]);
        assert_eq!(seen[4], tok.decode(&ids, true).unwrap());
        // At the end, an incomplete character is released as it decodes.
        let mut d = Detokenizer::default();
        d.push(&tok, Some(id("a")), false).unwrap();
        assert_eq!(
            d.push(&tok, Some(id("Ã")), true).unwrap(),
            tok.decode(&[id("a"), id("Ã")], true).unwrap()
        );
        // No id (a stop token) with `last` flushes nothing new.
        assert_eq!(
            d.push(&tok, None, true).unwrap(),
            tok.decode(&[id("a"), id("Ã")], true).unwrap()
        );
        // Bytes that never become a character wait for 4 ids, then go out.
        let mut d = Detokenizer::default();
        let lone = id("©"); // a continuation byte alone
        let seen: Vec<String> = (0..5)
            .map(|_| d.push(&tok, Some(lone), false).unwrap().to_string())
            .collect();
        assert_eq!(&seen[..3], ["", "", ""]);
        assert_eq!(seen[3], tok.decode(&[lone; 4], true).unwrap());
    }

    #[test]
    fn multibyte_stop_strings_and_text() {
        assert_eq!(run(&["éé"], &["aé", "é", "b"]), ("a".into(), true));
        assert_eq!(run(&["→"], &["x", "y→z"]), ("xy".into(), true));
    }
}
