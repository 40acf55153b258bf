//! Why an action failed, and what the runtime makes of it.

use std::time::Duration;

use parlor_bot::platform::PlatformError;

/// A failed OneBot action.
#[derive(Debug, thiserror::Error)]
pub enum OneBotError {
    /// The implementation answered with a `retcode` other than 0.
    #[error("`{action}` failed with retcode {retcode}: {message}")]
    Action {
        /// The action (`send_group_msg`).
        action: String,
        /// OneBot's `retcode` (1404: no such action; 100: bad parameters...).
        retcode: i64,
        /// The implementation's `message` / `wording`, when it gave one.
        message: String,
    },
    /// No implementation was connected within the action's timeout.
    #[error("no OneBot implementation is connected")]
    NotConnected,
    /// The connection closed before the answer came: the action may or may not have run.
    #[error("the connection closed before `{0}` was answered")]
    Dropped(String),
    /// No answer within the timeout.
    #[error("`{action}` was not answered within {timeout:?}")]
    Timeout {
        /// The action.
        action: String,
        /// How long it waited.
        timeout: Duration,
    },
    /// An answer that is not what the action returns.
    #[error("`{action}` answered without {missing}")]
    BadAnswer {
        /// The action.
        action: String,
        /// What was missing (`data.message_id`).
        missing: &'static str,
    },
}

impl OneBotError {
    /// Whether trying the same action again may succeed.
    pub fn is_transient(&self) -> bool {
        !matches!(self, OneBotError::Action { .. })
    }
}

impl From<OneBotError> for PlatformError {
    fn from(error: OneBotError) -> PlatformError {
        match &error {
            OneBotError::Action { retcode: 1404, .. } => PlatformError::NotFound(error.to_string()),
            OneBotError::Action {
                retcode: 1401 | 1403,
                ..
            } => PlatformError::Unauthorized,
            OneBotError::Action { .. } => PlatformError::Refused(error.to_string()),
            OneBotError::NotConnected
            | OneBotError::Dropped(_)
            | OneBotError::Timeout { .. }
            | OneBotError::BadAnswer { .. } => PlatformError::Unavailable(error.to_string()),
        }
    }
}
