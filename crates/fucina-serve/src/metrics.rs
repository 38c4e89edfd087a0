//! The server's counters and gauges, rendered in Prometheus' text format at
//! `GET /metrics`.

use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The counters and gauges the engine and the HTTP layer update. Every field is
/// an atomic (or a small mutex for the token rate), so updating costs no
/// allocation and rendering never blocks the engine for long.
#[derive(Debug)]
pub struct Metrics {
    requests: [AtomicU64; STATUS_CLASSES.len()],
    waiting: AtomicUsize,
    running: AtomicUsize,
    cache_bytes: AtomicUsize,
    budget_bytes: AtomicUsize,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    decode_steps: AtomicU64,
    mixed_steps: AtomicU64,
    completed: AtomicU64,
    cancelled: AtomicU64,
    failed: AtomicU64,
    ttft_micros_sum: AtomicU64,
    ttft_count: AtomicU64,
    ttft_micros_max: AtomicU64,
    prefix_hits: AtomicU64,
    prefix_hit_tokens: AtomicU64,
    prefix_bytes: AtomicUsize,
    prefix_budget: AtomicUsize,
    rate: Mutex<Rate>,
}

#[derive(Debug)]
struct Rate {
    since: Instant,
    tokens_at_since: u64,
    per_second: f64,
}

/// The HTTP status classes counted by [`Metrics::request`].
const STATUS_CLASSES: [&str; 6] = ["2xx", "400", "404", "413", "429", "5xx"];

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Default::default(),
            waiting: AtomicUsize::new(0),
            running: AtomicUsize::new(0),
            cache_bytes: AtomicUsize::new(0),
            budget_bytes: AtomicUsize::new(0),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            decode_steps: AtomicU64::new(0),
            mixed_steps: AtomicU64::new(0),
            completed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            ttft_micros_sum: AtomicU64::new(0),
            ttft_count: AtomicU64::new(0),
            ttft_micros_max: AtomicU64::new(0),
            prefix_hits: AtomicU64::new(0),
            prefix_hit_tokens: AtomicU64::new(0),
            prefix_bytes: AtomicUsize::new(0),
            prefix_budget: AtomicUsize::new(0),
            rate: Mutex::new(Rate {
                since: Instant::now(),
                tokens_at_since: 0,
                per_second: 0.0,
            }),
        }
    }
}

/// The window over which the token rate is measured.
const RATE_WINDOW: Duration = Duration::from_secs(1);

