//! The daemon's counters, in one process-wide Prometheus registry (`prometheus-client`,
//! the Prometheus project's own Rust client) that `/metrics` encodes. Fed from the
//! existing hooks: [`MetricsObserver`] for the agent loop, one-line calls elsewhere.
//!
//! Label values come from bounded sets only, and are escaped ([`label`]): the encoder
//! writes them as given, so a `"` or a newline in one would forge series. A tool name the
//! registry does not know (the model's invention) is `unknown`; a result code that is not
//! a code is `other`.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::agent::{AgentEvent, AgentObserver, TracingObserver, TurnEnd};
use crate::llm::Prices;
use crate::tool::ToolRegistry;

type Labels = Vec<(&'static str, String)>;

/// Every counter parlor keeps.
pub struct Metrics {
    registry: Registry,
    /// Turns by `platform` and `outcome`.
    pub turns: Family<Labels, Counter>,
    /// LLM requests by `model`.
    pub llm_requests: Family<Labels, Counter>,
    /// Seconds from an LLM request to its usage report, by `model`.
    pub llm_latency: Family<Labels, Histogram, fn() -> Histogram>,
    /// Tokens by the `model` that answered and `kind`: `prompt` (all of them, cached ones
    /// included), `completion`, `cache_read` and `cache_write` (parts of `prompt`).
    pub tokens: Family<Labels, Counter>,
    /// What those tokens cost at `[llm.prices]`, in US dollars, by `model` (a model without
    /// a price adds nothing).
    pub cost: Family<Labels, Counter<f64, AtomicU64>>,
    /// Tool calls by `tool` and `code` (`ok` or the result's code).
    pub tool_calls: Family<Labels, Counter>,
    /// Sessions held in memory.
    pub sessions: Gauge,
    /// Items waiting in the sessions' queues (a merged burst counts once).
    pub queued: Gauge,
    /// Background tasks by `status` (`running`, `completed`, `failed`, ...).
    pub background_tasks: Family<Labels, Gauge>,
    /// Platform send errors by `platform`.
    pub send_errors: Family<Labels, Counter>,
    /// Platform send retries by `platform`.
    pub send_retries: Family<Labels, Counter>,
    /// Clock task fires by `status`.
    pub clock_fires: Family<Labels, Counter>,
    /// Requests a fallback provider answered, by provider.
    pub llm_failovers: Family<Labels, Counter>,
    /// Chat leases this instance holds (several daemons on one store).
    pub chat_leases: Gauge,
    /// Chats taken over from another instance whose lease had expired.
    pub chat_lease_takeovers: Counter,
    /// Chat leases lost to another instance (this one stopped renewing in time).
    pub chat_leases_lost: Counter,
    /// Turn commits refused because another instance held the chat by then (the fence).
    pub fenced_commits: Counter,
    /// Seconds one lease renewal took (a round trip to the store).
    pub lease_renew_latency: Histogram,
    /// Seconds the store took to answer `/readyz`'s probe read.
    pub store_round_trip: Histogram,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("parlor");
        let turns = Family::<Labels, Counter>::default();
        registry.register("turns", "Turns by platform and outcome", turns.clone());
        let llm_requests = Family::<Labels, Counter>::default();
        registry.register(
            "llm_requests",
            "LLM requests by model",
            llm_requests.clone(),
        );
        let llm_latency: Family<Labels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(latency_histogram);
        registry.register(
            "llm_request_seconds",
            "Seconds from an LLM request to its usage report, by model",
            llm_latency.clone(),
        );
        let tokens = Family::<Labels, Counter>::default();
        registry.register(
            "llm_tokens",
            "Tokens by the model that answered and kind (prompt, completion, cache_read, cache_write)",
            tokens.clone(),
        );
        let cost = Family::<Labels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "llm_cost_usd",
            "What the tokens cost at the configured prices, in US dollars, by model",
            cost.clone(),
        );
        let tool_calls = Family::<Labels, Counter>::default();
        registry.register(
            "tool_calls",
            "Tool calls by tool and result code",
            tool_calls.clone(),
        );
        let sessions = Gauge::default();
        registry.register(
            "sessions_in_memory",
            "Sessions held in memory",
            sessions.clone(),
        );
        let queued = Gauge::default();
        registry.register(
            "queued_items",
            "Items waiting in the sessions' queues",
            queued.clone(),
        );
        let background_tasks = Family::<Labels, Gauge>::default();
        registry.register(
            "background_tasks",
            "Background tasks by status",
            background_tasks.clone(),
        );
        let send_errors = Family::<Labels, Counter>::default();
        registry.register(
            "platform_send_errors",
            "Platform send errors by platform",
            send_errors.clone(),
        );
        let send_retries = Family::<Labels, Counter>::default();
        registry.register(
            "platform_send_retries",
            "Platform send retries by platform",
            send_retries.clone(),
        );
        let clock_fires = Family::<Labels, Counter>::default();
        registry.register(
            "clock_fires",
            "Clock task fires by status",
            clock_fires.clone(),
        );
        let llm_failovers = Family::<Labels, Counter>::default();
        registry.register(
            "llm_failovers",
            "LLM requests a fallback provider answered, by provider",
            llm_failovers.clone(),
        );
        let chat_leases = Gauge::default();
        registry.register(
            "chat_leases",
            "Chat leases this instance holds",
            chat_leases.clone(),
        );
        let chat_lease_takeovers = Counter::default();
        registry.register(
            "chat_lease_takeovers",
            "Chats taken over from another instance whose lease had expired",
            chat_lease_takeovers.clone(),
        );
        let chat_leases_lost = Counter::default();
        registry.register(
            "chat_leases_lost",
            "Chat leases lost to another instance",
            chat_leases_lost.clone(),
        );
        let fenced_commits = Counter::default();
        registry.register(
            "fenced_commits",
            "Turn commits refused because another instance held the chat by then",
            fenced_commits.clone(),
        );
        // 1 ms to ~4 s: a store on the same network answers in the first buckets.
        let lease_renew_latency = Histogram::new(exponential_buckets(0.001, 2.0, 13));
        registry.register(
            "lease_renew_seconds",
            "Seconds one chat lease renewal took",
            lease_renew_latency.clone(),
        );
        let store_round_trip = Histogram::new(exponential_buckets(0.0001, 2.0, 16));
        registry.register(
            "store_probe_seconds",
            "Seconds the store took to answer the readiness probe's read",
            store_round_trip.clone(),
        );
        Metrics {
            registry,
            turns,
            llm_requests,
            llm_latency,
            tokens,
            cost,
            tool_calls,
            sessions,
            queued,
            background_tasks,
            send_errors,
            send_retries,
            clock_fires,
            llm_failovers,
            chat_leases,
            chat_lease_takeovers,
            chat_leases_lost,
            fenced_commits,
            lease_renew_latency,
            store_round_trip,
        }
    }
}

