//! The OneBot adapter's settings.

use std::net::SocketAddr;
use std::time::Duration;

use secrecy::SecretString;

/// QQ's image limit is larger, but a picture the model looks at needs no more than this.
pub const ONEBOT_MAX_IMAGE_BYTES: u64 = 20 * 1024 * 1024;

/// The longest text part sent in one message, in characters. QQ accepts roughly 4500
/// characters of text in one message; staying well below keeps a part clear of its limit
/// and of the risk control that long messages draw.
pub const DEFAULT_MAX_MESSAGE_CHARS: usize = 3000;

/// How parlor reaches the OneBot implementation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// Forward WebSocket: parlor connects to the implementation's WebSocket server
    /// (NapCat's default is `ws://127.0.0.1:3001`) and reconnects with backoff.
    Forward {
        /// `ws://` or `wss://` URL of the implementation's universal (`/`) endpoint.
        url: String,
    },
    /// Reverse WebSocket: parlor listens and the implementation connects (its
    /// "WebSocket client" setting pointed at this address), with the access token, which
    /// this transport requires.
    Reverse {
        /// Where parlor listens.
        listen: SocketAddr,
    },
}

/// How the OneBot adapter connects and behaves.
///
/// `Debug` never shows the access token, so the whole config may be logged.
#[derive(Clone, Debug)]
pub struct OneBotConfig {
    /// Forward or reverse WebSocket.
    pub transport: Transport,
    /// The access token both sides agree on: sent as `Authorization: Bearer` when parlor
    /// connects; required from the implementation when it connects (a reverse config
    /// without one is refused). `None`: no token (forward only).
    pub access_token: Option<SecretString>,
    /// The limit on each action (a request and its `echo`ed answer).
    pub request_timeout: Duration,
    /// The least time between two messages parlor posts into one chat: QQ's risk control
    /// bans accounts that post too fast.
    pub min_send_interval: Duration,
    /// The longest text part of a reply, in characters; longer replies are split.
    pub max_message_chars: usize,
    /// The largest image [`download_image`](parlor_bot::platform::Platform::download_image)
    /// fetches.
    pub max_image_bytes: u64,
    /// A connection that sent a heartbeat is dead once this many of its heartbeat
    /// intervals pass without any frame.
    pub missed_heartbeats: u32,
    /// Several daemons on one store (`[cluster]`): only the holder of this lease keeps the
    /// forward connection (one per account); the others wait to take it. A reverse
    /// connection goes to whichever daemon the implementation dials.
    pub connection_lease: Option<std::sync::Arc<parlor_bot::session::lease::Keeper>>,
}

impl OneBotConfig {
    /// A config for `transport` with every other setting at its default.
    pub fn new(transport: Transport) -> Self {
        OneBotConfig {
            transport,
            access_token: None,
            request_timeout: Duration::from_secs(30),
            min_send_interval: Duration::from_millis(1000),
            max_message_chars: DEFAULT_MAX_MESSAGE_CHARS,
            max_image_bytes: ONEBOT_MAX_IMAGE_BYTES,
            missed_heartbeats: 3,
            connection_lease: None,
        }
    }

    /// The same config with `token` as the access token.
    pub fn with_token(mut self, token: impl Into<SecretString>) -> Self {
        self.access_token = Some(token.into());
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_hides_the_token() {
        let config = OneBotConfig::new(Transport::Forward {
            url: "ws://127.0.0.1:3001".to_owned(),
        })
        .with_token("SECRET-onebot");
        let shown = format!("{config:?}");
        assert!(!shown.contains("SECRET"), "{shown}");
    }
}
