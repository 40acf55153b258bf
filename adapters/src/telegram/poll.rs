//! The `getUpdates` long-poll loop, with acknowledgement only after durable delivery.
//!
//! Telegram acknowledges updates implicitly: a `getUpdates` call with `offset = N` confirms
//! every update below `N`. So `offset` here only ever moves past an update once the runtime
//! took it durably (or once it was found to be something parlor skips). A whole answer goes
//! to the runtime as one batch ([`Inbox::deliver_all`]): recorded in order, made durable
//! together (one flush for the batch, not one per update), then acknowledged; when the
//! runtime takes only a prefix, only that prefix is acknowledged. Whatever was not
//! delivered is fetched again by the next poll, or by the next process after a restart.

use std::sync::Arc;
use std::time::Duration;

use parlor_bot::backoff::Failures;
use parlor_bot::platform::{Delivery, Inbox, InboxError, PlatformError};
use serde_json::Value;
use teloxide_core::RequestError;
use teloxide_core::payloads::GetUpdatesSetters;
use teloxide_core::prelude::Requester;
use teloxide_core::types::{Update, UpdateKind};
use tokio_util::sync::CancellationToken;

use super::TelegramAdapter;
use super::convert::{Received, convert_update};
use crate::Receiver;
use crate::common::{Failure, pause};

/// How long the farewell acknowledgement at shutdown may take: shutdown must stay prompt,
/// and a missed acknowledgement only costs a re-delivery that the runtime dedupes.
const ACK_ON_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(1);

/// One element of a `getUpdates` answer.
enum Polled {
    Update(Box<Update>),
    /// An element even the lenient re-parse could not read; skipped so that one malformed
    /// update cannot stall the bot forever.
    Broken {
        id: Option<u32>,
        error: String,
    },
}

impl Polled {
    fn id(&self) -> Option<u32> {
        match self {
            Polled::Update(update) => Some(update.id.0),
            Polled::Broken { id, .. } => *id,
        }
    }
}

/// How delivering one batch ended.
enum Batch {
    /// Every update was delivered or skipped.
    Done,
    /// Shutdown (ours or the inbox's): stop without acknowledging the rest.
    Stopped,
    /// The inbox could not store a message: back off and fetch it again.
    StoreFailed,
}

