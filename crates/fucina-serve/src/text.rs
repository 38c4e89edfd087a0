//! Turning a growing list of generated ids into text deltas: incomplete UTF-8
//! is held back until the bytes that complete it arrive, and so is any tail
//! of the text that could be the start of a stop string, so a stop string
//! split across tokens is found and never sent.

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
            // Hold back a replacement character at the end: the bytes that
            // complete it may still come.
            if full.ends_with('\u{FFFD}') {
                end -= '\u{FFFD}'.len_utf8();
            }
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
    fn incomplete_utf8_waits_for_its_bytes() {
        let mut s = TextStream::new(Vec::new());
        assert_eq!(s.advance("a\u{FFFD}", false), Advance::More("a".into()));
        assert_eq!(s.advance("aé", false), Advance::More("é".into()));
        // At the end it is sent as it is.
        assert_eq!(
            s.advance("aé\u{FFFD}", true),
            Advance::More("\u{FFFD}".into())
        );
    }

    #[test]
    fn multibyte_stop_strings_and_text() {
        assert_eq!(run(&["éé"], &["aé", "é", "b"]), ("a".into(), true));
        assert_eq!(run(&["→"], &["x", "y→z"]), ("xy".into(), true));
    }
}
