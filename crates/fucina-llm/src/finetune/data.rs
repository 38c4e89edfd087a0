//! Training data: JSONL records tokenized into examples, and batches of them.
//!
//! One JSON object per line (blank lines are skipped):
//! - `{"prompt": "...", "completion": "..."}`: the prompt is encoded with the
//!   tokenizer's special tokens (a BOS where the tokenizer adds one), the
//!   completion without, and the end-of-sequence id follows; only the
//!   completion's tokens (and the end) are predicted by the loss;
//! - `{"text": "..."}`: the text encoded with special tokens, then the
//!   end-of-sequence id; every token after the first is predicted;
//! - `{"messages": [{"role": "...", "content": "..."}, ...]}`: a conversation
//!   whose last message is the assistant's, rendered by the tokenizer's chat
//!   template (the template writes the special tokens and the end of turn; no
//!   end-of-sequence id is added); the loss predicts the tokens of the last
//!   message (those past the rendering of the conversation before it with the
//!   generation prompt).
//!
//! An example is truncated to the job's sequence length. A malformed line
//! (not JSON, not an object, another shape, a value that is not a string) is
//! an error naming the file and the line.

use std::path::Path;

use serde_json::Value;

use super::error::FinetuneError;
use crate::tokenizer::Tokenizer;

/// One tokenized example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Example {
    /// The token ids.
    pub ids: Vec<u32>,
    /// The first `prompt_len` ids are not predicted (the loss covers the ids
    /// at positions `prompt_len.max(1)..`).
    pub prompt_len: usize,
}

impl Example {
    /// How many tokens the loss predicts.
    pub fn targets(&self) -> usize {
        self.ids.len().saturating_sub(self.prompt_len.max(1))
    }
}

/// The text of one record: a prompt (masked) and a completion, or a text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// `{"prompt", "completion"}`.
    PromptCompletion {
        /// The prompt (not predicted).
        prompt: String,
        /// The completion (predicted).
        completion: String,
    },
    /// `{"text"}`.
    Text(String),
    /// `{"messages"}`: a conversation ending with the assistant's message.
    Messages(Vec<crate::chat::ChatMessage>),
}

/// The record of one JSONL line, or why it is malformed.
pub fn parse_record(line: &str) -> Result<Record, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    let Value::Object(o) = v else {
        return Err(format!("expected a JSON object, found {v}"));
    };
    let string = |k: &str| -> Result<String, String> {
        match o.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(format!("`{k}` must be a string, found {other}")),
            None => Err(format!("`{k}` is missing")),
        }
    };
    let mut keys: Vec<&str> = o.keys().map(String::as_str).collect();
    keys.sort_unstable();
    match keys.as_slice() {
        ["completion", "prompt"] => Ok(Record::PromptCompletion {
            prompt: string("prompt")?,
            completion: string("completion")?,
        }),
        ["text"] => Ok(Record::Text(string("text")?)),
        ["messages"] => messages(&o["messages"]).map(Record::Messages),
        _ => Err(format!(
            "expected {{\"prompt\", \"completion\"}}, {{\"text\"}} or {{\"messages\"}}, found the keys {keys:?}"
        )),
    }
}

