//! The OneBot v11 adapter: QQ groups and private chats through an implementation such as
//! NapCat, LuckyLilliaBot, Lagrange.OneBot or SnowLuma.
//!
//! ## Transports ([`Transport`])
//! One WebSocket carries both events and actions (OneBot's "universal" connection), with the
//! access token as `Authorization: Bearer`. **Forward**: parlor connects to the
//! implementation's WebSocket server and reconnects with backoff. **Reverse**: parlor
//! listens and the implementation connects. The listener always needs the token (a
//! reverse config without one is refused): a wrong or missing token is refused with 401
//! (the token is also taken as the `access_token` query parameter, compared in constant
//! time), a request with an `Origin` (a browser's) with 403. One connection is one QQ
//! account (`self_id`); while one is served a newcomer is refused with 409 and never
//! displaces it, and the served one is pinged: gone (half-open), it is dropped within
//! 10 s and the implementation's next attempt is taken.
//!
//! ## Receiving
//! Every event is converted by [`convert_event`] and handed to the runtime's inbox, events
//! that arrived together in one [`Inbox::deliver_all`](parlor_bot::platform::Inbox) batch.
//! OneBot has no acknowledgement and no offset: implementations resend some events after a
//! reconnect (the runtime dedupes by `(chat, message_id)`), and an event that arrives while
//! parlor is down is lost. A connection that announced heartbeats and then falls silent
//! for `missed_heartbeats` intervals is dropped and (forward) dialled again.
//!
//! ## Sending
//! Replies are rendered as plain text (QQ shows no Markdown; tables aligned, code
//! indented) and split at `max_message_chars`. The first part replies to the asked message
//! (`reply` segment) and, in a group, `at`s the asker; each part is one `send_group_msg` /
//! `send_private_msg`, answered with its `message_id`. Posts into one chat are at least
//! `min_send_interval` apart: QQ's risk control bans accounts that post too fast. A retried
//! reply skips the parts it already sent (within a run).
//!
//! ## Admins
//! A group's owner and admins as their messages' `sender.role` says (the latest message of
//! each member counts); a private chat has none.

mod config;
pub mod cq;
mod error;
mod event;
mod link;
mod pace;
mod transport;

use std::collections::{HashMap, HashSet, VecDeque};
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use parlor_bot::backoff::Backoff;
use parlor_bot::platform::{ChatRef, ImageRef, Platform, PlatformError, SentMessage};
use serde_json::{Value, json};

pub use config::{DEFAULT_MAX_MESSAGE_CHARS, ONEBOT_MAX_IMAGE_BYTES, OneBotConfig, Transport};
pub use cq::Segment;
pub use error::OneBotError;
pub use event::{
    BotIdentity, ConvertedMessage, GroupRole, PLATFORM, Received, convert_event, group_chat,
    private_chat, segments_of,
};

use link::Links;
use pace::Pacer;

use crate::common::{
    Failure, RetryPolicy, SizeLimit, Token, ensure_platform, nothing_to_send, parse_id,
    with_retries,
};

/// The platform as logs and error texts name it.
const NAME: &str = "QQ";

/// Waits between transient failures of one action.
const ACTION_BACKOFF: Backoff = Backoff {
    initial: Duration::from_millis(500),
    max: Duration::from_secs(10),
};

/// How many message ids (the bot's own; who asked what) are remembered.
const MEMORY: usize = 4096;

/// A OneBot connection: receives as a [`Receiver`](crate::Receiver), answers through
/// [`Platform`]. Cloning is cheap (one `Arc`).
#[derive(Clone)]
pub struct OneBotAdapter {
    inner: Arc<Inner>,
}

struct Inner {
    config: OneBotConfig,
    /// The access token, trimmed; `None` when none is configured.
    token: Option<Token>,
    links: Links,
    me: Mutex<BotIdentity>,
    known: Mutex<Known>,
    pacer: Pacer,
    /// Parts of a long reply already sent, by the reply's key, while the rest still fails:
    /// OneBot has no idempotency key, so this keeps a retried reply from repeating them.
    /// For image downloads from QQ's servers.
    http: reqwest::Client,
}

/// What the adapter learnt from the events it saw.
#[derive(Default)]
struct Known {
    /// group -> member -> role, from `sender.role`.
    roles: HashMap<i64, HashMap<i64, GroupRole>>,
    /// Ids of messages the bot posted (bounded), so a reply to one is addressed to it.
    own: Bounded<String>,
    /// `(session key, message id)` -> its sender, so a reply can `at` the asker (bounded).
    askers: HashMap<(String, String), i64>,
    asked: VecDeque<(String, String)>,
}

/// A set that forgets its oldest entries past [`MEMORY`].
struct Bounded<T> {
    order: VecDeque<T>,
    set: HashSet<T>,
}

