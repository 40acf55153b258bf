//! Bounded retries around one platform call: every attempt under a timeout, the platform's
//! `retry_after` honoured, network and server trouble retried with backoff, everything else
//! returned.
//!
//! A helper taking a closure rather than a client middleware (a teloxide `Requester`
//! adaptor, a reqwest layer): the policy must see the adapter's own [`Failure`]
//! classification, which also covers file downloads, and each call site stays one readable
//! expression.

use std::future::Future;
use std::time::Duration;

use parlor_bot::backoff::Backoff;
use parlor_bot::platform::PlatformError;

/// What a failed attempt calls for.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The platform's rate limit (Telegram's flood control, Discord's 429): wait exactly
    /// this long, then the same request may succeed.
    RetryAfter(Duration),
    /// Network or server trouble (or a timeout on our side): retry with backoff.
    Transient(String),
    /// Retrying the same request cannot help.
    Fatal(PlatformError),
}

/// How patiently one kind of call is retried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// The platform as the logs name it (`Telegram`).
    pub platform: &'static str,
    /// Attempts in total while the platform keeps answering 429.
    pub rate_limited_attempts: u32,
    /// Attempts in total while the network or server keeps failing.
    pub transient_attempts: u32,
    /// The longest `retry_after` waited for inside a call; a longer one is returned as
    /// [`PlatformError::RateLimited`] so a turn never hangs on one message for minutes.
    pub max_retry_after: Duration,
    /// Waits between transient failures.
    pub backoff: Backoff,
    /// The limit on each attempt.
    pub attempt_timeout: Duration,
}

impl RetryPolicy {
    /// For calls whose result matters (sending, admins, files): 5 tries through flood
    /// control, 3 through network trouble.
    pub(crate) fn standard(
        platform: &'static str,
        backoff: Backoff,
        attempt_timeout: Duration,
    ) -> Self {
        RetryPolicy {
            platform,
            rate_limited_attempts: 5,
            transient_attempts: 3,
            max_retry_after: Duration::from_secs(60),
            backoff,
            attempt_timeout,
        }
    }

    /// This policy's platform and timeout with one attempt: for sends, which the outbox
    /// retries with the reply's progress.
    pub(crate) fn single(self) -> Self {
        RetryPolicy::once(self.platform, self.attempt_timeout)
    }

    /// For best-effort calls ("typing..."): one try; the next turn shows typing again anyway.
    pub(crate) fn once(platform: &'static str, attempt_timeout: Duration) -> Self {
        RetryPolicy {
            platform,
            rate_limited_attempts: 1,
            transient_attempts: 1,
            max_retry_after: Duration::ZERO,
            backoff: Backoff::default(),
            attempt_timeout,
        }
    }
}

/// Runs `attempt` until it succeeds, fails fatally, or the policy's budget is spent.
pub(crate) async fn with_retries<T, F, Fut>(
    method: &'static str,
    policy: &RetryPolicy,
    mut attempt: F,
) -> Result<T, PlatformError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Failure>>,
{
    let mut rate_limited = 0u32;
    let mut transient = 0u32;
    loop {
        let failure = match tokio::time::timeout(policy.attempt_timeout, attempt()).await {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(failure)) => failure,
            Err(_) => Failure::Transient(format!(
                "{method} timed out after {:?}",
                policy.attempt_timeout
            )),
        };
        match failure {
            Failure::Fatal(error) => return Err(error),
            Failure::RetryAfter(wait) => {
                rate_limited += 1;
                if rate_limited >= policy.rate_limited_attempts || wait > policy.max_retry_after {
                    return Err(PlatformError::RateLimited(wait));
                }
                tracing::warn!(
                    method,
                    ?wait,
                    attempt = rate_limited,
                    "rate limited by {}; waiting as asked",
                    policy.platform
                );
                tokio::time::sleep(wait).await;
            }
            Failure::Transient(message) => {
                transient += 1;
                if transient >= policy.transient_attempts {
                    return Err(PlatformError::Unavailable(message));
                }
                let wait = policy.backoff.delay(transient - 1);
                tracing::warn!(method, ?wait, attempt = transient, error = %message, "{} request failed; retrying", policy.platform);
                tokio::time::sleep(wait).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy::standard(
            "Test",
            Backoff {
                initial: Duration::from_secs(1),
                max: Duration::from_secs(60),
            },
            Duration::from_secs(10),
        )
    }

    /// `with_retries` over an attempt that fails with `failure()` every time: what it
    /// returned, how many attempts it made, how long it waited.
    async fn always(failure: impl Fn() -> Failure) -> (Result<(), PlatformError>, u32, Duration) {
        let calls = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let result = with_retries("sendMessage", &policy(), || {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err(failure()))
        })
        .await;
        (result, calls.load(Ordering::SeqCst), started.elapsed())
    }

    #[tokio::test(start_paused = true)]
    async fn retry_after_is_waited_exactly_then_retried() {
        let calls = AtomicU32::new(0);
        let started = tokio::time::Instant::now();
        let result = with_retries("sendMessage", &policy(), || async {
            if calls.fetch_add(1, Ordering::SeqCst) < 2 {
                Err(Failure::RetryAfter(Duration::from_secs(3)))
            } else {
                Ok(7)
            }
        })
        .await;
        assert_eq!(result.expect("third attempt succeeds"), 7);
        assert_eq!(started.elapsed(), Duration::from_secs(6));
    }

    #[tokio::test(start_paused = true)]
    async fn rate_limit_budget_is_bounded() {
        let (result, calls, waited) = always(|| Failure::RetryAfter(Duration::from_secs(1))).await;
        assert!(matches!(result, Err(PlatformError::RateLimited(_))));
        assert_eq!(calls, 5);
        // Four waits as asked, none after the last attempt.
        assert_eq!(waited, Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_long_retry_after_is_returned_not_slept() {
        let (result, _, waited) = always(|| Failure::RetryAfter(Duration::from_secs(3600))).await;
        assert!(
            matches!(result, Err(PlatformError::RateLimited(wait)) if wait == Duration::from_secs(3600))
        );
        assert_eq!(waited, Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_three_times_with_backoff() {
        let (result, calls, waited) =
            always(|| Failure::Transient("connection refused".into())).await;
        assert!(matches!(result, Err(PlatformError::Unavailable(m)) if m == "connection refused"));
        assert_eq!(calls, 3);
        // Two waits: [0.5, 1] s and [1, 2] s.
        assert!(waited >= Duration::from_millis(1500) && waited <= Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_hanging_attempt_times_out_and_counts_as_transient() {
        let calls = AtomicU32::new(0);
        let result: Result<(), _> = with_retries("getMe", &policy(), || async {
            calls.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<Result<(), Failure>>().await
        })
        .await;
        assert!(matches!(result, Err(PlatformError::Unavailable(m)) if m.contains("timed out")));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn fatal_errors_are_not_retried() {
        let (result, calls, _) = always(|| Failure::Fatal(PlatformError::Unauthorized)).await;
        assert!(matches!(result, Err(PlatformError::Unauthorized)));
        assert_eq!(calls, 1);
    }
}
