//! What the fake knows: chats, messages, files, queued updates, scripted
//! failures and everything it recorded, behind one lock.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use serde_json::{Map, Value, json};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::builders::TgUser;
use super::records::{
    CallbackAnswer, ChatAction, EditedMessage, Failure, GetUpdatesCall, RecordedCall, SentMessage,
};
use super::webhook::Webhook;

/// The first `update_id` handed out when an update has none.
const FIRST_UPDATE_ID: i64 = 100_000;

/// `icon_color` of the synthesized `forum_topic_created` messages.
const TOPIC_ICON_COLOR: i64 = 7_322_096;

/// Update kinds Telegram does not send unless `allowed_updates` names them.
const OPT_IN_UPDATES: [&str; 3] = ["chat_member", "message_reaction", "message_reaction_count"];

/// The bot the fake impersonates, as `getMe` returns it: `@parlor_bot`
/// (id 4242) with privacy mode off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BotUser {
    pub(super) id: i64,
    first_name: String,
    pub(super) username: String,
    can_join_groups: bool,
    /// Privacy mode off.
    can_read_all_group_messages: bool,
    supports_inline_queries: bool,
    can_connect_to_business: bool,
    /// teloxide requires the field.
    has_main_web_app: bool,
}

impl Default for BotUser {
    fn default() -> Self {
        Self {
            id: 4242,
            first_name: "parlor".to_owned(),
            username: "parlor_bot".to_owned(),
            can_join_groups: true,
            can_read_all_group_messages: true,
            supports_inline_queries: false,
            can_connect_to_business: false,
            has_main_web_app: false,
        }
    }
}

impl BotUser {
    /// The bot as a `User` object (what appears in `from` of its messages).
    pub(super) fn user_json(&self) -> Value {
        json!({
            "id": self.id,
            "is_bot": true,
            "first_name": self.first_name,
            "username": self.username,
        })
    }

    /// The bot as `getMe` returns it: the `User` fields plus the bot-only
    /// capability flags.
    pub(super) fn me_json(&self) -> Value {
        let mut me = self.user_json();
        let extra = json!({
            "can_join_groups": self.can_join_groups,
            "can_read_all_group_messages": self.can_read_all_group_messages,
            "supports_inline_queries": self.supports_inline_queries,
            "can_connect_to_business": self.can_connect_to_business,
            "has_main_web_app": self.has_main_web_app,
        });
        merge(&mut me, extra);
        me
    }
}

#[derive(Debug)]
pub(super) struct ChatState {
    /// The `Chat` object, without `is_forum`.
    pub(super) json: Value,
    pub(super) is_forum: bool,
    /// Forum topics: thread id -> name.
    pub(super) topics: BTreeMap<i64, String>,
    pub(super) next_message_id: i64,
}

impl ChatState {
    pub(super) fn new(json: Value) -> Self {
        let is_forum = json.get("is_forum").and_then(Value::as_bool) == Some(true);
        let mut json = json;
        if let Some(obj) = json.as_object_mut() {
            obj.remove("is_forum");
        }
        Self {
            json,
            is_forum,
            topics: BTreeMap::new(),
            next_message_id: 1,
        }
    }

    pub(super) fn chat_json(&self) -> Value {
        let mut chat = self.json.clone();
        if self.is_forum {
            chat["is_forum"] = json!(true);
        }
        chat
    }

    pub(super) fn is_supergroup(&self) -> bool {
        self.json.get("type").and_then(Value::as_str) == Some("supergroup")
    }

    pub(super) fn is_private(&self) -> bool {
        self.json.get("type").and_then(Value::as_str) == Some("private")
    }
}

#[derive(Debug)]
pub(super) struct StoredFile {
    pub(super) unique_id: String,
    pub(super) path: String,
    pub(super) bytes: Bytes,
}

