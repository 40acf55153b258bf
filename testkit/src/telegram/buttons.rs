//! Inline keyboards the way Telegram runs them: a bot's message carries
//! `reply_markup.inline_keyboard` (callback data checked like Telegram's, 1-64 bytes), a
//! press is a `callback_query` update built by [`FakeTelegram::callback_query`] (for
//! `getUpdates` or the webhook), and `answerCallbackQuery` is recorded as a
//! [`CallbackAnswer`], accepted once per query the fake issued.

use std::time::Duration;

use serde_json::{Value, json};

use super::FakeTelegram;
use super::builders::TgUser;
use super::encoding::Params;
use super::http::{ApiErr, bad_request};
use super::records::{CallbackAnswer, InlineButton, SentMessage};
use super::state::{Inner, Shared};
use crate::server::{WaitTimeout, at_least};

/// Telegram's limit on `callback_data`, in bytes.
const MAX_CALLBACK_DATA_BYTES: usize = 64;

/// Telegram's limit on the text of a callback answer, in characters.
const MAX_ANSWER_CHARS: usize = 200;

/// What Telegram answers for a query id it never issued, or one already answered (or
/// older than its answer window).
const QUERY_INVALID: &str = "query is too old and response timeout expired or query ID is invalid";

/// Checks the inline keyboard of a send the way Telegram does: every `callback_data` is
/// 1-64 bytes, else `400 Bad Request: BUTTON_DATA_INVALID`. Other markup passes.
pub(super) fn check_reply_markup(markup: Option<&Value>) -> Result<(), ApiErr> {
    let Some(rows) = markup
        .and_then(|m| m.get("inline_keyboard"))
        .and_then(Value::as_array)
    else {
        return Ok(());
    };
    let buttons = rows.iter().filter_map(Value::as_array).flatten();
    for button in buttons {
        if let Some(data) = button.get("callback_data") {
            let len = data.as_str().map_or(0, str::len);
            if len == 0 || len > MAX_CALLBACK_DATA_BYTES {
                return Err(bad_request("BUTTON_DATA_INVALID"));
            }
        }
    }
    Ok(())
}

/// `answerCallbackQuery`: accepted once for a query id the fake issued, recorded.
pub(super) fn answer_callback_query(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let id = params.str("callback_query_id").unwrap_or_default();
    let text = params.str("text");
    if text
        .as_deref()
        .is_some_and(|t| t.chars().count() > MAX_ANSWER_CHARS)
    {
        // Telegram's wording for an over-long answer is not documented; the fake's own.
        return Err(bad_request("MESSAGE_TOO_LONG"));
    }
    let mut inner = shared.lock();
    if !inner.open_callback_queries.remove(&id) {
        return Err(bad_request(QUERY_INVALID));
    }
    inner.callback_answers.push(CallbackAnswer {
        callback_query_id: id,
        text,
        show_alert: params.bool("show_alert"),
        params: Value::Object(params.map.clone()),
    });
    Ok(json!(true))
}

impl Inner {
    /// Remembers a `callback_query` seen in an update as open: answerable once.
    pub(super) fn learn_callback_query(&mut self, update: &Value) {
        if let Some(id) = update.pointer("/callback_query/id").and_then(Value::as_str) {
            self.open_callback_queries.insert(id.to_owned());
        }
    }
}

impl SentMessage {
    /// The rows of `reply_markup.inline_keyboard`, if the message has one (empty
    /// otherwise).
    pub fn inline_keyboard(&self) -> Vec<Vec<InlineButton>> {
        let Some(rows) = self
            .reply_markup
            .as_ref()
            .and_then(|m| m.get("inline_keyboard"))
            .and_then(Value::as_array)
        else {
            return Vec::new();
        };
        rows.iter()
            .filter_map(Value::as_array)
            .map(|row| {
                row.iter()
                    .map(|button| InlineButton {
                        text: button
                            .get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                        callback_data: button
                            .get("callback_data")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                    })
                    .collect()
            })
            .collect()
    }
}

