//! Buttons: the action row under a sent message, and a press (a component interaction)
//! acknowledged at once and answered later.
//!
//! Discord fails an interaction ("This interaction failed") unless it gets a response within
//! three seconds. The runtime decides later, so the adapter responds right away with
//! `DEFERRED_UPDATE_MESSAGE` (type 6: "seen, the message stays as it is"), before the press
//! goes to the inbox; the runtime's answer is then a follow-up message through the
//! interaction's webhook, ephemeral (flag 64: only the presser sees it).
//!
//! The calls are raw REST through [`Rest`](super::rest::Rest), like every other call of this
//! adapter (why: `rest.rs`), rather than serenity's `CreateInteractionResponse` builders.
//! The interaction token is part of their URL and lets anyone post as the bot for 15
//! minutes, so it is scrubbed from their error texts like the bot token.

use std::time::Duration;

use parlor_bot::platform::{Button, ButtonPress, PlatformError};
use reqwest::Method;
use serde_json::{Value, json};
use serenity::model::application::ComponentInteraction;

use super::convert::{PLATFORM, convert_interaction};
use super::render::render_parts;
use super::{DiscordAdapter, NAME};
use crate::common::{Failure, RetryPolicy, button_row, ensure_platform, with_retries};

/// How long the acknowledgement may take: past Discord's three seconds the interaction has
/// failed anyway.
const ACKNOWLEDGE_WITHIN: Duration = Duration::from_secs(3);

/// Discord's limit on buttons in one action row.
const MAX_BUTTONS_PER_ROW: usize = 5;

/// Discord's limit on a button label, in characters.
const MAX_LABEL_CHARS: usize = 80;

/// The interaction response type "deferred update message": acknowledged, nothing shown.
const DEFERRED_UPDATE_MESSAGE: u8 = 6;

/// The message flag "ephemeral": only the user of the interaction sees it.
const EPHEMERAL: u64 = 1 << 6;

/// `buttons` as the `components` of a message: one action row of secondary buttons, each
/// `custom_id` = [`Button::data`]. `None` for no buttons. Refused (before anything is sent):
/// more than five buttons, or data that is empty or longer than [`Button::MAX_DATA`] bytes.
/// A label past Discord's 80 characters is cut, since it is only what people read.
pub(super) fn components(buttons: &[Button]) -> Result<Option<Value>, PlatformError> {
    if buttons.len() > MAX_BUTTONS_PER_ROW {
        return Err(PlatformError::Refused(format!(
            "{} buttons do not fit one Discord action row (at most {MAX_BUTTONS_PER_ROW})",
            buttons.len()
        )));
    }
    let row = button_row(buttons, |button| {
        let label = parlor_bot::text::split_chars(&button.label, MAX_LABEL_CHARS).0;
        // Style 2, secondary (grey): the post's text says what each button does.
        json!({"type": 2, "style": 2, "label": label, "custom_id": button.data})
    })?;
    Ok(row.map(|row| json!([{"type": 1, "components": row}])))
}

/// `{interaction id}:{token}` of [`ButtonPress::answer`], read back.
fn parse_answer(answer: &str) -> Option<(u64, &str)> {
    let (id, token) = answer.split_once(':')?;
    let id = id.parse().ok()?;
    (!token.is_empty()).then_some((id, token))
}

/// `failure` with the interaction token scrubbed from its text.
fn hide(failure: Failure, token: &str) -> Failure {
    let scrub = |text: String| text.replace(token, "<interaction token>");
    match failure {
        Failure::Transient(text) => Failure::Transient(scrub(text)),
        Failure::Fatal(error) => Failure::Fatal(match error {
            PlatformError::Refused(text) => PlatformError::Refused(scrub(text)),
            PlatformError::NotFound(text) => PlatformError::NotFound(scrub(text)),
            PlatformError::Unavailable(text) => PlatformError::Unavailable(scrub(text)),
            PlatformError::Conflict(text) => PlatformError::Conflict(scrub(text)),
            other => other,
        }),
        other => other,
    }
}

impl DiscordAdapter {
    /// A component interaction from the gateway, as the press to deliver: converted,
    /// remembered (its channel's guild, the presser's roles, the application), and
    /// acknowledged with type 6 before it is returned, so Discord's three seconds never
    /// wait on the inbox. `None` for what is not a button press, and for a press already
    /// delivered (a replay after a resume).
    pub(super) async fn take_press(
        &self,
        interaction: &ComponentInteraction,
    ) -> Option<ButtonPress> {
        let id = interaction.id.get();
        if self.seen(id) {
            return None;
        }
        let Some(press) = convert_interaction(interaction) else {
            tracing::debug!(
                interaction = id,
                "skipping a component interaction that is not a button"
            );
            return None;
        };
        self.learn_interaction(interaction);
        // Delivered even when the acknowledgement failed: the press happened, and the
        // runtime's answer may still reach the presser.
        if let Err(error) = self.acknowledge(id, &interaction.token).await {
            tracing::warn!(chat = %press.chat, interaction = id, %error, "could not acknowledge a button press; Discord shows it as failed");
        }
        Some(press)
    }

