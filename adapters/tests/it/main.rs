//! The adapters' integration tests, one binary: each platform's adapter against its fake
//! (`discord`, `onebot`, `telegram`), the conversions against recorded payloads
//! (`discord_convert`, `telegram_convert`; fixtures under `tests/fixtures/`), and what they
//! share (`support`).

// A failed unwrap in a test is the test failing.
#![allow(clippy::unwrap_used)]

mod discord;
mod discord_convert;
mod onebot;
mod support;
mod telegram;
mod telegram_convert;