/// The messages of a `messages` value: a non-empty list of `{"role",
/// "content"}` objects of strings, the last one the assistant's.
fn messages(v: &Value) -> Result<Vec<crate::chat::ChatMessage>, String> {
    let Value::Array(list) = v else {
        return Err(format!("`messages` must be a list, found {v}"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, m) in list.iter().enumerate() {
        let field = |k: &str| match m.get(k) {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(format!(
                "`messages[{i}]` must be an object with string `role` and `content`, found {m}"
            )),
        };
        out.push(crate::chat::ChatMessage::new(
            field("role")?,
            field("content")?,
        ));
    }
    match out.last() {
        Some(last) if last.role == "assistant" => Ok(out),
        Some(last) => Err(format!(
            "the last message is the {}'s; it must be the assistant's (the one the loss predicts)",
            last.role
        )),
        None => Err("`messages` is empty".to_string()),
    }
}

/// Tokenizes `record`: see the [module documentation](self).
///
/// # Errors
/// The tokenizer's.
pub fn tokenize(
    tok: &Tokenizer,
    record: &Record,
    eos: Option<u32>,
    seq_len: usize,
) -> Result<Example, crate::LlmError> {
    let (mut ids, prompt_len) = match record {
        Record::PromptCompletion { prompt, completion } => {
            let mut ids = tok.encode(prompt, true)?;
            let p = ids.len();
            ids.extend(tok.encode(completion, false)?);
            (ids, p)
        }
        Record::Text(t) => (tok.encode(t, true)?, 0),
        Record::Messages(m) => {
            let (context, _) = m.split_at(m.len() - 1);
            let prompt = tok.encode(&tok.apply_chat_template(context, true)?, false)?;
            let mut ids = tok.encode(&tok.apply_chat_template(m, false)?, false)?;
            // The prompt's tokens as far as the whole rendering starts with
            // them (a template may tokenize differently at the seam).
            let p = prompt.iter().zip(&ids).take_while(|(a, b)| a == b).count();
            ids.truncate(seq_len);
            return Ok(Example { ids, prompt_len: p });
        }
    };
    ids.extend(eos);
    ids.truncate(seq_len);
    Ok(Example { ids, prompt_len })
}

/// The examples of the JSONL file `path`, tokenized by `tok` and truncated to
/// `seq_len` tokens, `eos` appended to each; examples left with nothing to
/// predict (a prompt as long as `seq_len`) are dropped.
///
/// # Errors
/// [`FinetuneError::Io`] when the file cannot be read;
/// [`FinetuneError::Data`] naming the line of a malformed record (or of a
/// text the tokenizer refuses).
pub fn read_jsonl(
    path: impl AsRef<Path>,
    tok: &Tokenizer,
    eos: Option<u32>,
    seq_len: usize,
) -> Result<Vec<Example>, FinetuneError> {
    let path = path.as_ref();
    let text = std::fs::read_to_string(path).map_err(|source| FinetuneError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let data_err = |reason: String| FinetuneError::Data {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let record = parse_record(line).map_err(data_err)?;
        let ex = tokenize(tok, &record, eos, seq_len).map_err(|e| data_err(e.to_string()))?;
        if ex.targets() > 0 {
            out.push(ex);
        }
    }
    Ok(out)
}

/// A batch: `b` rows of `t` ids (right-padded), and the rows of the loss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// `[b, t]` ids, row-major (padding after each row's examples).
    pub ids: Vec<u32>,
    /// Rows.
    pub b: usize,
    /// Tokens per row (the longest row).
    pub t: usize,
    /// The flat positions `row · t + i` whose logits predict a target.
    pub positions: Vec<i64>,
    /// The id each of `positions` predicts.
    pub labels: Vec<i64>,
    /// For rows packing several examples: each token's position in its
    /// example and its segment (`[b · t]` each); `None` when every row holds
    /// one example (its tokens at positions `0..`).
    pub packing: Option<Packing>,
}

/// The layout of a packed [`Batch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Packing {
    /// Each token's position within its own example (`[b · t]`).
    pub positions: Vec<u32>,
    /// Each token's example within its row (`[b · t]`; padding gets a
    /// segment of its own).
    pub segments: Vec<u32>,
}

impl Batch {
    /// The batch of `examples`, one per row (padded with `pad` after each, to
    /// the longest), or `None` for no example.
    pub fn new(examples: &[&Example], pad: u32) -> Option<Batch> {
        let rows: Vec<Vec<&Example>> = examples.iter().map(|e| vec![*e]).collect();
        Batch::from_rows(&rows, pad)
    }

    /// The batch of `rows`, each the concatenation of its examples (a packed
    /// row: every example attends only to itself, from position 0), padded
    /// with `pad` to the longest row; `None` for no row.
    pub fn from_rows(rows: &[Vec<&Example>], pad: u32) -> Option<Batch> {
        let len = |r: &Vec<&Example>| r.iter().map(|e| e.ids.len()).sum::<usize>();
        let t = rows.iter().map(len).max()?;
        let b = rows.len();
        let packed = rows.iter().any(|r| r.len() > 1);
        let mut ids = vec![pad; b * t];
        let (mut positions, mut labels) = (Vec::new(), Vec::new());
        let mut pos = vec![0u32; b * t];
        let mut seg = vec![0u32; b * t];
        for (r, row) in rows.iter().enumerate() {
            let mut start = r * t;
            for (k, e) in row.iter().enumerate() {
                ids[start..start + e.ids.len()].copy_from_slice(&e.ids);
                for i in 0..e.ids.len() {
                    pos[start + i] = i as u32;
                    seg[start + i] = k as u32;
                }
                for i in e.prompt_len.max(1)..e.ids.len() {
                    positions.push((start + i - 1) as i64);
                    labels.push(i64::from(e.ids[i]));
                }
                start += e.ids.len();
            }
            for (i, p) in (start..(r + 1) * t).enumerate() {
                pos[p] = i as u32;
                seg[p] = row.len() as u32;
            }
        }
        Some(Batch {
            ids,
            b,
            t,
            positions,
            labels,
            packing: packed.then_some(Packing {
                positions: pos,
                segments: seg,
            }),
        })
    }
}

/// Packs `examples` into rows of at most `len` tokens, in order: a row takes
/// the next example while it fits (an example longer than `len` gets a row of
/// its own). Returns the examples' indices per row.
pub fn pack(examples: &[Example], len: usize) -> Vec<Vec<usize>> {
    let mut rows: Vec<Vec<usize>> = Vec::new();
    let mut used = 0;
    for (i, e) in examples.iter().enumerate() {
        match rows.last_mut() {
            Some(row) if used + e.ids.len() <= len => {
                row.push(i);
                used += e.ids.len();
            }
            _ => {
                rows.push(vec![i]);
                used = e.ids.len();
            }
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_parse_and_malformed_ones_say_why() {
        assert_eq!(
            parse_record(r#"{"prompt": "a", "completion": "b"}"#),
            Ok(Record::PromptCompletion {
                prompt: "a".into(),
                completion: "b".into()
            })
        );
        assert_eq!(
            parse_record(r#"{"text": "x"}"#),
            Ok(Record::Text("x".into()))
        );
        let m = r#"{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}"#;
        assert_eq!(
            parse_record(m),
            Ok(Record::Messages(vec![
                crate::chat::ChatMessage::new("user", "hi"),
                crate::chat::ChatMessage::new("assistant", "yo")
            ]))
        );
        for (bad, why) in [
            ("{", "not valid JSON"),
            ("[1]", "expected a JSON object"),
            (r#"{"prompt": "a"}"#, "found the keys [\"prompt\"]"),
            (r#"{"text": 3}"#, "`text` must be a string"),
            (r#"{"text": "a", "extra": 1}"#, "found the keys"),
            (r#"{"messages": {}}"#, "must be a list"),
            (r#"{"messages": []}"#, "is empty"),
            (
                r#"{"messages": [{"role": "user"}]}"#,
                "`messages[0]` must be an object",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}]}"#,
                "the last message is the user's",
            ),
        ] {
            let e = parse_record(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn a_batch_pads_and_predicts_only_the_completion() {
        let a = Example {
            ids: vec![5, 6, 7, 8],
            prompt_len: 2,
        };
        let b = Example {
            ids: vec![1, 2],
            prompt_len: 0,
        };
        let batch = Batch::new(&[&a, &b], 0).unwrap();
        assert_eq!((batch.b, batch.t), (2, 4));
        assert_eq!(batch.ids, [5, 6, 7, 8, 1, 2, 0, 0]);
        // Row 0 predicts 7 (from position 1) and 8; row 1 predicts 2.
        assert_eq!(batch.positions, [1, 2, 4]);
        assert_eq!(batch.labels, [7, 8, 2]);
        assert_eq!((a.targets(), b.targets()), (2, 1));
        assert_eq!(batch.packing, None);
        // Packed: [a | b] in one row, b's tokens at positions 0, 1 of
        // segment 1, then two pads (segment 2).
        let c = Example {
            ids: vec![9, 9],
            prompt_len: 0,
        };
        let rows = [vec![&a, &b], vec![&c]];
        let packed = Batch::from_rows(&rows, 0).unwrap();
        assert_eq!((packed.b, packed.t), (2, 6));
        assert_eq!(packed.ids, [5, 6, 7, 8, 1, 2, 9, 9, 0, 0, 0, 0]);
        assert_eq!(packed.positions, [1, 2, 4, 6]);
        assert_eq!(packed.labels, [7, 8, 2, 9]);
        let p = packed.packing.unwrap();
        assert_eq!(p.positions, [0, 1, 2, 3, 0, 1, 0, 1, 0, 1, 2, 3]);
        assert_eq!(p.segments, [0, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 1]);
        let ex = [a.clone(), b.clone(), c.clone(), a.clone()];
        assert_eq!(pack(&ex, 8), [vec![0, 1, 2], vec![3]]);
        assert_eq!(pack(&ex, 3), [vec![0], vec![1], vec![2], vec![3]]);
    }
}
