//! The OpenAI request bodies this server reads, checked field by field so that
//! an error names the field at fault, and the error body OpenAI's clients
//! expect.
//!
//! Fields the server does not use (`user`, `logit_bias` of `{}`, ...) are
//! ignored; fields it cannot honour (`n` other than 1, `echo`, non-zero
//! `presence_penalty`/`frequency_penalty`, `best_of` other than 1) are refused
//! with a 400 naming them, rather than silently answered as if honoured.

use serde_json::{Map, Value, json};

/// The most stop strings a request may give (OpenAI's limit).
pub const MAX_STOP: usize = 4;
/// The longest stop string, in bytes.
pub const MAX_STOP_BYTES: usize = 256;
/// The most alternatives `logprobs` / `top_logprobs` may ask for.
pub const MAX_LOGPROBS: usize = 20;

/// An error answered with OpenAI's error body
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: u16,
    /// What was wrong.
    pub message: String,
    /// The request field at fault, when one is.
    pub param: Option<String>,
    /// OpenAI's error type (`invalid_request_error`, `not_found_error`, ...).
    pub kind: &'static str,
    /// A machine-readable code, when there is one (`model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 naming `param`.
    pub fn invalid(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            param: Some(param.to_string()),
            kind: "invalid_request_error",
            code: None,
        }
    }

    /// An error of any status with no field at fault.
    pub fn status(status: u16, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
            kind,
            code: None,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// A completion's prompt: text, or token ids.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    /// Text, tokenized by the server (with the tokenizer's special tokens).
    Text(String),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
}

/// The parameters shared by both endpoints.
#[derive(Clone, Debug, PartialEq)]
pub struct Common {
    /// The `model` the request names, if any.
    pub model: Option<String>,
    /// `max_tokens` (or `max_completion_tokens`), if given.
    pub max_tokens: Option<usize>,
    /// `temperature` (default 1; 0 is greedy).
    pub temperature: f32,
    /// `top_p` (default 1).
    pub top_p: f32,
    /// `top_k` (an extension; default 0, off).
    pub top_k: usize,
    /// `seed`, if given.
    pub seed: Option<u64>,
    /// `stop`: at most [`MAX_STOP`] non-empty strings.
    pub stop: Vec<String>,
    /// `repetition_penalty` (an extension; default 1, off).
    pub repetition_penalty: f32,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

/// A `POST /v1/completions` body.
#[derive(Clone, Debug, PartialEq)]
pub struct CompletionRequest {
    /// `prompt`.
    pub prompt: Prompt,
    /// `logprobs`: the number of alternatives, if given.
    pub logprobs: Option<usize>,
    /// The shared parameters.
    pub common: Common,
}

/// One message of a chat.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// `role` (`system`, `user`, `assistant`, ...).
    pub role: String,
    /// `content` (text parts joined).
    pub content: String,
}

/// A `POST /v1/chat/completions` body.
#[derive(Clone, Debug, PartialEq)]
pub struct ChatRequest {
    /// `messages`.
    pub messages: Vec<Message>,
    /// `logprobs: true` with `top_logprobs` alternatives (0 when not given).
    pub logprobs: Option<usize>,
    /// The shared parameters.
    pub common: Common,
}

/// Parses a body as a JSON object.
///
/// # Errors
/// A 400 for malformed JSON or a body that is not an object.
pub fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(ApiError::status(
            400,
            "invalid_request_error",
            "the request body must be a JSON object",
        )),
        Err(e) => Err(ApiError::status(
            400,
            "invalid_request_error",
            format!("the request body is not valid JSON: {e}"),
        )),
    }
}

/// The type name of a JSON value, for error messages.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Field `name` of `m`, absent when missing or null.
fn field<'a>(m: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    m.get(name).filter(|v| !v.is_null())
}

fn number(m: &Map<String, Value>, name: &str) -> Result<Option<f64>, ApiError> {
    match field(m, name) {
        None => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(v) => Err(ApiError::invalid(
            name,
            format!("`{name}` must be a number, got {}", type_of(v)),
        )),
    }
}

fn integer(m: &Map<String, Value>, name: &str) -> Result<Option<u64>, ApiError> {
    match field(m, name) {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
            ApiError::invalid(
                name,
                format!("`{name}` must be a non-negative integer, got {n}"),
            )
        }),
        Some(v) => Err(ApiError::invalid(
            name,
            format!("`{name}` must be an integer, got {}", type_of(v)),
        )),
    }
}

