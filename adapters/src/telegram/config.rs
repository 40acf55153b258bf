//! The adapter's settings, with Telegram's own limits as defaults.

use std::time::Duration;

use secrecy::SecretString;

/// Waits between retries of failed requests (shared with the other clients).
pub use parlor_bot::backoff::Backoff;

/// Telegram's public Bot API server.
pub const DEFAULT_API_URL: &str = "https://api.telegram.org";

/// Telegram's `getFile` download limit for bots (20 MB).
pub const TELEGRAM_MAX_DOWNLOAD_BYTES: u64 = 20 * 1024 * 1024;

/// The update types asked for by default (see [`TelegramConfig::allowed_updates`]).
pub const DEFAULT_ALLOWED_UPDATES: &[&str] = &[
    "message",
    "edited_message",
    "my_chat_member",
    "callback_query",
];

/// How the Telegram adapter connects and behaves.
///
/// `Debug` never shows the token, so the whole config may be logged.
#[derive(Clone, Debug)]
pub struct TelegramConfig {
    /// The bot token from @BotFather. A secret: the daemon reads it from the environment or a
    /// file; it is never logged (`SecretString`'s `Debug` hides it, error texts are scrubbed
    /// of it).
    pub token: SecretString,
    /// The Bot API server. Requests go to `{api_url}/bot{token}/{method}`; a local
    /// `telegram-bot-api` server or a test fake can stand in for Telegram here.
    pub api_url: String,
    /// How long one `getUpdates` long poll may wait for updates on the server (seconds).
    /// Longer means fewer requests while the group is quiet.
    pub poll_timeout_secs: u32,
    /// The HTTP timeout of every request, long polls included; `None` means
    /// `poll_timeout_secs + 15`. Always raised to at least `poll_timeout_secs + 5`, because a
    /// long poll that times out on our side before Telegram answers would never deliver.
    pub request_timeout_secs: Option<u32>,
    /// The largest image [`download_image`](parlor_bot::platform::Platform::download_image)
    /// will fetch; bigger files are refused before (or while) downloading.
    pub max_image_bytes: u64,
    /// The update types asked for, as Telegram spells them. parlor reads `message`
    /// (messages, and a group's upgrade to a supergroup), `edited_message` (an edit updates
    /// the chat log, and the input while it waits for its turn), `my_chat_member` (the
    /// bot added to or removed from a chat) and `callback_query` (a press of the bot's
    /// buttons), the default; other types are acknowledged and skipped. Telegram reports no
    /// deletions to bots.
    pub allowed_updates: Vec<String>,
    /// Waits between retries of failed requests (network trouble, 409 conflicts).
    pub backoff: Backoff,
    /// Webhook mode when set: Telegram POSTs updates to a URL instead of parlor polling
    /// (see [`webhook`](super::webhook)). `None`, the default, long-polls `getUpdates`.
    pub webhook: Option<WebhookConfig>,
    /// Several daemons sharing one store (`[cluster]`): only the holder of this lease polls
    /// (Telegram answers 409 to a second poller), each poll then lasting at most a third of
    /// the lease so the holder renews in time; the others wait to take it over.
    pub poll_lease: Option<std::sync::Arc<parlor_bot::session::lease::Keeper>>,
}

/// Where Telegram posts updates in webhook mode, and how it proves it is Telegram.
///
/// `Debug` never shows the secret token.
#[derive(Clone, Debug)]
pub struct WebhookConfig {
    /// The public HTTPS URL given to `setWebhook`. The receiving route is its path, so a
    /// proxy in front must pass the path on unchanged.
    pub url: String,
    /// The `secret_token` of `setWebhook`: Telegram sends it back in the
    /// `X-Telegram-Bot-Api-Secret-Token` header of every update, and a request without it
    /// is refused. 1-256 characters of `A-Za-z0-9_-` (the caller checks).
    pub secret_token: SecretString,
}

impl TelegramConfig {
    /// A config for `token` with every other setting at its default.
    pub fn new(token: impl Into<SecretString>) -> Self {
        TelegramConfig {
            token: token.into(),
            api_url: DEFAULT_API_URL.to_owned(),
            poll_timeout_secs: 30,
            request_timeout_secs: None,
            max_image_bytes: TELEGRAM_MAX_DOWNLOAD_BYTES,
            allowed_updates: DEFAULT_ALLOWED_UPDATES
                .iter()
                .map(|&kind| kind.to_owned())
                .collect(),
            backoff: Backoff::default(),
            webhook: None,
            poll_lease: None,
        }
    }

    /// The HTTP timeout applied to every request (see
    /// [`request_timeout_secs`](Self::request_timeout_secs)).
    pub fn request_timeout(&self) -> Duration {
        let poll = u64::from(self.poll_timeout_secs);
        let configured = self.request_timeout_secs.map_or(poll + 15, u64::from);
        Duration::from_secs(configured.max(poll + 5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token() {
        let config = TelegramConfig::new("123456:SECRET-token");
        let shown = format!("{config:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("REDACTED"), "{shown}");
    }

    #[test]
    fn request_timeout_exceeds_the_long_poll() {
        let mut config = TelegramConfig::new("t");
        assert_eq!(config.request_timeout(), Duration::from_secs(45));
        config.request_timeout_secs = Some(10);
        assert_eq!(config.request_timeout(), Duration::from_secs(35));
        config.request_timeout_secs = Some(100);
        assert_eq!(config.request_timeout(), Duration::from_secs(100));
    }
}
