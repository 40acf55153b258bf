//! The console's `/errors`: the most recent warnings and errors, kept in a bounded ring in
//! memory by a `tracing` layer that `main` adds to the subscriber (so the journal and the
//! console see the same events). The chat is the event's `session` field, which the
//! session layer, the outbox and the toolsets put on what they log.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::sync::{Mutex, OnceLock};

use chrono::{DateTime, Utc};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Events kept.
pub const KEEP: usize = 200;

/// One warning or error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    /// When it was logged.
    pub time: DateTime<Utc>,
    /// `WARN` or `ERROR`.
    pub level: String,
    /// The module that logged it.
    pub target: String,
    /// Its message and other fields.
    pub message: String,
    /// Its `session` field: the chat.
    pub session: Option<String>,
}

/// The ring.
#[derive(Debug, Default)]
pub struct ErrorRing {
    events: Mutex<VecDeque<Logged>>,
}

impl ErrorRing {
    /// The events, newest first.
    pub fn recent(&self) -> Vec<Logged> {
        let events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        events.iter().rev().cloned().collect()
    }

    fn push(&self, event: Logged) {
        let mut events = self.events.lock().unwrap_or_else(|e| e.into_inner());
        if events.len() >= KEEP {
            events.pop_front();
        }
        events.push_back(event);
    }
}

/// The process's ring.
pub fn global() -> &'static ErrorRing {
    static RING: OnceLock<ErrorRing> = OnceLock::new();
    RING.get_or_init(ErrorRing::default)
}

/// The layer that fills [`global`] with every warning and error.
pub struct RingLayer;

#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
    session: Option<String>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => {
                let _ = write!(self.message, "{value:?}");
            }
            "session" => self.session = Some(format!("{value:?}").trim_matches('"').to_owned()),
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "message" => self.message.push_str(value),
            "session" => self.session = Some(value.to_owned()),
            name => {
                let _ = write!(self.rest, " {name}={value:?}");
            }
        }
    }
}

impl<S: Subscriber> Layer<S> for RingLayer {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let level = *event.metadata().level();
        if level > Level::WARN {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        global().push(Logged {
            // When the line was logged, for the operator to read: diagnostics, not data a
            // caller could supply.
            time: Utc::now(),
            level: level.to_string(),
            target: event.metadata().target().to_owned(),
            message: format!("{}{}", fields.message, fields.rest),
            session: fields.session,
        });
    }
}
