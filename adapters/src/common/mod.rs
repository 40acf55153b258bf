//! What the adapters do alike, kept once: bounded retries around a call ([`retry`]), the
//! reconnect loop of Discord's gateway and OneBot's forward connection ([`reconnect`]), the bot token kept secret and scrubbed from error texts ([`token`]),
//! the cap on image downloads ([`download`]) and the checks a send starts with ([`send`]).

pub(crate) mod download;
pub(crate) mod reconnect;
pub(crate) mod retry;
pub(crate) mod send;
pub(crate) mod token;

pub(crate) use download::SizeLimit;
pub(crate) use reconnect::{
    DELIVERY_ATTEMPTS, DELIVERY_BACKOFF, ReadyOnce, Reconnect, Session, pause, supervise,
};
pub(crate) use retry::{Failure, RetryPolicy, with_retries};
pub(crate) use send::{button_row, ensure_platform, nothing_to_send, parse_id, reply_target};
pub(crate) use token::Token;