impl Receiver for TelegramAdapter {
    /// Long-polls Telegram and delivers every message to `inbox` until `shutdown` is
    /// cancelled, then returns `Ok(())` promptly (an in-flight long poll is abandoned).
    ///
    /// `ready` is called once, right before `deleteWebhook` and the first `getUpdates`: the
    /// token was accepted at [`connect`](Self::connect) and from now on updates are
    /// received. The daemon hooks systemd's `READY=1` onto it. (Not after the first answer:
    /// on a quiet chat that takes a whole long-poll timeout.)
    ///
    /// An update is acknowledged (the next `getUpdates` offset moves past it) only after
    /// `inbox.deliver_all` took it durably. When the inbox answers `ShuttingDown`, the loop
    /// stops without acknowledging the rest; when it fails to store, the loop backs off and
    /// fetches the updates it did not take again. Failures never end the loop except a
    /// rejected token:
    /// - 409 Conflict (another process polls with this token, e.g. the old instance during
    ///   a restart): logged as an error, retried with backoff;
    /// - 429: waits exactly the `retry_after` Telegram asked for;
    /// - network trouble, timeouts, 5xx: exponential backoff with jitter (1 s .. 60 s by
    ///   default, see [`TelegramConfig::backoff`](super::TelegramConfig::backoff));
    /// - 401: returns [`PlatformError::Unauthorized`].
    ///
    /// Every wait also ends on `shutdown`.
    ///
    /// Polling starts with `deleteWebhook` (pending updates kept), since Telegram refuses
    /// `getUpdates` while a webhook is set. With [`TelegramConfig::webhook`](super::TelegramConfig::webhook)
    /// set, it registers the webhook instead and waits for shutdown (see [`super::webhook`]).
    async fn run_with_ready<R>(
        &self,
        inbox: Arc<dyn Inbox>,
        shutdown: CancellationToken,
        ready: R,
    ) -> Result<(), PlatformError>
    where
        R: FnOnce() + Send,
    {
        let config = &self.inner.config;
        if let Some(webhook) = &config.webhook {
            return self.run_webhook(webhook, shutdown, ready).await;
        }
        // The next `getUpdates` offset: every update below it was delivered or skipped.
        let mut offset: Option<i32> = None;
        // The offset Telegram has confirmed receiving (the last successful poll's).
        let mut acknowledged: Option<i32> = None;
        let mut failures = Failures::new(config.backoff);

        tracing::info!(
            username = ?self.inner.me.username,
            poll_timeout_secs = config.poll_timeout_secs,
            "polling Telegram for updates"
        );
        ready();
        // After `ready`, which promises only that the token works: a slow or failing
        // deleteWebhook must not hold back systemd's READY=1.
        tokio::select! {
            biased;
            () = shutdown.cancelled() => return Ok(()),
            deleted = self.delete_webhook() => match deleted {
                Ok(()) => {}
                Err(PlatformError::Unauthorized) => {
                    tracing::error!("Telegram rejected the bot token; stopping");
                    return Err(PlatformError::Unauthorized);
                }
                // The poll loop reports the conflict if a webhook is still set.
                Err(error) => tracing::warn!(%error, "could not remove a webhook before polling"),
            },
        }

        let mut poll_timeout = config.poll_timeout_secs;
        if let Some(lease) = &config.poll_lease {
            let period = u32::try_from(lease.period().as_secs()).unwrap_or(u32::MAX);
            poll_timeout = poll_timeout.min(period.max(1));
        }
        loop {
            if let Some(lease) = &config.poll_lease {
                // A daemon waiting for the poll is a standby, not a broken adapter.
                if !lease.hold(&shutdown).await {
                    break;
                }
            }
            let fetched = tokio::select! {
                biased;
                () = shutdown.cancelled() => break,
                fetched = self.fetch(offset, poll_timeout, None) => fetched,
            };
            let wait = match fetched {
                Ok(batch) => {
                    parlor_bot::health::global().set_ready("telegram");
                    acknowledged = offset;
                    match self
                        .deliver_batch(batch, inbox.as_ref(), &shutdown, &mut offset)
                        .await
                    {
                        Batch::Done => {
                            failures.reset();
                            continue;
                        }
                        Batch::Stopped => break,
                        Batch::StoreFailed => failures.next_delay(),
                    }
                }
                Err(Failure::RetryAfter(wait)) => {
                    tracing::warn!(?wait, "Telegram rate-limits getUpdates; waiting as asked");
                    wait
                }
                Err(Failure::Transient(error)) => {
                    let wait = failures.next_delay();
                    parlor_bot::health::global()
                        .set_down("telegram", format!("polling Telegram failed: {error}"));
                    tracing::warn!(%error, ?wait, "polling Telegram failed; retrying");
                    wait
                }
                Err(Failure::Fatal(PlatformError::Unauthorized)) => {
                    tracing::error!("Telegram rejected the bot token; stopping");
                    return Err(PlatformError::Unauthorized);
                }
                Err(Failure::Fatal(PlatformError::Conflict(description))) => {
                    let wait = failures.next_delay();
                    let secs = wait.as_secs_f32();
                    if description.contains("webhook") {
                        tracing::error!(
                            %description,
                            "a webhook is set for this bot token, so getUpdates cannot be used \
                             — remove it (deleteWebhook); retrying in {secs:.1}s"
                        );
                    } else {
                        tracing::error!(
                            %description,
                            "another process is polling with this bot token — only one parlor \
                             (or other bot) may use a token; retrying in {secs:.1}s"
                        );
                    }
                    wait
                }
                Err(Failure::Fatal(error)) => {
                    let wait = failures.next_delay();
                    parlor_bot::health::global()
                        .set_down("telegram", format!("Telegram refused getUpdates: {error}"));
                    tracing::error!(%error, ?wait, "Telegram refused getUpdates; retrying");
                    wait
                }
            };
            if !pause(wait, &shutdown).await {
                break;
            }
        }

        if let Some(offset) = offset
            && acknowledged != Some(offset)
        {
            self.acknowledge(offset).await;
        }
        if let Some(lease) = &config.poll_lease {
            // After the acknowledgement: the next poller starts past what was delivered.
            lease.release();
        }
        tracing::info!("stopped polling Telegram");
        Ok(())
    }
}

