//! A failover chain of providers, as one [`LlmBackend`]: the primary first, then each
//! `[[llm.fallbacks]]` entry in order, each with its own model, key and retries.
//!
//! A link is left for the next one only when the error says the provider, not the request,
//! is at fault ([`fails_over`]): it cannot be reached or timed out, it answered 5xx or 529
//! (overloaded), it is still rate limiting after its retries, it does not know the model,
//! it refuses the key, or its quota is spent. A request the provider refused as such (a 400,
//! a context too long) goes back to the caller at once: the next provider would refuse it
//! too. A cancel ends the chain.
//!
//! Each link has a circuit breaker: after [`Breaker::FAILURES_TO_OPEN`] failures in a row it
//! is left out for a while (30 s, doubling with each failed probe up to 10 minutes), so a
//! provider that is down does not cost every turn its timeouts and retries first. When the
//! while is over, one request probes it (half-open): success closes the breaker, failure
//! opens it again. When every link is left out, all are tried anyway, in order: a slow
//! answer beats silence.
//!
//! Every caller of the agent's backend (turns, clock fires, sub-agents, summaries) goes
//! through the chain, because the chain is that backend.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::wire::{ChatRequest, Completion};
use super::{LlmBackend, LlmError};

/// One provider of the chain.
pub struct Link {
    /// How logs and metrics name it (its model, say).
    pub name: String,
    /// The model to ask for; `None` keeps the request's (the primary's own).
    pub model: Option<String>,
    /// Its client, with its own retries.
    pub llm: Arc<dyn LlmBackend>,
}

/// The chain: see the module docs.
pub struct Failover {
    links: Vec<(Link, Mutex<Breaker>)>,
}

impl Failover {
    /// A chain trying `links` in order; the first is the primary.
    pub fn new(links: Vec<Link>) -> Self {
        Failover {
            links: links
                .into_iter()
                .map(|link| (link, Mutex::new(Breaker::default())))
                .collect(),
        }
    }

    fn breaker(&self, index: usize) -> Option<MutexGuard<'_, Breaker>> {
        self.links
            .get(index)
            // A poisoned breaker is still a consistent one: each update is one assignment.
            .map(|(_, breaker)| breaker.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Asks link `index`; `Err` with the error when the next link should be asked.
    async fn ask(
        &self,
        index: usize,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Result<Completion, LlmError>, LlmError> {
        let Some((link, _)) = self.links.get(index) else {
            return Err(LlmError::Connect("no such LLM provider".into()));
        };
        let request = match &link.model {
            Some(model) if *model != request.model => {
                let mut own = request.clone();
                own.model.clone_from(model);
                Cow::Owned(own)
            }
            _ => Cow::Borrowed(request),
        };
        let result = link.llm.stream(&request, cancel).await;
        let mut breaker = self.breaker(index);
        let Some(breaker) = breaker.as_deref_mut() else {
            return Ok(result);
        };
        match result {
            Ok(mut completion) => {
                completion.model = Some(request.model.clone());
                breaker.succeeded();
                if index > 0 {
                    tracing::info!(provider = %link.name, "a fallback provider answered");
                    crate::metrics::global().llm_failover(&link.name);
                }
                Ok(Ok(completion))
            }
            // A cancel says nothing of the provider; a probe cut short is given back.
            Err(LlmError::Cancelled) => {
                breaker.probing = false;
                Ok(Err(LlmError::Cancelled))
            }
            Err(error) if fails_over(&error) => {
                breaker.failed(Instant::now());
                if index + 1 < self.links.len() {
                    tracing::warn!(provider = %link.name, %error, "the provider failed; trying the next one");
                }
                Err(error)
            }
            // The request's own fault: the provider answered, which is all a probe asks.
            Err(error) => {
                breaker.succeeded();
                Ok(Err(error))
            }
        }
    }
}

#[async_trait]
impl LlmBackend for Failover {
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        let mut last = None;
        let mut asked = false;
        for index in 0..self.links.len() {
            // Asked one at a time: a half-open link's probe is taken only when it is used.
            if !self
                .breaker(index)
                .is_some_and(|mut b| b.admit(Instant::now()))
            {
                continue;
            }
            asked = true;
            match self.ask(index, request, cancel).await {
                Ok(result) => return result,
                Err(error) => last = Some(error),
            }
        }
        if !asked {
            // Every link is left out: try them all anyway.
            for index in 0..self.links.len() {
                match self.ask(index, request, cancel).await {
                    Ok(result) => return result,
                    Err(error) => last = Some(error),
                }
            }
        }
        Err(last.unwrap_or_else(|| LlmError::Connect("no LLM provider is configured".into())))
    }
}

/// Whether `error` says the provider (not the request) failed, so the next one may answer:
/// see the module docs.
pub fn fails_over(error: &LlmError) -> bool {
    match error {
        LlmError::Connect(_)
        | LlmError::Timeout(_)
        | LlmError::NoAnswerYet(_)
        | LlmError::Interrupted(_)
        | LlmError::Stream(_)
        | LlmError::Malformed(_) => true,
        LlmError::Cancelled => false,
        LlmError::Status { status, body, .. } => {
            let body = body.to_ascii_lowercase();
            let quota = ["quota", "billing", "credit", "insufficient_balance"]
                .iter()
                .any(|word| body.contains(word));
            let no_model = body.contains("model_not_found")
                || body.contains("model not found")
                || (body.contains("model") && body.contains("does not exist"));
            match status {
                // Rate limited after the link's own retries, overloaded, or down.
                429 | 500.. => true,
                // The key is refused or has no rights: this provider cannot answer anyone.
                401..=403 => true,
                404 => true,
                400 | 422 => no_model || quota,
                _ => false,
            }
        }
    }
}

/// A link's circuit breaker: see the module docs.
#[derive(Debug, Default)]
struct Breaker {
    /// Failures in a row.
    failures: u32,
    /// Times it opened in a row (the wait doubles with each).
    opened: u32,
    /// Left out until then.
    until: Option<Instant>,
    /// A half-open probe is out: other requests still leave the link out.
    probing: bool,
}

impl Breaker {
    /// Failures in a row that leave a link out.
    const FAILURES_TO_OPEN: u32 = 3;
    /// How long a link is first left out.
    const OPEN_FOR: Duration = Duration::from_secs(30);
    /// The longest it is left out.
    const MAX_OPEN_FOR: Duration = Duration::from_secs(600);

