//! The HTTP layer: OpenAI's endpoints on axum, each request tokenized here and
//! handed to the [`Engine`], its events turned into one JSON response or a
//! stream of server-sent events.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use fucina_llm::SamplingParams;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::api::{self, ApiError, Common, Prompt};
use crate::engine::{Engine, Event, FinishReason, GenRequest, SubmitError, TokenInfo};
use crate::metrics::Metrics;

/// What the handlers share: the engine, the model's name and the limits.
#[derive(Clone, Debug)]
pub struct AppState {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    engine: Engine,
    model_id: String,
    max_body: usize,
    created: u64,
    next_id: AtomicU64,
}

/// Which endpoint a response is for (the two differ only in their JSON shapes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Endpoint {
    Completions,
    Chat,
}

/// The `max_tokens` of a completion that gives none (OpenAI's default).
pub const DEFAULT_COMPLETION_TOKENS: usize = 16;

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl AppState {
    /// The state of a server that answers for `engine`'s model under the name
    /// `model_id`, reading request bodies of at most `max_body` bytes.
    pub fn new(engine: Engine, model_id: String, max_body: usize) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                engine,
                model_id,
                max_body,
                created: now_secs(),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// The engine.
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        self.inner.engine.metrics()
    }
}

/// The routes: `POST /v1/completions`, `POST /v1/chat/completions`,
/// `GET /v1/models`, `GET /health`, `GET /metrics`.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(state)
}

/// Serves `router(state)` on `listener` until `shutdown` completes, then
/// refuses new requests (503) and waits for the open connections (running
/// streams finish).
///
/// # Errors
/// The listener's I/O errors.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let draining = state.clone();
    axum::serve(listener, router(state))
        .with_graceful_shutdown(async move {
            shutdown.await;
            draining.engine().begin_shutdown();
        })
        .await
}

fn error_response(state: &AppState, e: ApiError) -> Response {
    state.metrics().request(e.status);
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = (status, axum::Json(e.body())).into_response();
    if e.status == 429 {
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    r
}

fn ok_json(state: &AppState, v: Value) -> Response {
    state.metrics().request(200);
    axum::Json(v).into_response()
}

async fn not_found(State(state): State<AppState>, req: Request) -> Response {
    error_response(
        &state,
        ApiError::status(
            404,
            "not_found_error",
            format!("no route for {} {}", req.method(), req.uri().path()),
        ),
    )
}

async fn health(State(state): State<AppState>) -> Response {
    if state.engine().is_draining() {
        return error_response(
            &state,
            ApiError::status(503, "server_error", "shutting down"),
        );
    }
    ok_json(&state, json!({"status": "ok"}))
}

async fn metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics().render(),
    )
        .into_response()
}

async fn models(State(state): State<AppState>) -> Response {
    let inner = &state.inner;
    let v = json!({
        "object": "list",
        "data": [{
            "id": inner.model_id,
            "object": "model",
            "created": inner.created,
            "owned_by": "fucina",
        }],
    });
    ok_json(&state, v)
}

/// The body's bytes, at most `max_body` of them.
async fn read_body(state: &AppState, req: Request) -> Result<Vec<u8>, ApiError> {
    let limit = state.inner.max_body;
    let too_large = || {
        ApiError::status(
            413,
            "invalid_request_error",
            format!("the request body exceeds {limit} bytes"),
        )
    };
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match axum::body::to_bytes(req.into_body(), limit).await {
        Ok(b) => Ok(b.to_vec()),
        Err(_) => Err(too_large()),
    }
}

async fn completions(State(state): State<AppState>, req: Request) -> Response {
    match start_completion(&state, req).await {
        Ok((rx, stream, meta)) => answer(&state, rx, stream, meta).await,
        Err(e) => error_response(&state, e),
    }
}

async fn chat_completions(State(state): State<AppState>, req: Request) -> Response {
    match start_chat(&state, req).await {
        Ok((rx, stream, meta)) => answer(&state, rx, stream, meta).await,
        Err(e) => error_response(&state, e),
    }
}

/// What a response needs besides the events.
struct Meta {
    endpoint: Endpoint,
    id: String,
    logprobs: bool,
    include_usage: bool,
}

type Started = (UnboundedReceiver<Event>, bool, Meta);

async fn start_completion(state: &AppState, req: Request) -> Result<Started, ApiError> {
    let body = read_body(state, req).await?;
    let r = api::completion_request(&api::parse_object(&body)?)?;
    let tokenizer = &state.engine().info().tokenizer;
    let prompt = match r.prompt {
        Prompt::Text(text) => tokenizer
            .encode(&text, true)
            .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
        Prompt::Ids(ids) => ids,
    };
    let max_tokens = r.common.max_tokens.unwrap_or(DEFAULT_COMPLETION_TOKENS);
    submit(
        state,
        Endpoint::Completions,
        prompt,
        max_tokens,
        r.logprobs,
        &r.common,
        Vec::new(),
    )
}

