//! The Bot API methods the fake implements beyond bookkeeping, each checking
//! its parameters the way Telegram does and answering with what Telegram
//! would.

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::builders::{PHOTO_SIZE, utf16_len};
use super::buttons::check_reply_markup;
use super::encoding::{Params, as_i64};
use super::html::parse_html;
use super::http::{ApiErr, bad_request, ok};
use super::records::{ChatAction, EditedMessage, Failure, GetUpdatesCall, SentMessage};
use super::state::{Compose, Inner, Shared, now_unix, unique_id};
use crate::server::deadline_after;

/// Maximum text length of a message, in UTF-16 code units after entity
/// parsing.
const MAX_TEXT_UTF16: usize = 4096;

/// Maximum caption length of a media message, in UTF-16 code units.
const MAX_CAPTION_UTF16: usize = 1024;

/// Chat actions `sendChatAction` accepts.
const CHAT_ACTIONS: [&str; 11] = [
    "typing",
    "upload_photo",
    "record_video",
    "upload_video",
    "record_voice",
    "upload_voice",
    "upload_document",
    "choose_sticker",
    "find_location",
    "record_video_note",
    "upload_video_note",
];

pub(super) async fn get_updates(shared: &Arc<Shared>, params: &Params) -> Response {
    let offset = params.i64("offset");
    let limit = params
        .i64("limit")
        .map_or(100, |l| l.clamp(1, 100))
        .try_into()
        .unwrap_or(100usize);
    let timeout = params.i64("timeout").unwrap_or(0).max(0);
    let allowed: Option<Vec<String>> = params.json("allowed_updates").and_then(|v| {
        v.as_array().map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
    });
    let generation = {
        let mut inner = shared.lock();
        inner.poll_generation += 1;
        inner.get_updates_calls.push(GetUpdatesCall {
            offset,
            limit: params.i64("limit"),
            timeout: params.i64("timeout"),
            allowed_updates: allowed.clone(),
        });
        if let Some(offset) = offset {
            inner.apply_offset(offset);
        }
        if let Some(allowed) = allowed {
            inner.allowed_updates = if allowed.is_empty() {
                None
            } else {
                Some(allowed)
            };
        }
        inner.poll_generation
    };
    // Ends an older poll that is still waiting (it answers 409).
    shared.updates.notify_waiters();
    shared.changed.notify_waiters();

    let deadline = deadline_after(Duration::from_secs(timeout.unsigned_abs()));
    loop {
        let notified = shared.updates.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let inner = shared.lock();
            if inner.poll_generation != generation {
                drop(inner);
                return Failure::Conflict.render();
            }
            let batch: Vec<Value> = inner.updates.iter().take(limit).cloned().collect();
            if !batch.is_empty() || tokio::time::Instant::now() >= deadline {
                return ok(Value::Array(batch));
            }
        }
        tokio::select! {
            _ = tokio::time::timeout_at(deadline, notified) => {}
            () = shared.cancel.cancelled() => return ok(json!([])),
        }
    }
}

fn chat_id_param(inner: &Inner, params: &Params) -> Result<i64, ApiErr> {
    let Some(raw) = params.get("chat_id") else {
        return Err(bad_request("chat_id is empty"));
    };
    let Some(chat_id) = as_i64(raw) else {
        return Err(bad_request("chat not found"));
    };
    if inner.chats.contains_key(&chat_id) {
        Ok(chat_id)
    } else if chat_id > 0 {
        Err(ApiErr {
            status: StatusCode::FORBIDDEN,
            description: "Forbidden: bot can't initiate conversation with a user".to_owned(),
        })
    } else {
        Err(bad_request("chat not found"))
    }
}

/// The reply target of a send: `reply_parameters.message_id` or legacy
/// `reply_to_message_id`, with `allow_sending_without_reply`.
fn reply_param(params: &Params) -> (Option<i64>, bool) {
    if let Some(rp) = params.json("reply_parameters") {
        let id = rp.get("message_id").and_then(as_i64);
        let lenient = rp
            .get("allow_sending_without_reply")
            .and_then(Value::as_bool)
            == Some(true);
        return (id, lenient);
    }
    (
        params.i64("reply_to_message_id"),
        params.bool("allow_sending_without_reply"),
    )
}

/// Checks thread and reply target of a send to `chat_id`; returns the
/// `reply_to_message` to embed.
fn send_context(
    inner: &Inner,
    chat_id: i64,
    thread: Option<i64>,
    reply_to: Option<i64>,
    lenient: bool,
) -> Result<Option<Value>, ApiErr> {
    if let Some(thread) = thread {
        let chat = &inner.chats[&chat_id];
        if !(chat.is_forum && chat.topics.contains_key(&thread)) {
            return Err(bad_request("message thread not found"));
        }
    }
    match reply_to {
        Some(id) => match inner.message(chat_id, id) {
            Some(m) => Ok(Some(m)),
            None if lenient => Ok(None),
            None => Err(bad_request("message to be replied not found")),
        },
        None => Ok(None),
    }
}

