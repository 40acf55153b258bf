//! OneBot input on arbitrary bytes: CQ strings and whole events.
//!
//! As text, a message parses into segments, and writing those back as a CQ string and
//! parsing again gives the same segments (escaping loses nothing, and no text turns into a
//! code). As JSON, an event converts without panicking, as a message in either format.
#![no_main]

use libfuzzer_sys::fuzz_target;
use parlor_adapters::onebot::{BotIdentity, convert_event, cq};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let segments = cq::parse(text);
        let written = cq::to_string(&segments);
        assert_eq!(cq::parse(&written), segments, "{text:?} -> {written:?}");
    }
    let me = BotIdentity {
        self_id: 42,
        nickname: Some("parlor".to_owned()),
    };
    if let Ok(event) = serde_json::from_slice::<Value>(data) {
        let _ = convert_event(&event, &me, |id| id == "7");
        if let Some(text) = event.as_str() {
            let wrapped = serde_json::json!({
                "post_type": "message", "message_type": "group", "message_id": 1,
                "group_id": 555, "user_id": 1001, "self_id": 42, "message": text,
                "sender": {"role": "admin"}
            });
            let _ = convert_event(&wrapped, &me, |_| false);
        }
    }
});
