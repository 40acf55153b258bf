//! teloxide's errors -> what the adapter does about them, with the token scrubbed.
//!
//! Two teloxide facts shape this file. The bot token is part of every request URL
//! (`/bot{token}/getUpdates`, `/file/bot{token}/...`) and reqwest's errors print their URL:
//! teloxide hides it in the errors it converts itself, but the chunk errors of
//! `Download::download_file_stream` are raw reqwest errors with the full URL. So every
//! message derived from an error goes through [`Token::redact`] before it is logged or
//! returned.
//! And teloxide ignores the HTTP status and `error_code`, recognising errors only by their
//! exact `description`; anything it does not know arrives as `ApiError::Unknown(description)`,
//! so the prefixes Telegram uses (`Conflict:`, `... not found`, ...) are matched here too.

use parlor_bot::platform::PlatformError;
use teloxide_core::{ApiError, RequestError};

use crate::common::{Failure, Token};

/// Classifies a teloxide error; `token` is scrubbed from every message.
pub(crate) fn classify(error: &RequestError, token: &Token) -> Failure {
    match error {
        RequestError::RetryAfter(seconds) => Failure::RetryAfter(seconds.duration()),
        RequestError::Api(api) => classify_api(api, token),
        RequestError::MigrateToChatId(new_id) => Failure::Fatal(PlatformError::Refused(format!(
            "the group was upgraded to a supergroup; its new chat id is {}",
            new_id.0
        ))),
        RequestError::Network(_) | RequestError::Io(_) => Failure::Transient(token.describe(error)),
        RequestError::InvalidJson { source, raw } => Failure::Transient(token.redact(&format!(
            "unexpected answer from the Bot API ({source}): {}",
            truncate(raw, 200)
        ))),
    }
}

fn classify_api(error: &ApiError, token: &Token) -> Failure {
    let description = match error {
        ApiError::Unknown(description) => description.clone(),
        known => known.to_string(),
    };
    let description = token.redact(&description);
    let fatal = |error| Failure::Fatal(error);
    match error {
        ApiError::InvalidToken => fatal(PlatformError::Unauthorized),
        ApiError::TerminatedByOtherGetUpdates | ApiError::CantGetUpdates => {
            fatal(PlatformError::Conflict(description))
        }
        ApiError::ChatNotFound
        | ApiError::UserNotFound
        | ApiError::MessageToReplyNotFound
        | ApiError::WrongFileId
        | ApiError::WrongFileIdOrUrl
        | ApiError::FileIdInvalid => fatal(PlatformError::NotFound(description)),
        ApiError::Unknown(text) => {
            if text.starts_with("Conflict") {
                fatal(PlatformError::Conflict(description))
            } else if text.contains("not found") || is_bad_file_id(text) {
                fatal(PlatformError::NotFound(description))
            } else if is_server_trouble(text) {
                Failure::Transient(description)
            } else {
                fatal(PlatformError::Refused(description))
            }
        }
        _ => fatal(PlatformError::Refused(description)),
    }
}

/// `Bad Request: invalid file_id` and the like: the file does not exist (for this bot).
fn is_bad_file_id(description: &str) -> bool {
    let lower = description.to_ascii_lowercase();
    (lower.contains("file_id") || lower.contains("file id"))
        && (lower.contains("invalid") || lower.contains("wrong"))
}

/// Telegram's descriptions for 5xx answers, which are worth retrying.
fn is_server_trouble(description: &str) -> bool {
    [
        "Internal Server Error",
        "Bad Gateway",
        "Service Unavailable",
        "Gateway Timeout",
    ]
    .iter()
    .any(|prefix| description.starts_with(prefix))
}

fn truncate(text: &str, max_chars: usize) -> &str {
    parlor_bot::text::split_chars(text, max_chars).0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn token() -> Token {
        Token::new(&"tok".into()).expect("not blank")
    }

    fn api(description: &str) -> RequestError {
        let json = format!(r#"{{"description":{description:?}}}"#);
        #[derive(serde::Deserialize)]
        struct Wrapper {
            description: ApiError,
        }
        let parsed: Wrapper = serde_json::from_str(&json).expect("ApiError parses any string");
        RequestError::Api(parsed.description)
    }

    #[test]
    fn telegram_descriptions_map_to_platform_errors() {
        let cases: &[(&str, &str)] = &[
            ("Unauthorized", "Unauthorized"),
            ("Not Found", "Unauthorized"),
            (
                "Conflict: terminated by other getUpdates request; make sure that only one bot instance is running",
                "Conflict",
            ),
            (
                "Conflict: can't use getUpdates method while webhook is active; use deleteWebhook to delete the webhook first",
                "Conflict",
            ),
            ("Bad Request: chat not found", "NotFound"),
            ("Bad Request: message thread not found", "NotFound"),
            ("Bad Request: wrong file id", "NotFound"),
            ("Bad Request: invalid file_id", "NotFound"),
            ("Forbidden: bot was blocked by the user", "Refused"),
            (
                "Bad Request: not enough rights to send text messages",
                "Refused",
            ),
        ];
        for (description, expected) in cases {
            let kind = match classify(&api(description), &token()) {
                Failure::Fatal(PlatformError::Unauthorized) => "Unauthorized",
                Failure::Fatal(PlatformError::Conflict(_)) => "Conflict",
                Failure::Fatal(PlatformError::NotFound(_)) => "NotFound",
                Failure::Fatal(PlatformError::Refused(_)) => "Refused",
                other => panic!("{description}: {other:?}"),
            };
            assert_eq!(kind, *expected, "{description}");
        }
        assert!(matches!(
            classify(&api("Internal Server Error: restart"), &token()),
            Failure::Transient(_)
        ));
        assert!(matches!(
            classify(
                &RequestError::RetryAfter(teloxide_core::types::Seconds::from_seconds(7)),
                &token()
            ),
            Failure::RetryAfter(wait) if wait == Duration::from_secs(7)
        ));
    }
}