    /// Whether a request may use the link now; the first one after an open while is the
    /// probe.
    fn admit(&mut self, now: Instant) -> bool {
        match self.until {
            None => true,
            Some(_) if self.probing => false,
            Some(until) if now >= until => {
                self.probing = true;
                true
            }
            Some(_) => false,
        }
    }

    fn succeeded(&mut self) {
        *self = Breaker::default();
    }

    fn failed(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        if self.probing || self.failures >= Self::FAILURES_TO_OPEN {
            let wait = Self::OPEN_FOR
                .saturating_mul(1 << self.opened.min(5))
                .min(Self::MAX_OPEN_FOR);
            self.opened = self.opened.saturating_add(1);
            self.until = Some(now + wait);
            self.probing = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(status: u16, body: &str) -> LlmError {
        LlmError::Status {
            status,
            body: body.to_owned(),
            retry_after: None,
        }
    }

    #[test]
    fn provider_faults_fail_over_and_request_faults_do_not() {
        for error in [
            status(500, ""),
            status(502, "bad gateway"),
            status(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
            ),
            status(429, "rate limited"),
            status(404, r#"{"error":{"code":"model_not_found"}}"#),
            status(400, "The model `gpt-9` does not exist"),
            status(401, "invalid api key"),
            status(400, "You exceeded your current quota"),
            LlmError::Timeout(Duration::from_secs(60)),
            LlmError::Connect("refused".into()),
        ] {
            assert!(fails_over(&error), "{error}");
        }
        for error in [
            status(400, r#"{"error":{"code":"context_length_exceeded"}}"#),
            status(400, "messages: roles must alternate"),
            status(413, "too large"),
            LlmError::Cancelled,
        ] {
            assert!(!fails_over(&error), "{error}");
        }
    }

    #[test]
    fn a_breaker_opens_after_failures_and_lets_one_probe_through_later() {
        let start = Instant::now();
        let mut breaker = Breaker::default();
        for _ in 0..Breaker::FAILURES_TO_OPEN {
            assert!(breaker.admit(start));
            breaker.failed(start);
        }
        assert!(!breaker.admit(start), "open");
        let later = start + Breaker::OPEN_FOR;
        assert!(breaker.admit(later), "the probe");
        assert!(!breaker.admit(later), "one probe at a time");
        breaker.failed(later);
        assert!(
            !breaker.admit(later + Breaker::OPEN_FOR),
            "open twice as long after a failed probe"
        );
        let again = later + Breaker::OPEN_FOR * 2;
        assert!(breaker.admit(again));
        breaker.succeeded();
        assert!(breaker.admit(again) && breaker.admit(again), "closed");
    }
}
