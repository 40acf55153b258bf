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
}
