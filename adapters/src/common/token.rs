//! The bot token: a secret that both platforms put into requests (Telegram into every URL,
//! Discord into a header) and that reqwest's errors may repeat (they print their URL), so
//! every text derived from an error is scrubbed of it before it is logged or returned.

use secrecy::{ExposeSecret, SecretString};

/// A bot token as an adapter keeps it: trimmed and never empty.
#[derive(Clone, Debug)]
pub(crate) struct Token(SecretString);

impl Token {
    /// `token` without surrounding whitespace (a token file usually ends in a newline);
    /// `None` when nothing is left, which no platform accepts.
    pub(crate) fn new(token: &SecretString) -> Option<Token> {
        let trimmed = token.expose_secret().trim();
        (!trimmed.is_empty()).then(|| Token(trimmed.into()))
    }

    /// The token itself, for the request that carries it.
    pub(crate) fn expose(&self) -> &str {
        self.0.expose_secret()
    }

    /// `text` with every occurrence of the token replaced by `<token>`.
    pub(crate) fn redact(&self, text: &str) -> String {
        text.replace(self.expose(), "<token>")
    }

    /// [`error_chain`] of `error`, redacted.
    pub(crate) fn describe(&self, error: &dyn std::error::Error) -> String {
        self.redact(&error_chain(error))
    }
}

/// The error and its sources, `: `-separated: reqwest keeps the cause worth reading
/// ("connection refused") in the source chain, behind "error sending request".
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction_removes_every_occurrence() {
        let token = Token::new(&" 1:AB\n".into()).expect("not blank");
        let text = "error sending request for url (http://x/bot1:AB/getMe) 1:AB";
        assert_eq!(
            token.redact(text),
            "error sending request for url (http://x/bot<token>/getMe) <token>"
        );
    }

    #[test]
    fn a_blank_token_is_none_and_debug_hides_the_token() {
        assert!(Token::new(&"  \n".into()).is_none());
        let token = Token::new(&"MTIz.SECRET".into()).expect("not blank");
        assert!(!format!("{token:?}").contains("SECRET"));
    }

    #[test]
    fn the_chain_adds_only_causes_not_already_said() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] Inner);
        #[derive(Debug, thiserror::Error)]
        #[error("connection refused")]
        struct Inner;
        assert_eq!(error_chain(&Outer(Inner)), "outer: connection refused");

        #[derive(Debug, thiserror::Error)]
        #[error("outer: connection refused")]
        struct Repeats(#[source] Inner);
        assert_eq!(error_chain(&Repeats(Inner)), "outer: connection refused");
    }
}
