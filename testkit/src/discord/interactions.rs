//! Buttons the way Discord runs them: a message's `components` (action rows of buttons,
//! checked like Discord's), a press dispatched as `INTERACTION_CREATE` by
//! [`FakeDiscord::button_press`], and the two answers a bot gives, both recorded: the
//! interaction response (`POST /interactions/{id}/{token}/callback`, once per interaction)
//! and follow-up messages through the interaction's webhook
//! (`POST /webhooks/{application}/{token}`, only after a response).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{
    DEFAULT_GUILD_ID, DiscordSent, DiscordUser, FakeDiscord, Inner, Shared, content_of,
    discord_error, empty_message, example_message, gate, invalid_json, json_response,
};
use crate::server::{WaitTimeout, at_least};

/// Discord's limit on components in one action row.
const MAX_ROW_COMPONENTS: usize = 5;

/// Discord's limit on a `custom_id`, in characters.
const MAX_CUSTOM_ID_CHARS: usize = 100;

/// Discord's limit on a button label, in characters.
const MAX_LABEL_CHARS: usize = 80;

/// The message flag "ephemeral".
const EPHEMERAL: u64 = 1 << 6;

/// An interaction the fake dispatched, as it remembers it.
#[derive(Debug, Clone)]
pub(super) struct Issued {
    token: String,
    application_id: u64,
    /// Whether the interaction got its one response.
    responded: bool,
}

/// An interaction [`FakeDiscord::button_press`] dispatched: what a test needs to find its
/// answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscordInteraction {
    /// The interaction's snowflake.
    pub id: String,
    /// Its token.
    pub token: String,
    /// The application it is for (the bot's id).
    pub application_id: String,
}

/// A button of a sent message's `components` (see [`DiscordSent::buttons`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscordButton {
    /// `label`.
    pub label: Option<String>,
    /// `custom_id` (link buttons have none).
    pub custom_id: Option<String>,
    /// `style`: 1 primary, 2 secondary, 3 success, 4 danger, 5 link.
    pub style: u64,
}

/// A `POST /interactions/{id}/{token}/callback` the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscordInteractionCallback {
    /// The interaction.
    pub interaction_id: String,
    /// The response `type` (6: deferred update message).
    pub kind: u64,
    /// The whole request body.
    pub body: Value,
}

/// A `POST /webhooks/{application}/{token}` follow-up the fake accepted.
#[derive(Debug, Clone, PartialEq)]
pub struct DiscordFollowup {
    /// The interaction whose token it used.
    pub interaction_id: String,
    /// `content`.
    pub content: String,
    /// `flags` (64: ephemeral), 0 when absent.
    pub flags: u64,
    /// The whole request body.
    pub body: Value,
}

impl DiscordFollowup {
    /// Whether only the user of the interaction sees it (flag 64).
    pub fn is_ephemeral(&self) -> bool {
        self.flags & EPHEMERAL != 0
    }
}

impl DiscordSent {
    /// `components`, as sent.
    pub fn components(&self) -> Option<&Value> {
        self.body.get("components").filter(|c| !c.is_null())
    }

    /// The buttons of every action row, in order.
    pub fn buttons(&self) -> Vec<DiscordButton> {
        let rows = self.components().and_then(Value::as_array);
        rows.into_iter()
            .flatten()
            .filter_map(|row| row.get("components").and_then(Value::as_array))
            .flatten()
            .filter(|c| c.get("type").and_then(Value::as_u64) == Some(2))
            .map(|button| DiscordButton {
                label: button
                    .get("label")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                custom_id: button
                    .get("custom_id")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                style: button.get("style").and_then(Value::as_u64).unwrap_or(0),
            })
            .collect()
    }
}

/// Checks a message's `components` the way Discord does: action rows (type 1) of at most
/// five buttons (type 2), each with a style 1-5, a label of at most 80 characters, and a
/// `custom_id` of 1-100 characters (a link button, style 5, a `url` instead). `Some` is
/// Discord's `400` code 50035 answer, as [`gate`] answers.
pub(super) fn check_components(components: Option<&Value>) -> Option<Response> {
    let components = components.filter(|c| !c.is_null())?;
    let invalid = |what: &str| {
        Some(json_response(
            StatusCode::BAD_REQUEST,
            json!({
                "code": 50035,
                "message": "Invalid Form Body",
                "errors": {"components": {"_errors": [{
                    "code": "COMPONENT_INVALID",
                    "message": what,
                }]}}
            }),
        ))
    };
    let Some(rows) = components.as_array() else {
        return invalid("components must be an array");
    };
    for row in rows {
        if row.get("type").and_then(Value::as_u64) != Some(1) {
            return invalid("a top-level component must be an action row");
        }
        let children = row
            .get("components")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if children.is_empty() || children.len() > MAX_ROW_COMPONENTS {
            return invalid("an action row holds 1 to 5 components");
        }
        for button in &children {
            if button.get("type").and_then(Value::as_u64) != Some(2) {
                continue;
            }
            let style = button.get("style").and_then(Value::as_u64).unwrap_or(0);
            let label = button.get("label").and_then(Value::as_str).unwrap_or("");
            if !(1..=5).contains(&style) || label.chars().count() > MAX_LABEL_CHARS {
                return invalid("invalid button");
            }
            let custom_id = button.get("custom_id").and_then(Value::as_str);
            let ok = if style == 5 {
                custom_id.is_none() && button.get("url").is_some()
            } else {
                custom_id.is_some_and(|id| (1..=MAX_CUSTOM_ID_CHARS).contains(&id.chars().count()))
            };
            if !ok {
                return invalid("invalid custom_id");
            }
        }
    }
    None
}