pub(super) struct Compose {
    pub(super) chat_id: i64,
    pub(super) from: Value,
    pub(super) date: i64,
    pub(super) reply: Option<Value>,
    pub(super) thread: Option<i64>,
    pub(super) content: Map<String, Value>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) bot: BotUser,
    pub(super) updates: VecDeque<Value>,
    pub(super) next_update_id: i64,
    pub(super) allowed_updates: Option<Vec<String>>,
    pub(super) filtered_updates: Vec<Value>,
    pub(super) acked_offset: Option<i64>,
    pub(super) poll_generation: u64,
    pub(super) get_updates_calls: Vec<GetUpdatesCall>,
    pub(super) chats: HashMap<i64, ChatState>,
    pub(super) users: HashMap<i64, Value>,
    pub(super) messages: HashMap<(i64, i64), Value>,
    pub(super) files: HashMap<String, StoredFile>,
    pub(super) next_file: u64,
    pub(super) downloads: Vec<String>,
    pub(super) admins: HashMap<i64, Vec<i64>>,
    /// Per method: scripted failures, each after that many calls still pass.
    pub(super) failures: HashMap<String, VecDeque<(usize, Failure)>>,
    pub(super) calls: Vec<RecordedCall>,
    pub(super) unknown: Vec<String>,
    pub(super) sent: Vec<SentMessage>,
    pub(super) actions: Vec<ChatAction>,
    pub(super) edits: Vec<EditedMessage>,
    pub(super) commands: Value,
    /// The webhook `setWebhook` set; `getUpdates` is refused while there is one.
    pub(super) webhook: Option<Webhook>,
    /// Callback query ids issued and not answered yet: Telegram takes one answer each.
    pub(super) open_callback_queries: HashSet<String>,
    /// The counter behind default callback query ids.
    pub(super) next_callback_query: u64,
    /// Accepted `answerCallbackQuery` calls.
    pub(super) callback_answers: Vec<CallbackAnswer>,
}

impl Inner {
    pub(super) fn new() -> Self {
        Self {
            bot: BotUser::default(),
            updates: VecDeque::new(),
            next_update_id: FIRST_UPDATE_ID,
            allowed_updates: None,
            filtered_updates: Vec::new(),
            acked_offset: None,
            poll_generation: 0,
            get_updates_calls: Vec::new(),
            chats: HashMap::new(),
            users: HashMap::new(),
            messages: HashMap::new(),
            files: HashMap::new(),
            next_file: 1,
            downloads: Vec::new(),
            admins: HashMap::new(),
            failures: HashMap::new(),
            calls: Vec::new(),
            unknown: Vec::new(),
            sent: Vec::new(),
            actions: Vec::new(),
            edits: Vec::new(),
            commands: json!([]),
            webhook: None,
            open_callback_queries: HashSet::new(),
            next_callback_query: 0,
            callback_answers: Vec::new(),
        }
    }

    pub(super) fn remember_user(&mut self, user: &Value) {
        if let Some(id) = user.get("id").and_then(Value::as_i64) {
            self.users.insert(id, user.clone());
        }
    }

    pub(super) fn ensure_group(&mut self, chat_id: i64) -> &mut ChatState {
        self.chats.entry(chat_id).or_insert_with(|| {
            ChatState::new(json!({
                "id": chat_id,
                "type": "supergroup",
                "title": format!("group {chat_id}"),
            }))
        })
    }

    pub(super) fn ensure_private(&mut self, user: &TgUser) {
        self.chats
            .entry(user.id)
            .or_insert_with(|| ChatState::new(user.private_chat_json()));
    }

    pub(super) fn ensure_topic(&mut self, chat_id: i64, thread_id: i64, creator: &Value) {
        let chat = self.ensure_group(chat_id);
        chat.is_forum = true;
        if chat.topics.contains_key(&thread_id) {
            return;
        }
        let name = format!("topic {thread_id}");
        chat.topics.insert(thread_id, name.clone());
        chat.next_message_id = chat.next_message_id.max(thread_id + 1);
        let chat_json = chat.chat_json();
        self.messages
            .entry((chat_id, thread_id))
            .or_insert_with(|| {
                json!({
                    "message_id": thread_id,
                    "message_thread_id": thread_id,
                    "is_topic_message": true,
                    "from": creator,
                    "chat": chat_json,
                    "date": now_unix() - 60,
                    "forum_topic_created": {"name": name, "icon_color": TOPIC_ICON_COLOR},
                })
            });
    }

