//! Webhook mode the way Telegram runs it: `setWebhook` and `deleteWebhook` record the URL
//! and the secret token, `getUpdates` is refused with 409 while a webhook is set, and
//! [`FakeTelegram::deliver_webhook`] POSTs an update to the registered URL with the
//! registered secret in `X-Telegram-Bot-Api-Secret-Token`, as Telegram's delivery does.

use std::time::Duration;

use serde_json::{Value, json};

use super::FakeTelegram;
use super::builders::MessageBuilder;
use super::encoding::Params;
use super::http::{ApiErr, bad_request};
use super::state::Shared;
use crate::server::WaitTimeout;

/// The header Telegram sends the secret token in.
pub const SECRET_HEADER: &str = "X-Telegram-Bot-Api-Secret-Token";

/// How long one delivery may take before it counts as failed.
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The webhook as the latest `setWebhook` set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Webhook {
    /// `url`.
    pub url: String,
    /// `secret_token`, if given.
    pub secret_token: Option<String>,
    /// `allowed_updates`, if given.
    pub allowed_updates: Option<Vec<String>>,
    /// `drop_pending_updates`, if given.
    pub drop_pending_updates: Option<bool>,
}

/// Why [`FakeTelegram::deliver_webhook`] could not get an answer.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No `setWebhook` is in effect.
    #[error("no webhook is set")]
    NotSet,
    /// The POST failed before an answer came (refused, timed out...).
    #[error("the webhook request failed: {0}")]
    Request(String),
}

/// Telegram's rule for `secret_token`: 1-256 characters of `A-Za-z0-9_-`.
fn valid_secret(secret: &str) -> bool {
    (1..=256).contains(&secret.len())
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `setWebhook`: an empty `url` removes the webhook, as on Telegram.
pub(super) fn set_webhook(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let url = params.str("url").unwrap_or_default();
    if url.is_empty() {
        shared.lock().webhook = None;
        return Ok(json!(true));
    }
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(bad_request(
            "bad webhook: An HTTPS URL must be provided for webhook",
        ));
    }
    let secret_token = params.str("secret_token");
    if secret_token.as_deref().is_some_and(|s| !valid_secret(s)) {
        return Err(bad_request("secret token contains unallowed characters"));
    }
    let allowed_updates: Option<Vec<String>> = params.json("allowed_updates").and_then(|v| {
        v.as_array().map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
    });
    let drop_pending_updates = params
        .get("drop_pending_updates")
        .map(|_| params.bool("drop_pending_updates"));
    let mut inner = shared.lock();
    if drop_pending_updates == Some(true) {
        inner.updates.clear();
    }
    inner.webhook = Some(Webhook {
        url,
        secret_token,
        allowed_updates,
        drop_pending_updates,
    });
    Ok(json!(true))
}

/// `deleteWebhook`; `drop_pending_updates` empties the queue, as on Telegram.
pub(super) fn delete_webhook(shared: &Shared, params: &Params) -> Value {
    let mut inner = shared.lock();
    inner.webhook = None;
    if params.bool("drop_pending_updates") {
        inner.updates.clear();
    }
    json!(true)
}

/// `getWebhookInfo`.
pub(super) fn webhook_info(shared: &Shared) -> Value {
    let inner = shared.lock();
    json!({
        "url": inner.webhook.as_ref().map_or("", |w| w.url.as_str()),
        "has_custom_certificate": false,
        "pending_update_count": inner.updates.len(),
    })
}

impl FakeTelegram {
    /// The webhook in effect, if any.
    pub fn webhook(&self) -> Option<Webhook> {
        self.shared.lock().webhook.clone()
    }

    /// Sets a webhook as if some bot had called `setWebhook` earlier (say, a previous
    /// deployment in webhook mode): `getUpdates` is refused until `deleteWebhook`.
    pub fn set_webhook(&self, url: &str, secret_token: Option<&str>) {
        self.shared.lock().webhook = Some(Webhook {
            url: url.to_owned(),
            secret_token: secret_token.map(str::to_owned),
            allowed_updates: None,
            drop_pending_updates: None,
        });
        self.shared.changed.notify_waiters();
    }

    /// Waits until a webhook is set, then returns it.
    pub async fn wait_for_webhook(&self, timeout: Duration) -> Result<Webhook, WaitTimeout> {
        self.wait_until(timeout, |inner| {
            inner
                .webhook
                .clone()
                .ok_or_else(|| ("a webhook set".to_owned(), "none".to_owned()))
        })
        .await
    }

    /// Makes `update` one Telegram could deliver without queuing it for `getUpdates`: a
    /// missing `update_id` is assigned, and its chats, users and messages are remembered,
    /// as [`FakeTelegram::push_update`] does. Hand the result to
    /// [`FakeTelegram::deliver_webhook`] (as often as a test likes: a redelivery is the
    /// same JSON).
    pub fn webhook_update(&self, update: Value) -> Value {
        let mut update = match update {
            Value::Object(o) => Value::Object(o),
            other => json!({ "unknown": other }),
        };
        let mut inner = self.shared.lock();
        let id = match update.get("update_id").and_then(Value::as_i64) {
            Some(id) => id,
            None => {
                let id = inner.next_update_id;
                update["update_id"] = json!(id);
                id
            }
        };
        inner.next_update_id = inner.next_update_id.max(id + 1);
        inner.learn(&update);
        update
    }

    /// POSTs `update` to the webhook's URL with its secret token in
    /// `X-Telegram-Bot-Api-Secret-Token` (none if `setWebhook` gave none), as Telegram
    /// delivers; returns the HTTP status the bot answered.
    pub async fn deliver_webhook(&self, update: &Value) -> Result<u16, WebhookError> {
        let webhook = self.webhook().ok_or(WebhookError::NotSet)?;
        post(&webhook.url, update, webhook.secret_token.as_deref()).await
    }

    /// [`FakeTelegram::deliver_webhook`] with `secret` in the header instead (none:
    /// no header), to try the bot's check.
    pub async fn deliver_webhook_with_secret(
        &self,
        update: &Value,
        secret: Option<&str>,
    ) -> Result<u16, WebhookError> {
        let webhook = self.webhook().ok_or(WebhookError::NotSet)?;
        post(&webhook.url, update, secret).await
    }
}

impl MessageBuilder<'_> {
    /// Builds the message and wraps it as a webhook update
    /// (`{"update_id":..,"message":..}`, see [`FakeTelegram::webhook_update`]) without
    /// queuing it for `getUpdates`.
    pub fn webhook_update(self) -> Value {
        let fake = self.fake();
        let message = self.build();
        fake.webhook_update(json!({ "message": message }))
    }
}

async fn post(url: &str, update: &Value, secret: Option<&str>) -> Result<u16, WebhookError> {
    let client = reqwest::Client::builder()
        .timeout(DELIVERY_TIMEOUT)
        .no_proxy()
        .build()
        .map_err(|e| WebhookError::Request(e.to_string()))?;
    let mut request = client.post(url).json(update);
    if let Some(secret) = secret {
        request = request.header(SECRET_HEADER, secret);
    }
    let answer = request
        .send()
        .await
        .map_err(|e| WebhookError::Request(e.to_string()))?;
    Ok(answer.status().as_u16())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_follow_telegrams_rule() {
        assert!(valid_secret("abc_DEF-123"));
        assert!(valid_secret(&"a".repeat(256)));
        assert!(!valid_secret(""));
        assert!(!valid_secret(&"a".repeat(257)));
        assert!(!valid_secret("no spaces"));
    }
}
