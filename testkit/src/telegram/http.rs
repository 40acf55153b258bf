//! The HTTP layer: routing `/bot{token}/{method}` and `/file/bot{token}/...`,
//! the Bot API answer envelope, and recording every call before it is
//! answered.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::buttons;
use super::encoding::{Params, parse_params, percent_decode};
use super::methods;
use super::records::{Failure, RecordedCall};
use super::state::Shared;
use super::webhook;

impl Failure {
    pub(super) fn render(&self) -> Response {
        match self {
            Self::RetryAfter(secs) => api_error_with(
                StatusCode::TOO_MANY_REQUESTS,
                &format!("Too Many Requests: retry after {secs}"),
                json!({"retry_after": secs}),
            ),
            Self::Conflict => api_error(
                StatusCode::CONFLICT,
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
            ),
            Self::BadRequest(desc) => {
                let desc = if desc.starts_with("Bad Request") {
                    desc.clone()
                } else {
                    format!("Bad Request: {desc}")
                };
                api_error(StatusCode::BAD_REQUEST, &desc)
            }
            Self::MigrateToChatId(to) => api_error_with(
                StatusCode::BAD_REQUEST,
                "Bad Request: group chat was upgraded to a supergroup chat",
                json!({"migrate_to_chat_id": to}),
            ),
            Self::Status(code, desc) => api_error(
                StatusCode::from_u16(*code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                desc,
            ),
        }
    }
}

pub(super) fn ok(result: Value) -> Response {
    axum::Json(json!({"ok": true, "result": result})).into_response()
}

pub(super) fn api_error(status: StatusCode, description: &str) -> Response {
    (
        status,
        axum::Json(json!({
            "ok": false,
            "error_code": status.as_u16(),
            "description": description,
        })),
    )
        .into_response()
}

fn api_error_with(status: StatusCode, description: &str, parameters: Value) -> Response {
    (
        status,
        axum::Json(json!({
            "ok": false,
            "error_code": status.as_u16(),
            "description": description,
            "parameters": parameters,
        })),
    )
        .into_response()
}

/// An error answer of a method handler.
pub(super) struct ApiErr {
    pub(super) status: StatusCode,
    pub(super) description: String,
}

impl ApiErr {
    pub(super) fn render(&self) -> Response {
        api_error(self.status, &self.description)
    }
}

pub(super) fn bad_request(description: &str) -> ApiErr {
    ApiErr {
        status: StatusCode::BAD_REQUEST,
        description: format!("Bad Request: {description}"),
    }
}

pub(super) async fn handle(
    State(shared): State<Arc<Shared>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let segments: Vec<String> = uri
        .path()
        .split('/')
        .filter(|s| !s.is_empty())
        .map(percent_decode)
        .collect();
    let token_ok = |seg: &str| seg.strip_prefix("bot") == Some(shared.token.as_str());
    match segments.as_slice() {
        [file, bot, path @ ..] if file == "file" && bot.starts_with("bot") && !path.is_empty() => {
            if !token_ok(bot) {
                return api_error(StatusCode::UNAUTHORIZED, "Unauthorized");
            }
            download(&shared, &path.join("/"))
        }
        [bot, name] if bot.starts_with("bot") => {
            if !token_ok(bot) {
                return api_error(StatusCode::UNAUTHORIZED, "Unauthorized");
            }
            let params = match parse_params(&uri, &headers, &body) {
                Ok(p) => p,
                Err(bad) => return bad_request(&bad.to_string()).render(),
            };
            call(&shared, &method, name, &headers, params).await
        }
        _ => api_error(StatusCode::NOT_FOUND, "Not Found"),
    }
}

fn download(shared: &Shared, path: &str) -> Response {
    let mut inner = shared.lock();
    let Some(bytes) = inner
        .files
        .values()
        .find(|f| f.path == path)
        .map(|f| f.bytes.clone())
    else {
        return api_error(StatusCode::NOT_FOUND, "Not Found");
    };
    inner.downloads.push(path.to_owned());
    drop(inner);
    shared.changed.notify_waiters();
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        )],
        bytes,
    )
        .into_response()
}

async fn call(
    shared: &Arc<Shared>,
    http_method: &Method,
    name: &str,
    headers: &HeaderMap,
    params: Params,
) -> Response {
    let lower = name.to_ascii_lowercase();
    let failure = {
        let mut inner = shared.lock();
        inner.calls.push(RecordedCall {
            method: name.to_owned(),
            http_method: http_method.as_str().to_owned(),
            content_type: headers
                .get(CONTENT_TYPE)
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
            params: Value::Object(params.map.clone()),
        });
        match inner.failures.get_mut(&lower) {
            Some(queue) => match queue.front_mut() {
                Some((passing, _)) if *passing > 0 => {
                    *passing -= 1;
                    None
                }
                _ => queue.pop_front().map(|(_, failure)| failure),
            },
            None => None,
        }
    };
    shared.changed.notify_waiters();
    if let Some(failure) = failure {
        if lower == "getupdates" {
            // Still a new poll: it ends a waiting one, as on Telegram.
            shared.lock().poll_generation += 1;
            shared.updates.notify_waiters();
        }
        return failure.render();
    }

    let response = match lower.as_str() {
        "getupdates" if shared.lock().webhook.is_some() => {
            return api_error(
                StatusCode::CONFLICT,
                "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
            );
        }
        "getupdates" => return methods::get_updates(shared, &params).await,
        "getme" => Ok(shared.lock().bot.me_json()),
        "sendmessage" => methods::send_message(shared, name, &params),
        "sendphoto" | "senddocument" => methods::send_media(shared, name, &lower, &params),
        "editmessagetext" => methods::edit_message_text(shared, &params),
        "sendchataction" => methods::send_chat_action(shared, &params),
        "getfile" => methods::get_file(shared, &params),
        "getchatadministrators" => methods::get_chat_administrators(shared, &params),
        "getchatmember" => methods::get_chat_member(shared, &params),
        "getwebhookinfo" => Ok(webhook::webhook_info(shared)),
        "setwebhook" => webhook::set_webhook(shared, &params),
        "deletewebhook" => Ok(webhook::delete_webhook(shared, &params)),
        "setmycommands" => {
            let commands = params.json("commands").unwrap_or_else(|| json!([]));
            shared.lock().commands = commands;
            Ok(json!(true))
        }
        "getmycommands" => Ok(shared.lock().commands.clone()),
        "deletemycommands" => {
            shared.lock().commands = json!([]);
            Ok(json!(true))
        }
        "answercallbackquery" => buttons::answer_callback_query(shared, &params),
        "sendmessagedraft" | "deletemessage" => Ok(json!(true)),
        _ => {
            shared.lock().unknown.push(name.to_owned());
            Err(ApiErr {
                status: StatusCode::NOT_FOUND,
                description: "Not Found: method not found".to_owned(),
            })
        }
    };
    shared.changed.notify_waiters();
    match response {
        Ok(result) => ok(result),
        Err(e) => e.render(),
    }
}
