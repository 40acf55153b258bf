//! The sliding-window rate limit: at most `max` events in any `window`. Sessions pace their
//! turns with it and the Discord adapter its sends per channel.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The times of the last events inside the window, oldest first (at most `max` of them).
#[derive(Debug, Clone, Default)]
pub struct SlidingWindow {
    times: VecDeque<Instant>,
}

impl SlidingWindow {
    /// Takes a slot at `now` when fewer than `max` (at least one) events fell in the last
    /// `window`; otherwise says how long until the oldest leaves it.
    pub fn try_take(&mut self, now: Instant, max: usize, window: Duration) -> Result<(), Duration> {
        while self
            .times
            .front()
            .is_some_and(|t| now.duration_since(*t) >= window)
        {
            self.times.pop_front();
        }
        if self.times.len() < max.max(1) {
            self.times.push_back(now);
            return Ok(());
        }
        let oldest = self.times.front().copied().unwrap_or(now);
        Err(window.saturating_sub(now.duration_since(oldest)))
    }

    /// How many remembered events fell in the last `window` before `now`.
    pub fn count(&self, now: Instant, window: Duration) -> usize {
        self.times
            .iter()
            .filter(|t| now.duration_since(**t) < window)
            .count()
    }

    /// When the newest event was, if any is remembered.
    pub fn last(&self) -> Option<Instant> {
        self.times.back().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_window_admits_max_then_says_how_long_to_wait() {
        let mut w = SlidingWindow::default();
        let minute = Duration::from_secs(60);
        let start = Instant::now();
        assert!(w.try_take(start, 2, minute).is_ok());
        assert!(
            w.try_take(start + Duration::from_secs(10), 2, minute)
                .is_ok()
        );
        assert_eq!(
            w.try_take(start + Duration::from_secs(20), 2, minute),
            Err(Duration::from_secs(40))
        );
        assert!(w.try_take(start + minute, 2, minute).is_ok());
    }
}