fn boolean(m: &Map<String, Value>, name: &str) -> Result<bool, ApiError> {
    match field(m, name) {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(ApiError::invalid(
            name,
            format!("`{name}` must be a boolean, got {}", type_of(v)),
        )),
    }
}

fn in_range(name: &str, v: f64, lo: f64, hi: f64, what: &str) -> Result<f32, ApiError> {
    if v.is_finite() && (lo..=hi).contains(&v) {
        Ok(v as f32)
    } else {
        Err(ApiError::invalid(
            name,
            format!("`{name}` must be {what}, got {v}"),
        ))
    }
}

/// Refuses a field that is present with a value other than `neutral`.
fn refuse_unless(m: &Map<String, Value>, name: &str, neutral: &Value) -> Result<(), ApiError> {
    match field(m, name) {
        Some(v) if v != neutral && !(v.is_number() && v.as_f64() == neutral.as_f64()) => {
            Err(ApiError::invalid(
                name,
                format!("`{name}` is not supported by this server (only {neutral})"),
            ))
        }
        _ => Ok(()),
    }
}

fn common(m: &Map<String, Value>) -> Result<Common, ApiError> {
    let model = match field(m, "model") {
        None => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(v) => {
            return Err(ApiError::invalid(
                "model",
                format!("`model` must be a string, got {}", type_of(v)),
            ));
        }
    };
    let mut max_tokens = None;
    for name in ["max_tokens", "max_completion_tokens"] {
        if let Some(n) = integer(m, name)? {
            if n == 0 {
                return Err(ApiError::invalid(
                    name,
                    format!("`{name}` must be at least 1"),
                ));
            }
            max_tokens = Some(usize::try_from(n).unwrap_or(usize::MAX));
        }
    }
    let temperature = match number(m, "temperature")? {
        None => 1.0,
        Some(t) => in_range("temperature", t, 0.0, 2.0, "between 0 and 2")?,
    };
    let top_p = match number(m, "top_p")? {
        None => 1.0,
        Some(p) if p > 0.0 => in_range("top_p", p, 0.0, 1.0, "in (0, 1]")?,
        Some(p) => {
            return Err(ApiError::invalid(
                "top_p",
                format!("`top_p` must be in (0, 1], got {p}"),
            ));
        }
    };
    let top_k = integer(m, "top_k")?.map_or(0, |k| usize::try_from(k).unwrap_or(usize::MAX));
    let seed = match field(m, "seed") {
        None => None,
        // OpenAI's seeds are signed 64-bit integers: a negative one maps to its
        // two's-complement bits.
        Some(Value::Number(n)) if n.as_i64().is_some() => Some(n.as_i64().unwrap_or(0) as u64),
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64(),
        Some(v) => {
            return Err(ApiError::invalid(
                "seed",
                format!("`seed` must be an integer, got {v}"),
            ));
        }
    };
    let stop = match field(m, "stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            if items.len() > MAX_STOP {
                return Err(ApiError::invalid(
                    "stop",
                    format!(
                        "`stop` may hold at most {MAX_STOP} strings, got {}",
                        items.len()
                    ),
                ));
            }
            items
                .iter()
                .map(|v| match v {
                    Value::String(s) => Ok(s.clone()),
                    v => Err(ApiError::invalid(
                        "stop",
                        format!("`stop` must hold strings, got {}", type_of(v)),
                    )),
                })
                .collect::<Result<_, _>>()?
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!(
                    "`stop` must be a string or an array of strings, got {}",
                    type_of(v)
                ),
            ));
        }
    };
    if let Some(s) = stop
        .iter()
        .find(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(ApiError::invalid(
            "stop",
            format!(
                "a stop string must have 1 to {MAX_STOP_BYTES} bytes, got {}",
                s.len()
            ),
        ));
    }
    let repetition_penalty = match number(m, "repetition_penalty")? {
        None => 1.0,
        Some(r) if r > 0.0 => in_range("repetition_penalty", r, 0.0, 1e6, "positive")?,
        Some(r) => {
            return Err(ApiError::invalid(
                "repetition_penalty",
                format!("`repetition_penalty` must be positive, got {r}"),
            ));
        }
    };
    refuse_unless(m, "n", &json!(1))?;
    refuse_unless(m, "best_of", &json!(1))?;
    refuse_unless(m, "presence_penalty", &json!(0))?;
    refuse_unless(m, "frequency_penalty", &json!(0))?;
    refuse_unless(m, "echo", &json!(false))?;
    let stream = boolean(m, "stream")?;
    let include_usage = match field(m, "stream_options") {
        None => false,
        Some(Value::Object(o)) => boolean(o, "include_usage")?,
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("`stream_options` must be an object, got {}", type_of(v)),
            ));
        }
    };
    Ok(Common {
        model,
        max_tokens,
        temperature,
        top_p,
        top_k,
        seed,
        stop,
        repetition_penalty,
        stream,
        include_usage,
    })
}

