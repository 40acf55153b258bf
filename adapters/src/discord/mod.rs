//! The Discord adapter: serenity's gateway in, [`Platform`] out.
//!
//! ## Receiving ([`Receiver::run_with_ready`](crate::Receiver::run_with_ready))
//! serenity's `Client` holds the gateway connection (intents `GUILD_MESSAGES`,
//! `DIRECT_MESSAGES`, `MESSAGE_CONTENT`; the last is privileged and must be enabled in the
//! Developer Portal). Its shard runner heartbeats, and after a disconnect resumes the session
//! (Discord then replays the events missed) or identifies anew. Each `MESSAGE_CREATE` is
//! normalized by [`convert_message`] and handed to the runtime's
//! [`Inbox`](parlor_bot::platform::Inbox). The gateway has no acknowledgement, so a message
//! whose delivery fails to store is retried a few times with backoff and then logged as lost;
//! a replay after a resume is harmless (the runtime dedupes by `(chat, message_id)`, and the
//! adapter skips ids it delivered recently).
//!
//! ## Normalizing ([`convert_message`])
//! One session per channel id: a guild channel, a thread (its own channel id) and a DM each.
//! Mentions by `<@id>`/`<@!id>` or the `mentions` array, replies to the bot, and
//! `<@bot> /help` seen as `/help`. The bot's own messages (echoed by Discord) are dropped.
//!
//! ## Sending
//! [`render_parts`] renders the model's Markdown with the runtime's Discord renderer, in parts
//! of at most 2000 characters (fences balanced; `@everyone`/`@here`/role mentions defused
//! unless allowed). Each part is a `POST /channels/{id}/messages` whose `allowed_mentions` is always
//! explicit: `parse: ["users"]` (plus `roles` and `everyone` only with
//! [`DiscordConfig::allow_mass_mentions`]) — Discord's default, and serenity's `reply`, would
//! let `@everyone` ping. The first part references the triggering message with
//! `fail_if_not_exists: false` and pings its author (`replied_user: true`). Sends are paced per
//! channel ([`DiscordConfig::sends_per_window`]) and a 429's `retry_after` is honoured.
//!
//! ## Buttons
//! [`Platform::send_buttons`] puts one action row of buttons under the last part. A press is
//! an `INTERACTION_CREATE` (a message component): the adapter responds with type 6 at once,
//! within Discord's three seconds, then delivers it as a button event
//! ([`convert_interaction`]); [`Platform::answer_button`] answers with an ephemeral
//! follow-up. See `interaction.rs`.
//!
//! ## Admins
//! The owner of the guild, and the members whose roles (with `@everyone`) grant
//! `ADMINISTRATOR` or `MANAGE_GUILD`. Listing a guild's members needs the privileged
//! `GUILD_MEMBERS` intent, so the adapter uses the members it has seen write (their roles come
//! with every guild `MESSAGE_CREATE`); the roles' permissions and the owner come from
//! `GET /guilds/{id}` and are cached for five minutes. A DM has no admins.
//!
//! ## Secrets
//! The token is sent in a header only; `Debug` of [`DiscordConfig`] and [`DiscordAdapter`]
//! hide it and error texts are scrubbed of it.

mod config;
mod convert;
mod gateway;
mod interaction;
mod render;
mod rest;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use parlor_bot::platform::{
    Button, ButtonPress, ChatRef, ImageRef, Platform, PlatformError, SentMessage,
};
use reqwest::Method;
use serde_json::{Value, json};
use serenity::model::id::{ChannelId, GuildId, RoleId, UserId};
use tokio::time::Instant;

pub use config::{DISCORD_MAX_IMAGE_BYTES, DiscordConfig};
pub use convert::{BotIdentity, convert_interaction, convert_message};
pub use render::{MAX_MESSAGE_CHARS, render_parts};

use convert::PLATFORM;
use rest::{REST_BACKOFF, Rest, SendLimiter};

use crate::common::{
    Failure, RetryPolicy, SizeLimit, Token, ensure_platform, nothing_to_send, parse_id,
    reply_target, with_retries,
};

/// The platform as logs and error texts name it.
const NAME: &str = "Discord";

/// Discord's own REST host; `api_url` replaces it.
pub const DEFAULT_API_URL: &str = "https://discord.com";

/// Permission bits that make a member an admin for parlor.
const ADMINISTRATOR: u64 = 1 << 3;
const MANAGE_GUILD: u64 = 1 << 5;

/// How long a guild's owner and role permissions are reused.
const GUILD_CACHE_TTL: Duration = Duration::from_secs(300);

