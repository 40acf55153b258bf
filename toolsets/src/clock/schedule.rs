//! [`Schedule`]: when a clock task fires. Three shapes, told apart by their text:
//!
//! - a cron expression, 5 fields (`minute hour day-of-month month day-of-week`) or 6 (seconds
//!   first), read in the task's IANA time zone by `croner` (nicknames like `@daily` work too);
//! - a one-shot date-time: RFC 3339 with an offset (`2026-12-24T09:00:00+01:00`), or a local
//!   `YYYY-MM-DDTHH:MM[:SS]` read in the task's time zone;
//! - `every <duration>` (`every 90s`, `every 15m`, `every 2h`, `every 1d`, `every 1h30m`,
//!   `every 2 hours`): fixed steps of elapsed time from an anchor (the time the schedule was
//!   set), blind to the wall clock — use cron for "at 9:00 local time".
//!
//! ## Daylight saving time
//! Cron times are wall-clock times in the task's zone; `croner` resolves them through
//! `chrono-tz` and follows the Open Cron Pattern Specification:
//! - a *fixed-time* pattern (single second, minute and hour, e.g. `30 2 * * *`) whose time
//!   does not exist on a spring-forward day fires at the first real instant after the gap
//!   (Europe/Berlin 2026-03-29: 03:00 CEST = 01:00 UTC), and on a fall-back day it fires
//!   once, at the earlier of the two instants (2026-10-25 02:30 CEST = 00:30 UTC);
//! - an *interval* pattern (`*/30 * * * *`) skips wall-clock times in a gap and fires on
//!   both passes through a repeated hour.

use std::fmt;
use std::time::Duration;

use chrono::{DateTime, LocalResult, NaiveDateTime, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

/// Why a schedule text was refused; the text is a sentence the model can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ScheduleError(pub String);

/// The shape of a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScheduleKind {
    /// A cron expression in the task's time zone.
    Cron,
    /// A single date-time.
    Once,
    /// `every <duration>` from an anchor.
    Every,
}

impl ScheduleKind {
    /// `cron`, `once`, `every`.
    pub fn as_str(self) -> &'static str {
        match self {
            ScheduleKind::Cron => "cron",
            ScheduleKind::Once => "once",
            ScheduleKind::Every => "every",
        }
    }
}

#[derive(Clone)]
enum Rule {
    Cron(Box<Cron>),
    Once(DateTime<Utc>),
    Every {
        period: TimeDelta,
        anchor: DateTime<Utc>,
    },
}

/// A parsed schedule: the text as given, its time zone and the rule that finds fire times.
#[derive(Clone)]
pub struct Schedule {
    text: String,
    tz: Tz,
    rule: Rule,
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Schedule")
            .field("text", &self.text)
            .field("tz", &self.tz.name())
            .field("kind", &self.kind())
            .finish()
    }
}

/// What the model is told a schedule may look like.
const SHAPES: &str = "use a cron expression (5 fields `minute hour day-of-month month \
    day-of-week`, or 6 with seconds first), a date-time such as `2026-12-24T09:00:00+01:00` for \
    a one-shot task, or `every <duration>` such as `every 15m`";

impl Schedule {
    /// Parses `text` in time zone `tz`. `anchor` is the start of an `every` schedule (its
    /// first fire is one period after it); the other shapes ignore it.
    pub fn parse(text: &str, tz: Tz, anchor: DateTime<Utc>) -> Result<Schedule, ScheduleError> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(ScheduleError(format!("the schedule is empty; {SHAPES}")));
        }
        let lower = trimmed.to_ascii_lowercase();
        let rule = if let Some(rest) = lower.strip_prefix("every") {
            let secs = parse_duration(rest)?;
            // Whole seconds keep `next_after` exact and the stored anchor round-trips.
            let anchor = DateTime::from_timestamp(anchor.timestamp(), 0).unwrap_or(anchor);
            Rule::Every {
                period: TimeDelta::seconds(secs),
                anchor,
            }
        } else if looks_like_date(trimmed) {
            Rule::Once(parse_datetime(trimmed, tz)?)
        } else {
            Rule::Cron(Box::new(parse_cron(trimmed)?))
        };
        Ok(Schedule {
            text: trimmed.to_owned(),
            tz,
            rule,
        })
    }

    /// The schedule text as given (trimmed).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The time zone cron times are read in and fire times are shown in.
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// Cron, one-shot or interval.
    pub fn kind(&self) -> ScheduleKind {
        match self.rule {
            Rule::Cron(_) => ScheduleKind::Cron,
            Rule::Once(_) => ScheduleKind::Once,
            Rule::Every { .. } => ScheduleKind::Every,
        }
    }

    /// Whether the schedule fires once only.
    pub fn is_one_shot(&self) -> bool {
        matches!(self.rule, Rule::Once(_))
    }

    /// The period of an `every` schedule.
    pub fn period(&self) -> Option<Duration> {
        match &self.rule {
            Rule::Every { period, .. } => period.to_std().ok(),
            _ => None,
        }
    }

    /// The first fire time strictly after `after`; `None` when there is none (a one-shot
    /// time that has passed, a cron pattern that never matches again).
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        match &self.rule {
            Rule::Cron(cron) => cron
                .find_next_occurrence(&after.with_timezone(&self.tz), false)
                .ok()
                .map(|t| t.with_timezone(&Utc)),
            Rule::Once(at) => (*at > after).then_some(*at),
            Rule::Every { period, anchor } => {
                let step = period.num_seconds().max(1);
                let first = *anchor + *period;
                if after < first {
                    return Some(first);
                }
                // `num_seconds` truncates; for a non-negative span that is the floor, so
                // the result is strictly after `after` even with sub-second parts.
                let k = (after - *anchor).num_seconds().div_euclid(step) + 1;
                anchor.checked_add_signed(TimeDelta::seconds(k.checked_mul(step)?))
            }
        }
    }

    /// The next `n` fire times after `after`, in order (fewer when the schedule ends).
    pub fn next_n(&self, after: DateTime<Utc>, n: usize) -> Vec<DateTime<Utc>> {
        let mut out = Vec::with_capacity(n);
        let mut cursor = after;
        while out.len() < n {
            let Some(next) = self.next_after(cursor) else {
                break;
            };
            out.push(next);
            cursor = next;
        }
        out
    }

    /// The shortest gap between consecutive fire times among the next `samples` after
    /// `after`; `None` for a schedule with fewer than two of them. The interval floor is
    /// checked with it (a cron pattern's gaps vary: `0,1 * * * *`).
    pub fn shortest_gap(&self, after: DateTime<Utc>, samples: usize) -> Option<Duration> {
        self.next_n(after, samples)
            .windows(2)
            .filter_map(|w| (w[1] - w[0]).to_std().ok())
            .min()
    }

    /// `t` as RFC 3339 in the schedule's time zone (`2026-03-30T09:00:00+02:00`).
    pub fn local(&self, t: DateTime<Utc>) -> String {
        format_in(t, self.tz)
    }
}

