//! Chat templates: a conversation rendered as the prompt text an instruct
//! model was trained on, by the model's own Jinja template
//! (`tokenizer_config.json`'s `chat_template`, or a GGUF file's
//! `tokenizer.chat_template`), the way `transformers`' `apply_chat_template`
//! renders it.
//!
//! The renderer is `minijinja` set up as `transformers` sets up Jinja:
//! `trim_blocks` and `lstrip_blocks` on, loop controls (`break`, `continue`),
//! `raise_exception(message)` (an error naming the template and the message),
//! `strftime_now(format)` (the current time, UTC, or the time
//! [`ChatOptions::now_unix`] gives), a `tojson` filter that writes what
//! Python's `json.dumps` writes (`ensure_ascii`, `indent`, `separators` and
//! `sort_keys` as keyword arguments), Python's string and dict methods
//! (`.strip()`, `.split()`, `.startswith()`, `.items()`, ...), and the
//! `{% generation %}` block of `transformers`' assistant-mask extension (its
//! body renders as it is). Values print as Python prints them (`{{ x }}` and
//! `x | string`): `True`, `None`, `{'a': [1, 2.0]}`. (Concatenation with `~`
//! spells booleans and none as minijinja does: `true`, `none`.)
//! The variables a template sees are those `transformers` passes: `messages`,
//! `tools` and `documents` (none unless given), `add_generation_prompt`,
//! `bos_token` and `eos_token` (when known), and any extra variables given
//! (such as Qwen3's `enable_thinking`). Dictionaries keep their key order, as
//! Python's do, so `tojson` and `.items()` follow the order of the input.
//!
//! ```
//! use fucina_llm::chat::{ChatMessage, ChatTemplate};
//!
//! let chatml = "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content \
//!               + '<|im_end|>\\n' }}{% endfor %}\
//!               {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
//! let t = ChatTemplate::new("chatml", chatml)?;
//! let text = t.apply(&[ChatMessage::user("Hi")], true)?;
//! assert_eq!(text, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
//! assert_eq!(t.end_of_turn_markers(), ["<|im_end|>"]);
//! # Ok::<(), fucina_llm::LlmError>(())
//! ```

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};

use crate::LlmError;

/// The end-of-turn markers of the common chat formats: ChatML's `<|im_end|>`,
/// Llama 3's `<|eot_id|>` and `<|eom_id|>`, Gemma's `<end_of_turn>`, Phi-3's
/// `<|end|>`. A template that spells one of them ends its turns with it.
pub const END_OF_TURN_MARKERS: [&str; 5] = [
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<end_of_turn>",
    "<|end|>",
];

/// One message of a conversation: its role (`system`, `user`, `assistant`,
/// or whatever else a template knows, such as `tool`) and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// The speaker: `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text of the message.
    pub content: String,
}

impl ChatMessage {
    /// A message of `role` saying `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }

    fn to_value(&self) -> Value {
        Value::from_pairs([
            ("role", Value::from(self.role.as_str())),
            ("content", Value::from(self.content.as_str())),
        ])
    }
}

/// What a rendering passes to a template beyond the messages, as JSON text
/// (parsed keeping the key order, as Python's `json.loads` does).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatOptions {
    /// The `tools` variable: a JSON array of tool definitions (the JSON
    /// schemas `transformers` takes as `tools=`); `None` passes none.
    pub tools_json: Option<String>,
    /// Extra variables: a JSON object whose members become template variables
    /// (e.g. `{"enable_thinking": false}` for Qwen3, `{"date_string": "26 Jul
    /// 2024"}` for Llama 3.x); they override `bos_token` and `eos_token`, as
    /// keyword arguments do in `transformers`.
    pub variables_json: Option<String>,
    /// The time `strftime_now` formats, in seconds since the Unix epoch (UTC);
    /// `None` is the current time. A fixed time makes the text of a template
    /// that prints today's date (Llama 3.2, SmolLM3) reproducible.
    pub now_unix: Option<i64>,
}