    pub(super) fn chat_json(&self, chat_id: i64) -> Value {
        self.chats.get(&chat_id).map_or_else(
            || json!({"id": chat_id, "type": "supergroup"}),
            ChatState::chat_json,
        )
    }

    pub(super) fn message(&self, chat_id: i64, message_id: i64) -> Option<Value> {
        self.messages.get(&(chat_id, message_id)).cloned()
    }

    pub(super) fn synthesize_message(
        &self,
        chat_id: i64,
        message_id: i64,
        from_bot: bool,
    ) -> Value {
        let from = if from_bot {
            self.bot.user_json()
        } else {
            json!({"id": 1, "is_bot": false, "first_name": "someone"})
        };
        json!({
            "message_id": message_id,
            "from": from,
            "chat": self.chat_json(chat_id),
            "date": now_unix() - 60,
            "text": "(earlier message)",
        })
    }

    pub(super) fn alloc_message_id(&mut self, chat_id: i64) -> i64 {
        let chat = self
            .chats
            .entry(chat_id)
            .or_insert_with(|| ChatState::new(json!({"id": chat_id, "type": "supergroup"})));
        let id = chat.next_message_id;
        chat.next_message_id += 1;
        id
    }

    /// Creates, stores and returns a new message in `c.chat_id`.
    pub(super) fn compose(&mut self, c: Compose) -> Value {
        let message_id = self.alloc_message_id(c.chat_id);
        let (chat_json, supergroup, topic_name) = {
            let chat = &self.chats[&c.chat_id];
            (
                chat.chat_json(),
                chat.is_supergroup(),
                c.thread.and_then(|t| chat.topics.get(&t).cloned()),
            )
        };
        let mut msg = json!({
            "message_id": message_id,
            "from": c.from,
            "chat": chat_json.clone(),
            "date": c.date,
        });
        let reply = c.reply.map(|mut r| {
            if let Some(obj) = r.as_object_mut() {
                obj.remove("reply_to_message");
            }
            r
        });
        match (c.thread, reply) {
            (Some(thread), reply) => {
                msg["message_thread_id"] = json!(thread);
                msg["is_topic_message"] = json!(true);
                let reply = reply
                    .or_else(|| self.message(c.chat_id, thread))
                    .unwrap_or_else(|| {
                        let name = topic_name.unwrap_or_else(|| format!("topic {thread}"));
                        json!({
                            "message_id": thread,
                            "message_thread_id": thread,
                            "is_topic_message": true,
                            "chat": chat_json,
                            "date": c.date,
                            "forum_topic_created": {"name": name, "icon_color": TOPIC_ICON_COLOR},
                        })
                    });
                msg["reply_to_message"] = reply;
            }
            (None, Some(reply)) => {
                if supergroup {
                    let root = reply
                        .get("message_thread_id")
                        .and_then(Value::as_i64)
                        .or_else(|| reply.get("message_id").and_then(Value::as_i64));
                    if let Some(root) = root {
                        msg["message_thread_id"] = json!(root);
                    }
                    if reply.get("is_topic_message").and_then(Value::as_bool) == Some(true) {
                        msg["is_topic_message"] = json!(true);
                    }
                }
                msg["reply_to_message"] = reply;
            }
            (None, None) => {}
        }
        merge(&mut msg, Value::Object(c.content));
        self.messages.insert((c.chat_id, message_id), msg.clone());
        msg
    }