/// Reads a `/v1/completions` body.
///
/// # Errors
/// A 400 naming the field: a missing or mistyped `prompt` (one string, or one
/// array of token ids; a list of prompts is refused), and the shared fields'
/// errors.
pub fn completion_request(m: &Map<String, Value>) -> Result<CompletionRequest, ApiError> {
    let prompt = match field(m, "prompt") {
        None => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(s)) => Prompt::Text(s.clone()),
        Some(Value::Array(items)) if items.iter().all(Value::is_number) => Prompt::Ids(
            items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .and_then(|n| u32::try_from(n).ok())
                        .ok_or_else(|| {
                            ApiError::invalid("prompt", format!("`{v}` is not a token id"))
                        })
                })
                .collect::<Result<_, _>>()?,
        ),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            Prompt::Text(items[0].as_str().unwrap_or_default().to_string())
        }
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid(
                "prompt",
                "`prompt` must be one string or one array of token ids (one prompt per request)",
            ));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("`prompt` must be a string, got {}", type_of(v)),
            ));
        }
    };
    let logprobs = match integer(m, "logprobs")? {
        Some(n) if n as usize > MAX_LOGPROBS => {
            return Err(ApiError::invalid(
                "logprobs",
                format!("`logprobs` must be at most {MAX_LOGPROBS}, got {n}"),
            ));
        }
        n => n.map(|n| n as usize),
    };
    Ok(CompletionRequest {
        prompt,
        logprobs,
        common: common(m)?,
    })
}