impl FakeTelegram {
    /// Starts a press by `from` of a button under message `message_id` of `chat_id` with
    /// `data` as its `callback_data`. The `message` of the query is the stored message
    /// (the bot's sent messages are stored, with their topic) or, for one the fake does not
    /// know, a text message from the bot. An unknown chat becomes `from`'s private chat
    /// when `chat_id` is `from.id`, else a supergroup. Finish it with
    /// [`CallbackQueryBuilder::push`] or [`CallbackQueryBuilder::webhook_update`].
    pub fn callback_query(
        &self,
        from: TgUser,
        chat_id: i64,
        message_id: i64,
        data: impl Into<String>,
    ) -> CallbackQueryBuilder<'_> {
        CallbackQueryBuilder {
            fake: self,
            from,
            chat_id,
            message_id,
            data: Some(data.into()),
            id: None,
        }
    }

    /// Accepted `answerCallbackQuery` calls, oldest first.
    pub fn callback_answers(&self) -> Vec<CallbackAnswer> {
        self.shared.lock().callback_answers.clone()
    }

    /// Waits until at least `n` callback queries were answered, then returns every answer.
    pub async fn wait_for_callback_answers(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<CallbackAnswer>, WaitTimeout> {
        self.wait_until(timeout, |inner| {
            at_least(&inner.callback_answers, n, "callback answer(s)")
        })
        .await
    }
}

/// A `callback_query` update being built; created by [`FakeTelegram::callback_query`].
#[derive(Debug)]
#[must_use = "a callback query does nothing until .push() or .webhook_update()"]
pub struct CallbackQueryBuilder<'a> {
    fake: &'a FakeTelegram,
    from: TgUser,
    chat_id: i64,
    message_id: i64,
    data: Option<String>,
    id: Option<String>,
}

impl CallbackQueryBuilder<'_> {
    /// Sets the query `id` (default: a fresh `"cbq{n}"`).
    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = Some(id.into());
        self
    }

    /// Leaves `data` out, as in a game's callback (`game_short_name` is set instead).
    pub fn without_data(mut self) -> Self {
        self.data = None;
        self
    }

    /// The `CallbackQuery` object, its id open for one `answerCallbackQuery`.
    pub fn build(self) -> Value {
        let mut inner = self.fake.shared.lock();
        inner.remember_user(&self.from.to_json());
        if !inner.chats.contains_key(&self.chat_id) {
            if self.chat_id == self.from.id {
                inner.ensure_private(&self.from);
            } else {
                inner.ensure_group(self.chat_id);
            }
        }
        let message = inner
            .message(self.chat_id, self.message_id)
            .unwrap_or_else(|| inner.synthesize_message(self.chat_id, self.message_id, true));
        let id = self.id.unwrap_or_else(|| {
            inner.next_callback_query += 1;
            format!("cbq{}", inner.next_callback_query)
        });
        inner.open_callback_queries.insert(id.clone());
        let mut query = json!({
            "id": id,
            "from": self.from.to_json(),
            "message": message,
            // Telegram's is an opaque number per chat; any stable value serves.
            "chat_instance": format!("{}", self.chat_id.unsigned_abs().wrapping_mul(7_919)),
        });
        match self.data {
            Some(data) => query["data"] = json!(data),
            None => query["game_short_name"] = json!("game"),
        }
        query
    }

    /// Queues the press as `{"update_id":..,"callback_query":..}` for `getUpdates`;
    /// returns the `update_id`.
    pub fn push(self) -> i64 {
        let fake = self.fake;
        let query = self.build();
        fake.push_update(json!({ "callback_query": query }))
    }

    /// The press as a webhook update (see [`FakeTelegram::webhook_update`]), not queued
    /// for `getUpdates`; hand it to [`FakeTelegram::deliver_webhook`].
    pub fn webhook_update(self) -> Value {
        let fake = self.fake;
        let query = self.build();
        fake.webhook_update(json!({ "callback_query": query }))
    }
}