// 0.1 s to ~51 s: a local model answers in the first buckets, a long tool-laden turn in the last.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.1, 2.0, 10))
}

impl Metrics {
    /// The registry in the Prometheus text exposition format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail; an empty answer would be the only symptom.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "cannot encode the metrics");
        }
        out
    }

    /// Counts a platform send that failed for good.
    pub fn send_error(&self, platform: &str) {
        self.send_errors
            .get_or_create(&vec![("platform", label(platform))])
            .inc();
    }

    /// Counts a platform send that is tried again.
    pub fn send_retry(&self, platform: &str) {
        self.send_retries
            .get_or_create(&vec![("platform", label(platform))])
            .inc();
    }

    /// Sets the background task gauges to `counts` (status, tasks); a status not named
    /// goes to 0, so a finished kind does not keep its last figure.
    pub fn set_background_tasks(&self, counts: &[(&str, usize)]) {
        for status in BACKGROUND_STATUSES {
            let n = counts
                .iter()
                .filter(|(s, _)| s == status)
                .map(|(_, n)| *n)
                .sum::<usize>();
            self.background_tasks
                .get_or_create(&vec![("status", (*status).to_owned())])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Counts a request that fallback provider `name` answered.
    pub fn llm_failover(&self, name: &str) {
        self.llm_failovers
            .get_or_create(&vec![("provider", label(name))])
            .inc();
    }

    /// Counts a clock task fire by how it ended.
    pub fn clock_fire(&self, status: &str) {
        self.clock_fires
            .get_or_create(&vec![("status", label(status))])
            .inc();
    }
}

/// `value` as a label value may hold it: `\\`, `"` and newlines escaped as the text format
/// asks, so no value can end its label or its line.
pub fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A result code as a label: codes are `UPPER_SNAKE` and short; anything else is `other`.
fn code_label(code: &str) -> String {
    let is_code = !code.is_empty()
        && code.len() <= 48
        && code
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if is_code {
        code.to_owned()
    } else {
        "other".to_owned()
    }
}

/// Every status a background task can have, so each is exported (0 included).
const BACKGROUND_STATUSES: &[&str] = &[
    "running",
    "completed",
    "failed",
    "timed_out",
    "stopped",
    "interrupted",
];

/// The process's metrics.
pub fn global() -> &'static Metrics {
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    METRICS.get_or_init(Metrics::default)
}

/// Feeds the agent loop's events into [`global`] and on to the log.
pub struct MetricsObserver {
    model: String,
    /// Every model that may answer (the main one and its fallbacks): a model label is one of
    /// these or `other`.
    models: Vec<String>,
    prices: Prices,
    /// The tools whose names may be labels; without it every tool is `unknown`.
    tools: Option<ToolRegistry>,
    inner: Arc<dyn AgentObserver>,
    // When the latest LLM request of each session was sent; a handful of entries at most.
    sent: Mutex<Vec<(String, Instant)>>,
}

impl std::fmt::Debug for MetricsObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsObserver")
            .field("model", &self.model)
            .finish_non_exhaustive()
    }
}

