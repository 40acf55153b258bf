//! What the fake records of the bot's calls, and the failures it can be
//! scripted to answer with.

use std::time::Instant;

use serde_json::Value;

#[cfg(doc)]
use super::FakeTelegram;

/// A scripted error answer, queued per method with
/// [`FakeTelegram::fail_next`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// `429 {"description":"Too Many Requests: retry after N","parameters":{"retry_after":N}}`
    /// (teloxide: `RequestError::RetryAfter`).
    RetryAfter(u32),
    /// `409 Conflict: terminated by other getUpdates request; make sure that
    /// only one bot instance is running` (teloxide:
    /// `RequestError::Api(ApiError::TerminatedByOtherGetUpdates)`).
    Conflict,
    /// `400` with this description; `"Bad Request: "` is prepended unless
    /// already present.
    BadRequest(String),
    /// `400 Bad Request: group chat was upgraded to a supergroup chat` with
    /// `parameters.migrate_to_chat_id` (teloxide:
    /// `RequestError::MigrateToChatId`).
    MigrateToChatId(i64),
    /// Any status with this exact description. An invalid status becomes
    /// 500. Note that teloxide sleeps 10 s before reading any 5xx answer.
    Status(u16, String),
}

/// A message the bot sent (`sendMessage`, `sendPhoto` or `sendDocument`)
/// and the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct SentMessage {
    /// The method as it was called, e.g. `"sendMessage"` or `"SendMessage"`.
    pub method: String,
    /// The target chat.
    pub chat_id: i64,
    /// The `message_id` the fake assigned.
    pub message_id: i64,
    /// `text` exactly as sent (for media: the `caption`, or empty).
    pub text: String,
    /// `parse_mode`, e.g. `"HTML"`.
    pub parse_mode: Option<String>,
    /// `reply_parameters.message_id` (or the legacy `reply_to_message_id`).
    pub reply_to_message_id: Option<i64>,
    /// `message_thread_id`.
    pub thread_id: Option<i64>,
    /// `reply_markup`, if any.
    pub reply_markup: Option<Value>,
    /// For media: the `file_id` of the sent photo or document.
    pub file_id: Option<String>,
    /// All request parameters (file parts appear as
    /// `{"file_name":..,"size":..}`).
    pub params: Value,
    /// The `Message` object the fake answered with.
    pub message: Value,
    /// When the fake accepted the send (before it answered): what a test compares with the
    /// moments it killed the bot, to tell a resend of the documented window (a kill between
    /// the platform accepting a send and the bot recording it) from any other double.
    pub accepted_at: Instant,
}

/// A button of a sent message's inline keyboard (see [`SentMessage::inline_keyboard`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InlineButton {
    /// `text`, the label.
    pub text: String,
    /// `callback_data`, for a callback button.
    pub callback_data: Option<String>,
}

/// An `answerCallbackQuery` call the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct CallbackAnswer {
    /// `callback_query_id`.
    pub callback_query_id: String,
    /// `text`, if any.
    pub text: Option<String>,
    /// `show_alert` (false when absent, as on Telegram).
    pub show_alert: bool,
    /// All request parameters.
    pub params: Value,
}

/// A `sendChatAction` call the fake accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatAction {
    /// The target chat.
    pub chat_id: i64,
    /// The action, e.g. `"typing"`.
    pub action: String,
    /// `message_thread_id`, if any.
    pub thread_id: Option<i64>,
}

/// An `editMessageText` call the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct EditedMessage {
    /// The chat of the edited message.
    pub chat_id: i64,
    /// The edited message.
    pub message_id: i64,
    /// The new text exactly as sent.
    pub text: String,
    /// `parse_mode`, if any.
    pub parse_mode: Option<String>,
    /// All request parameters.
    pub params: Value,
}

/// The parameters of one `getUpdates` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetUpdatesCall {
    /// `offset`, if given.
    pub offset: Option<i64>,
    /// `limit`, if given.
    pub limit: Option<i64>,
    /// `timeout` in seconds, if given.
    pub timeout: Option<i64>,
    /// `allowed_updates`, if given.
    pub allowed_updates: Option<Vec<String>>,
}

/// One Bot API method call as the fake received it (with the right token).
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    /// The method name as it appeared in the URL, e.g. `"GetUpdates"`.
    pub method: String,
    /// The HTTP method, e.g. `"POST"`.
    pub http_method: String,
    /// The `Content-Type` header, if any.
    pub content_type: Option<String>,
    /// Query and body parameters merged into one object (body wins). Values
    /// from query strings, forms and multipart text fields stay strings;
    /// multipart file parts appear as `{"file_name":..,"size":..}`.
    pub params: Value,
}

impl RecordedCall {
    /// Whether this is a call of `method` (compared case-insensitively).
    pub(super) fn is(&self, method: &str) -> bool {
        self.method.eq_ignore_ascii_case(method)
    }
}
