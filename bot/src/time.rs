//! Where wall time comes from. Waiting is always tokio's timer; [`WallTime`] only says what
//! time it is, so a test under paused tokio time moves the wall clock too.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

/// Where the clock, the sessions, the stores' callers and the toolsets' background tasks,
/// sub-agents and memory read wall time. Waiting is always done with tokio's timer; this only
/// says what time it is.
#[derive(Clone)]
pub struct WallTime(Arc<dyn Fn() -> DateTime<Utc> + Send + Sync>);

impl fmt::Debug for WallTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("WallTime").field(&self.now()).finish()
    }
}

impl WallTime {
    /// The system clock (`Utc::now`): the production default. It follows a wall-clock step
    /// (the NTP sync after boot, a VM resumed) within one sleep of the service, which never
    /// sleeps longer than a minute at a time.
    pub fn system() -> Self {
        WallTime(Arc::new(Utc::now))
    }

    /// Wall time that follows tokio's clock: `Utc::now()` at this call plus the tokio time
    /// elapsed since. Under paused time (`start_paused` tests) wall time moves exactly as
    /// far as tokio time does, so a task due in an hour fires after an hour of paused time.
    pub fn tokio_anchored() -> Self {
        Self::anchored_at(Utc::now())
    }

    /// Like [`tokio_anchored`](Self::tokio_anchored), with the wall time at this instant
    /// given: a test can start on a chosen day (a DST change, say).
    pub fn anchored_at(wall: DateTime<Utc>) -> Self {
        let base = tokio::time::Instant::now();
        WallTime(Arc::new(move || {
            let elapsed = tokio::time::Instant::now().saturating_duration_since(base);
            wall + TimeDelta::from_std(elapsed).unwrap_or(TimeDelta::MAX)
        }))
    }

    /// Any function of no arguments.
    pub fn from_fn(f: impl Fn() -> DateTime<Utc> + Send + Sync + 'static) -> Self {
        WallTime(Arc::new(f))
    }

    /// What time it is.
    pub fn now(&self) -> DateTime<Utc> {
        (self.0)()
    }
}

/// `day` as `YYYY-MM-DD` (what `NaiveDate`'s `Display` writes), appended to `out`. Store keys
/// begin with the day several times per turn, and chrono's formatter costs about a thousand
/// instructions each time; this writes the same bytes directly.
pub fn push_day(out: &mut String, day: chrono::NaiveDate) {
    use chrono::Datelike;
    let year = day.year();
    if !(0..=9999).contains(&year) {
        // Signed and wider years are chrono's to write.
        out.push_str(&day.to_string());
        return;
    }
    push_digits(out, u32::try_from(year).unwrap_or(0), 4);
    out.push('-');
    push_digits(out, day.month(), 2);
    out.push('-');
    push_digits(out, day.day(), 2);
}

/// `value`'s last `width` decimal digits, zero-padded.
fn push_digits(out: &mut String, value: u32, width: u32) {
    for place in (0..width).rev() {
        let digit = value / 10u32.pow(place) % 10;
        out.push(char::from(b'0' + u8::try_from(digit).unwrap_or(0)));
    }
}

/// Serializes a `DateTime<Utc>` exactly as chrono's `Serialize` does (RFC 3339 with `Z` and
/// only the fraction digits needed: none, 3, 6 or 9), without its formatter: every turn's
/// trace writes two timestamps. Use with `#[serde(serialize_with = "...")]`; reading stays
/// chrono's.
pub mod rfc3339 {
    use chrono::{DateTime, Datelike, Timelike, Utc};
    use serde::Serializer;

    /// The text of `at`.
    pub fn text(at: &DateTime<Utc>) -> String {
        let year = at.year();
        let nanos = at.nanosecond();
        // Leap seconds (nanos past one second) and years beyond four digits: chrono's own.
        if !(0..=9999).contains(&year) || nanos >= 1_000_000_000 {
            return serde_json::to_value(at)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_else(|| at.to_rfc3339());
        }
        let mut out = String::with_capacity(30);
        super::push_day(&mut out, at.date_naive());
        out.push('T');
        super::push_digits(&mut out, at.hour(), 2);
        out.push(':');
        super::push_digits(&mut out, at.minute(), 2);
        out.push(':');
        super::push_digits(&mut out, at.second(), 2);
        if nanos != 0 {
            out.push('.');
            if nanos.is_multiple_of(1_000_000) {
                super::push_digits(&mut out, nanos / 1_000_000, 3);
            } else if nanos.is_multiple_of(1_000) {
                super::push_digits(&mut out, nanos / 1_000, 6);
            } else {
                super::push_digits(&mut out, nanos, 9);
            }
        }
        out.push('Z');
        out
    }

    /// For `#[serde(serialize_with = "crate::time::rfc3339::serialize")]`.
    pub fn serialize<S: Serializer>(at: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&text(at))
    }

    /// For an `Option<DateTime<Utc>>` field.
    pub fn serialize_option<S: Serializer>(
        at: &Option<DateTime<Utc>>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match at {
            Some(at) => s.serialize_some(&text(at)),
            None => s.serialize_none(),
        }
    }
}

#[cfg(test)]
mod format_tests {
    use chrono::{DateTime, NaiveDate, TimeZone, Utc};

    #[test]
    fn days_and_timestamps_are_written_as_chrono_writes_them() {
        for (y, m, d) in [
            (2026, 12, 7),
            (1, 1, 1),
            (999, 10, 31),
            (9999, 12, 31),
            (-5, 3, 4),
            (10000, 1, 1),
        ] {
            let day = NaiveDate::from_ymd_opt(y, m, d).expect("day");
            let mut out = String::new();
            super::push_day(&mut out, day);
            assert_eq!(out, day.to_string());
        }
        let base = Utc
            .with_ymd_and_hms(2026, 12, 7, 5, 9, 3)
            .single()
            .expect("time");
        for nanos in [
            0,
            1,
            7_000,
            120_000_000,
            123_456_000,
            123_456_789,
            999_999_999,
            1_000_000,
            10,
        ] {
            let at = base + chrono::TimeDelta::nanoseconds(nanos);
            let chrono_text = serde_json::to_value(at).expect("json");
            assert_eq!(
                super::rfc3339::text(&at),
                chrono_text.as_str().expect("text"),
                "{nanos}"
            );
            let back: DateTime<Utc> = serde_json::from_value(chrono_text).expect("read");
            assert_eq!(back, at);
        }
        let far = Utc
            .with_ymd_and_hms(12000, 1, 1, 0, 0, 0)
            .single()
            .expect("time");
        assert_eq!(
            serde_json::to_value(super::rfc3339::text(&far)).expect("json"),
            serde_json::to_value(far).expect("json")
        );
    }
}