    /// Learns chats, users, messages and open callback queries from a raw update.
    pub(super) fn learn(&mut self, update: &Value) {
        self.learn_callback_query(update);
        for key in [
            "message",
            "edited_message",
            "channel_post",
            "edited_channel_post",
            "business_message",
            "edited_business_message",
        ] {
            let Some(msg) = update.get(key) else { continue };
            let Some(chat) = msg.get("chat") else {
                continue;
            };
            let Some(chat_id) = chat.get("id").and_then(Value::as_i64) else {
                continue;
            };
            let state = self
                .chats
                .entry(chat_id)
                .or_insert_with(|| ChatState::new(chat.clone()));
            if chat.get("is_forum").and_then(Value::as_bool) == Some(true) {
                state.is_forum = true;
            }
            if let Some(mid) = msg.get("message_id").and_then(Value::as_i64) {
                state.next_message_id = state.next_message_id.max(mid + 1);
                if msg.get("is_topic_message").and_then(Value::as_bool) == Some(true)
                    && let Some(thread) = msg.get("message_thread_id").and_then(Value::as_i64)
                {
                    state
                        .topics
                        .entry(thread)
                        .or_insert_with(|| format!("topic {thread}"));
                }
                self.messages.insert((chat_id, mid), msg.clone());
            }
            if let Some(from) = msg.get("from") {
                self.remember_user(from);
            }
        }
    }

    pub(super) fn update_allowed(&self, update: &Value) -> bool {
        let Some(kind) = update
            .as_object()
            .and_then(|o| o.keys().find(|k| k.as_str() != "update_id"))
        else {
            return true;
        };
        match &self.allowed_updates {
            Some(allowed) => allowed.iter().any(|a| a == kind),
            None => !OPT_IN_UPDATES.contains(&kind.as_str()),
        }
    }

    pub(super) fn apply_offset(&mut self, offset: i64) {
        if offset > 0 {
            self.updates.retain(|u| update_id(u) >= offset);
            self.acked_offset = Some(self.acked_offset.map_or(offset, |o| o.max(offset)));
        } else if offset < 0 {
            let keep = usize::try_from(offset.unsigned_abs()).unwrap_or(usize::MAX);
            while self.updates.len() > keep {
                self.updates.pop_front();
            }
        }
    }

    pub(super) fn file_json(&self, file_id: &str) -> Option<Value> {
        self.files.get(file_id).map(|f| {
            json!({
                "file_id": file_id,
                "file_unique_id": f.unique_id,
                "file_size": f.bytes.len(),
                "file_path": f.path,
            })
        })
    }

    pub(super) fn store_file(&mut self, file_id: String, bytes: Bytes) -> String {
        let path = format!("documents/file_{}", self.next_file);
        self.next_file += 1;
        self.files.insert(
            file_id.clone(),
            StoredFile {
                unique_id: unique_id(&file_id),
                path: path.clone(),
                bytes,
            },
        );
        path
    }

    pub(super) fn user_json(&self, user_id: i64) -> Value {
        if user_id == self.bot.id {
            return self.bot.user_json();
        }
        self.users.get(&user_id).cloned().unwrap_or_else(
            || json!({"id": user_id, "is_bot": false, "first_name": format!("user{user_id}")}),
        )
    }
}

pub(super) fn update_id(update: &Value) -> i64 {
    update
        .get("update_id")
        .and_then(Value::as_i64)
        .unwrap_or_default()
}

pub(super) struct Shared {
    pub(super) token: String,
    pub(super) inner: Mutex<Inner>,
    /// Woken when updates are pushed or a new `getUpdates` starts.
    pub(super) updates: Notify,
    /// Woken when anything is recorded (calls, sent messages, offsets).
    pub(super) changed: Notify,
    pub(super) cancel: CancellationToken,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Inner> {
        crate::server::lock(&self.inner)
    }
}

pub(super) fn now_unix() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// A stable short `file_unique_id` derived from a `file_id` (FNV-1a).
pub(super) fn unique_id(file_id: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for b in file_id.bytes() {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("AQAD{hash:016x}")
}

/// Shallow-merges the fields of object `extra` into object `base`.
pub(super) fn merge(base: &mut Value, extra: Value) {
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
}