/// Reads a `/v1/chat/completions` body.
///
/// # Errors
/// A 400 naming the field: missing or mistyped `messages` (each an object
/// with a string `role` and a `content` that is a string or a list of text
/// parts), `top_logprobs` above [`MAX_LOGPROBS`], and the shared fields'
/// errors.
pub fn chat_request(m: &Map<String, Value>) -> Result<ChatRequest, ApiError> {
    let Some(Value::Array(items)) = field(m, "messages") else {
        return Err(ApiError::invalid(
            "messages",
            "`messages` is required: an array of {role, content} objects",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    let mut messages = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let param = format!("messages[{i}]");
        let Value::Object(o) = item else {
            return Err(ApiError::invalid(
                &param,
                format!("{param} must be an object"),
            ));
        };
        let Some(Value::String(role)) = o.get("role") else {
            return Err(ApiError::invalid(
                &format!("{param}.role"),
                format!("{param}.role must be a string"),
            ));
        };
        let content = match o.get("content") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for p in parts {
                    match (p.get("type").and_then(Value::as_str), p.get("text")) {
                        (Some("text"), Some(Value::String(t))) => text.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("{param}.content"),
                                "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported",
                            ));
                        }
                    }
                }
                text
            }
            Some(v) => {
                return Err(ApiError::invalid(
                    &format!("{param}.content"),
                    format!("{param}.content must be a string, got {}", type_of(v)),
                ));
            }
        };
        messages.push(Message {
            role: role.clone(),
            content,
        });
    }
    let top = match integer(m, "top_logprobs")? {
        Some(n) if n as usize > MAX_LOGPROBS => {
            return Err(ApiError::invalid(
                "top_logprobs",
                format!("`top_logprobs` must be at most {MAX_LOGPROBS}, got {n}"),
            ));
        }
        n => n.map_or(0, |n| n as usize),
    };
    let logprobs = boolean(m, "logprobs")?.then_some(top);
    Ok(ChatRequest {
        messages,
        logprobs,
        common: common(m)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(s: &str) -> Map<String, Value> {
        parse_object(s.as_bytes()).unwrap()
    }

    fn err_param(r: Result<CompletionRequest, ApiError>) -> Option<String> {
        r.unwrap_err().param
    }

    #[test]
    fn a_completion_request_reads_every_field() {
        let r = completion_request(&obj(
            r#"{"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.5,
                "top_p": 0.9, "top_k": 4, "seed": -1, "stop": ["\n", "END"],
                "repetition_penalty": 1.1, "stream": true, "logprobs": 3, "user": "x",
                "n": 1, "presence_penalty": 0}"#,
        ))
        .unwrap();
        assert_eq!(r.prompt, Prompt::Text("hi".into()));
        assert_eq!(r.logprobs, Some(3));
        let c = r.common;
        assert_eq!(c.model.as_deref(), Some("m"));
        assert_eq!(c.max_tokens, Some(7));
        assert_eq!((c.temperature, c.top_p, c.top_k), (0.5, 0.9, 4));
        assert_eq!(c.seed, Some(u64::MAX));
        assert_eq!(c.stop, ["\n", "END"]);
        assert!(c.stream);
        let ids = completion_request(&obj(r#"{"prompt": [1, 2, 3]}"#)).unwrap();
        assert_eq!(ids.prompt, Prompt::Ids(vec![1, 2, 3]));
        assert_eq!(ids.common.temperature, 1.0);
    }

    #[test]
    fn each_bad_field_is_named() {
        let cases = [
            (r#"{}"#, "prompt"),
            (r#"{"prompt": 3}"#, "prompt"),
            (r#"{"prompt": ["a", "b"]}"#, "prompt"),
            (r#"{"prompt": [1, -2]}"#, "prompt"),
            (r#"{"prompt": "x", "max_tokens": "9"}"#, "max_tokens"),
            (r#"{"prompt": "x", "max_tokens": 0}"#, "max_tokens"),
            (r#"{"prompt": "x", "max_tokens": -3}"#, "max_tokens"),
            (r#"{"prompt": "x", "temperature": 3}"#, "temperature"),
            (r#"{"prompt": "x", "top_p": 0}"#, "top_p"),
            (r#"{"prompt": "x", "top_k": 1.5}"#, "top_k"),
            (r#"{"prompt": "x", "seed": "s"}"#, "seed"),
            (r#"{"prompt": "x", "stop": ["a","b","c","d","e"]}"#, "stop"),
            (r#"{"prompt": "x", "stop": [""]}"#, "stop"),
            (r#"{"prompt": "x", "stop": [1]}"#, "stop"),
            (r#"{"prompt": "x", "n": 2}"#, "n"),
            (r#"{"prompt": "x", "echo": true}"#, "echo"),
            (
                r#"{"prompt": "x", "presence_penalty": 0.5}"#,
                "presence_penalty",
            ),
            (r#"{"prompt": "x", "logprobs": 21}"#, "logprobs"),
            (r#"{"prompt": "x", "stream": "yes"}"#, "stream"),
            (r#"{"prompt": "x", "model": 5}"#, "model"),
            (
                r#"{"prompt": "x", "repetition_penalty": 0}"#,
                "repetition_penalty",
            ),
        ];
        for (body, param) in cases {
            assert_eq!(
                err_param(completion_request(&obj(body))).as_deref(),
                Some(param),
                "{body}"
            );
        }
        assert!(parse_object(b"{not json").is_err());
        assert!(parse_object(b"[1]").is_err());
    }

    #[test]
    fn chat_requests_read_messages_and_name_bad_ones() {
        let r = chat_request(&obj(
            r#"{"messages": [{"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
                "logprobs": true, "top_logprobs": 2}"#,
        ))
        .unwrap();
        assert_eq!(r.messages[1].content, "ab");
        assert_eq!(r.logprobs, Some(2));
        for (body, param) in [
            (r#"{}"#, "messages"),
            (r#"{"messages": []}"#, "messages"),
            (r#"{"messages": [1]}"#, "messages[0]"),
            (r#"{"messages": [{"content": "x"}]}"#, "messages[0].role"),
            (
                r#"{"messages": [{"role": "user", "content": 3}]}"#,
                "messages[0].content",
            ),
            (
                r#"{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}"#,
                "messages[0].content",
            ),
        ] {
            assert_eq!(
                chat_request(&obj(body)).unwrap_err().param.as_deref(),
                Some(param),
                "{body}"
            );
        }
    }
}