/// A connected Discord bot: receives as a [`Receiver`](crate::Receiver), answers
/// through [`Platform`]. Cloning is cheap (one `Arc`).
#[derive(Clone)]
pub struct DiscordAdapter {
    inner: Arc<Inner>,
}

struct Inner {
    config: DiscordConfig,
    rest: Rest,
    me: BotIdentity,
    limiter: SendLimiter,
    known: Mutex<Known>,
}

/// What the adapter has learnt from the messages it saw and the guilds it asked about.
#[derive(Default)]
struct Known {
    /// channel -> guild (`None`: a DM).
    channel_guild: HashMap<u64, Option<u64>>,
    /// guild -> user -> role ids, from the `member` of guild messages.
    members: HashMap<u64, HashMap<u64, Vec<u64>>>,
    /// guild -> (fetched at, owner, role id -> permissions).
    guilds: HashMap<u64, (Instant, u64, HashMap<u64, u64>)>,
    /// Recently delivered message and interaction ids (bounded), to skip gateway replays.
    delivered: VecDeque<u64>,
    delivered_set: HashSet<u64>,
    /// The bot's application id (READY, or an interaction): the follow-ups' webhook.
    application: Option<u64>,
}

const DELIVERED_MEMORY: usize = 4096;

impl fmt::Debug for DiscordAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DiscordAdapter")
            .field("me", &self.inner.me)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl DiscordAdapter {
    /// Checks the token with `GET /users/@me` and prepares the REST client.
    ///
    /// Surrounding whitespace of the token is ignored. Errors:
    /// [`PlatformError::Unauthorized`] for a missing or rejected token,
    /// [`PlatformError::Unavailable`] when Discord (or `api_url`) cannot be reached after
    /// retries, [`PlatformError::Refused`] for an unusable `api_url`.
    pub async fn connect(config: DiscordConfig) -> Result<DiscordAdapter, PlatformError> {
        let token = Token::new(&config.token).ok_or(PlatformError::Unauthorized)?;
        let base = match &config.api_url {
            Some(url) => {
                let url = url.trim().trim_end_matches('/');
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(PlatformError::Refused(format!(
                        "invalid Discord api_url `{url}`: it must start with http:// or https://"
                    )));
                }
                url.to_owned()
            }
            None => DEFAULT_API_URL.to_owned(),
        };
        let rest = Rest::new(&base, token)?;
        let policy = RetryPolicy::standard(NAME, REST_BACKOFF, config.request_timeout);
        let me = with_retries("GET /users/@me", &policy, || {
            rest.call(Method::GET, "/users/@me", None)
        })
        .await?;
        let me = BotIdentity {
            id: me
                .get("id")
                .and_then(snowflake)
                .ok_or_else(|| PlatformError::Unavailable("GET /users/@me: no id".to_owned()))?,
            username: me
                .get("username")
                .and_then(Value::as_str)
                .unwrap_or("bot")
                .to_owned(),
        };
        tracing::info!(bot_id = me.id, username = %me.username, "connected to Discord");
        Ok(DiscordAdapter {
            inner: Arc::new(Inner {
                limiter: SendLimiter::new(config.sends_per_window, config.send_window),
                config,
                rest,
                me,
                known: Mutex::new(Known::default()),
            }),
        })
    }

    /// Who the bot is.
    pub fn identity(&self) -> &BotIdentity {
        &self.inner.me
    }

    /// The settings it was connected with.
    pub fn config(&self) -> &DiscordConfig {
        &self.inner.config
    }

    fn policy(&self) -> RetryPolicy {
        RetryPolicy::standard(NAME, REST_BACKOFF, self.inner.config.request_timeout)
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.inner.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Remembers the channel's guild and the author's roles from a gateway message.
    pub(crate) fn learn(&self, message: &serenity::model::channel::Message) {
        let author = message
            .member
            .as_ref()
            .map(|m| (message.author.id, &m.roles[..]));
        self.learn_place(message.channel_id, message.guild_id, author);
    }

    /// Remembers what a component interaction tells: the channel's guild, the presser's
    /// roles (as a guild message's author's) and the application it is for.
    pub(crate) fn learn_interaction(
        &self,
        interaction: &serenity::model::application::ComponentInteraction,
    ) {
        let presser = interaction
            .member
            .as_ref()
            .map(|m| (m.user.id, &m.roles[..]));
        self.learn_place(interaction.channel_id, interaction.guild_id, presser);
        self.learn_application(interaction.application_id.get());
    }

    /// Remembers `channel`'s guild and, in a guild, `member`'s roles: what a message and a
    /// press tell alike.
    fn learn_place(
        &self,
        channel: ChannelId,
        guild: Option<GuildId>,
        member: Option<(UserId, &[RoleId])>,
    ) {
        let guild = guild.map(|g| g.get());
        let mut known = self.known();
        known.channel_guild.insert(channel.get(), guild);
        if let (Some(guild), Some((user, roles))) = (guild, member) {
            known
                .members
                .entry(guild)
                .or_default()
                .insert(user.get(), roles.iter().map(|r| r.get()).collect());
        }
    }

    /// Remembers the application id READY named.
    pub(crate) fn learn_application(&self, id: u64) {
        self.known().application = Some(id);
    }

    /// The application id for interaction webhooks: as learnt, else the bot's user id,
    /// which is a bot's application id (after a restart, before READY).
    fn application_id(&self) -> u64 {
        self.known().application.unwrap_or(self.inner.me.id)
    }

    /// Whether `id` was delivered recently.
    pub(crate) fn seen(&self, id: u64) -> bool {
        self.known().delivered_set.contains(&id)
    }

    pub(crate) fn mark_delivered(&self, id: u64) {
        let mut known = self.known();
        if known.delivered_set.insert(id) {
            known.delivered.push_back(id);
            if known.delivered.len() > DELIVERED_MEMORY
                && let Some(old) = known.delivered.pop_front()
            {
                known.delivered_set.remove(&old);
            }
        }
    }

    /// The `allowed_mentions` every message carries.
    fn allowed_mentions(&self, replied_user: bool) -> Value {
        let parse: &[&str] = if self.inner.config.allow_mass_mentions {
            &["users", "roles", "everyone"]
        } else {
            &["users"]
        };
        json!({"parse": parse, "replied_user": replied_user})
    }

    /// The guild of `channel`: learnt from messages, else `GET /channels/{id}`.
    async fn guild_of(&self, channel: u64) -> Result<Option<u64>, PlatformError> {
        if let Some(guild) = self.known().channel_guild.get(&channel) {
            return Ok(*guild);
        }
        let path = format!("/channels/{channel}");
        let info = with_retries("GET /channels/{id}", &self.policy(), || {
            self.inner.rest.call(Method::GET, &path, None)
        })
        .await?;
        let guild = info.get("guild_id").and_then(snowflake);
        self.known().channel_guild.insert(channel, guild);
        Ok(guild)
    }

    /// The guild's owner and role permissions (cached).
    async fn guild_permissions(
        &self,
        guild: u64,
    ) -> Result<(u64, HashMap<u64, u64>), PlatformError> {
        if let Some((at, owner, roles)) = self.known().guilds.get(&guild)
            && at.elapsed() < GUILD_CACHE_TTL
        {
            return Ok((*owner, roles.clone()));
        }
        let path = format!("/guilds/{guild}");
        let info = with_retries("GET /guilds/{id}", &self.policy(), || {
            self.inner.rest.call(Method::GET, &path, None)
        })
        .await?;
        let owner = info.get("owner_id").and_then(snowflake).unwrap_or(0);
        let roles: HashMap<u64, u64> = info
            .get("roles")
            .and_then(Value::as_array)
            .map(|roles| {
                roles
                    .iter()
                    .filter_map(|role| {
                        Some((
                            role.get("id").and_then(snowflake)?,
                            role.get("permissions").and_then(snowflake).unwrap_or(0),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.known()
            .guilds
            .insert(guild, (Instant::now(), owner, roles.clone()));
        Ok((owner, roles))
    }

    /// Whether `url` may be downloaded: Discord's CDN, or the configured `api_url`'s host.
    fn download_allowed(&self, url: &str) -> bool {
        let Ok(parsed) = reqwest::Url::parse(url) else {
            return false;
        };
        let host = parsed.host_str().unwrap_or_default();
        if parsed.scheme() == "https"
            && matches!(host, "cdn.discordapp.com" | "media.discordapp.net")
        {
            return true;
        }
        reqwest::Url::parse(self.inner.rest.base()).is_ok_and(|base| {
            base.scheme() == parsed.scheme()
                && base.host_str() == parsed.host_str()
                && base.port_or_known_default() == parsed.port_or_known_default()
        })
    }
}

impl DiscordAdapter {
    /// The sending behind [`Platform::send`], one attempt per part, skipping the parts in
    /// `sent`; with a `key`, every part is idempotent (see [`nonce`]). `buttons`, when any,
    /// go under the last part as one action row.
    async fn send_parts(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        key: Option<&str>,
        sent: &mut Vec<String>,
        buttons: &[Button],
    ) -> Result<SentMessage, PlatformError> {
        let channel = channel_of(chat)?;
        let reply_to: Option<u64> = reply_target(chat, reply_to, NAME);
        // Checked before any part goes out, so a refusal never leaves a reply cut short.
        let components = interaction::components(buttons)?;
        let parts = render_parts(text, self.inner.config.allow_mass_mentions);
        if parts.is_empty() {
            return Err(nothing_to_send(NAME));
        }
        let last = parts.len() - 1;
        let path = format!("/channels/{channel}/messages");
        let policy = self.policy().single();
        for (index, part) in parts.iter().enumerate().skip(sent.len()) {
            let reference = reply_to.filter(|_| index == 0);
            let mut body = json!({
                "content": part,
                "allowed_mentions": self.allowed_mentions(reference.is_some()),
            });
            if let Some(key) = key {
                body["nonce"] = json!(nonce(channel, key, index));
                body["enforce_nonce"] = json!(true);
            }
            if index == last
                && let Some(components) = &components
            {
                body["components"] = components.clone();
            }
            if let Some(message_id) = reference {
                body["message_reference"] = json!({
                    "message_id": message_id.to_string(),
                    "channel_id": channel.to_string(),
                    "fail_if_not_exists": false,
                });
            }
            let answer = with_retries("POST /channels/{id}/messages", &policy, || async {
                self.inner.limiter.acquire(channel).await;
                self.inner.rest.call(Method::POST, &path, Some(&body)).await
            })
            .await;
            match answer {
                Ok(answer) => {
                    let id = answer.get("id").and_then(snowflake).ok_or_else(|| {
                        PlatformError::Unavailable("Discord answered without a message id".into())
                    })?;
                    sent.push(id.to_string());
                }
                Err(error) => {
                    if index > 0 {
                        tracing::warn!(%chat, sent = index, total = parts.len(), %error, "a long reply was cut off; a retry sends the rest");
                    }
                    return Err(error);
                }
            }
        }
        Ok(SentMessage {
            message_ids: sent.clone(),
        })
    }
}

/// The `nonce` of part `index` of the reply `key` in `channel`: at most 25 characters, as
/// Discord allows, and the same in every process (FNV-1a, not a seeded hash), so a retry
/// after a restart carries the nonce of the first attempt. The channel is hashed in because
/// Discord checks a nonce per author, not per channel, and a key need only be unique within
/// its chat.
fn nonce(channel: u64, key: &str, index: usize) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in channel.to_be_bytes().iter().chain(key.as_bytes()).copied() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    // 16 hex digits, `.`, then the index: 25 characters hold indexes up to 10^8.
    format!("{hash:016x}.{index}")
}

/// A snowflake (or permission bits) given as a string or a number.
fn snowflake(value: &Value) -> Option<u64> {
    match value {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_u64(),
        _ => None,
    }
}

/// The channel id of a [`ChatRef`] on Discord.
fn channel_of(chat: &ChatRef) -> Result<u64, PlatformError> {
    ensure_platform(chat, PLATFORM, NAME)?;
    parse_id(&chat.chat_id, NAME, "channel")
}

#[async_trait]
impl Platform for DiscordAdapter {
    fn name(&self) -> &str {
        PLATFORM
    }

    /// Sends `text` as [`render_parts`] splits it; the first part replies to `reply_to` (still
    /// sent if that message is gone). Returns the ids of all parts; an empty text is refused.
    /// With a `key` each part carries a `nonce` derived from it and the part's index, with
    /// `enforce_nonce`: Discord answers a part it already created (within a few minutes)
    /// with that message instead of posting it again, so a send retried after a lost
    /// answer or a restart shows each part once.
    async fn send(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        key: Option<&str>,
        sent: &mut Vec<String>,
    ) -> Result<SentMessage, PlatformError> {
        self.send_parts(chat, text, reply_to, key, sent, &[]).await
    }

    /// [`send`](Platform::send) with `buttons` as one action row of secondary buttons
    /// (`custom_id` = [`Button::data`]) under the last part; at most five. A press comes
    /// back as an `INTERACTION_CREATE`, acknowledged at once and delivered as
    /// [`ChatEvent::Button`](parlor_bot::platform::ChatEvent::Button).
    async fn send_buttons(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        key: Option<&str>,
        sent: &mut Vec<String>,
        buttons: &[Button],
    ) -> Result<SentMessage, PlatformError> {
        self.send_parts(chat, text, reply_to, key, sent, buttons)
            .await
    }

    /// With `text`, an ephemeral follow-up only the presser sees; without, nothing (the
    /// press was acknowledged when it arrived).
    async fn answer_button(
        &self,
        press: &ButtonPress,
        text: Option<&str>,
    ) -> Result<(), PlatformError> {
        self.answer_press(press, text).await
    }

    /// One `POST /channels/{id}/typing` (lasts ~10 s on Discord), not retried.
    async fn send_typing(&self, chat: &ChatRef) -> Result<(), PlatformError> {
        let channel = channel_of(chat)?;
        let path = format!("/channels/{channel}/typing");
        let policy = RetryPolicy::once(NAME, self.inner.config.request_timeout);
        with_retries("POST /channels/{id}/typing", &policy, || {
            self.inner.rest.call(Method::POST, &path, None)
        })
        .await
        .map(|_| ())
    }

    /// `discord:{user_id}` of the guild owner and of the members seen in the guild whose roles
    /// grant Administrator or Manage Server. A DM has none.
    async fn chat_admins(&self, chat: &ChatRef) -> Result<Vec<String>, PlatformError> {
        let channel = channel_of(chat)?;
        let Some(guild) = self.guild_of(channel).await? else {
            return Ok(Vec::new());
        };
        let (owner, roles) = self.guild_permissions(guild).await?;
        let everyone = roles.get(&guild).copied().unwrap_or(0);
        let is_admin = |bits: u64| bits & (ADMINISTRATOR | MANAGE_GUILD) != 0;
        let mut admins: Vec<u64> = Vec::new();
        if owner != 0 {
            admins.push(owner);
        }
        if let Some(members) = self.known().members.get(&guild) {
            for (user, member_roles) in members {
                let bits = member_roles
                    .iter()
                    .filter_map(|role| roles.get(role))
                    .fold(everyone, |acc, bits| acc | bits);
                if is_admin(bits) && !admins.contains(user) {
                    admins.push(*user);
                }
            }
        }
        admins.sort_unstable();
        Ok(admins
            .into_iter()
            .map(|id| format!("{PLATFORM}:{id}"))
            .collect())
    }

    /// Downloads an attachment by its URL (Discord's CDN or the configured `api_url` host
    /// only), never more than `max_image_bytes`.
    async fn download_image(&self, image: &ImageRef) -> Result<Vec<u8>, PlatformError> {
        let limit = SizeLimit(self.inner.config.max_image_bytes);
        limit.check(image.size)?;
        if !self.download_allowed(&image.file_id) {
            return Err(PlatformError::Refused(
                "not a Discord attachment URL".to_owned(),
            ));
        }
        let url = image.file_id.as_str();
        let token = self.inner.rest.token();
        with_retries("attachment download", &self.policy(), || async {
            let response = self
                .inner
                .rest
                .client()
                .get(url)
                .send()
                .await
                .map_err(|e| Failure::Transient(token.describe(&e)))?;
            let status = response.status();
            if !status.is_success() {
                let message = format!("attachment download: {}", status.as_u16());
                return Err(match status.as_u16() {
                    404 => Failure::Fatal(PlatformError::NotFound(message)),
                    429 => Failure::RetryAfter(rest::retry_after(response.headers(), &Value::Null)),
                    500..=599 => Failure::Transient(message),
                    _ => Failure::Fatal(PlatformError::Refused(message)),
                });
            }
            let length = response.content_length();
            limit.check(length).map_err(Failure::Fatal)?;
            limit
                .read(response.bytes_stream(), length.unwrap_or(0), |e| {
                    Failure::Transient(token.describe(&e))
                })
                .await
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nonces_fit_discord_and_are_stable_and_distinct() {
        let a = nonce(42, "outbox:17", 0);
        assert_eq!(a, nonce(42, "outbox:17", 0), "the same in every process");
        assert!(nonce(42, "outbox:17", 99_999_999).chars().count() <= 25);
        assert_ne!(a, nonce(42, "outbox:17", 1));
        assert_ne!(a, nonce(42, "outbox:18", 0));
        assert_ne!(
            a,
            nonce(43, "outbox:17", 0),
            "the same key in another channel"
        );
        // Computed independently; a change here breaks deduplication across an upgrade.
        assert_eq!(nonce(1, "k", 2), "e601833a248df59b.2");
    }
}
