//! Bounded retries with backoff, as a decorator around any [`LlmBackend`].
//!
//! Retrying lives outside the HTTP client so that every backend (and every test double)
//! gets the same policy, and so that the client itself stays one request, one answer.

use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

use super::wire::{ChatRequest, Completion};
use super::{LlmBackend, LlmError};
use crate::backoff::Backoff;

/// How often and how patiently a failed request is retried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first attempt; `0` disables retrying.
    pub max_retries: u32,
    /// The wait before the first retry; doubled for every further one.
    pub initial_backoff: Duration,
    /// The longest computed wait (a server's `Retry-After` may ask for longer).
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 3,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The longest `Retry-After` obeyed; a server asking for more is waited on only this long,
    /// so a chat never hangs for an hour on one header.
    pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

    /// The wait before retry number `retry` (0-based): `initial_backoff * 2^retry`, capped
    /// at `max_backoff`, then jittered down by up to half so that many sessions hitting the
    /// same outage do not retry in lockstep. Always within `[cap / 2, cap]`.
    pub fn backoff(&self, retry: u32) -> Duration {
        Backoff {
            initial: self.initial_backoff,
            max: self.max_backoff,
        }
        .delay(retry)
    }

    /// The wait before retry number `retry` after `error`: the server's `Retry-After` when it
    /// sent one (capped at [`Self::MAX_RETRY_AFTER`]), otherwise [`Self::backoff`].
    pub fn delay_for(&self, retry: u32, error: &LlmError) -> Duration {
        match error {
            LlmError::Status {
                retry_after: Some(after),
                ..
            } => (*after).min(Self::MAX_RETRY_AFTER),
            _ => self.backoff(retry),
        }
    }
}

/// An [`LlmBackend`] that retries its inner backend when the error
/// [is retryable](LlmError::is_retryable), at most `policy.max_retries` times, waiting
/// [`RetryPolicy::delay_for`] in between. Cancellation ends a wait at once.
#[derive(Debug, Clone)]
pub struct Retrying<B> {
    inner: B,
    policy: RetryPolicy,
}

impl<B> Retrying<B> {
    /// Wraps `inner` with `policy`.
    pub fn new(inner: B, policy: RetryPolicy) -> Self {
        Retrying { inner, policy }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    /// The policy in force.
    pub fn policy(&self) -> &RetryPolicy {
        &self.policy
    }

    /// Unwraps the inner backend.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

#[async_trait]
impl<B: LlmBackend> LlmBackend for Retrying<B> {
    async fn stream(
        &self,
        request: &ChatRequest,
        cancel: &CancellationToken,
    ) -> Result<Completion, LlmError> {
        let mut retry = 0u32;
        loop {
            let error = match self.inner.stream(request, cancel).await {
                Ok(completion) => return Ok(completion),
                Err(e) => e,
            };
            if !error.is_retryable() || retry >= self.policy.max_retries {
                return Err(error);
            }
            if cancel.is_cancelled() {
                return Err(LlmError::Cancelled);
            }
            let delay = self.policy.delay_for(retry, &error);
            retry += 1;
            // The error text never holds the key: the client redacts it from bodies.
            tracing::warn!(
                retry,
                max_retries = self.policy.max_retries,
                delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
                model = %request.model,
                error = %error,
                "LLM request failed; retrying"
            );
            tokio::select! {
                biased;
                () = cancel.cancelled() => return Err(LlmError::Cancelled),
                () = tokio::time::sleep(delay) => {}
            }
        }
    }
}