impl FakeDiscord {
    /// Starts a press by `user` of the button `custom_id` under message `message_id` of
    /// `channel_id`. Sent with [`DiscordInteractionBuilder::push`] as `INTERACTION_CREATE`
    /// (type 3, `data.component_type` 2) on the gateway, to the shard of the channel's
    /// guild. In a guild channel the presser is `member.user` and `guild_id` is set; in a
    /// DM channel ([`FakeDiscord::dm_channel`]) the presser is `user`. The `message` is the
    /// stored one (the bot's sent messages are stored, components included) or, for one
    /// the fake does not know, a message of the bot.
    pub fn button_press(
        &self,
        channel_id: u64,
        user: &DiscordUser,
        message_id: impl Into<String>,
        custom_id: impl Into<String>,
    ) -> DiscordInteractionBuilder<'_> {
        DiscordInteractionBuilder {
            fake: self,
            channel_id,
            user: user.clone(),
            message_id: message_id.into(),
            custom_id: custom_id.into(),
            component_type: 2,
        }
    }

    /// Every accepted interaction response, oldest first.
    pub fn interaction_callbacks(&self) -> Vec<DiscordInteractionCallback> {
        self.shared.lock().callbacks.clone()
    }

    /// Every accepted follow-up, oldest first.
    pub fn followups(&self) -> Vec<DiscordFollowup> {
        self.shared.lock().followups.clone()
    }

    /// Waits until at least `n` interaction responses were accepted, then returns all.
    pub async fn wait_for_interaction_callbacks(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<DiscordInteractionCallback>, WaitTimeout> {
        self.wait_until(timeout, |inner| {
            at_least(&inner.callbacks, n, "interaction response(s)")
        })
        .await
    }

    /// Waits until at least `n` follow-ups were accepted, then returns all.
    pub async fn wait_for_followups(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<DiscordFollowup>, WaitTimeout> {
        self.wait_until(timeout, |inner| {
            at_least(&inner.followups, n, "follow-up(s)")
        })
        .await
    }
}

/// An `INTERACTION_CREATE` being built; created by [`FakeDiscord::button_press`].
#[must_use = "call push() to send it"]
pub struct DiscordInteractionBuilder<'a> {
    fake: &'a FakeDiscord,
    channel_id: u64,
    user: DiscordUser,
    message_id: String,
    custom_id: String,
    component_type: u64,
}

impl DiscordInteractionBuilder<'_> {
    /// Another component type than a button (2): 3 is a string select (sent with
    /// `values: []`).
    pub fn component_type(mut self, component_type: u64) -> Self {
        self.component_type = component_type;
        self
    }

    /// Dispatches the interaction (or queues it for the next connection); returns its id,
    /// token and application.
    pub fn push(self) -> DiscordInteraction {
        let shared = &self.fake.shared;
        let id = shared.snowflake();
        let token = format!("aW50ZXJhY3Rpb24.fake.{id}");
        let (payload, application_id) = {
            let mut inner = shared.lock();
            let application_id = inner.bot.id;
            let channel = inner.channels.get(&self.channel_id).cloned();
            let dm = channel.as_ref().is_some_and(|c| c.kind == 1);
            let guild_id = (!dm).then(|| {
                channel
                    .as_ref()
                    .and_then(|c| c.guild_id)
                    .unwrap_or(DEFAULT_GUILD_ID)
            });
            let message = inner
                .messages
                .get(&self.message_id)
                .cloned()
                .unwrap_or_else(|| bot_message(&inner, &self.message_id, self.channel_id));
            let mut data =
                json!({"custom_id": self.custom_id, "component_type": self.component_type});
            if self.component_type != 2 {
                data["values"] = json!([]);
            }
            let mut payload = json!({
                "id": id.to_string(),
                "application_id": application_id.to_string(),
                "type": 3,
                "data": data,
                "channel_id": self.channel_id.to_string(),
                "channel": {
                    "id": self.channel_id.to_string(),
                    "type": channel.as_ref().map_or(0, |c| c.kind),
                    "name": format!("channel-{}", self.channel_id),
                },
                "token": token,
                "version": 1,
                "message": message,
                "app_permissions": "2248473465835073",
                "locale": "en-US",
                "entitlements": [],
                "authorizing_integration_owners": {},
                "attachment_size_limit": 26_214_400,
            });
            match guild_id {
                Some(guild_id) => {
                    let roles = inner
                        .guilds
                        .get(&guild_id)
                        .and_then(|g| g.members.get(&self.user.id).cloned())
                        .unwrap_or_default();
                    payload["guild_id"] = json!(guild_id.to_string());
                    payload["guild_locale"] = json!("en-US");
                    payload["context"] = json!(0);
                    payload["member"] = json!({
                        "user": self.user.to_json(),
                        "roles": roles.iter().map(u64::to_string).collect::<Vec<_>>(),
                        "joined_at": "2020-01-01T00:00:00.000000+00:00",
                        "deaf": false,
                        "mute": false,
                        "flags": 0,
                        "nick": null,
                        "permissions": "2248473465835073",
                    });
                }
                None => {
                    payload["context"] = json!(1);
                    payload["user"] = self.user.to_json();
                }
            }
            inner.interactions.insert(
                id,
                Issued {
                    token: token.clone(),
                    application_id,
                    responded: false,
                },
            );
            (payload, application_id)
        };
        self.fake.dispatch("INTERACTION_CREATE", payload);
        DiscordInteraction {
            id: id.to_string(),
            token,
            application_id: application_id.to_string(),
        }
    }
}