impl MetricsObserver {
    /// Counts for `model`, then logs as [`TracingObserver`] does.
    pub fn new(model: impl Into<String>) -> Self {
        let model = model.into();
        MetricsObserver {
            models: vec![model.clone()],
            model: label(&model),
            prices: Prices::default(),
            tools: None,
            inner: Arc::new(TracingObserver),
            sent: Mutex::new(Vec::new()),
        }
    }

    /// Names the other models that may answer (fallbacks) and prices them all.
    #[must_use]
    pub fn with_models(
        mut self,
        fallbacks: impl IntoIterator<Item = String>,
        prices: Prices,
    ) -> Self {
        self.models.extend(fallbacks);
        self.prices = prices;
        self
    }

    /// `model` as a label: a configured one, else `other`.
    fn model_label(&self, model: &str) -> String {
        if self.models.iter().any(|m| m == model) {
            label(model)
        } else {
            "other".to_owned()
        }
    }

    /// Names tool calls by `tools` (a tool it does not know is `unknown`).
    #[must_use]
    pub fn with_tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = Some(tools);
        self
    }

    fn model(&self) -> Labels {
        vec![("model", self.model.clone())]
    }

    /// `name` if the registry has such a tool, else `unknown`: the model names tools, and
    /// its inventions must not each become a series.
    fn tool_label(&self, name: &str) -> String {
        let known = self.tools.as_ref().is_some_and(|tools| tools.has(name));
        if known {
            label(name)
        } else {
            "unknown".to_owned()
        }
    }
}

/// The platform part of a session key (`telegram:-100...` is `telegram`).
fn platform_of(session: &str) -> String {
    label(session.split(':').next().unwrap_or(session))
}

impl AgentObserver for MetricsObserver {
    fn on_event(&self, event: &AgentEvent<'_>) {
        let metrics = global();
        match *event {
            AgentEvent::LlmRequest { session, .. } => {
                metrics.llm_requests.get_or_create(&self.model()).inc();
                let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
                sent.retain(|(s, _)| s != session);
                sent.push((session.to_owned(), Instant::now()));
            }
            AgentEvent::Usage {
                session,
                model,
                usage,
            } => {
                let name = self.model_label(model);
                for (kind, tokens) in [
                    ("prompt", usage.prompt_tokens),
                    ("completion", usage.completion_tokens),
                    ("cache_read", usage.cache_read_tokens),
                    ("cache_write", usage.cache_write_tokens),
                ] {
                    let labels = vec![("model", name.clone()), ("kind", kind.to_owned())];
                    metrics.tokens.get_or_create(&labels).inc_by(tokens);
                }
                if let Some(nanos) = self.prices.cost_nanos(model, usage) {
                    metrics
                        .cost
                        .get_or_create(&vec![("model", name)])
                        .inc_by(nanos as f64 / 1e9);
                }
                let mut sent = self.sent.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(at) = sent.iter().position(|(s, _)| s == session) {
                    let (_, started) = sent.swap_remove(at);
                    metrics
                        .llm_latency
                        .get_or_create(&self.model())
                        .observe(started.elapsed().as_secs_f64());
                }
            }
            AgentEvent::ToolFinished { call, result, .. } => {
                let code = if result.success {
                    "ok".to_owned()
                } else {
                    result.code().map_or_else(|| "error".to_owned(), code_label)
                };
                metrics
                    .tool_calls
                    .get_or_create(&vec![
                        ("tool", self.tool_label(&call.function.name)),
                        ("code", code),
                    ])
                    .inc();
            }
            AgentEvent::TurnFinished { session, end, .. } => {
                let outcome = match end {
                    TurnEnd::Answered => "answered",
                    TurnEnd::IterationLimit => "iteration_limit",
                    TurnEnd::Cancelled => "cancelled",
                    TurnEnd::RepeatedToolCall => "repeated_tool_call",
                };
                metrics
                    .turns
                    .get_or_create(&vec![
                        ("platform", platform_of(session)),
                        ("outcome", outcome.to_owned()),
                    ])
                    .inc();
            }
            AgentEvent::ToolStarted { .. } => {}
        }
        self.inner.on_event(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_label_cannot_end_its_quotes_or_its_line() {
        assert_eq!(
            label("x\"} 1\nparlor_evil{a=\"b\\"),
            "x\\\"} 1\\nparlor_evil{a=\\\"b\\\\"
        );
        assert_eq!(code_label("TOOL_NOT_FOUND"), "TOOL_NOT_FOUND");
        assert_eq!(code_label("x\"}"), "other");
    }

    #[test]
    fn a_tool_the_registry_does_not_know_is_unknown() {
        let observer = MetricsObserver::new("m");
        assert_eq!(observer.tool_label("shell"), "unknown");
        let empty = ToolRegistry::new(Vec::new()).unwrap_or_else(|e| panic!("{e}"));
        let observer = observer.with_tools(empty);
        assert_eq!(observer.tool_label("x\"} 1\nparlor_evil{a=\"b"), "unknown");
    }
}