/// Parses `text` according to `parse_mode` into the delivered text and its
/// entities.
fn formatted(
    text: &str,
    parse_mode: Option<&str>,
    explicit: Option<Value>,
) -> Result<(String, Vec<Value>), ApiErr> {
    match parse_mode.map(str::to_ascii_lowercase).as_deref() {
        None | Some("") => Ok((
            text.to_owned(),
            explicit
                .and_then(|v| v.as_array().cloned())
                .unwrap_or_default(),
        )),
        Some("html") => {
            parse_html(text).map_err(|e| bad_request(&format!("can't parse entities: {e}")))
        }
        Some("markdown" | "markdownv2") => Ok((text.to_owned(), Vec::new())),
        Some(_) => Err(bad_request("unsupported parse_mode")),
    }
}

/// What a send or edit call asked for, as its record reports it.
struct Asked {
    text: String,
    parse_mode: Option<String>,
    file_id: Option<String>,
}

/// Parses and checks the `text` parameter the way Telegram does for messages
/// (captions have their own limit): what was asked, and the delivered text
/// with its entities.
fn message_text(params: &Params) -> Result<(Asked, String, Vec<Value>), ApiErr> {
    let text = params.str("text").unwrap_or_default();
    let parse_mode = params.str("parse_mode");
    let (plain, entities) = formatted(&text, parse_mode.as_deref(), params.json("entities"))?;
    if plain.trim().is_empty() {
        return Err(bad_request("message text is empty"));
    }
    if utf16_len(&plain) > MAX_TEXT_UTF16 {
        return Err(bad_request("message is too long"));
    }
    let asked = Asked {
        text,
        parse_mode,
        file_id: None,
    };
    Ok((asked, plain, entities))
}

pub(super) fn send_message(shared: &Shared, name: &str, params: &Params) -> Result<Value, ApiErr> {
    let mut inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let (asked, plain, entities) = message_text(params)?;
    let mut content = Map::new();
    content.insert("text".into(), json!(plain));
    if !entities.is_empty() {
        content.insert("entities".into(), Value::Array(entities));
    }
    let markup = params.json("reply_markup");
    check_reply_markup(markup.as_ref())?;
    if let Some(markup) = markup {
        content.insert("reply_markup".into(), markup);
    }
    post(&mut inner, name, params, chat_id, content, asked)
}

pub(super) fn send_media(
    shared: &Shared,
    name: &str,
    lower: &str,
    params: &Params,
) -> Result<Value, ApiErr> {
    let field = if lower == "sendphoto" {
        "photo"
    } else {
        "document"
    };
    let mut inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let (file_id, file_name, size) = match params.upload(field) {
        Some(upload) => {
            let id = format!("fake-file-{}", inner.next_file);
            let size = upload.bytes.len();
            inner.store_file(id.clone(), upload.bytes.clone());
            (id, upload.file_name.clone(), size)
        }
        None => {
            let Some(id) = params.str(field).filter(|s| !s.is_empty()) else {
                return Err(bad_request(&format!("there is no {field} in the request")));
            };
            let size = inner.files.get(&id).map_or(0, |f| f.bytes.len());
            (id, None, size)
        }
    };
    let caption = params.str("caption").unwrap_or_default();
    let parse_mode = params.str("parse_mode");
    let (plain, entities) = formatted(
        &caption,
        parse_mode.as_deref(),
        params.json("caption_entities"),
    )?;
    if utf16_len(&plain) > MAX_CAPTION_UTF16 {
        return Err(bad_request("message caption is too long"));
    }
    let mut content = Map::new();
    if field == "photo" {
        content.insert(
            "photo".into(),
            json!([{
                "file_id": file_id,
                "file_unique_id": unique_id(&file_id),
                "file_size": size,
                "width": PHOTO_SIZE.0,
                "height": PHOTO_SIZE.1,
            }]),
        );
    } else {
        let mut doc = json!({
            "file_id": file_id,
            "file_unique_id": unique_id(&file_id),
            "file_size": size,
        });
        if let Some(n) = &file_name {
            doc["file_name"] = json!(n);
        }
        content.insert("document".into(), doc);
    }
    if !plain.is_empty() {
        content.insert("caption".into(), json!(plain));
    }
    if !entities.is_empty() {
        content.insert("caption_entities".into(), Value::Array(entities));
    }
    let asked = Asked {
        text: caption,
        parse_mode,
        file_id: Some(file_id),
    };
    post(&mut inner, name, params, chat_id, content, asked)
}