impl TelegramAdapter {
    /// One `getUpdates` call under the request timeout.
    async fn fetch(
        &self,
        offset: Option<i32>,
        timeout_secs: u32,
        limit: Option<u8>,
    ) -> Result<Vec<Polled>, Failure> {
        let mut request = self
            .inner
            .bot
            .get_updates()
            .timeout(timeout_secs)
            .allowed_updates(self.inner.allowed_updates.iter().copied());
        if let Some(offset) = offset {
            request = request.offset(offset);
        }
        if let Some(limit) = limit {
            request = request.limit(limit);
        }
        let timeout = self.inner.config.request_timeout();
        match tokio::time::timeout(timeout, request).await {
            Err(_) => Err(Failure::Transient(format!(
                "getUpdates timed out after {timeout:?}"
            ))),
            Ok(Ok(updates)) => Ok(updates
                .into_iter()
                .map(|update| Polled::Update(Box::new(update)))
                .collect()),
            Ok(Err(RequestError::InvalidJson { raw, source })) => match salvage(&raw) {
                Some(batch) => {
                    tracing::warn!(error = %source, "reading getUpdates leniently");
                    Ok(batch)
                }
                None => Err(self.fail(&RequestError::InvalidJson { raw, source })),
            },
            Ok(Err(error)) => Err(self.fail(&error)),
        }
    }

    /// Delivers a batch as one [`Inbox::deliver_all`], then moves `offset` past every
    /// update the inbox took (and every skipped one before the first it did not take).
    async fn deliver_batch(
        &self,
        batch: Vec<Polled>,
        inbox: &dyn Inbox,
        shutdown: &CancellationToken,
        offset: &mut Option<i32>,
    ) -> Batch {
        // Per update: its id and, unless skipped, the index of its delivery.
        let mut updates = Vec::with_capacity(batch.len());
        let mut deliveries = Vec::with_capacity(batch.len());
        for polled in batch {
            let update_id = polled.id();
            let delivery = match polled {
                Polled::Update(update) => self.incoming(&update).map(|received| match received {
                    Received::Message(m) => Delivery::Message(m),
                    Received::Event(e) => Delivery::Event(e),
                }),
                Polled::Broken { id, error } => {
                    tracing::warn!(update_id = ?id, %error, "skipping an update that cannot be read");
                    None
                }
            };
            let index = delivery.map(|delivery| {
                deliveries.push(delivery);
                deliveries.len() - 1
            });
            updates.push((update_id, index));
        }
        let count = deliveries.len();
        let delivered = if count == 0 {
            Ok(())
        } else {
            tokio::select! {
                biased;
                () = shutdown.cancelled() => return Batch::Stopped,
                delivered = inbox.deliver_all(deliveries) => delivered,
            }
        };
        let (taken, outcome) = match delivered {
            Ok(()) => (count, Batch::Done),
            Err(failed) => {
                let outcome = match failed.error {
                    InboxError::ShuttingDown => Batch::Stopped,
                    InboxError::Store(error) => {
                        tracing::error!(
                            taken = failed.durable, of = count, %error,
                            "could not store Telegram updates; the rest stay unacknowledged and are fetched again"
                        );
                        Batch::StoreFailed
                    }
                };
                (failed.durable.min(count), outcome)
            }
        };
        for (update_id, index) in updates {
            // The first update the inbox did not take, and everything after it, stays.
            if index.is_some_and(|index| index >= taken) {
                break;
            }
            if let Some(id) = update_id {
                let next = next_offset(id);
                *offset = Some(offset.map_or(next, |current| current.max(next)));
            }
        }
        tracing::debug!(taken, of = count, offset = ?offset, "delivered a batch");
        outcome
    }

