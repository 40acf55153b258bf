//! The Telegram adapter: Bot API long polling (or a webhook) in, [`Platform`] out.
//!
//! ## Receiving
//! As a [`Receiver`](crate::Receiver) the adapter long-polls `getUpdates` itself rather than
//! through teloxide's `Dispatcher`/polling listener (so it needs only `teloxide-core`, the Bot
//! API client), because parlor decides when an update is acknowledged:
//! each message is handed to the runtime's [`Inbox`](parlor_bot::platform::Inbox), and only
//! once `deliver` returned `Ok` (the message is durably recorded) does the next
//! `getUpdates` carry an `offset` past it. If the daemon stops or crashes before that,
//! Telegram delivers the update again and the runtime's dedupe on `(chat, message_id)`
//! absorbs the repeat. Updates parlor cannot represent are acknowledged and skipped.
//!
//! In webhook mode ([`webhook`]) Telegram POSTs each update to the binary's HTTP listener
//! instead; the same conversion and the same inbox take it, and the HTTP answer is the
//! acknowledgement.
//!
//! ## Normalizing ([`convert_message`])
//! - A chat is `telegram:{chat_id}`; a forum topic is its own session
//!   `telegram:{chat_id}/topic:{thread_id}`. Reply threads of ordinary groups carry a
//!   `message_thread_id` too, but stay in the chat's session.
//! - A sender is `telegram:{user_id}`; messages written "as the group" (anonymous admins)
//!   or by a linked channel are attributed to that chat, `telegram:{sender_chat_id}`.
//! - `mentions_bot` is set by a `mention` entity `@this_bot` (any case; entity offsets are
//!   UTF-16 code units), a `text_mention` of the bot, or a command `/cmd@this_bot`.
//! - **Commands.** [`IncomingMessage`](parlor_bot::platform::IncomingMessage) has no field for
//!   "which bot a command is for", and the runtime treats a bare `/cmd` as addressed to it.
//!   So the adapter strips `@this_bot` from our own commands (the runtime sees `/help`) and
//!   leaves `/help@other_bot` untouched: it does not start with a bare command word, so the
//!   runtime does not take it.
//!
//! ## Buttons
//! [`Platform::send_buttons`] puts an inline keyboard (one row of callback buttons) under the
//! last part of a reply. A press arrives as a `callback_query` update, which
//! [`convert_update`] turns into a [`ButtonPress`] event like any other update (polled or
//! posted to the webhook); [`Platform::answer_button`] answers it with `answerCallbackQuery`.
//!
//! ## Sending
//! [`render()`] turns the model's Markdown into message parts: plain text plus explicit
//! entities, at most 4096 UTF-16 units each, never a `parse_mode` (so no reply can be refused
//! for bad markup). The first part
//! replies to the triggering message (without failing if that message was deleted); all
//! parts go to the topic. Every call runs under a timeout with bounded retries: Telegram's
//! `retry_after` is honoured, network trouble is retried with backoff, other API errors map
//! to [`PlatformError`].
//!
//! ## Secrets
//! The token is part of every request URL. It is never logged: [`TelegramConfig`]'s and
//! [`TelegramAdapter`]'s `Debug` hide it, and every error message is scrubbed of it.

mod config;
mod convert;
mod error;
mod poll;
mod render;
pub mod webhook;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use parlor_bot::platform::{
    Button, ButtonPress, ChatRef, ImageRef, Platform, PlatformError, SentMessage,
};
use teloxide_core::net::Download;
use teloxide_core::payloads::{
    AnswerCallbackQuerySetters, SendChatActionSetters, SendMessage, SendMessageSetters,
};
use teloxide_core::prelude::Requester;
use teloxide_core::requests::{JsonRequest, Payload};
use teloxide_core::types::{
    AllowedUpdate, CallbackQueryId, ChatAction, ChatId, FileId, InlineKeyboardButton,
    InlineKeyboardMarkup, MessageId, ReplyParameters, ThreadId,
};
use teloxide_core::{Bot, RequestError};

pub use config::{
    Backoff, DEFAULT_ALLOWED_UPDATES, DEFAULT_API_URL, TELEGRAM_MAX_DOWNLOAD_BYTES, TelegramConfig,
    WebhookConfig,
};
pub use convert::{BotIdentity, Received, convert_button_press, convert_message, convert_update};
pub use render::{MAX_MESSAGE_UTF16, RenderedPart, render};

use convert::PLATFORM;
use error::classify;

use crate::common::{
    Failure, RetryPolicy, SizeLimit, Token, button_row, ensure_platform, nothing_to_send, parse_id,
    reply_target, with_retries,
};