impl Metrics {
    /// Counts an answered HTTP request by its status: 2xx, 400, 404, 413, 429
    /// and 5xx are counted apart, other statuses are not counted.
    pub fn request(&self, status: u16) {
        let class = match status {
            200..=299 => 0,
            400 => 1,
            404 => 2,
            413 => 3,
            429 => 4,
            500..=599 => 5,
            _ => return,
        };
        self.requests[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Requests waiting for a place in the batch.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// Sequences in the running batch.
    pub fn running(&self) -> usize {
        self.running.load(Ordering::Relaxed)
    }

    /// Bytes of KV cache the running sequences hold.
    pub fn cache_bytes(&self) -> usize {
        self.cache_bytes.load(Ordering::Relaxed)
    }

    /// Tokens generated so far.
    pub fn generated_tokens(&self) -> u64 {
        self.generated_tokens.load(Ordering::Relaxed)
    }

    /// Batched decode steps run so far (mixed steps included).
    pub fn decode_steps(&self) -> u64 {
        self.decode_steps.load(Ordering::Relaxed)
    }

    /// Decode steps that carried a prompt chunk in the same pass
    /// (`Model::step`).
    pub fn mixed_steps(&self) -> u64 {
        self.mixed_steps.load(Ordering::Relaxed)
    }

    /// Sequences cancelled because their client went away.
    pub fn cancelled_count(&self) -> u64 {
        self.cancelled.load(Ordering::Relaxed)
    }

    /// Sequences that copied at least one block from the prefix cache.
    pub fn prefix_hits(&self) -> u64 {
        self.prefix_hits.load(Ordering::Relaxed)
    }

    /// Prompt positions copied from the prefix cache instead of prefilled.
    pub fn prefix_hit_tokens(&self) -> u64 {
        self.prefix_hit_tokens.load(Ordering::Relaxed)
    }

    /// Bytes of blocks the prefix cache holds.
    pub fn prefix_cache_bytes(&self) -> usize {
        self.prefix_bytes.load(Ordering::Relaxed)
    }

    pub(crate) fn prefix_hit(&self, tokens: usize, new_sequence: bool) {
        if new_sequence {
            self.prefix_hits.fetch_add(1, Ordering::Relaxed);
        }
        self.prefix_hit_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_prefix_cache(&self, bytes: usize) {
        self.prefix_bytes.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn set_prefix_budget(&self, bytes: usize) {
        self.prefix_budget.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn set_waiting(&self, n: usize) {
        self.waiting.store(n, Ordering::Relaxed);
    }

    pub(crate) fn set_running(&self, n: usize, cache_bytes: usize) {
        self.running.store(n, Ordering::Relaxed);
        self.cache_bytes.store(cache_bytes, Ordering::Relaxed);
    }

    pub(crate) fn set_budget(&self, bytes: usize) {
        self.budget_bytes.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn prompt_tokens(&self, n: usize) {
        self.prompt_tokens.fetch_add(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn generated_token(&self) {
        let total = self.generated_tokens.fetch_add(1, Ordering::Relaxed) + 1;
        let mut rate = self.rate.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = rate.since.elapsed();
        if elapsed >= RATE_WINDOW {
            rate.per_second = (total - rate.tokens_at_since) as f64 / elapsed.as_secs_f64();
            rate.since = Instant::now();
            rate.tokens_at_since = total;
        }
    }

    pub(crate) fn decode_step(&self) {
        self.decode_steps.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn mixed_step(&self) {
        self.mixed_steps.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn completed(&self) {
        self.completed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn cancelled(&self) {
        self.cancelled.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn failed(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn first_token(&self, after: Duration) {
        let us = u64::try_from(after.as_micros()).unwrap_or(u64::MAX);
        self.ttft_micros_sum.fetch_add(us, Ordering::Relaxed);
        self.ttft_count.fetch_add(1, Ordering::Relaxed);
        self.ttft_micros_max.fetch_max(us, Ordering::Relaxed);
    }

    /// The metrics in Prometheus' text exposition format.
    pub fn render(&self) -> String {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, lines: &[(String, String)]| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in lines {
                let _ = writeln!(out, "{name}{labels} {value}");
            }
        };
        let plain = |v: String| vec![(String::new(), v)];
        let requests: Vec<(String, String)> = STATUS_CLASSES
            .iter()
            .zip(&self.requests)
            .map(|(c, n)| (format!("{{status=\"{c}\"}}"), load(n).to_string()))
            .collect();
        metric(
            "fucina_requests_total",
            "counter",
            "HTTP requests answered, by status.",
            &requests,
        );
        metric(
            "fucina_queue_waiting",
            "gauge",
            "Requests waiting for a place in the batch.",
            &plain(self.waiting().to_string()),
        );
        metric(
            "fucina_sequences_running",
            "gauge",
            "Sequences in the running batch.",
            &plain(self.running().to_string()),
        );
        metric(
            "fucina_kv_cache_bytes",
            "gauge",
            "KV cache bytes the running sequences hold.",
            &plain(self.cache_bytes().to_string()),
        );
        metric(
            "fucina_kv_cache_budget_bytes",
            "gauge",
            "KV cache bytes the running sequences may hold together.",
            &plain(self.budget_bytes.load(Ordering::Relaxed).to_string()),
        );
        metric(
            "fucina_prefix_cache_bytes",
            "gauge",
            "Bytes of prompt-prefix blocks the prefix cache holds.",
            &plain(self.prefix_cache_bytes().to_string()),
        );
        metric(
            "fucina_prefix_cache_budget_bytes",
            "gauge",
            "The prefix cache's budget in bytes (0: off).",
            &plain(self.prefix_budget.load(Ordering::Relaxed).to_string()),
        );
        for (name, help, v) in [
            (
                "fucina_prompt_tokens_total",
                "Prompt tokens prefilled.",
                &self.prompt_tokens,
            ),
            (
                "fucina_generated_tokens_total",
                "Tokens generated.",
                &self.generated_tokens,
            ),
            (
                "fucina_decode_steps_total",
                "Batched decode steps (mixed steps included).",
                &self.decode_steps,
            ),
            (
                "fucina_mixed_steps_total",
                "Decode steps that carried a prompt chunk in the same pass.",
                &self.mixed_steps,
            ),
            (
                "fucina_sequences_completed_total",
                "Sequences that ended (stop or length).",
                &self.completed,
            ),
            (
                "fucina_sequences_cancelled_total",
                "Sequences dropped because their client went away.",
                &self.cancelled,
            ),
            (
                "fucina_sequences_failed_total",
                "Sequences that failed in the model's kernels.",
                &self.failed,
            ),
            (
                "fucina_prefix_cache_hits_total",
                "Sequences that copied prompt blocks from the prefix cache.",
                &self.prefix_hits,
            ),
            (
                "fucina_prefix_cache_hit_tokens_total",
                "Prompt positions copied from the prefix cache instead of prefilled.",
                &self.prefix_hit_tokens,
            ),
        ] {
            metric(name, "counter", help, &plain(load(v).to_string()));
        }
        let rate = {
            let r = self.rate.lock().unwrap_or_else(|p| p.into_inner());
            // No token for two windows: the rate is 0.
            if r.since.elapsed() > 2 * RATE_WINDOW {
                0.0
            } else {
                r.per_second
            }
        };
        metric(
            "fucina_tokens_per_second",
            "gauge",
            "Tokens generated per second over the last full one-second window.",
            &plain(format!("{rate:.3}")),
        );
        let secs = |us: u64| format!("{:.6}", us as f64 / 1e6);
        metric(
            "fucina_time_to_first_token_seconds",
            "summary",
            "Seconds from a request's arrival to its first token.",
            &[
                ("_sum".to_string(), secs(load(&self.ttft_micros_sum))),
                ("_count".to_string(), load(&self.ttft_count).to_string()),
            ],
        );
        metric(
            "fucina_time_to_first_token_max_seconds",
            "gauge",
            "The longest time to first token so far.",
            &plain(secs(load(&self.ttft_micros_max))),
        );
        out
    }
}
