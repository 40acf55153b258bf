//! `time_now`: the current date and time in an IANA time zone. Models do not know the date;
//! scheduling, greetings and "what day is it" all need it.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use parlor_bot::tool::bridge::{BridgeError, ToolError};
use parlor_bot::tool::{Risk, ToolSetBridge};

/// The error code for a time zone name that is not in the IANA database.
pub const UNKNOWN_TIMEZONE: &str = "UNKNOWN_TIMEZONE";

/// Where "now" comes from; tests pin it.
pub type Now = Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>;

/// Arguments of `time_now`.
#[derive(Debug, Deserialize, JsonSchema)]
pub struct TimeArgs {
    /// IANA time zone name such as "Europe/Berlin" or "America/New_York"; the operator's
    /// default zone when omitted.
    pub timezone: Option<String>,
}

/// What `time_now` returns in `data`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimeNow {
    /// The zone used.
    pub timezone: String,
    /// RFC 3339 local time with offset, e.g. `2026-12-01T10:23:00+01:00`.
    pub datetime: String,
    /// Local date, `YYYY-MM-DD`.
    pub date: String,
    /// Local time, `HH:MM:SS`.
    pub time: String,
    /// English weekday name.
    pub weekday: String,
    /// Offset from UTC, `+01:00`.
    pub utc_offset: String,
    /// Seconds since the Unix epoch.
    pub unix: i64,
}

/// A time zone name that is not an IANA one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not an IANA time zone name (like \"Europe/Berlin\" or \"UTC\")")]
pub struct UnknownTimezone(pub String);

/// Parses an IANA time zone name.
pub fn parse_timezone(name: &str) -> Result<Tz, UnknownTimezone> {
    name.trim()
        .parse::<Tz>()
        .map_err(|_| UnknownTimezone(name.to_owned()))
}

/// The local time of `now` in `tz`.
pub fn time_in(now: DateTime<Utc>, tz: Tz) -> TimeNow {
    let local = now.with_timezone(&tz);
    TimeNow {
        timezone: tz.name().to_owned(),
        datetime: local.to_rfc3339_opts(chrono::SecondsFormat::Secs, false),
        date: local.format("%Y-%m-%d").to_string(),
        time: local.format("%H:%M:%S").to_string(),
        weekday: local.format("%A").to_string(),
        utc_offset: local.format("%:z").to_string(),
        unix: now.timestamp(),
    }
}

/// The `time` toolset with the system clock.
pub fn time_toolset(default_tz: Tz) -> Result<ToolSetBridge, BridgeError> {
    time_toolset_with_now(default_tz, Arc::new(Utc::now))
}

/// The `time` toolset reading the current time from `now`.
pub fn time_toolset_with_now(default_tz: Tz, now: Now) -> Result<ToolSetBridge, BridgeError> {
    ToolSetBridge::builder("time")
        .add_function(
            "time_now",
            "Get the current date, time and weekday in a time zone. Use it whenever the \
             answer depends on today's date or the time of day.",
            move |args: TimeArgs| {
                let now = Arc::clone(&now);
                async move {
                    let tz = match args.timezone.as_deref() {
                        Some(name) if !name.trim().is_empty() => parse_timezone(name)
                            .map_err(|why| ToolError::new(UNKNOWN_TIMEZONE, why.to_string()))?,
                        _ => default_tz,
                    };
                    Ok::<_, ToolError>(time_in(now(), tz))
                }
            },
        )
        .risk(Risk::Read)
        .failure_codes(&[UNKNOWN_TIMEZONE])
        .result_doc(
            "`data`: `timezone`, `datetime` (RFC 3339), `date`, `time`, `weekday`, \
             `utc_offset`, `unix`.",
        )
        .build()
}
