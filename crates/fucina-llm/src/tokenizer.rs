//! `tokenizer.json`, or the tokenizer a GGUF file stores: text to token ids and
//! back, through the `tokenizers` crate (Hugging Face's own Rust library, so the
//! ids are the ones Python gets).
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
//!
//! A tokenizer also carries the model's chat templates, when its files give
//! them: `tokenizer_config.json` (or `chat_template.jinja`) beside a
//! `tokenizer.json`, or a GGUF file's `tokenizer.chat_template`. See
//! [`crate::chat`] and [`Tokenizer::apply_chat_template`].

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::LlmError;
use crate::chat::{ChatMessage, ChatOptions, ChatTemplate};
use crate::gguf::{GgufFile, GgufValue};

/// The file beside `tokenizer.json` with the chat template and the special
/// tokens' spellings.
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
/// The file beside `tokenizer.json` that newer model directories keep the
/// chat template in (it takes precedence over `tokenizer_config.json`'s, as in
/// `transformers`).
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// A tokenizer read from a `tokenizer.json` file or a GGUF file's metadata.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    /// The special tokens, by id.
    special: Vec<(u32, String)>,
    /// The chat templates, by name (`default` for a lone one).
    chat_templates: Vec<(String, ChatTemplate)>,
}

impl Tokenizer {
    /// Reads `path` (a `tokenizer.json` as Hugging Face writes it), and the
    /// chat templates of the `tokenizer_config.json` and `chat_template.jinja`
    /// beside it when they exist ([`Tokenizer::read_tokenizer_config`]).
    ///
    /// # Errors
    /// [`LlmError::Io`] when a file cannot be read, [`LlmError::BadFile`]
    /// (naming the file) when it is not a tokenizer the `tokenizers` crate
    /// understands, or a `tokenizer_config.json` that
    /// [`Tokenizer::read_tokenizer_config`] refuses.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer, LlmError> {
        let path = path.as_ref();
        let bytes = crate::files::read_regular(path)?;
        let mut tok = Tokenizer::from_bytes(&bytes, path)?;
        if let Some(dir) = path.parent() {
            let config = dir.join(TOKENIZER_CONFIG_FILE);
            if config.is_file() {
                tok.read_tokenizer_config(&config)?;
            }
            let jinja = dir.join(CHAT_TEMPLATE_FILE);
            if jinja.is_file() {
                let source = crate::files::read_regular_text(&jinja)?;
                let (bos, eos) = tok.default_special_spellings();
                let t = ChatTemplate::new(jinja.display().to_string(), source)
                    .map_err(|e| bad_template(&jinja, e))?
                    .with_special_tokens(bos, eos);
                tok.set_chat_template("default", t);
            }
        }
        Ok(tok)
    }

    /// Reads the chat templates and the `bos_token` and `eos_token` spellings
    /// of a `tokenizer_config.json`: `chat_template` is a template, or a list
    /// of `{"name": ..., "template": ...}` (a lone template is named
    /// `default`); `bos_token` and `eos_token` are strings or
    /// `{"content": ...}` objects. Templates already set with the same name are
    /// replaced.
    ///
    /// # Errors
    /// [`LlmError::Io`] when the file cannot be read; [`LlmError::BadFile`]
    /// naming the file and the key for bad JSON, a value of the wrong type, or
    /// a template that does not parse (with the template's name and
    /// minijinja's message).
    pub fn read_tokenizer_config(&mut self, path: impl AsRef<Path>) -> Result<(), LlmError> {
        let path = path.as_ref();
        let text = crate::files::read_regular_text(path)?;
        let bad = |reason: String| LlmError::BadFile {
            path: path.to_path_buf(),
            reason,
        };
        let value: Value =
            serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let Value::Object(map) = &value else {
            return Err(bad("the file is not a JSON object".into()));
        };
        let spelling = |key: &str| -> Result<Option<String>, LlmError> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(bad(format!(
                        "{key}: an object without a string \"content\""
                    ))),
                },
                Some(_) => Err(bad(format!("{key}: neither a string nor an object"))),
            }
        };
        let (bos, eos) = (spelling("bos_token")?, spelling("eos_token")?);
        let mut templates: Vec<(String, String)> = Vec::new();
        match map.get("chat_template") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => templates.push(("default".into(), s.clone())),
            Some(Value::Array(list)) => {
                for (i, item) in list.iter().enumerate() {
                    match (item.get("name"), item.get("template")) {
                        (Some(Value::String(n)), Some(Value::String(t))) => {
                            templates.push((n.clone(), t.clone()))
                        }
                        _ => {
                            return Err(bad(format!(
                                "chat_template[{i}]: not an object with string \"name\" and \"template\""
                            )));
                        }
                    }
                }
            }
            Some(_) => return Err(bad("chat_template: neither a string nor a list".into())),
        }
        for (name, source) in templates {
            let label = format!("{} chat_template {name:?}", path.display());
            let t = ChatTemplate::new(label, source)
                .map_err(|e| bad_template(path, e))?
                .with_special_tokens(bos.clone(), eos.clone());
            self.set_chat_template(&name, t);
        }
        Ok(())
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
            chat_templates: Vec::new(),
        })
    }

    /// The tokenizer a GGUF file stores in its `tokenizer.ggml.*` metadata, as
    /// llama.cpp's converter writes it, rebuilt as the `tokenizers` model
    /// Hugging Face's own conversion of the same vocabulary gives (see the
    /// "Tokenizer" section of docs/LLM.md for the details):
    ///
    /// - `tokenizer.ggml.model = "gpt2"`: byte-level BPE over
    ///   `tokenizer.ggml.tokens` (spelled in the byte-level alphabet) and
    ///   `tokenizer.ggml.merges` (`"left right"` strings, highest priority
    ///   first), with the pre-tokenizer `tokenizer.ggml.pre` names: `gpt-2`
    ///   (also when the key is absent or `default`, where llama.cpp uses an
    ///   approximate split of its own), `llama-bpe` (Llama 3: its split regex,
    ///   a bos token by default, whole-word tokens before merges), `qwen2` and
    ///   `smollm` (GPT-2's split after splitting off every digit);
    /// - `tokenizer.ggml.model = "llama"`: SentencePiece-style BPE, whose merges
    ///   follow `tokenizer.ggml.scores` (a pair whose merged piece scores higher
    ///   merges first), `▁` for spaces with a space put before the text unless
    ///   `tokenizer.ggml.add_space_prefix` is false, and bytes the vocabulary
    ///   lacks spelled by its `<0xXX>` tokens;
    /// - `tokenizer.ggml.token_type`: control tokens (3) become special added
    ///   tokens, user-defined ones (4) plain added tokens, the unknown token (2)
    ///   the model's; `tokenizer.ggml.{bos,eos,unknown,padding}_token_id` and
    ///   `tokenizer.ggml.add_{bos,eos}_token` decide what `encode(_, true)` adds
    ///   (a bos token by default for `llama` and `llama-bpe`, nothing by default
    ///   for the other `gpt2` vocabularies); a `llama` vocabulary without those
    ///   ids gets llama.cpp's defaults (bos 1, eos 2, unknown 0).
    ///
    /// # Errors
    /// [`LlmError::BadFile`] naming the file and the key: a missing or unknown
    /// `tokenizer.ggml.model` or `tokenizer.ggml.pre`, an array of the wrong
    /// element type or length, a merge that is not two vocabulary tokens, a
    /// token id past the vocabulary.
    ///
    /// The chat templates are `tokenizer.chat_template` (named `default`) and
    /// `tokenizer.chat_template.NAME` for each name `tokenizer.chat_templates`
    /// lists, as llama.cpp's converter writes them; their `bos_token` and
    /// `eos_token` are the spellings of the bos and eos ids.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, LlmError> {
        let json = gguf_tokenizer_json(file)?;
        let bytes = serde_json::to_vec(&json).map_err(|e| LlmError::BadFile {
            path: file.path().to_path_buf(),
            reason: format!("tokenizer.ggml.*: {e}"),
        })?;
        let mut tok = Tokenizer::from_bytes(&bytes, file.path())?;
        tok.read_gguf_chat_templates(file)?;
        Ok(tok)
    }

    /// The chat templates of a GGUF file's metadata (see [`Tokenizer::from_gguf`]).
    fn read_gguf_chat_templates(&mut self, file: &GgufFile) -> Result<(), LlmError> {
        let bad = |key: &str, reason: String| LlmError::BadFile {
            path: file.path().to_path_buf(),
            reason: format!("metadata {key}: {reason}"),
        };
        let string = |key: &str| -> Result<Option<&str>, LlmError> {
            match file.get(key) {
                None => Ok(None),
                Some(v) => v
                    .as_str()
                    .map(Some)
                    .ok_or_else(|| bad(key, format!("{} where a string was expected", kind(v)))),
            }
        };
        let spelled = |key: &str| -> Option<String> {
            let id = file.get(key)?.as_u64()?;
            self.id_to_token(u32::try_from(id).ok()?)
        };
        let (bos, eos) = (
            spelled("tokenizer.ggml.bos_token_id"),
            spelled("tokenizer.ggml.eos_token_id"),
        );
        let mut keys = vec![("default".to_string(), "tokenizer.chat_template".to_string())];
        if let Some(v) = file.get("tokenizer.chat_templates") {
            let list = v.as_array().ok_or_else(|| {
                bad(
                    "tokenizer.chat_templates",
                    format!("{} where an array was expected", kind(v)),
                )
            })?;
            for item in list {
                let name = item.as_str().ok_or_else(|| {
                    bad(
                        "tokenizer.chat_templates",
                        "an element is not a string".into(),
                    )
                })?;
                keys.push((name.to_string(), format!("tokenizer.chat_template.{name}")));
            }
        }
        for (name, key) in keys {
            if let Some(source) = string(&key)? {
                let label = format!("{} {key}", file.path().display());
                let t = ChatTemplate::new(label, source)
                    .map_err(|e| bad_template(file.path(), e))?
                    .with_special_tokens(bos.clone(), eos.clone());
                self.set_chat_template(&name, t);
            }
        }
        Ok(())
    }

    /// Sets the chat template called `name` (`default` is the one
    /// [`Tokenizer::apply_chat_template`] uses), replacing one of that name.
    pub fn set_chat_template(&mut self, name: &str, template: ChatTemplate) {
        match self.chat_templates.iter_mut().find(|(n, _)| n == name) {
            Some(slot) => slot.1 = template,
            None => self.chat_templates.push((name.to_string(), template)),
        }
    }

    /// The default chat template: the one called `default` (a lone
    /// `chat_template` string is), `None` when the files gave none.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template_named("default")
    }

    /// The chat template called `name` (such as `tool_use`).
    pub fn chat_template_named(&self, name: &str) -> Option<&ChatTemplate> {
        self.chat_templates
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, t)| t)
    }

    /// The names of the chat templates, in the order the files give them.
    pub fn chat_template_names(&self) -> impl Iterator<Item = &str> {
        self.chat_templates.iter().map(|(n, _)| n.as_str())
    }

    /// `messages` rendered by the default chat template
    /// ([`ChatTemplate::apply`]): the prompt text, which
    /// `encode(text, false)` turns into ids (the template writes the
    /// beginning-of-sequence token itself where the model wants one, as
    /// `transformers`' `apply_chat_template(tokenize=True)` does).
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] when the tokenizer has no chat template, or
    /// the template fails (naming it and its message).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, LlmError> {
        let t = self.chat_template().ok_or_else(|| self.no_template())?;
        t.apply(messages, add_generation_prompt)
    }

    /// [`Tokenizer::apply_chat_template`] with tools and extra variables
    /// ([`ChatTemplate::apply_with`]), choosing the template as `transformers`
    /// does: the one named `tool_use` when tools are given and there is one,
    /// else the default.
    ///
    /// # Errors
    /// As [`Tokenizer::apply_chat_template`] and [`ChatTemplate::apply_with`].
    pub fn apply_chat_template_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String, LlmError> {
        let tool_use = options
            .tools_json
            .as_ref()
            .and_then(|_| self.chat_template_named("tool_use"));
        match tool_use {
            Some(t) => t.apply_with(messages, add_generation_prompt, options),
            None => self
                .chat_template()
                .ok_or_else(|| self.no_template())?
                .apply_with(messages, add_generation_prompt, options),
        }
    }

    fn no_template(&self) -> LlmError {
        LlmError::InvalidRequest {
            op: "chat template",
            reason: format!(
                "{} has no chat template (no tokenizer_config.json chat_template, chat_template.jinja or GGUF tokenizer.chat_template)",
                self.path.display()
            ),
        }
    }

    /// The ids of the default chat template's end-of-turn markers
    /// ([`ChatTemplate::end_of_turn_markers`]) that the vocabulary has, sorted;
    /// empty without a template.
    pub fn end_of_turn_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self
            .chat_template()
            .map(|t| t.end_of_turn_markers())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| self.token_to_id(m))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// The spellings the templates of `tokenizer_config.json` got, for a
    /// template read from elsewhere in the same directory.
    fn default_special_spellings(&self) -> (Option<String>, Option<String>) {
        match self.chat_templates.first() {
            Some((_, t)) => (
                t.bos_token().map(str::to_string),
                t.eos_token().map(str::to_string),
            ),
            None => (None, None),
        }
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

/// A template that does not parse, as an error of the file it came from.
fn bad_template(path: &Path, e: LlmError) -> LlmError {
    match e {
        LlmError::InvalidRequest { reason, .. } => LlmError::BadFile {
            path: path.to_path_buf(),
            reason,
        },
        other => other,
    }
}

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
const TOKEN_NORMAL: i64 = 1;
const TOKEN_UNKNOWN: i64 = 2;
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// SentencePiece's word-boundary mark, which stands for a space.
const SPM_SPACE: &str = "\u{2581}";

/// The pre-tokenizer regex of Llama 3 (`tokenizer.ggml.pre = "llama-bpe"`).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// The pre-tokenizer regex of Qwen2 (`tokenizer.ggml.pre = "qwen2"`): Llama 3's
/// with one digit per piece.
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.json` equivalent of a GGUF file's `tokenizer.ggml.*` metadata.
fn gguf_tokenizer_json(file: &GgufFile) -> Result<Value, LlmError> {
    let bad = |key: &str, reason: String| LlmError::BadFile {
        path: file.path().to_path_buf(),
        reason: format!("metadata {key}: {reason}"),
    };
    let array = |key: &str| -> Result<Option<&[GgufValue]>, LlmError> {
        match file.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_array()
                .map(Some)
                .ok_or_else(|| bad(key, format!("{} where an array was expected", kind(v)))),
        }
    };
    let strings = |key: &str| -> Result<Option<Vec<&str>>, LlmError> {
        let Some(a) = array(key)? else {
            return Ok(None);
        };
        a.iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .ok_or_else(|| bad(key, format!("element {i} is {}, not a string", kind(v))))
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    };
    let flag = |key: &str| -> Result<Option<bool>, LlmError> {
        match file.get(key) {
            None => Ok(None),
            Some(GgufValue::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(bad(key, format!("{} where a bool was expected", kind(v)))),
        }
    };

    let model_key = "tokenizer.ggml.model";
    let model = match file.get(model_key) {
        None => return Err(bad(model_key, "missing".into())),
        Some(v) => v.as_str().ok_or_else(|| {
            bad(
                model_key,
                format!("{} where a string was expected", kind(v)),
            )
        })?,
    };
    let spm = match model {
        "llama" => true,
        "gpt2" => false,
        other => {
            return Err(bad(
                model_key,
                format!("tokenizer model {other:?} is not supported (llama and gpt2 are)"),
            ));
        }
    };
    let tokens_key = "tokenizer.ggml.tokens";
    let tokens = strings(tokens_key)?.ok_or_else(|| bad(tokens_key, "missing".into()))?;
    if tokens.is_empty() {
        return Err(bad(tokens_key, "an empty vocabulary".into()));
    }
    let n = tokens.len();
    let types_key = "tokenizer.ggml.token_type";
    let types: Vec<i64> = match array(types_key)? {
        None => vec![TOKEN_NORMAL; n],
        Some(a) => {
            if a.len() != n {
                return Err(bad(
                    types_key,
                    format!("{} entries for {n} tokens", a.len()),
                ));
            }
            a.iter()
                .enumerate()
                .map(|(i, v)| match *v {
                    GgufValue::I32(t) => Ok(i64::from(t)),
                    GgufValue::U32(t) => Ok(i64::from(t)),
                    _ => Err(bad(
                        types_key,
                        format!("element {i} is {}, not an integer", kind(v)),
                    )),
                })
                .collect::<Result<_, _>>()?
        }
    };
    let id = |key: &str| -> Result<Option<usize>, LlmError> {
        match file.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(i) if (i as usize) < n => Ok(Some(i as usize)),
                _ => Err(bad(
                    key,
                    format!("{v:?} is not a token id of the {n}-token vocabulary"),
                )),
            },
        }
    };
    // llama.cpp's defaults for a SentencePiece vocabulary: bos 1, eos 2, unk 0.
    let spm_default = |i: usize| (spm && i < n).then_some(i);
    let bos = id("tokenizer.ggml.bos_token_id")?.or(spm_default(1));
    let eos = id("tokenizer.ggml.eos_token_id")?.or(spm_default(2));
    let unk = match id("tokenizer.ggml.unknown_token_id")? {
        Some(u) => Some(u),
        None => types
            .iter()
            .position(|&t| t == TOKEN_UNKNOWN)
            .or(spm_default(0)),
    };
    // The padding id is checked like the others; nothing in encoding uses it.
    id("tokenizer.ggml.padding_token_id")?;
    let pre_key = "tokenizer.ggml.pre";
    let pre = match file.get(pre_key) {
        None => "default",
        Some(v) => v
            .as_str()
            .ok_or_else(|| bad(pre_key, format!("{} where a string was expected", kind(v))))?,
    };
    // Llama 3's vocabulary: a bos token by default, and a word that is a token
    // is taken whole before any merge (as llama.cpp and its tokenizer.json do).
    let llama3 = !spm && matches!(pre, "llama-bpe" | "llama3" | "llama-v3");
    let add_bos = flag("tokenizer.ggml.add_bos_token")?.unwrap_or(spm || llama3);
    let add_eos = flag("tokenizer.ggml.add_eos_token")?.unwrap_or(false);

    // The vocabulary (a repeated spelling keeps its first id) and the added tokens.
    let mut vocab = serde_json::Map::with_capacity(n);
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(n);
    let mut added = Vec::new();
    for (i, (&tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        if index.contains_key(tok) {
            continue;
        }
        index.insert(tok, i);
        vocab.insert(tok.to_string(), json!(i));
        let special = ty == TOKEN_CONTROL || (ty == TOKEN_UNKNOWN && spm);
        if special || ty == TOKEN_USER_DEFINED {
            added.push(json!({
                "id": i, "content": tok, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": !special, "special": special,
            }));
        }
    }
    let spelled = |id: Option<usize>| id.map(|i| tokens[i]);

    let merges: Vec<Value> = if spm {
        let scores_key = "tokenizer.ggml.scores";
        let a = array(scores_key)?.ok_or_else(|| bad(scores_key, "missing".into()))?;
        if a.len() != n {
            return Err(bad(
                scores_key,
                format!("{} entries for {n} tokens", a.len()),
            ));
        }
        let scores: Vec<f32> = a
            .iter()
            .enumerate()
            .map(|(i, v)| match *v {
                GgufValue::F32(x) if !x.is_nan() => Ok(x),
                _ => Err(bad(
                    scores_key,
                    format!("element {i} is {v:?}, not an f32 number"),
                )),
            })
            .collect::<Result<_, _>>()?;
        spm_merges(&tokens, &types, &scores, &index)
    } else {
        let merges_key = "tokenizer.ggml.merges";
        let list = strings(merges_key)?.ok_or_else(|| bad(merges_key, "missing".into()))?;
        list.iter()
            .enumerate()
            .map(|(i, m)| match m.split_once(' ') {
                Some((l, r))
                    if index.contains_key(l)
                        && index.contains_key(r)
                        && index.contains_key(format!("{l}{r}").as_str()) =>
                {
                    Ok(json!([l, r]))
                }
                _ => Err(bad(
                    merges_key,
                    format!(
                        "element {i} {m:?} is not two vocabulary tokens, separated by a space, \
                         whose concatenation is a vocabulary token"
                    ),
                )),
            })
            .collect::<Result<_, _>>()?
    };

    let bpe = json!({
        "type": "BPE", "dropout": null, "unk_token": spelled(unk),
        "continuing_subword_prefix": null, "end_of_word_suffix": null,
        "fuse_unk": spm, "byte_fallback": spm, "ignore_merges": llama3,
        "vocab": vocab, "merges": merges,
    });
    let (normalizer, pre_tokenizer, decoder) = if spm {
        let prefix = flag("tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
        let replace = json!({"type": "Replace", "pattern": {"String": " "}, "content": SPM_SPACE});
        let mut normalizers = Vec::new();
        let mut decoders = vec![
            json!({"type": "Replace", "pattern": {"String": SPM_SPACE}, "content": " "}),
            json!({"type": "ByteFallback"}),
            json!({"type": "Fuse"}),
        ];
        if prefix {
            normalizers.push(json!({"type": "Prepend", "prepend": SPM_SPACE}));
            decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
        }
        normalizers.push(replace);
        (
            json!({"type": "Sequence", "normalizers": normalizers}),
            Value::Null,
            json!({"type": "Sequence", "decoders": decoders}),
        )
    } else {
        let byte_level = |regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": regex});
        let split = |re: &str| json!({"type": "Split", "pattern": {"Regex": re}, "behavior": "Isolated", "invert": false});
        let pre_tokenizer = match pre {
            "default" | "gpt-2" | "gpt2" => byte_level(true),
            "llama-bpe" | "llama3" => {
                json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
            }
            "qwen2" => {
                json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
            }
            "smollm" => json!({"type": "Sequence", "pretokenizers": [
                {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
            other => {
                return Err(bad(
                    pre_key,
                    format!(
                        "pre-tokenizer {other:?} is not supported (default, gpt-2, llama-bpe, qwen2 and smollm are)"
                    ),
                ));
            }
        };
        (Value::Null, pre_tokenizer, byte_level(true))
    };

    // What `encode(_, true)` adds: the bos and eos tokens the metadata asks for.
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut special_tokens = serde_json::Map::new();
    let mut add = |key: &str, on: bool, id: Option<usize>| -> Result<Option<Value>, LlmError> {
        if !on {
            return Ok(None);
        }
        let id = id.ok_or_else(|| bad(key, "true, but the token's id is not given".into()))?;
        let tok = tokens[id];
        special_tokens.insert(
            tok.to_string(),
            json!({"id": tok, "ids": [id], "tokens": [tok]}),
        );
        Ok(Some(json!({"SpecialToken": {"id": tok, "type_id": 0}})))
    };
    let bos_piece = add("tokenizer.ggml.add_bos_token", add_bos, bos)?;
    let eos_piece = add("tokenizer.ggml.add_eos_token", add_eos, eos)?;
    for (seq, out) in [("A", &mut single), ("B", &mut pair)] {
        out.extend(bos_piece.clone());
        out.push(json!({"Sequence": {"id": seq, "type_id": 0}}));
        out.extend(eos_piece.clone());
    }
    let pair: Vec<Value> = single.iter().cloned().chain(pair).collect();
    let post_processor = json!({
        "type": "TemplateProcessing", "single": single, "pair": pair,
        "special_tokens": special_tokens,
    });

    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": added, "normalizer": normalizer, "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor, "decoder": decoder, "model": bpe,
    }))
}

/// The BPE merges of a SentencePiece vocabulary with scores, as Hugging Face
/// derives them: every split of a normal token into two vocabulary tokens is a
/// merge; merges are ranked by the merged token's score (highest first), then
/// by the merged token's id, then by the ids of the left and right parts.
fn spm_merges(
    tokens: &[&str],
    types: &[i64],
    scores: &[f32],
    index: &HashMap<&str, usize>,
) -> Vec<Value> {
    let mut merges: Vec<(f32, usize, usize, usize)> = Vec::new();
    for (m, (&tok, &ty)) in tokens.iter().zip(types).enumerate() {
        if ty != TOKEN_NORMAL || index.get(tok) != Some(&m) {
            continue;
        }
        for (cut, _) in tok.char_indices().skip(1) {
            let (l, r) = tok.split_at(cut);
            if let (Some(&li), Some(&ri)) = (index.get(l), index.get(r)) {
                merges.push((scores[m], m, li, ri));
            }
        }
    }
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then(a.1.cmp(&b.1))
            .then(a.2.cmp(&b.2))
            .then(a.3.cmp(&b.3))
    });
    merges
        .into_iter()
        .map(|(_, _, l, r)| json!([tokens[l], tokens[r]]))
        .collect()
}

/// A metadata value's type, for error messages.
fn kind(v: &GgufValue) -> &'static str {
    match v {
        GgufValue::String(_) => "a string",
        GgufValue::Array(_) => "an array",
        GgufValue::Bool(_) => "a bool",
        GgufValue::F32(_) | GgufValue::F64(_) => "a float",
        _ => "an integer",
    }
}