/// `t` as RFC 3339 (whole seconds) in `tz`.
pub fn format_in(t: DateTime<Utc>, tz: Tz) -> String {
    t.with_timezone(&tz)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, false)
}

fn parse_cron(text: &str) -> Result<Cron, ScheduleError> {
    let fields = text.split_whitespace().count();
    if !text.starts_with('@') && !(5..=6).contains(&fields) {
        return Err(ScheduleError(format!(
            "{text:?} has {fields} fields; a cron expression has 5 (minute hour day-of-month \
             month day-of-week) or 6 (seconds first); otherwise {SHAPES}"
        )));
    }
    let parser = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build();
    let cron = parser
        .parse(text)
        .map_err(|e| ScheduleError(format!("{text:?} is not a valid cron expression: {e}")))?;
    Ok(cron)
}

/// A one-shot date-time starts with `YYYY-MM-DD`.
fn looks_like_date(text: &str) -> bool {
    let b = text.as_bytes();
    b.len() >= 10
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[5..7].iter().all(u8::is_ascii_digit)
        && b[7] == b'-'
}

fn parse_datetime(text: &str, tz: Tz) -> Result<DateTime<Utc>, ScheduleError> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    const LOCAL: [&str; 4] = [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
    ];
    let Some(naive) = LOCAL
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(text, f).ok())
    else {
        return Err(ScheduleError(format!(
            "{text:?} is not a date-time; write it as RFC 3339 (`2026-12-24T09:00:00+01:00`) \
             or as local time in the task's time zone (`2026-12-24T09:00`)"
        )));
    };
    match tz.from_local_datetime(&naive) {
        LocalResult::Single(t) => Ok(t.with_timezone(&Utc)),
        // A repeated hour (clocks going back): the first pass, as cron does.
        LocalResult::Ambiguous(earlier, _) => Ok(earlier.with_timezone(&Utc)),
        LocalResult::None => Err(ScheduleError(format!(
            "{text} does not exist in {} (the clocks skip it for daylight saving time); \
             pick another time or give an explicit UTC offset",
            tz.name()
        ))),
    }
}

/// Parses the part after `every`: one or more `<number><unit>` (spaces allowed; a lone
/// unit means one of it), into whole seconds.
fn parse_duration(rest: &str) -> Result<i64, ScheduleError> {
    let bad = |why: &str| {
        ScheduleError(format!(
            "`every{rest}`: {why}; write `every <number><unit>` with s, m, h or d, e.g. \
             `every 90s`, `every 15m`, `every 2h`, `every 1d`"
        ))
    };
    let mut chars = rest.trim().chars().peekable();
    let mut total: i64 = 0;
    let mut parts = 0;
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        if chars.peek().is_none() {
            break;
        }
        let mut digits = String::new();
        while let Some(c) = chars.peek().copied().filter(char::is_ascii_digit) {
            digits.push(c);
            chars.next();
        }
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut unit = String::new();
        while let Some(c) = chars.peek().copied().filter(char::is_ascii_alphabetic) {
            unit.push(c);
            chars.next();
        }
        if digits.is_empty() && unit.is_empty() {
            return Err(bad("unexpected characters"));
        }
        let n: i64 = if digits.is_empty() {
            1
        } else {
            digits.parse().map_err(|_| bad("the number is too large"))?
        };
        let scale = match unit.as_str() {
            "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hr" | "hrs" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            "" => return Err(bad("a unit is missing")),
            _ => return Err(bad(&format!("unknown unit {unit:?}"))),
        };
        total = n
            .checked_mul(scale)
            .and_then(|s| total.checked_add(s))
            .filter(|t| *t <= 366 * 86_400)
            .ok_or_else(|| bad("the interval is longer than a year"))?;
        parts += 1;
    }
    if parts == 0 || total == 0 {
        return Err(bad("the interval is missing or zero"));
    }
    Ok(total)
}