impl<T> Default for Bounded<T> {
    fn default() -> Self {
        Bounded {
            order: VecDeque::new(),
            set: HashSet::new(),
        }
    }
}

impl<T: std::hash::Hash + Eq + Clone> Bounded<T> {
    fn insert(&mut self, item: T) {
        if self.set.insert(item.clone()) {
            self.order.push_back(item);
            if self.order.len() > MEMORY
                && let Some(old) = self.order.pop_front()
            {
                self.set.remove(&old);
            }
        }
    }

    fn contains(&self, item: &T) -> bool {
        self.set.contains(item)
    }
}

impl fmt::Debug for OneBotAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OneBotAdapter")
            .field("me", &self.identity())
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

/// Where a [`ChatRef`] points on QQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    Group(i64),
    Private(i64),
}

impl Target {
    fn parse(chat: &ChatRef) -> Result<Target, PlatformError> {
        ensure_platform(chat, PLATFORM, NAME)?;
        match chat.chat_id.split_once(':') {
            Some(("group", id)) => Ok(Target::Group(parse_id(id, NAME, "group")?)),
            Some(("private", id)) => Ok(Target::Private(parse_id(id, NAME, "user")?)),
            _ => Err(PlatformError::NotFound(format!(
                "`{chat}` is neither a QQ group (qq:group:<id>) nor a private chat (qq:private:<id>)"
            ))),
        }
    }
}

