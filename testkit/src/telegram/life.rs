//! Updates about a chat's life rather than a message in it, the way Telegram shapes them:
//! the bot added or removed (`my_chat_member`), a basic group upgraded to a supergroup
//! (`migrate_to_chat_id` / `migrate_from_chat_id`), an edited message (`edited_message`).

use serde_json::{Value, json};

use super::FakeTelegram;
use super::builders::TgUser;
use super::state::{ChatState, now_unix};

impl FakeTelegram {
    /// Registers basic group `chat_id` (`"type": "group"`, a small negative id such as
    /// `-5001`), which [`FakeTelegram::upgrade_group`] can turn into a supergroup. Message
    /// builders then post into it.
    pub fn basic_group(&self, chat_id: i64, title: &str) {
        let mut inner = self.shared.lock();
        inner.chats.insert(
            chat_id,
            ChatState::new(json!({"id": chat_id, "type": "group", "title": title})),
        );
    }

    /// Queues a `my_chat_member` update: `by` added the bot to `chat_id` with status
    /// `status` (`"member"` or `"administrator"`). Returns the `update_id`.
    pub fn bot_added(&self, chat_id: i64, by: &TgUser, status: &str) -> i64 {
        self.bot_status(chat_id, by, "left", status)
    }

    /// Queues a `my_chat_member` update: the bot's status in `chat_id` went from `member`
    /// to `status` (`"left"`, or `"kicked"` when `by` removed it). Returns the `update_id`.
    pub fn bot_removed(&self, chat_id: i64, by: &TgUser, status: &str) -> i64 {
        self.bot_status(chat_id, by, "member", status)
    }

    fn bot_status(&self, chat_id: i64, by: &TgUser, old: &str, new: &str) -> i64 {
        let (chat, bot) = {
            let mut inner = self.shared.lock();
            inner.remember_user(&by.to_json());
            if !inner.chats.contains_key(&chat_id) {
                inner.ensure_group(chat_id);
            }
            (inner.chat_json(chat_id), inner.bot.user_json())
        };
        let member = |status: &str| {
            let mut member = json!({"status": status, "user": bot});
            if status == "kicked" {
                member["until_date"] = json!(0);
            }
            if status == "administrator" {
                for right in [
                    "can_be_edited",
                    "is_anonymous",
                    "can_manage_chat",
                    "can_delete_messages",
                    "can_manage_video_chats",
                    "can_restrict_members",
                    "can_promote_members",
                    "can_change_info",
                    "can_invite_users",
                    "can_post_stories",
                    "can_edit_stories",
                    "can_delete_stories",
                ] {
                    member[right] = json!(false);
                }
            }
            member
        };
        self.push_update(json!({
            "my_chat_member": {
                "chat": chat,
                "from": by.to_json(),
                "date": now_unix(),
                "old_chat_member": member(old),
                "new_chat_member": member(new),
            }
        }))
    }

    /// Upgrades basic group `old` to supergroup `new` (same title), as Telegram reports
    /// it: a service message with `migrate_to_chat_id` in the old group, then one with
    /// `migrate_from_chat_id` in the new supergroup (from `GroupAnonymousBot`, as the
    /// group). Returns both `update_id`s.
    pub fn upgrade_group(&self, old: i64, new: i64, by: &TgUser) -> (i64, i64) {
        let (old_message, new_message) = {
            let mut inner = self.shared.lock();
            let title = inner
                .chat_json(old)
                .get("title")
                .cloned()
                .unwrap_or_else(|| json!(format!("group {old}")));
            inner.chats.insert(
                new,
                ChatState::new(json!({"id": new, "type": "supergroup", "title": title})),
            );
            let old_chat = inner.chat_json(old);
            let new_chat = inner.chat_json(new);
            let old_id = inner.alloc_message_id(old);
            let new_id = inner.alloc_message_id(new);
            (
                json!({
                    "message_id": old_id,
                    "from": by.to_json(),
                    "chat": old_chat,
                    "date": now_unix(),
                    "migrate_to_chat_id": new,
                }),
                json!({
                    "message_id": new_id,
                    "from": {"id": 1_087_968_824, "is_bot": true, "first_name": "Group",
                             "username": "GroupAnonymousBot"},
                    "sender_chat": new_chat.clone(),
                    "chat": new_chat,
                    "date": now_unix(),
                    "migrate_from_chat_id": old,
                }),
            )
        };
        (
            self.push_update(json!({ "message": old_message })),
            self.push_update(json!({ "message": new_message })),
        )
    }

    /// Queues an `edited_message` update: message `message_id` of `chat_id` (one the fake
    /// knows) with the new text `text`, an `edit_date`, and no entities (a mention of the
    /// bot is still seen by its `@username` in the text). `None` when the fake does not
    /// know the message.
    pub fn edit_message(&self, chat_id: i64, message_id: i64, text: &str) -> Option<i64> {
        let mut message: Value = self.message(chat_id, message_id)?;
        let object = message.as_object_mut()?;
        object.remove("entities");
        object.remove("caption_entities");
        if object.contains_key("caption") {
            object.insert("caption".into(), json!(text));
        } else {
            object.insert("text".into(), json!(text));
        }
        object.insert("edit_date".into(), json!(now_unix()));
        Some(self.push_update(json!({ "edited_message": message })))
    }
}