/// A message of the bot with id `message_id`, for a press under a message the fake never
/// saw.
fn bot_message(inner: &Inner, message_id: &str, channel_id: u64) -> Value {
    let mut message = example_message(message_id, inner.bot.to_json(), "(earlier message)");
    message["channel_id"] = json!(channel_id.to_string());
    message["reactions"] = json!([]);
    message["mentions"] = json!([]);
    message
}

/// `POST /api/v10/interactions/{id}/{token}/callback`: one response per interaction the
/// fake issued (code 10062 Unknown interaction otherwise; 40060 for a second one).
pub(super) async fn interaction_callback(
    State(shared): State<std::sync::Arc<Shared>>,
    Path((id, token)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = gate(
        &shared,
        "interaction_callback",
        "POST",
        uri.path(),
        &headers,
        false,
    ) {
        return r;
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return invalid_json();
    };
    let Some(kind) = body.get("type").and_then(Value::as_u64) else {
        return discord_error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body");
    };
    {
        let mut inner = shared.lock();
        let issued = id
            .parse::<u64>()
            .ok()
            .and_then(|id| inner.interactions.get_mut(&id))
            .filter(|issued| issued.token == token);
        let Some(issued) = issued else {
            return discord_error(StatusCode::NOT_FOUND, 10062, "Unknown interaction");
        };
        if issued.responded {
            return discord_error(
                StatusCode::BAD_REQUEST,
                40060,
                "Interaction has already been acknowledged.",
            );
        }
        issued.responded = true;
        inner.callbacks.push(DiscordInteractionCallback {
            interaction_id: id,
            kind,
            body,
        });
    }
    shared.changed.notify_waiters();
    StatusCode::NO_CONTENT.into_response()
}

/// `POST /api/v10/webhooks/{application}/{token}`: a follow-up of an interaction that has
/// its response (10015 Unknown Webhook before, or for a token the fake never issued).
pub(super) async fn followup(
    State(shared): State<std::sync::Arc<Shared>>,
    Path((application, token)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Some(r) = gate(&shared, "followup", "POST", uri.path(), &headers, false) {
        return r;
    }
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return invalid_json();
    };
    let content = content_of(&body);
    if content.trim().is_empty() {
        return empty_message();
    }
    if content.chars().count() > 2000 {
        return discord_error(StatusCode::BAD_REQUEST, 50035, "Invalid Form Body");
    }
    let message = {
        let mut inner = shared.lock();
        let found = inner.interactions.iter().find(|(_, issued)| {
            issued.token == token
                && issued.responded
                && application.parse::<u64>().ok() == Some(issued.application_id)
        });
        let Some((&interaction_id, _)) = found else {
            return discord_error(StatusCode::NOT_FOUND, 10015, "Unknown Webhook");
        };
        let flags = body.get("flags").and_then(Value::as_u64).unwrap_or(0);
        let id = shared.snowflake().to_string();
        let mut message = example_message(&id, inner.bot.to_json(), &content);
        message["flags"] = json!(flags);
        message["webhook_id"] = json!(application);
        inner.followups.push(DiscordFollowup {
            interaction_id: interaction_id.to_string(),
            content,
            flags,
            body,
        });
        message
    };
    shared.changed.notify_waiters();
    json_response(StatusCode::OK, message)
}