thread_local! {
    /// The time `strftime_now` reports during a rendering on this thread.
    static NOW_UNIX: Cell<Option<i64>> = const { Cell::new(None) };
}

/// A compiled chat template.
#[derive(Clone)]
pub struct ChatTemplate {
    name: String,
    source: Arc<str>,
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("name", &self.name)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish()
    }
}

/// The name the template is stored under in its environment.
const TEMPLATE: &str = "chat_template";

impl ChatTemplate {
    /// Compiles `source`; `name` names the template in errors (say, the file
    /// and key it came from).
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] naming the template and minijinja's message
    /// (with the line) when `source` does not parse.
    pub fn new(
        name: impl Into<String>,
        source: impl Into<String>,
    ) -> Result<ChatTemplate, LlmError> {
        let name = name.into();
        let source: String = source.into();
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("the default delimiters are a valid syntax"),
        );
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_filter("string", |v: &Value| python_str(v));
        env.add_filter("join", join);
        env.set_formatter(|out, _state, value| {
            out.write_str(&python_str(value))
                .map_err(|e| Error::new(ErrorKind::WriteFailure, e.to_string()))
        });
        env.add_template_owned(TEMPLATE, generation_blocks_as_ifs(&source))
            .map_err(|e| template_error(&name, "does not parse", &e))?;
        Ok(ChatTemplate {
            name,
            source: source.into(),
            env,
            bos_token: None,
            eos_token: None,
        })
    }

    /// Sets the `bos_token` and `eos_token` variables (the tokenizer's
    /// beginning- and end-of-sequence spellings; unset variables are undefined,
    /// and print as nothing).
    pub fn with_special_tokens(
        mut self,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> ChatTemplate {
        self.bos_token = bos_token;
        self.eos_token = eos_token;
        self
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The `bos_token` variable, when set.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// The `eos_token` variable, when set.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The markers that end a turn in this template: those of
    /// [`END_OF_TURN_MARKERS`] its source spells, and the `eos_token` when the
    /// template writes it (Mistral, Zephyr and TinyLlama end turns with it).
    pub fn end_of_turn_markers(&self) -> Vec<&str> {
        let mut out: Vec<&str> = END_OF_TURN_MARKERS
            .into_iter()
            .filter(|m| self.source.contains(m))
            .collect();
        if let Some(eos) = self.eos_token.as_deref()
            && self.source.contains("eos_token")
            && !out.contains(&eos)
        {
            out.push(eos);
        }
        out
    }

    /// Renders `messages`; with `add_generation_prompt` the text ends with what
    /// opens the assistant's reply. The same as
    /// `tokenizer.apply_chat_template(messages, tokenize=False,
    /// add_generation_prompt=...)` in `transformers`.
    ///
    /// # Errors
    /// [`LlmError::InvalidRequest`] naming the template and the message when
    /// rendering fails: the template raises (`raise_exception`, such as Gemma's
    /// "System role not supported"), or reads something that is not there.
    pub fn apply(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, LlmError> {
        self.apply_with(messages, add_generation_prompt, &ChatOptions::default())
    }

    /// [`ChatTemplate::apply`] with `tools` and extra variables.
    ///
    /// # Errors
    /// As [`ChatTemplate::apply`]; also when `options` holds JSON that does
    /// not parse, or tools that are not an array or extra variables that are
    /// not an object.
    pub fn apply_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String, LlmError> {
        let messages = Value::from(
            messages
                .iter()
                .map(ChatMessage::to_value)
                .collect::<Vec<_>>(),
        );
        self.render(messages, add_generation_prompt, options)
    }

    /// [`ChatTemplate::apply_with`] with the messages as a JSON array of
    /// objects, for messages with more than a role and a text (an assistant's
    /// `tool_calls`, a tool result's `name`, a `reasoning_content`). As in
    /// `transformers`, members whose value is `null` are dropped.
    ///
    /// # Errors
    /// As [`ChatTemplate::apply_with`]; also when `messages_json` is not a JSON
    /// array of objects.
    pub fn apply_json(
        &self,
        messages_json: &str,
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String, LlmError> {
        let messages = parse_json(messages_json, &self.name, "messages")?;
        let ok = messages.kind() == ValueKind::Seq
            && messages
                .try_iter()
                .map(|mut it| it.all(|m| m.kind() == ValueKind::Map))
                .unwrap_or(false);
        if !ok {
            return Err(invalid(
                &self.name,
                "messages: not a JSON array of objects".into(),
            ));
        }
        let messages = Value::from(
            messages
                .try_iter()
                .map_err(|e| template_error(&self.name, "messages", &e))?
                .map(|m| drop_nulls(&m))
                .collect::<Vec<_>>(),
        );
        self.render(messages, add_generation_prompt, options)
    }

    fn render(
        &self,
        messages: Value,
        add_generation_prompt: bool,
        options: &ChatOptions,
    ) -> Result<String, LlmError> {
        let tools = match &options.tools_json {
            None => Value::from(()),
            Some(text) => {
                let v = parse_json(text, &self.name, "tools")?;
                if v.kind() != ValueKind::Seq {
                    return Err(invalid(&self.name, "tools: not a JSON array".into()));
                }
                v
            }
        };
        let mut vars: Vec<(String, Value)> = vec![
            ("messages".into(), messages),
            ("tools".into(), tools),
            ("documents".into(), Value::from(())),
            (
                "add_generation_prompt".into(),
                Value::from(add_generation_prompt),
            ),
        ];
        let special = [
            ("bos_token", &self.bos_token),
            ("eos_token", &self.eos_token),
        ];
        for (key, value) in special {
            if let Some(v) = value {
                vars.push((key.into(), Value::from(v.as_str())));
            }
        }
        if let Some(text) = &options.variables_json {
            let extra = parse_json(text, &self.name, "variables")?;
            if extra.kind() != ValueKind::Map {
                return Err(invalid(&self.name, "variables: not a JSON object".into()));
            }
            let keys = extra
                .try_iter()
                .map_err(|e| template_error(&self.name, "variables", &e))?;
            for key in keys {
                let value = extra
                    .get_item(&key)
                    .map_err(|e| template_error(&self.name, "variables", &e))?;
                let key = key
                    .as_str()
                    .map(str::to_string)
                    .unwrap_or_else(|| key.to_string());
                vars.retain(|(k, _)| *k != key);
                vars.push((key, value));
            }
        }
        let tmpl = self
            .env
            .get_template(TEMPLATE)
            .map_err(|e| template_error(&self.name, "does not parse", &e))?;
        let before = NOW_UNIX.with(|c| c.replace(options.now_unix));
        let out = tmpl.render(Value::from_pairs(vars));
        NOW_UNIX.with(|c| c.set(before));
        out.map_err(|e| template_error(&self.name, "failed", &e))
    }
}

fn invalid(name: &str, reason: String) -> LlmError {
    LlmError::InvalidRequest {
        op: "chat template",
        reason: format!("{name}: {reason}"),
    }
}

/// An error of minijinja, with the template's name, what failed and the
/// message (and the line, which minijinja's message carries).
fn template_error(name: &str, what: &str, e: &Error) -> LlmError {
    let mut msg = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg.push_str(&format!(": {s}"));
        source = s.source();
    }
    invalid(name, format!("{what}: {msg}"))
}

/// `source` with the `{% generation %}` and `{% endgeneration %}` tags of
/// `transformers`' assistant-mask extension (which renders the body as it is)
/// spelled `{% if true %}` and `{% endif %}`, whitespace control kept, so the
/// text is the same and minijinja, which has no such tag, parses it.
fn generation_blocks_as_ifs(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let tag = &rest[at..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let (open, body) = match inner.strip_prefix(['-', '+']) {
            Some(b) => (&inner[..1], b),
            None => ("", inner),
        };
        let (body, close) = match body.strip_suffix(['-', '+']) {
            Some(b) => (b, &body[b.len()..]),
            None => (body, ""),
        };
        let word = match body.trim() {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match word {
            Some(w) => out.push_str(&format!("{{%{open} {w} {close}%}}")),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

/// A value as Python's `str()` writes it (strings as they are).
fn python_str(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => v.as_str().unwrap_or_default().to_string(),
        ValueKind::Undefined => String::new(),
        _ => python_repr(v),
    }
}

/// A value as Python's `repr()` writes it: `'text'`, `True`, `None`, `1.0`,
/// `[1, 'a']`, `{'k': None}`.
fn python_repr(v: &Value) -> String {
    match v.kind() {
        ValueKind::String => python_str_repr(v.as_str().unwrap_or_default()),
        ValueKind::None => "None".into(),
        ValueKind::Undefined => String::new(),
        ValueKind::Bool => (if v.is_true() { "True" } else { "False" }).into(),
        ValueKind::Number if !v.is_integer() => match f64::try_from(v.clone()) {
            Ok(x) if x.is_nan() => "nan".into(),
            Ok(x) if x.is_infinite() => (if x > 0.0 { "inf" } else { "-inf" }).into(),
            Ok(x) => python_float(x),
            Err(_) => v.to_string(),
        },
        ValueKind::Seq => match v.try_iter() {
            Ok(items) => format!(
                "[{}]",
                items
                    .map(|i| python_repr(&i))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Err(_) => v.to_string(),
        },
        ValueKind::Map => match v.try_iter() {
            Ok(keys) => {
                let items: Vec<String> = keys
                    .map(|k| {
                        let val = v.get_item(&k).unwrap_or_default();
                        format!("{}: {}", python_repr(&k), python_repr(&val))
                    })
                    .collect();
                format!("{{{}}}", items.join(", "))
            }
            Err(_) => v.to_string(),
        },
        _ => v.to_string(),
    }
}

/// A string as Python's `repr()` quotes it: single quotes unless the text has
/// a single quote and no double quote; `\\`, `\n`, `\r`, `\t` and `\xNN`
/// escapes for the rest of the control characters.
fn python_str_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || (0x7f..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// `value | join(d='', attribute=None)` as Jinja's: the items (or their
/// `attribute`, a dotted path) as Python's `str()` writes them, separated by `d`.
fn join(value: &Value, d: Option<String>, kwargs: Kwargs) -> Result<String, Error> {
    let attribute: Option<String> = kwargs.get("attribute")?;
    kwargs.assert_all_used()?;
    let mut parts = Vec::new();
    for mut item in value.try_iter()? {
        for key in attribute.iter().flat_map(|a| a.split('.')) {
            item = match key.parse::<i64>() {
                Ok(i) => item.get_item(&Value::from(i))?,
                Err(_) => item.get_attr(key)?,
            };
        }
        parts.push(python_str(&item));
    }
    Ok(parts.join(d.as_deref().unwrap_or("")))
}

/// `raise_exception(message)`: the template's own error.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("raise_exception: {message}"),
    ))
}

/// Members whose value is none, dropped from a message object (what
/// `transformers` does before rendering).
fn drop_nulls(message: &Value) -> Value {
    let Ok(keys) = message.try_iter() else {
        return message.clone();
    };
    Value::from_pairs(keys.filter_map(|k| {
        let v = message.get_item(&k).ok()?;
        (!v.is_none()).then_some((k, v))
    }))
}

// ---------------------------------------------------------------------------
// JSON in, keeping key order.

/// JSON text as a minijinja value, objects keeping their key order.
fn parse_json(text: &str, name: &str, what: &str) -> Result<Value, LlmError> {
    serde_json::from_str::<OrderedJson>(text)
        .map(|j| j.0)
        .map_err(|e| invalid(name, format!("{what}: not valid JSON: {e}")))
}

/// A JSON value read into a minijinja value (a serde visitor, so objects keep
/// their order instead of going through `serde_json::Map`, which sorts).
struct OrderedJson(Value);

impl<'de> serde::Deserialize<'de> for OrderedJson {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(JsonVisitor).map(OrderedJson)
    }
}

struct JsonVisitor;

impl<'de> serde::de::Visitor<'de> for JsonVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::from(()))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(OrderedJson(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::from(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut pairs: Vec<(String, Value)> = Vec::new();
        while let Some((k, OrderedJson(v))) = map.next_entry::<String, OrderedJson>()? {
            // A repeated key keeps its first place and its last value, as in Python.
            match pairs.iter_mut().find(|(key, _)| *key == k) {
                Some(slot) => slot.1 = v,
                None => pairs.push((k, v)),
            }
        }
        Ok(Value::from_pairs(pairs))
    }
}

// ---------------------------------------------------------------------------
// tojson: Python's json.dumps.

/// `value | tojson(ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, as `transformers` defines it (Python's `json.dumps`).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n.max(0) as usize)),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        },
    };
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => (
                    a.as_str().unwrap_or_default().to_string(),
                    b.as_str().unwrap_or_default().to_string(),
                ),
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ));
                }
            }
        }
        // Python's defaults: ", " without an indent, "," with one.
        _ => (
            if indent.is_some() { "," } else { ", " }.to_string(),
            ": ".to_string(),
        ),
    };
    let opts = JsonStyle {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(out)
}