/// Posts `content` from the bot into `chat_id`, in the thread and as the
/// reply the call asked for, and records it as sent.
fn post(
    inner: &mut Inner,
    name: &str,
    params: &Params,
    chat_id: i64,
    content: Map<String, Value>,
    asked: Asked,
) -> Result<Value, ApiErr> {
    let thread = params.i64("message_thread_id");
    let (reply_to, lenient) = reply_param(params);
    let reply = send_context(inner, chat_id, thread, reply_to, lenient)?;
    let from = inner.bot.user_json();
    let message = inner.compose(Compose {
        chat_id,
        from,
        date: now_unix(),
        reply,
        thread,
        content,
    });
    inner.sent.push(SentMessage {
        method: name.to_owned(),
        chat_id,
        message_id: message["message_id"].as_i64().unwrap_or_default(),
        text: asked.text,
        parse_mode: asked.parse_mode,
        reply_to_message_id: reply_to,
        thread_id: thread,
        reply_markup: params.json("reply_markup"),
        file_id: asked.file_id,
        params: Value::Object(params.map.clone()),
        message: message.clone(),
        accepted_at: std::time::Instant::now(),
    });
    Ok(message)
}

pub(super) fn edit_message_text(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let mut inner = shared.lock();
    if params.get("inline_message_id").is_some() {
        return Ok(json!(true));
    }
    let chat_id = chat_id_param(&inner, params)?;
    let Some(message_id) = params.i64("message_id") else {
        return Err(bad_request("message identifier is not specified"));
    };
    let Some(mut message) = inner.message(chat_id, message_id) else {
        return Err(bad_request("message to edit not found"));
    };
    if message.pointer("/from/id").and_then(Value::as_i64) != Some(inner.bot.id) {
        return Err(bad_request("message can't be edited"));
    }
    let (asked, plain, entities) = message_text(params)?;
    let markup = params.json("reply_markup");
    let old_entities = message
        .get("entities")
        .cloned()
        .unwrap_or_else(|| json!([]));
    if message.get("text") == Some(&json!(plain))
        && old_entities == json!(entities)
        && message.get("reply_markup") == markup.as_ref()
    {
        return Err(bad_request(
            "message is not modified: specified new message content and reply markup are exactly the same as a current content and reply markup of the message",
        ));
    }
    message["text"] = json!(plain);
    if let Some(obj) = message.as_object_mut() {
        obj.remove("entities");
        obj.remove("reply_markup");
    }
    if !entities.is_empty() {
        message["entities"] = Value::Array(entities);
    }
    if let Some(markup) = markup {
        message["reply_markup"] = markup;
    }
    message["edit_date"] = json!(now_unix());
    inner
        .messages
        .insert((chat_id, message_id), message.clone());
    inner.edits.push(EditedMessage {
        chat_id,
        message_id,
        text: asked.text,
        parse_mode: asked.parse_mode,
        params: Value::Object(params.map.clone()),
    });
    Ok(message)
}

pub(super) fn send_chat_action(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let mut inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let action = params.str("action").unwrap_or_default();
    if !CHAT_ACTIONS.contains(&action.as_str()) {
        return Err(bad_request("wrong parameter action in request"));
    }
    inner.actions.push(ChatAction {
        chat_id,
        action,
        thread_id: params.i64("message_thread_id"),
    });
    Ok(json!(true))
}

pub(super) fn get_file(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let file_id = params.str("file_id").unwrap_or_default();
    shared
        .lock()
        .file_json(&file_id)
        .ok_or_else(|| bad_request("invalid file_id"))
}

fn admin_json(user: Value, creator: bool) -> Value {
    if creator {
        return json!({"status": "creator", "user": user, "is_anonymous": false});
    }
    json!({
        "status": "administrator",
        "user": user,
        "can_be_edited": false,
        "is_anonymous": false,
        "can_manage_chat": true,
        "can_delete_messages": true,
        "can_manage_video_chats": true,
        "can_restrict_members": true,
        "can_promote_members": false,
        "can_change_info": true,
        "can_invite_users": true,
        "can_post_stories": false,
        "can_edit_stories": false,
        "can_delete_stories": false,
        "can_pin_messages": true,
        "can_manage_topics": false,
    })
}

pub(super) fn get_chat_administrators(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    if inner.chats[&chat_id].is_private() {
        return Err(bad_request(
            "there are no administrators in the private chat",
        ));
    }
    let ids = inner.admins.get(&chat_id).cloned().unwrap_or_default();
    Ok(ids
        .iter()
        .enumerate()
        .map(|(i, id)| admin_json(inner.user_json(*id), i == 0))
        .collect())
}

pub(super) fn get_chat_member(shared: &Shared, params: &Params) -> Result<Value, ApiErr> {
    let inner = shared.lock();
    let chat_id = chat_id_param(&inner, params)?;
    let Some(user_id) = params.i64("user_id") else {
        return Err(bad_request("user not found"));
    };
    let user = inner.user_json(user_id);
    let ids = inner.admins.get(&chat_id).cloned().unwrap_or_default();
    Ok(match ids.iter().position(|id| *id == user_id) {
        Some(i) => admin_json(user, i == 0),
        None if inner.users.contains_key(&user_id) || user_id == inner.bot.id => {
            json!({"status": "member", "user": user})
        }
        None => json!({"status": "left", "user": user}),
    })
}
