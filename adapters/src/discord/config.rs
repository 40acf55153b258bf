//! The Discord adapter's settings.

use std::time::Duration;

use secrecy::SecretString;

/// Discord's attachment size limit for bots without boosts (25 MiB); a sensible cap for
/// images the model may look at.
pub const DISCORD_MAX_IMAGE_BYTES: u64 = 25 * 1024 * 1024;

/// How the Discord adapter connects and behaves.
///
/// `Debug` never shows the token, so the whole config may be logged.
#[derive(Clone, Debug)]
pub struct DiscordConfig {
    /// The bot token (Developer Portal -> Bot -> Token). A secret: never logged.
    pub token: SecretString,
    /// Where REST calls go instead of `https://discord.com` (a proxy, or a test fake); the
    /// gateway URL is then whatever `GET {api_url}/api/v10/gateway` answers. `None`: Discord.
    pub api_url: Option<String>,
    /// Whether replies may ping `@everyone`, `@here` and roles. Off by default: only user
    /// mentions written as `<@id>` ping.
    pub allow_mass_mentions: bool,
    /// The largest image [`download_image`](parlor_bot::platform::Platform::download_image)
    /// fetches.
    pub max_image_bytes: u64,
    /// The limit on each REST request.
    pub request_timeout: Duration,
    /// Messages parlor sends to one channel per [`send_window`](Self::send_window)
    /// (Discord allows 5 per 5 s per channel; serenity's own limiter is off when `api_url`
    /// is set, so parlor paces itself).
    pub sends_per_window: usize,
    /// See [`sends_per_window`](Self::sends_per_window).
    pub send_window: Duration,
    /// How many shards the bot's gateway is split into (Discord requires several past 2,500
    /// servers); each shard is one connection, carrying the servers with
    /// `(server id >> 22) % shards` equal to its number. 1: one connection.
    pub shards: u32,
    /// Several daemons on one store (`[cluster]`): one lease per shard, by shard number;
    /// a shard runs only in the daemon holding its lease, and the others wait to take it.
    /// Empty: every shard runs here.
    pub shard_leases: Vec<std::sync::Arc<parlor_bot::session::lease::Keeper>>,
}

impl DiscordConfig {
    /// A config for `token` with every other setting at its default.
    pub fn new(token: impl Into<SecretString>) -> Self {
        DiscordConfig {
            token: token.into(),
            api_url: None,
            allow_mass_mentions: false,
            max_image_bytes: DISCORD_MAX_IMAGE_BYTES,
            request_timeout: Duration::from_secs(30),
            sends_per_window: 5,
            send_window: Duration::from_secs(5),
            shards: 1,
            shard_leases: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token() {
        let shown = format!("{:?}", DiscordConfig::new("MTIz.SECRET.token"));
        assert!(!shown.contains("SECRET"), "{shown}");
        assert!(shown.contains("REDACTED"), "{shown}");
    }
}
