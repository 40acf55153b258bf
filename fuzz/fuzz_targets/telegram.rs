//! Telegram update conversion on arbitrary JSON: whatever teloxide deserializes into an
//! `Update` (or a bare `Message`), `convert_message` never panics, for a bot with and
//! without a username.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlor_adapters::telegram::{BotIdentity, convert_message};
use teloxide_core::types::{Message, Update, UpdateKind};

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
    let message = if let Ok(update) = serde_json::from_slice::<Update>(data) {
        match update.kind {
            UpdateKind::Message(m) | UpdateKind::EditedMessage(m) => m,
            _ => return,
        }
    } else if let Ok(m) = serde_json::from_slice::<Message>(data) {
        m
    } else {
        return;
    };
    for me in &identities {
        let _ = convert_message(&message, me);
    }
});