    /// `POST /interactions/{id}/{token}/callback` with type 6, one attempt within
    /// [`ACKNOWLEDGE_WITHIN`].
    async fn acknowledge(&self, id: u64, token: &str) -> Result<(), PlatformError> {
        let path = format!("/interactions/{id}/{token}/callback");
        let body = json!({"type": DEFERRED_UPDATE_MESSAGE});
        let policy = RetryPolicy::once(NAME, ACKNOWLEDGE_WITHIN);
        self.post_with_token(
            "POST /interactions/{id}/{token}/callback",
            &policy,
            &path,
            &body,
            token,
        )
        .await
    }

    /// [`Platform::answer_button`](parlor_bot::platform::Platform::answer_button): the
    /// press was acknowledged when it arrived, so `None` sends nothing; `text` becomes an
    /// ephemeral follow-up (`POST /webhooks/{application}/{token}`, flags 64), rendered
    /// like a reply and cut to one message. One attempt: a repeat would show twice.
    pub(super) async fn answer_press(
        &self,
        press: &ButtonPress,
        text: Option<&str>,
    ) -> Result<(), PlatformError> {
        ensure_platform(&press.chat, PLATFORM, NAME)?;
        let Some(text) = text else {
            return Ok(());
        };
        let (_, token) = parse_answer(&press.answer).ok_or_else(|| {
            PlatformError::Refused("not a Discord interaction to answer".to_owned())
        })?;
        let parts = render_parts(text, self.inner.config.allow_mass_mentions);
        let Some(content) = parts.first() else {
            return Ok(());
        };
        if parts.len() > 1 {
            tracing::warn!(chat = %press.chat, parts = parts.len(), "a button answer is longer than one message; only its first part is shown");
        }
        let path = format!("/webhooks/{}/{token}", self.application_id());
        let body = json!({
            "content": content,
            "flags": EPHEMERAL,
            "allowed_mentions": self.allowed_mentions(false),
        });
        self.post_with_token(
            "POST /webhooks/{application}/{token}",
            &self.policy().single(),
            &path,
            &body,
            token,
        )
        .await
    }

    /// `POST` of `body` to `path`, an interaction's URL, under `policy` (`route` names it
    /// in logs). The interaction `token` in the URL is scrubbed from every error text,
    /// since it lets anyone post as the bot.
    async fn post_with_token(
        &self,
        route: &'static str,
        policy: &RetryPolicy,
        path: &str,
        body: &Value,
        token: &str,
    ) -> Result<(), PlatformError> {
        with_retries(route, policy, || async {
            self.inner
                .rest
                .call(Method::POST, path, Some(body))
                .await
                .map_err(|failure| hide(failure, token))
        })
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_read_back_and_malformed_ones_do_not() {
        assert_eq!(parse_answer("123:tok:en"), Some((123, "tok:en")));
        assert_eq!(parse_answer("123:"), None);
        assert_eq!(parse_answer("abc:token"), None);
        assert_eq!(parse_answer("123"), None);
    }

    #[test]
    fn buttons_make_one_row_and_bad_ones_are_refused() {
        let button = |label: &str, data: &str| Button {
            label: label.to_owned(),
            data: data.to_owned(),
        };
        assert_eq!(components(&[]).ok(), Some(None));
        let row = components(&[button(&"l".repeat(90), "yes")])
            .ok()
            .flatten()
            .expect("a row");
        assert_eq!(row[0]["type"], 1);
        assert_eq!(row[0]["components"][0]["custom_id"], "yes");
        assert_eq!(
            row[0]["components"][0]["label"].as_str().map(str::len),
            Some(80)
        );
        assert!(components(&vec![button("a", "b"); 6]).is_err());
        assert!(components(&[button("a", "")]).is_err());
        assert!(components(&[button("a", &"x".repeat(65))]).is_err());
    }

    #[test]
    fn interaction_tokens_are_scrubbed() {
        let failure = Failure::Fatal(PlatformError::NotFound(
            "/interactions/1/SeCrEt/callback: 404".to_owned(),
        ));
        match hide(failure, "SeCrEt") {
            Failure::Fatal(PlatformError::NotFound(text)) => {
                assert_eq!(text, "/interactions/1/<interaction token>/callback: 404");
            }
            other => panic!("{other:?}"),
        }
    }
}
