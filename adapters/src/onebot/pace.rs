//! Pacing per chat: posts into one chat at least a minimum interval apart, because QQ's
//! risk control bans accounts that post too fast; other chats are not held up.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Chats remembered before quiet ones are forgotten.
const REMEMBERED: usize = 1024;

/// The next free moment of each chat.
pub(crate) struct Pacer {
    interval: Duration,
    next: Mutex<HashMap<String, Instant>>,
}

impl Pacer {
    pub(crate) fn new(interval: Duration) -> Pacer {
        Pacer {
            interval,
            next: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for `chat`'s turn and takes it: the slot is booked before the wait, so posts
    /// queued together leave one interval apart, in the order they asked.
    pub(crate) async fn wait(&self, chat: &str) {
        if self.interval.is_zero() {
            return;
        }
        let slot = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let now = Instant::now();
            if next.len() > REMEMBERED {
                next.retain(|_, free| *free > now);
            }
            let free = next.get(chat).copied().unwrap_or(now).max(now);
            next.insert(chat.to_owned(), free + self.interval);
            free
        };
        tokio::time::sleep_until(slot).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn posts_into_one_chat_keep_the_interval_and_other_chats_do_not_wait() {
        let pacer = Pacer::new(Duration::from_secs(1));
        let start = Instant::now();
        pacer.wait("qq:group:1").await;
        pacer.wait("qq:group:2").await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        pacer.wait("qq:group:1").await;
        assert_eq!(start.elapsed(), Duration::from_secs(1));
        pacer.wait("qq:group:1").await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        tokio::time::sleep(Duration::from_secs(5)).await;
        let later = Instant::now();
        pacer.wait("qq:group:1").await;
        assert_eq!(
            later.elapsed(),
            Duration::ZERO,
            "a quiet chat posts at once"
        );
    }
}
