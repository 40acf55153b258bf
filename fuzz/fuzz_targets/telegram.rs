//! Telegram update conversion on arbitrary JSON: whatever teloxide deserializes into an
//! `Update` goes through `convert_update` (messages, edits, membership changes, button
//! presses), and a bare `Message` through `convert_message`; neither ever panics, for a bot
//! with and without a username.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlor_adapters::telegram::{BotIdentity, convert_message, convert_update};
use teloxide_core::types::{Message, Update};

fuzz_target!(|data: &[u8]| {
    let identities = [
        BotIdentity {
            id: 42,
            username: Some("parlor_bot".to_owned()),
        },
        BotIdentity {
            id: 42,
            username: None,
        },
    ];
    if let Ok(update) = serde_json::from_slice::<Update>(data) {
        for me in &identities {
            let _ = convert_update(&update, me);
        }
    } else if let Ok(message) = serde_json::from_slice::<Message>(data) {
        for me in &identities {
            let _ = convert_message(&message, me);
        }
    }
});
