//! What the Telegram and Discord adapters do alike, kept once: bounded retries around a
//! call ([`retry`]), the bot token kept secret and scrubbed from error texts ([`token`]),
//! and the cap on image downloads ([`download`]).

pub(crate) mod download;
pub(crate) mod retry;
pub(crate) mod token;

pub(crate) use download::SizeLimit;
pub(crate) use retry::{Failure, RetryPolicy, with_retries};
pub(crate) use token::Token;