struct JsonStyle {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

fn write_json(out: &mut String, v: &Value, s: &JsonStyle, depth: usize) -> Result<(), Error> {
    match v.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if v.is_integer() {
                out.push_str(&v.to_string());
            } else {
                let x = f64::try_from(v.clone())?;
                out.push_str(&python_float(x));
            }
        }
        ValueKind::String => write_json_str(out, v.as_str().unwrap_or_default(), s.ensure_ascii),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            write_container(out, s, depth, '[', ']', &items, |out, item, depth| {
                write_json(out, item, s, depth)
            })?;
        }
        ValueKind::Map => {
            let mut entries: Vec<(String, Value)> = Vec::new();
            for k in v.try_iter()? {
                let val = v.get_item(&k)?;
                let key = match k.as_str() {
                    Some(s) => s.to_string(),
                    None if k.is_none() => "null".to_string(),
                    None if k.kind() == ValueKind::Bool => {
                        (if k.is_true() { "true" } else { "false" }).to_string()
                    }
                    None => k.to_string(),
                };
                entries.push((key, val));
            }
            if s.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            write_container(out, s, depth, '{', '}', &entries, |out, (k, val), depth| {
                write_json_str(out, k, s.ensure_ascii);
                out.push_str(&s.key_sep);
                write_json(out, val, s, depth)
            })?;
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!(
                    "tojson: a value of kind {} is not JSON serializable",
                    v.kind()
                ),
            ));
        }
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    s: &JsonStyle,
    depth: usize,
    open: char,
    close: char,
    items: &[T],
    mut each: impl FnMut(&mut String, &T, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push_str(&s.item_sep);
        }
        if let Some(ind) = &s.indent {
            out.push('\n');
            out.push_str(&ind.repeat(depth + 1));
        }
        each(out, item, depth + 1)?;
    }
    if let Some(ind) = &s.indent {
        out.push('\n');
        out.push_str(&ind.repeat(depth));
    }
    out.push(close);
    Ok(())
}