/// The platform as logs and error texts name it.
const NAME: &str = "Telegram";

/// The longest text of a callback answer (`answerCallbackQuery`), in characters: Telegram
/// refuses a longer one.
pub const MAX_CALLBACK_ANSWER_CHARS: usize = 200;

/// A connected Telegram bot: receives as a [`Receiver`](crate::Receiver), answers through
/// [`Platform`]. Cloning is cheap (one `Arc`); clones share the HTTP client.
#[derive(Clone)]
pub struct TelegramAdapter {
    inner: Arc<Inner>,
}

struct Inner {
    /// teloxide's client: token, API URL and a reqwest client whose timeout exceeds the long
    /// poll. Its `Debug` prints the token, so `TelegramAdapter` has its own.
    bot: Bot,
    config: TelegramConfig,
    /// The (trimmed) token, for scrubbing it out of error messages.
    token: Token,
    me: BotIdentity,
    /// `config.allowed_updates`, parsed once at connect.
    allowed_updates: Vec<AllowedUpdate>,
}

impl fmt::Debug for TelegramAdapter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelegramAdapter")
            .field("me", &self.inner.me)
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

impl TelegramAdapter {
    /// Builds the client and asks Telegram who we are (`getMe`).
    ///
    /// Surrounding whitespace of the token (a newline from a token file) is ignored.
    /// Errors: [`PlatformError::Unauthorized`] for a missing or wrong token;
    /// [`PlatformError::Refused`] for an unusable config (bad `api_url`, unknown update
    /// type); [`PlatformError::Unavailable`] when Telegram cannot be reached after retries.
    pub async fn connect(config: TelegramConfig) -> Result<TelegramAdapter, PlatformError> {
        let token = Token::new(&config.token).ok_or(PlatformError::Unauthorized)?;
        let allowed_updates = config
            .allowed_updates
            .iter()
            .map(|name| {
                serde_json::from_value::<AllowedUpdate>(serde_json::Value::String(name.clone()))
                    .map_err(|_| {
                        PlatformError::Refused(format!(
                            "unknown Telegram update type `{name}` in allowed_updates"
                        ))
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;
        // teloxide appends `/bot{token}/{method}` as path segments; a trailing slash would
        // leave an empty segment in between.
        let api_url = config.api_url.trim().trim_end_matches('/');
        let api_url = api_url.parse().map_err(|error| {
            PlatformError::Refused(format!("invalid Telegram api_url `{api_url}`: {error}"))
        })?;
        // teloxide's defaults (5 s connect timeout, TCP_NODELAY) with a request timeout
        // longer than the long poll: its default 17 s would cut every quiet 30 s poll.
        let client = parlor_bot::net::pooled(teloxide_core::net::default_reqwest_settings())
            .timeout(config.request_timeout())
            .build()
            .map_err(|error| {
                PlatformError::Unavailable(format!("cannot build the HTTP client: {error}"))
            })?;
        let bot = Bot::with_client(token.expose(), client).set_api_url(api_url);

        let policy = RetryPolicy::standard(NAME, config.backoff, config.request_timeout());
        let me = with_retries("getMe", &policy, || async {
            match bot.get_me().await {
                Ok(me) => Ok(BotIdentity {
                    id: me.user.id.0,
                    username: me.user.username.clone(),
                }),
                Err(error) => {
                    // `Me` requires fields (`has_main_web_app`, ...) that a future or
                    // stand-in server may omit; id and username are all we need.
                    if let RequestError::InvalidJson { raw, .. } = &error
                        && let Some(me) = identity_from_raw(raw)
                    {
                        return Ok(me);
                    }
                    Err(classify(&error, &token))
                }
            }
        })
        .await?;
        tracing::info!(bot_id = me.id, username = ?me.username, "connected to Telegram");
        Ok(TelegramAdapter {
            inner: Arc::new(Inner {
                bot,
                config,
                token,
                me,
                allowed_updates,
            }),
        })
    }

    /// Who the bot is (`getMe`).
    pub fn identity(&self) -> &BotIdentity {
        &self.inner.me
    }

    /// The settings it was connected with.
    pub fn config(&self) -> &TelegramConfig {
        &self.inner.config
    }

    fn policy(&self) -> RetryPolicy {
        RetryPolicy::standard(
            NAME,
            self.inner.config.backoff,
            self.inner.config.request_timeout(),
        )
    }

    fn fail(&self, error: &RequestError) -> Failure {
        classify(error, &self.inner.token)
    }
}

/// `{"ok":true,"result":{"id":..,"username":..}}` read leniently.
fn identity_from_raw(raw: &str) -> Option<BotIdentity> {
    let value: serde_json::Value = serde_json::from_str(raw).ok()?;
    let result = value.get("result")?;
    Some(BotIdentity {
        id: result.get("id")?.as_u64()?,
        username: result
            .get("username")
            .and_then(|name| name.as_str())
            .map(str::to_owned),
    })
}

/// Where a [`ChatRef`] points on Telegram.
struct Target {
    chat: ChatId,
    thread: Option<ThreadId>,
}

impl Target {
    fn parse(chat: &ChatRef) -> Result<Target, PlatformError> {
        ensure_platform(chat, PLATFORM, NAME)?;
        let id = parse_id(&chat.chat_id, NAME, "chat")?;
        let thread = match &chat.thread_id {
            None => None,
            Some(thread) => Some(ThreadId(MessageId(parse_id(thread, NAME, "topic")?))),
        };
        Ok(Target {
            chat: ChatId(id),
            thread,
        })
    }
}

/// `sendMessage` with only the sent message's id read from the answer: the adapter needs
/// nothing else of the `Message` Telegram returns, and teloxide's `Message` is parsed through
/// untagged enums (each variant tried on a buffered copy of the JSON, a failed try
/// allocating its error), most of what a send cost to parse.
#[derive(serde::Serialize)]
#[serde(transparent)]
struct SendMessageId(SendMessage);

impl Payload for SendMessageId {
    type Output = SentId;
    const NAME: &'static str = SendMessage::NAME;
}

/// What [`SendMessageId`] reads of the sent message.
#[derive(serde::Deserialize)]
struct SentId {
    message_id: i32,
}

impl TelegramAdapter {
    /// Renders, splits and sends `text`, one attempt per part, skipping the parts in `sent`
    /// (see [`Platform::send`]); `buttons`, when any, go under the last part as an inline
    /// keyboard of one row.
    async fn send_parts(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        sent: &mut Vec<String>,
        buttons: &[Button],
    ) -> Result<SentMessage, PlatformError> {
        let target = Target::parse(chat)?;
        let reply_to = reply_target(chat, reply_to, NAME).map(MessageId);
        // Checked before any part goes out: Telegram would refuse only the last part, after
        // the others were posted without the buttons they lead to.
        let keyboard = inline_keyboard(buttons)?;
        let parts = render(text);
        if parts.is_empty() {
            return Err(nothing_to_send(NAME));
        }
        let last = parts.len() - 1;
        let policy = self.policy().single();
        for (index, part) in parts.iter().enumerate().skip(sent.len()) {
            let answer = with_retries("sendMessage", &policy, || {
                let mut payload = SendMessage::new(target.chat, part.text.as_str())
                    .entities(part.entities.clone());
                if let Some(thread) = target.thread {
                    payload = payload.message_thread_id(thread);
                }
                if index == last
                    && let Some(keyboard) = &keyboard
                {
                    payload = payload.reply_markup(keyboard.clone());
                }
                if index == 0
                    && let Some(reply_to) = reply_to
                {
                    payload = payload.reply_parameters(
                        ReplyParameters::new(reply_to).allow_sending_without_reply(),
                    );
                }
                let request = JsonRequest::new(self.inner.bot.clone(), SendMessageId(payload));
                async move { request.await.map_err(|error| self.fail(&error)) }
            })
            .await;
            match answer {
                Ok(answer) => sent.push(answer.message_id.to_string()),
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

/// `buttons` as an inline keyboard of one row of callback buttons; `None` for no buttons.
/// A button whose data is empty or longer than Telegram's `callback_data` allows
/// ([`Button::MAX_DATA`] bytes) is refused ([`button_row`]).
fn inline_keyboard(buttons: &[Button]) -> Result<Option<InlineKeyboardMarkup>, PlatformError> {
    let row = button_row(buttons, |button| {
        InlineKeyboardButton::callback(button.label.as_str(), button.data.as_str())
    })?;
    Ok(row.map(|row| InlineKeyboardMarkup::new([row])))
}

#[async_trait]
impl Platform for TelegramAdapter {
    fn name(&self) -> &str {
        PLATFORM
    }

    /// Sends `text` (Markdown) as [`render()`] renders and splits it; the first part replies
    /// to `reply_to` (and is still sent if that message is gone), every part goes to the
    /// chat's topic. Returns the ids of all parts. An empty text is refused (Telegram would
    /// refuse it too). Telegram has no idempotency key: `key` is not used.
    async fn send(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        _key: Option<&str>,
        sent: &mut Vec<String>,
    ) -> Result<SentMessage, PlatformError> {
        self.send_parts(chat, text, reply_to, sent, &[]).await
    }

    /// [`send`](Platform::send) with `buttons` as an inline keyboard (one row of callback
    /// buttons, `callback_data` = [`Button::data`]) under the last part. A press comes back
    /// as a `callback_query` update, delivered as
    /// [`ChatEvent::Button`](parlor_bot::platform::ChatEvent::Button).
    async fn send_buttons(
        &self,
        chat: &ChatRef,
        text: &str,
        reply_to: Option<&str>,
        _key: Option<&str>,
        sent: &mut Vec<String>,
        buttons: &[Button],
    ) -> Result<SentMessage, PlatformError> {
        self.send_parts(chat, text, reply_to, sent, buttons).await
    }

    /// `answerCallbackQuery` for the press's query id: with `text`, cut to
    /// [`MAX_CALLBACK_ANSWER_CHARS`], shown as an alert (`show_alert`); without, it only
    /// stops the client's spinner. Retried like other calls whose result matters: a repeat
    /// of an answer Telegram already took is refused, never shown twice.
    async fn answer_button(
        &self,
        press: &ButtonPress,
        text: Option<&str>,
    ) -> Result<(), PlatformError> {
        ensure_platform(&press.chat, PLATFORM, NAME)?;
        let text =
            text.map(|text| parlor_bot::text::split_chars(text, MAX_CALLBACK_ANSWER_CHARS).0);
        with_retries("answerCallbackQuery", &self.policy(), || {
            let mut request = self
                .inner
                .bot
                .answer_callback_query(CallbackQueryId(press.answer.clone()));
            if let Some(text) = text {
                request = request.text(text).show_alert(true);
            }
            async move { request.await.map_err(|error| self.fail(&error)) }
        })
        .await
        .map(|_| ())
    }

    /// One `sendChatAction(typing)`, not retried: it is cosmetic and repeated by the caller.
    async fn send_typing(&self, chat: &ChatRef) -> Result<(), PlatformError> {
        let target = Target::parse(chat)?;
        let policy = RetryPolicy::once(NAME, self.inner.config.request_timeout());
        with_retries("sendChatAction", &policy, || {
            let mut request = self
                .inner
                .bot
                .send_chat_action(target.chat, ChatAction::Typing);
            if let Some(thread) = target.thread {
                request = request.message_thread_id(thread);
            }
            async move { request.await.map_err(|error| self.fail(&error)) }
        })
        .await
        .map(|_| ())
    }

    /// `getChatAdministrators` as `telegram:{user_id}`, plus `telegram:{chat_id}` itself:
    /// only admins can write "as the group" (anonymous admins), and such messages carry
    /// that sender id. A private chat (positive id) has no admins and costs no request.
    async fn chat_admins(&self, chat: &ChatRef) -> Result<Vec<String>, PlatformError> {
        let target = Target::parse(chat)?;
        if target.chat.0 > 0 {
            return Ok(Vec::new());
        }
        let members = with_retries("getChatAdministrators", &self.policy(), || async {
            self.inner
                .bot
                .get_chat_administrators(target.chat)
                .await
                .map_err(|error| self.fail(&error))
        })
        .await?;
        let mut admins: Vec<String> = members
            .iter()
            .map(|member| format!("{PLATFORM}:{}", member.user.id.0))
            .collect();
        admins.push(format!("{PLATFORM}:{}", target.chat.0));
        Ok(admins)
    }

    /// `getFile`, then the download, never more than `max_image_bytes`: refused up front
    /// when the size is known, and cut off while streaming when it is not.
    async fn download_image(&self, image: &ImageRef) -> Result<Vec<u8>, PlatformError> {
        let limit = SizeLimit(self.inner.config.max_image_bytes);
        limit.check(image.size)?;
        let policy = self.policy();
        let file = with_retries("getFile", &policy, || async {
            self.inner
                .bot
                .get_file(FileId(image.file_id.clone()))
                .await
                .map_err(|error| self.fail(&error))
        })
        .await?;
        // teloxide reports an unknown size as u32::MAX.
        let known_size = (file.meta.size != u32::MAX).then_some(u64::from(file.meta.size));
        limit.check(known_size)?;
        with_retries("downloadFile", &policy, || {
            let stream = self.inner.bot.download_file_stream(&file.path);
            limit.read(stream, known_size.unwrap_or(0), |error| {
                let message = self.inner.token.describe(&error);
                match error.status().map(|status| status.as_u16()) {
                    Some(404) => Failure::Fatal(PlatformError::NotFound(message)),
                    Some(status) if status < 500 => Failure::Fatal(PlatformError::Refused(message)),
                    _ => Failure::Transient(message),
                }
            })
        })
        .await
    }
}
