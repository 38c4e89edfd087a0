//! `tokenizer.json`: text to token ids and back, through the `tokenizers` crate
//! (Hugging Face's own Rust library, so the ids are the ones Python gets).
//!
//! The crate is built without C or C++ code: its pure-Rust regex engine
//! (`fancy-regex`) stands in for Oniguruma, and its trainer, progress bars and
//! downloads are left out.
//!
//! ```no_run
//! use fucina_llm::tokenizer::Tokenizer;
//!
//! let tok = Tokenizer::from_file("model/tokenizer.json")?;
//! let ids = tok.encode("Hello", true)?; // with the beginning-of-sequence token, if the file adds one
//! let text = tok.decode(&ids, true)?; // without the special tokens
//! # Ok::<(), fucina_llm::LlmError>(())
//! ```

use std::path::{Path, PathBuf};

use crate::LlmError;

/// A tokenizer read from a `tokenizer.json` file.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The special tokens, by id.
    special: Vec<(u32, String)>,
}

impl Tokenizer {
    /// Reads `path` (a `tokenizer.json` as Hugging Face writes it).
    ///
    /// # Errors
    /// [`LlmError::Io`] when the file cannot be read, [`LlmError::BadFile`]
    /// (naming the file) when it is not a tokenizer the `tokenizers` crate
    /// understands.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, LlmError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| LlmError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Tokenizer::from_bytes(&bytes, path)
    }

    /// Parses a `tokenizer.json` held in memory; `path` only names it in errors.
    ///
    /// # Errors
    /// [`LlmError::BadFile`] naming `path` when the bytes are not a tokenizer.
    pub fn from_bytes(bytes: &[u8], path: impl AsRef<Path>) -> Result<Tokenizer, LlmError> {
        let path = path.as_ref().to_path_buf();
        let inner = tokenizers::Tokenizer::from_bytes(bytes).map_err(|e| LlmError::BadFile {
            path: path.clone(),
            reason: format!("not a tokenizer.json the tokenizers crate reads: {e}"),
        })?;
        let mut special: Vec<(u32, String)> = inner
            .get_added_tokens_decoder()
            .into_iter()
            .filter(|(_, t)| t.special)
            .map(|(id, t)| (id, t.content))
            .collect();
        special.sort();
        Ok(Tokenizer {
            inner,
            path,
            special,
        })
    }

    /// The file the tokenizer was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The ids of `text`; with `add_special` the file's post-processor adds its
    /// special tokens (typically a beginning-of-sequence token), as
    /// `add_special_tokens=True` does in Python.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when the tokenizer fails on `text`.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, LlmError> {
        let enc = self
            .inner
            .encode(text, add_special)
            .map_err(|e| LlmError::InvalidRequest {
                op: "tokenizer encode",
                reason: format!("{}: {e}", self.path.display()),
            })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`; with `skip_special` the special tokens are left out.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] naming the first id the vocabulary does not
    /// have (the `tokenizers` crate would drop it silently), or when decoding
    /// fails (e.g. bytes that are not UTF-8 are replaced, not an error; a
    /// decoder error is).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, LlmError> {
        if let Some(&bad) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(LlmError::InvalidRequest {
                op: "tokenizer decode",
                reason: format!(
                    "token id {bad} is not in the vocabulary of {} ({} tokens)",
                    self.path.display(),
                    self.vocab_size()
                ),
            });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| LlmError::InvalidRequest {
                op: "tokenizer decode",
                reason: format!("{}: {e}", self.path.display()),
            })
    }

    /// The id of the token spelled `token` (a vocabulary entry or an added token).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The spelling of token `id`, as stored in the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The number of tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The special tokens `(id, spelling)`, sorted by id.
    pub fn special_tokens(&self) -> &[(u32, String)] {
        &self.special
    }

    /// Whether `id` is a special token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.binary_search_by_key(&id, |&(i, _)| i).is_ok()
    }
}