    /// The message or event an update carries, normalized; `None` for everything parlor
    /// skips.
    pub(super) fn incoming(&self, update: &Update) -> Option<Received> {
        if let UpdateKind::Error(_) = &update.kind {
            tracing::warn!(
                update_id = update.id.0,
                "skipping an update teloxide cannot parse"
            );
            return None;
        }
        let received = convert_update(update, &self.inner.me);
        if received.is_none() {
            tracing::debug!(
                update_id = update.id.0,
                "skipping an update without a message, an event or text"
            );
        }
        received
    }

    /// Confirms delivered updates before exiting, so a clean restart does not fetch them
    /// again. `timeout=0, limit=1`: whatever this returns stays unacknowledged for the next
    /// run.
    async fn acknowledge(&self, offset: i32) {
        match tokio::time::timeout(
            ACK_ON_SHUTDOWN_TIMEOUT,
            self.fetch(Some(offset), 0, Some(1)),
        )
        .await
        {
            Ok(Ok(_)) => tracing::debug!(offset, "acknowledged delivered updates"),
            _ => tracing::debug!(
                offset,
                "could not acknowledge at shutdown; Telegram re-delivers, the runtime dedupes"
            ),
        }
    }
}

/// The offset that acknowledges update `id`.
fn next_offset(id: u32) -> i32 {
    i32::try_from(u64::from(id) + 1).unwrap_or(i32::MAX)
}

/// Reads a `getUpdates` answer element by element after teloxide failed on the whole, so
/// that one unreadable update is skipped instead of failing every poll forever.
fn salvage(raw: &str) -> Option<Vec<Polled>> {
    let value: Value = serde_json::from_str(raw).ok()?;
    if value.get("ok")?.as_bool()? {
        let items = value.get("result")?.as_array()?;
        Some(
            items
                .iter()
                .map(
                    |item| match serde_json::from_value::<Update>(item.clone()) {
                        Ok(update) => Polled::Update(Box::new(update)),
                        Err(error) => Polled::Broken {
                            id: item
                                .get("update_id")
                                .and_then(Value::as_u64)
                                .and_then(|id| u32::try_from(id).ok()),
                            error: error.to_string(),
                        },
                    },
                )
                .collect(),
        )
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salvage_keeps_good_updates_and_skips_broken_ones() {
        let raw = r#"{"ok":true,"result":[
            {"update_id":5,"message":{"message_id":1,"date":1,"chat":{"id":1,"type":"private"},"text":"hi"}},
            {"update_id":6,"message":"not an object"},
            {"no_id":true}
        ]}"#;
        let batch = salvage(raw).expect("valid JSON");
        assert_eq!(batch.len(), 3);
        assert!(matches!(&batch[0], Polled::Update(update) if update.id.0 == 5));
        // teloxide turns an unreadable message into `UpdateKind::Error`, keeping the id.
        assert_eq!(batch[1].id(), Some(6));
        assert!(matches!(&batch[2], Polled::Broken { id: None, .. }));
        assert!(salvage(r#"{"ok":false,"description":"x"}"#).is_none());
        assert!(salvage("<html>").is_none());
    }

    #[test]
    fn offsets_move_past_the_update() {
        assert_eq!(next_offset(41), 42);
        assert_eq!(next_offset(u32::MAX), i32::MAX);
    }
}