async fn start_chat(state: &AppState, req: Request) -> Result<Started, ApiError> {
    let body = read_body(state, req).await?;
    let r = api::chat_request(&api::parse_object(&body)?)?;
    let prompt = crate::chat::render(state.engine(), &r.messages)?;
    // Without max_tokens a chat turn runs until its end or the context's.
    let max_tokens = r.common.max_tokens.unwrap_or(usize::MAX);
    let end_of_turn = state.engine().info().end_of_turn.clone();
    submit(
        state,
        Endpoint::Chat,
        prompt,
        max_tokens,
        r.logprobs,
        &r.common,
        end_of_turn,
    )
}

fn submit(
    state: &AppState,
    endpoint: Endpoint,
    prompt: Vec<u32>,
    max_tokens: usize,
    logprobs: Option<usize>,
    c: &Common,
    stop_tokens: Vec<u32>,
) -> Result<Started, ApiError> {
    let inner = &state.inner;
    if let Some(m) = &c.model
        && *m != inner.model_id
    {
        let mut e = ApiError::status(
            404,
            "not_found_error",
            format!(
                "the model `{m}` does not exist; this server serves `{}`",
                inner.model_id
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        return Err(e);
    }
    let n = inner.next_id.fetch_add(1, Ordering::Relaxed);
    // Without a seed, each request gets its own (time and a counter).
    let seed = c.seed.unwrap_or_else(|| {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    });
    let ctx_len = state.engine().info().ctx_len;
    let req = GenRequest {
        max_tokens: max_tokens.min(ctx_len),
        prompt,
        sampling: SamplingParams {
            temperature: c.temperature,
            top_k: c.top_k,
            top_p: c.top_p,
            repetition_penalty: c.repetition_penalty,
            seed,
            stop_tokens: Vec::new(),
        },
        stop: c.stop.clone(),
        logprobs,
        stop_tokens,
    };
    let rx = state.engine().submit(req).map_err(|e| match e {
        SubmitError::QueueFull(_) => ApiError::status(429, "rate_limit_error", e.to_string()),
        SubmitError::PromptTooLong { .. } => {
            let mut a = ApiError::invalid(
                if endpoint == Endpoint::Chat {
                    "messages"
                } else {
                    "prompt"
                },
                e.to_string(),
            );
            a.code = Some("context_length_exceeded");
            a
        }
        SubmitError::Invalid(m) => ApiError::invalid(
            if endpoint == Endpoint::Chat {
                "messages"
            } else {
                "prompt"
            },
            m,
        ),
        SubmitError::ShuttingDown => ApiError::status(503, "server_error", e.to_string()),
    })?;
    let prefix = match endpoint {
        Endpoint::Completions => "cmpl",
        Endpoint::Chat => "chatcmpl",
    };
    let meta = Meta {
        endpoint,
        id: format!("{prefix}-{n}"),
        logprobs: logprobs.is_some(),
        include_usage: c.include_usage,
    };
    Ok((rx, c.stream, meta))
}

async fn answer(
    state: &AppState,
    rx: UnboundedReceiver<Event>,
    stream: bool,
    meta: Meta,
) -> Response {
    if stream {
        state.metrics().request(200);
        return sse(state.clone(), rx, meta).into_response();
    }
    let mut rx = rx;
    let (mut text, mut tokens) = (String::new(), Vec::new());
    loop {
        match rx.recv().await {
            Some(Event::Text { text: t, tokens: k }) => {
                text.push_str(&t);
                tokens.extend(k);
            }
            Some(Event::Done {
                reason,
                prompt_tokens,
                completion_tokens,
            }) => {
                let usage = usage(prompt_tokens, completion_tokens);
                let v = whole_response(state, &meta, &text, &tokens, reason, usage);
                return ok_json(state, v);
            }
            Some(Event::Failed(m)) => {
                return error_response(state, ApiError::status(500, "server_error", m));
            }
            None => {
                return error_response(
                    state,
                    ApiError::status(503, "server_error", "the engine stopped"),
                );
            }
        }
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    })
}

fn whole_response(
    state: &AppState,
    meta: &Meta,
    text: &str,
    tokens: &[TokenInfo],
    reason: FinishReason,
    usage: Value,
) -> Value {
    let inner = &state.inner;
    let logprobs = meta
        .logprobs
        .then(|| logprobs_json(meta.endpoint, tokens, 0));
    let choice = match meta.endpoint {
        Endpoint::Completions => json!({
            "index": 0,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": reason.as_str(),
        }),
        Endpoint::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": reason.as_str(),
        }),
    };
    json!({
        "id": meta.id,
        "object": match meta.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion",
        },
        "created": now_secs(),
        "model": inner.model_id,
        "choices": [choice],
        "usage": usage,
    })
}

