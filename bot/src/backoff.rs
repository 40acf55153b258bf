//! Exponential backoff with jitter, shared by every client that retries: the LLM client and
//! the platform adapters.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

/// Waits between retries: `initial * 2^retry`, capped at `max`, then jittered down by up to
/// half so that many sessions (or a restart after an outage) do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The wait after the first failure.
    pub initial: Duration,
    /// The longest wait.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
        }
    }
}

impl Backoff {
    /// The wait before retry number `retry` (0-based); always within `[cap / 2, cap]`.
    pub fn delay(&self, retry: u32) -> Duration {
        let cap = self
            .initial
            .saturating_mul(2u32.saturating_pow(retry.min(31)))
            .min(self.max);
        let half = cap / 2;
        let span = u64::try_from((cap - half).as_nanos()).unwrap_or(u64::MAX);
        let jitter = if span == 0 {
            0
        } else {
            random_u64() % (span.saturating_add(1))
        };
        half + Duration::from_nanos(jitter)
    }
}

/// A run of consecutive failures and the waits it has earned: each failure waits longer, a
/// success starts over. For loops that retry forever (a poll, a gateway) rather than a
/// bounded number of times.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    backoff: Backoff,
    count: u32,
}

impl Failures {
    /// No failures yet.
    pub fn new(backoff: Backoff) -> Self {
        Failures { backoff, count: 0 }
    }

    /// Counts one more failure; the wait before the next try.
    pub fn next_delay(&mut self) -> Duration {
        let wait = self.backoff.delay(self.count);
        self.count = self.count.saturating_add(1);
        wait
    }

    /// Forgets the failures: the next one waits as little as the first.
    pub fn reset(&mut self) {
        self.count = 0;
    }

    /// Consecutive failures so far.
    pub fn count(&self) -> u32 {
        self.count
    }
}

/// Randomness good enough for jitter without a dependency: std seeds every `RandomState`
/// differently.
fn random_u64() -> u64 {
    RandomState::new().hash_one(0u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_stay_jittered_within_half() {
        let b = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(8),
        };
        for (retry, cap) in [(0, 1), (1, 2), (2, 4), (3, 8), (10, 8), (40, 8)] {
            let cap = Duration::from_secs(cap);
            for _ in 0..50 {
                let d = b.delay(retry);
                assert!(d >= cap / 2 && d <= cap, "{retry}: {d:?}");
            }
        }
    }

    #[test]
    fn the_default_waits_one_second_to_a_minute() {
        let backoff = Backoff::default();
        for retry in 0..40 {
            let cap = Duration::from_secs(1)
                .saturating_mul(2u32.saturating_pow(retry.min(31)))
                .min(Duration::from_secs(60));
            let delay = backoff.delay(retry);
            assert!(delay >= cap / 2 && delay <= cap, "{retry}: {delay:?}");
        }
        assert!(backoff.delay(100) <= Duration::from_secs(60));
    }

    #[test]
    fn failures_grow_the_wait_until_reset() {
        let mut failures = Failures::new(Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(4),
        });
        for cap in [1, 2, 4, 4] {
            let d = failures.next_delay();
            assert!(d <= Duration::from_secs(cap) && d >= Duration::from_secs(cap) / 2);
        }
        assert_eq!(failures.count(), 4);
        failures.reset();
        assert_eq!(failures.count(), 0);
        assert!(failures.next_delay() <= Duration::from_secs(1));
    }
}