impl OneBotAdapter {
    /// Prepares the adapter; nothing is connected until it runs as a
    /// [`Receiver`](crate::Receiver). Errors: [`PlatformError::Refused`] for a forward URL
    /// that is not `ws://` or `wss://`, a blank access token, or a reverse listener
    /// without one (anything local, a web page included, could connect as the account).
    pub fn new(config: OneBotConfig) -> Result<OneBotAdapter, PlatformError> {
        if let Transport::Forward { url } = &config.transport
            && !(url.starts_with("ws://") || url.starts_with("wss://"))
        {
            return Err(PlatformError::Refused(format!(
                "invalid OneBot url `{url}`: it must start with ws:// or wss://"
            )));
        }
        let token = match &config.access_token {
            Some(secret) => Some(Token::new(secret).ok_or_else(|| {
                PlatformError::Refused("the OneBot access token is blank".to_owned())
            })?),
            None => None,
        };
        if matches!(config.transport, Transport::Reverse { .. }) && token.is_none() {
            return Err(PlatformError::Refused(
                "a reverse OneBot listener needs an access token".to_owned(),
            ));
        }
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| {
                PlatformError::Unavailable(format!("cannot build the HTTP client: {e}"))
            })?;
        Ok(OneBotAdapter {
            inner: Arc::new(Inner {
                pacer: Pacer::new(config.min_send_interval),
                config,
                token,
                links: Links::new(),
                me: Mutex::new(BotIdentity::default()),
                known: Mutex::new(Known::default()),
                http,
            }),
        })
    }

    /// Who the bot is, as far as the implementation has said (`self_id` 0 before).
    pub fn identity(&self) -> BotIdentity {
        self.inner
            .me
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The settings it was made with.
    pub fn config(&self) -> &OneBotConfig {
        &self.inner.config
    }

    /// Whether an implementation is connected now.
    pub fn connected(&self) -> bool {
        self.inner.links.connected()
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.inner.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn policy(&self) -> RetryPolicy {
        RetryPolicy::standard(NAME, ACTION_BACKOFF, self.inner.config.request_timeout)
    }

    /// Runs one action and returns its `data`: waits (within `request_timeout`) for a
    /// connection, sends the request with a fresh `echo`, and waits for the answer carrying
    /// it. Not retried.
    pub async fn call(&self, action: &str, params: Value) -> Result<Value, OneBotError> {
        self.inner
            .links
            .call(action, params, self.inner.config.request_timeout)
            .await
    }

    /// [`call`](Self::call) with bounded retries of connection trouble; a `retcode` is
    /// returned at once.
    async fn call_retried(
        &self,
        action: &'static str,
        params: &Value,
    ) -> Result<Value, PlatformError> {
        self.call_with(&self.policy(), action, params).await
    }

    /// [`call`](Self::call) as `policy` retries it.
    async fn call_with(
        &self,
        policy: &RetryPolicy,
        action: &'static str,
        params: &Value,
    ) -> Result<Value, PlatformError> {
        with_retries(action, policy, || async {
            self.call(action, params.clone()).await.map_err(|error| {
                if error.is_transient() {
                    Failure::Transient(error.to_string())
                } else {
                    Failure::Fatal(error.into())
                }
            })
        })
        .await
    }

    /// `get_login_info`: the account's QQ number and nickname; remembered as the
    /// [`identity`](Self::identity).
    pub async fn login_info(&self) -> Result<BotIdentity, OneBotError> {
        let data = self.call("get_login_info", json!({})).await?;
        let self_id = event::int(data.get("user_id")).ok_or_else(|| OneBotError::BadAnswer {
            action: "get_login_info".to_owned(),
            missing: "data.user_id",
        })?;
        let nickname = data
            .get("nickname")
            .and_then(Value::as_str)
            .filter(|n| !n.trim().is_empty())
            .map(str::to_owned);
        let me = BotIdentity { self_id, nickname };
        *self.inner.me.lock().unwrap_or_else(|e| e.into_inner()) = me.clone();
        Ok(me)
    }

    /// `get_msg`: a message by id, as the implementation has it (`sender`, `message`...).
    pub async fn message(&self, message_id: &str) -> Result<Value, OneBotError> {
        let id = message_id
            .parse::<i64>()
            .map_or_else(|_| json!(message_id), |id| json!(id));
        self.call("get_msg", json!({"message_id": id})).await
    }

    /// `get_group_member_info`: a member's role in a group, asked afresh (`no_cache`) and
    /// remembered for [`Platform::chat_admins`].
    pub async fn member_role(&self, group_id: i64, user_id: i64) -> Result<GroupRole, OneBotError> {
        let data = self
            .call(
                "get_group_member_info",
                json!({"group_id": group_id, "user_id": user_id, "no_cache": true}),
            )
            .await?;
        let role = match data.get("role").and_then(Value::as_str) {
            Some("owner") => GroupRole::Owner,
            Some("admin") => GroupRole::Admin,
            Some(_) => GroupRole::Member,
            None => {
                return Err(OneBotError::BadAnswer {
                    action: "get_group_member_info".to_owned(),
                    missing: "data.role",
                });
            }
        };
        self.learn_role(group_id, user_id, role);
        Ok(role)
    }

    fn learn_role(&self, group: i64, user: i64, role: GroupRole) {
        let mut known = self.known();
        // A bound on groups: roles of a group that fell out are learnt again from its
        // next messages.
        if known.roles.len() > MEMORY && !known.roles.contains_key(&group) {
            known.roles.clear();
        }
        known.roles.entry(group).or_default().insert(user, role);
    }

    /// Takes what a converted event teaches: the sender's role, who asked what, and the
    /// identity the event names.
    fn learn(&self, event: &Value, received: &Received) {
        if let Some(self_id) = event::int(event.get("self_id")) {
            let mut me = self.inner.me.lock().unwrap_or_else(|e| e.into_inner());
            if me.self_id != self_id {
                me.self_id = self_id;
            }
        }
        match received {
            Received::Message(converted) => {
                if let Some((group, user, role)) = converted.role {
                    self.learn_role(group, user, role);
                }
                let message = &converted.message;
                if let Some(user) = message
                    .sender
                    .id
                    .strip_prefix("qq:")
                    .and_then(|id| id.parse().ok())
                {
                    let key = (message.chat.session_key(), message.message_id.clone());
                    let mut known = self.known();
                    if known.askers.insert(key.clone(), user).is_none() {
                        known.asked.push_back(key);
                        if known.asked.len() > MEMORY
                            && let Some(old) = known.asked.pop_front()
                        {
                            known.askers.remove(&old);
                        }
                    }
                }
            }
            Received::Own(id) => self.known().own.insert(id.clone()),
            _ => {}
        }
    }

    /// Converts an event with what the adapter knows.
    fn convert(&self, event: &Value) -> Received {
        let me = self.identity();
        let received = {
            let known = self.known();
            convert_event(event, &me, |id| known.own.contains(&id.to_owned()))
        };
        self.learn(event, &received);
        received
    }
}

impl OneBotAdapter {
    /// Renders, splits, paces and sends `text`, one attempt per part, skipping the parts
    /// in `sent` (see [`Platform::send`]).
    async fn send_parts(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        sent: &mut Vec<String>,
    ) -> Result<SentMessage, PlatformError> {
        let target = Target::parse(chat)?;
        let parts = parlor_render::plain::render_parts(text, self.inner.config.max_message_chars);
        if parts.is_empty() {
            return Err(nothing_to_send(NAME));
        }
        let reply_to = reply_to.filter(|id| !id.trim().is_empty());
        let asker = match (target, reply_to) {
            (Target::Group(_), Some(id)) => self
                .known()
                .askers
                .get(&(chat.session_key(), id.to_owned()))
                .copied(),
            _ => None,
        };
        let policy = self.policy().single();
        for (index, part) in parts.iter().enumerate().skip(sent.len()) {
            let mut segments = Vec::new();
            if index == 0
                && let Some(reply_to) = reply_to
            {
                segments.push(Segment::new("reply", [("id", reply_to.to_owned())]));
                if let Some(asker) = asker {
                    segments.push(Segment::new("at", [("qq", asker.to_string())]));
                    segments.push(Segment::text(" "));
                }
            }
            segments.push(Segment::text(part.as_str()));
            let (action, params) = match target {
                Target::Group(group) => (
                    "send_group_msg",
                    json!({"group_id": group, "message": segments}),
                ),
                Target::Private(user) => (
                    "send_private_msg",
                    json!({"user_id": user, "message": segments}),
                ),
            };
            self.inner.pacer.wait(&chat.session_key()).await;
            let answer = self
                .call_with(&policy, action, &params)
                .await
                .and_then(|data| {
                    event::int(data.get("message_id"))
                        .map(|id| id.to_string())
                        .ok_or_else(|| {
                            PlatformError::Unavailable(format!(
                                "`{action}` answered without a message_id"
                            ))
                        })
                });
            match answer {
                Ok(id) => {
                    self.known().own.insert(id.clone());
                    sent.push(id);
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

    /// Downloads `url` (http or https), never more than `max_image_bytes`.
    async fn download(&self, url: &str) -> Result<Vec<u8>, PlatformError> {
        let limit = SizeLimit(self.inner.config.max_image_bytes);
        with_retries("image download", &self.policy(), || async {
            let response = self
                .inner
                .http
                .get(url)
                .send()
                .await
                .map_err(|e| Failure::Transient(format!("image download: {e}")))?;
            let status = response.status();
            if !status.is_success() {
                let message = format!("image download: HTTP {}", status.as_u16());
                return Err(match status.as_u16() {
                    404 | 410 => Failure::Fatal(PlatformError::NotFound(message)),
                    429 | 500..=599 => Failure::Transient(message),
                    _ => Failure::Fatal(PlatformError::Refused(message)),
                });
            }
            let length = response.content_length();
            limit.check(length).map_err(Failure::Fatal)?;
            limit
                .read(response.bytes_stream(), length.unwrap_or(0), |e| {
                    Failure::Transient(format!("image download: {e}"))
                })
                .await
        })
        .await
    }
}

fn is_http(url: &str) -> bool {
    url.starts_with("http://") || url.starts_with("https://")
}

#[async_trait]
impl Platform for OneBotAdapter {
    fn name(&self) -> &str {
        PLATFORM
    }

    /// Sends `text` as plain text in parts; the first part replies to `reply_to` (and, in a
    /// group, `at`s whoever wrote it, when the adapter saw that message). Returns the ids
    /// of all parts; an empty text is refused. OneBot has no idempotency key: `key` is not
    /// used.
    async fn send(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        _key: Option<&str>,
        sent: &mut Vec<String>,
    ) -> Result<SentMessage, PlatformError> {
        self.send_parts(chat, text, reply_to, sent).await
    }

    /// OneBot v11 has no typing indicator: nothing to do.
    async fn send_typing(&self, chat: &ChatRef) -> Result<(), PlatformError> {
        Target::parse(chat).map(|_| ())
    }

    /// `qq:{user_id}` of the group's owner and admins seen so far (their messages'
    /// `sender.role`, or [`OneBotAdapter::member_role`]); none in a private chat.
    async fn chat_admins(&self, chat: &ChatRef) -> Result<Vec<String>, PlatformError> {
        let Target::Group(group) = Target::parse(chat)? else {
            return Ok(Vec::new());
        };
        let mut admins: Vec<i64> = self
            .known()
            .roles
            .get(&group)
            .map(|members| {
                members
                    .iter()
                    .filter(|(_, role)| role.is_admin())
                    .map(|(user, _)| *user)
                    .collect()
            })
            .unwrap_or_default();
        admins.sort_unstable();
        Ok(admins
            .into_iter()
            .map(|id| format!("{PLATFORM}:{id}"))
            .collect())
    }

    /// Downloads an image by the URL its segment carried; an image known only by file name
    /// is asked for with `get_image` first (its `url`). Never more than `max_image_bytes`.
    async fn download_image(&self, image: &ImageRef) -> Result<Vec<u8>, PlatformError> {
        SizeLimit(self.inner.config.max_image_bytes).check(image.size)?;
        if is_http(&image.file_id) {
            return self.download(&image.file_id).await;
        }
        let data = self
            .call_retried("get_image", &json!({"file": image.file_id}))
            .await?;
        match data
            .get("url")
            .and_then(Value::as_str)
            .filter(|u| is_http(u))
        {
            Some(url) => self.download(url).await,
            None => Err(PlatformError::Refused(
                "the OneBot implementation gave no download URL for this image".to_owned(),
            )),
        }
    }
}