/// OpenAI's log-probability shapes: the completions endpoint's parallel
/// arrays (`text_offset` counted from `offset`), the chat endpoint's list of
/// token objects.
fn logprobs_json(endpoint: Endpoint, tokens: &[TokenInfo], offset: usize) -> Value {
    match endpoint {
        Endpoint::Completions => {
            let mut at = offset;
            let offsets: Vec<usize> = tokens
                .iter()
                .map(|t| {
                    let o = at;
                    at += t.text.len();
                    o
                })
                .collect();
            json!({
                "tokens": tokens.iter().map(|t| t.text.as_str()).collect::<Vec<_>>(),
                "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                "top_logprobs": tokens.iter().map(|t| {
                    t.top.iter().map(|(_, s, lp)| (s.clone(), json!(lp))).collect::<serde_json::Map<_, _>>()
                }).collect::<Vec<_>>(),
                "text_offset": offsets,
            })
        }
        Endpoint::Chat => json!({
            "content": tokens.iter().map(|t| json!({
                "token": t.text,
                "logprob": t.logprob,
                "bytes": t.text.as_bytes(),
                "top_logprobs": t.top.iter().map(|(_, s, lp)| json!({
                    "token": s, "logprob": lp, "bytes": s.as_bytes(),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        }),
    }
}

/// The state of a streamed response.
struct Streaming {
    state: AppState,
    rx: UnboundedReceiver<Event>,
    meta: Meta,
    /// Events ready to send before reading the next engine event.
    queued: std::collections::VecDeque<SseEvent>,
    ended: bool,
    sent_role: bool,
    text_len: usize,
}

fn chunk(s: &Streaming, choice: Value, usage: Option<Value>) -> SseEvent {
    let mut v = json!({
        "id": s.meta.id,
        "object": match s.meta.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        },
        "created": now_secs(),
        "model": s.state.inner.model_id,
        "choices": [choice],
    });
    if let Some(u) = usage {
        v["usage"] = u;
    }
    SseEvent::default().data(v.to_string())
}

fn sse(
    state: AppState,
    rx: UnboundedReceiver<Event>,
    meta: Meta,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let st = Streaming {
        state,
        rx,
        meta,
        queued: Default::default(),
        ended: false,
        sent_role: false,
        text_len: 0,
    };
    let stream = futures_util::stream::unfold(st, |mut s| async move {
        loop {
            if let Some(e) = s.queued.pop_front() {
                return Some((Ok(e), s));
            }
            if s.ended {
                return None;
            }
            match s.rx.recv().await {
                Some(Event::Text { text, tokens }) => {
                    let logprobs = s
                        .meta
                        .logprobs
                        .then(|| logprobs_json(s.meta.endpoint, &tokens, s.text_len));
                    s.text_len += text.len();
                    let choice = match s.meta.endpoint {
                        Endpoint::Completions => json!({
                            "index": 0, "text": text, "logprobs": logprobs, "finish_reason": null,
                        }),
                        Endpoint::Chat => {
                            let delta = if s.sent_role {
                                json!({"content": text})
                            } else {
                                s.sent_role = true;
                                json!({"role": "assistant", "content": text})
                            };
                            json!({"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": null})
                        }
                    };
                    let e = chunk(&s, choice, None);
                    s.queued.push_back(e);
                }
                Some(Event::Done {
                    reason,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    let usage = usage(prompt_tokens, completion_tokens);
                    let choice = match s.meta.endpoint {
                        Endpoint::Completions => json!({
                            "index": 0, "text": "", "logprobs": null, "finish_reason": reason.as_str(),
                        }),
                        Endpoint::Chat => json!({
                            "index": 0, "delta": {}, "logprobs": null, "finish_reason": reason.as_str(),
                        }),
                    };
                    let e = chunk(&s, choice, s.meta.include_usage.then_some(usage));
                    s.queued.push_back(e);
                    s.queued.push_back(SseEvent::default().data("[DONE]"));
                    s.ended = true;
                }
                Some(Event::Failed(m)) => {
                    let body = ApiError::status(500, "server_error", m).body();
                    s.queued
                        .push_back(SseEvent::default().data(body.to_string()));
                    s.queued.push_back(SseEvent::default().data("[DONE]"));
                    s.ended = true;
                }
                None => return None,
            }
        }
    });
    Sse::new(stream).keep_alive(KeepAlive::default())
}