fn write_json_str(out: &mut String, text: &str, ensure_ascii: bool) {
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && (c as u32) > 0x7e) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// A float as Python's `repr` (and so `json.dumps`) writes it: the shortest
/// digits that read back, fixed notation for exponents -5 < e < 16, else
/// `1e-05` style; `NaN`, `Infinity`, `-Infinity`.
fn python_float(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..16).contains(&exp) {
        let fixed = format!("{x}");
        if fixed.contains('.') {
            fixed
        } else {
            format!("{fixed}.0")
        }
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.abs())
    }
}

// ---------------------------------------------------------------------------
// strftime_now.

/// `strftime_now(format)`: the current time (UTC), or the rendering's
/// [`ChatOptions::now_unix`], formatted by `format`'s `%` directives.
fn strftime_now(format: String) -> Result<String, Error> {
    let secs = NOW_UNIX.with(Cell::get).unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0)
    });
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` with the `%` directives of C's `strftime` (those templates use:
/// `%Y %y %m %B %b %d %e %j %A %a %H %I %M %S %p %%`) for `secs` seconds after
/// the Unix epoch, UTC.
pub(crate) fn strftime(format: &str, secs: i64) -> Result<String, Error> {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(d) = chars.next() else {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "strftime_now: a lone % ends the format",
            ));
        };
        let month_name = MONTHS[(month - 1) as usize];
        match d {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'B' => out.push_str(month_name),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:2}")),
            'j' => out.push_str(&format!("{yday:03}")),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            '%' => out.push('%'),
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("strftime_now: the directive %{other} is not supported"),
                ));
            }
        }
    }
    Ok(out)
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard
/// Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// The day count from 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_matches_python() {
        // 2024-07-26 13:05:09 UTC, a Friday, day 208 of a leap year.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t).unwrap(), "26 Jul 2024");
        assert_eq!(strftime("%d %B %Y", t).unwrap(), "26 July 2024");
        assert_eq!(
            strftime("%A %a %j %H:%M:%S %I%p %y %m %e%%", t).unwrap(),
            "Friday Fri 208 13:05:09 01PM 24 07 26%"
        );
        assert_eq!(strftime("%Y-%m-%d", 0).unwrap(), "1970-01-01");
        assert_eq!(strftime("%Y-%m-%d %a", -86_400).unwrap(), "1969-12-31 Wed");
        assert!(strftime("%Q", t).is_err());
        assert!(strftime("50%", t).is_err());
    }

    #[test]
    fn generation_tags_become_ifs() {
        assert_eq!(
            generation_blocks_as_ifs(
                "a{% generation %}b{%- endgeneration -%}c{{ x }}{% if y %}{% endif %}"
            ),
            "a{% if true %}b{%- endif -%}c{{ x }}{% if y %}{% endif %}"
        );
        assert_eq!(
            generation_blocks_as_ifs("{%+ generation+%}{% raw %}"),
            "{%+ if true +%}{% raw %}"
        );
        assert_eq!(
            generation_blocks_as_ifs("tail {% unterminated"),
            "tail {% unterminated"
        );
    }

    #[test]
    fn python_reprs() {
        let v = Value::from_pairs([
            ("s", Value::from("it's \"x\"\n")),
            ("b", Value::from(true)),
            ("n", Value::from(())),
            (
                "l",
                Value::from(vec![Value::from(1), Value::from(2.5), Value::from("a'")]),
            ),
        ]);
        assert_eq!(
            python_str(&v),
            r#"{'s': 'it\'s "x"\n', 'b': True, 'n': None, 'l': [1, 2.5, "a'"]}"#
        );
        assert_eq!(python_str(&Value::from("plain")), "plain");
        assert_eq!(python_str(&Value::from(1.0)), "1.0");
    }

    #[test]
    fn python_floats() {
        for (x, s) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (123456789012345.0, "123456789012345.0"),
            (-2.5e-7, "-2.5e-07"),
            (f64::NAN, "NaN"),
        ] {
            assert_eq!(python_float(x), s, "{x}");
        }
    }
}
