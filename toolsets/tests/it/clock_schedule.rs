//! Schedule parsing and fire times: cron (5 and 6 fields), one-shot date-times, intervals,
//! refused texts with their reasons, and the Europe/Berlin DST days of 2026.

use chrono::Utc;
use chrono_tz::Tz;
use parlor_toolsets::clock::{Schedule, ScheduleKind};

use crate::support::clock::utc;

fn berlin() -> Tz {
    "Europe/Berlin".parse().unwrap()
}

/// The next `n` fire times after `after`, as UTC RFC 3339 text.
fn next(text: &str, tz: Tz, after: &str, n: usize) -> Vec<String> {
    let schedule = Schedule::parse(text, tz, utc(after)).unwrap();
    schedule
        .next_n(utc(after), n)
        .iter()
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .collect()
}

fn refused(text: &str, tz: Tz) -> String {
    match Schedule::parse(text, tz, utc("2026-06-01T00:00:00Z")) {
        Ok(s) => panic!("{text:?} was accepted as {s:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn five_field_cron_fires_on_weekdays_in_its_zone() {
    // Friday 2026-06-05, 12:00 Berlin: the next weekday mornings are Mon, Tue, Wed.
    assert_eq!(
        next("0 9 * * 1-5", berlin(), "2026-06-05T10:00:00Z", 3),
        [
            "2026-06-08T07:00:00Z",
            "2026-06-09T07:00:00Z",
            "2026-06-10T07:00:00Z"
        ]
    );
    let s = Schedule::parse("0 9 * * MON-FRI", berlin(), Utc::now()).unwrap();
    assert_eq!(s.kind(), ScheduleKind::Cron);
    assert!(!s.is_one_shot());
    assert_eq!(
        s.local(utc("2026-06-08T07:00:00Z")),
        "2026-06-08T09:00:00+02:00"
    );
}

#[test]
fn six_field_cron_has_seconds_first() {
    assert_eq!(
        next("30 0 9 * * *", Tz::UTC, "2026-06-05T10:00:00Z", 2),
        ["2026-06-06T09:00:30Z", "2026-06-07T09:00:30Z"]
    );
    assert_eq!(
        next("*/20 * * * * *", Tz::UTC, "2026-06-05T10:00:00Z", 3),
        [
            "2026-06-05T10:00:20Z",
            "2026-06-05T10:00:40Z",
            "2026-06-05T10:01:00Z"
        ]
    );
    let s = Schedule::parse("*/20 * * * * *", Tz::UTC, Utc::now()).unwrap();
    assert_eq!(
        s.shortest_gap(utc("2026-06-05T10:00:00Z"), 10),
        Some(std::time::Duration::from_secs(20))
    );
}

#[test]
fn a_nickname_is_a_cron_expression() {
    assert_eq!(
        next("@daily", Tz::UTC, "2026-06-05T10:00:00Z", 1),
        ["2026-06-06T00:00:00Z"]
    );
}

#[test]
fn a_one_shot_fires_once_with_its_own_offset_or_in_the_zone() {
    let s = Schedule::parse("2026-12-24T09:00:00+01:00", berlin(), Utc::now()).unwrap();
    assert_eq!(s.kind(), ScheduleKind::Once);
    assert!(s.is_one_shot());
    assert_eq!(
        next(
            "2026-12-24T09:00:00+01:00",
            berlin(),
            "2026-12-01T00:00:00Z",
            3
        ),
        ["2026-12-24T08:00:00Z"],
        "one time only"
    );
    assert_eq!(
        next("2026-12-24T09:00:00Z", berlin(), "2026-12-01T00:00:00Z", 1),
        ["2026-12-24T09:00:00Z"]
    );
    // Without an offset: local time in the task's zone (winter: UTC+1, summer: UTC+2).
    assert_eq!(
        next("2026-12-24T09:00", berlin(), "2026-12-01T00:00:00Z", 1),
        ["2026-12-24T08:00:00Z"]
    );
    assert_eq!(
        next("2026-07-01 09:30:15", berlin(), "2026-06-01T00:00:00Z", 1),
        ["2026-07-01T07:30:15Z"]
    );
    // A repeated hour takes its first pass.
    assert_eq!(
        next("2026-10-25T02:30", berlin(), "2026-10-01T00:00:00Z", 1),
        ["2026-10-25T00:30:00Z"]
    );
    // Passed: nothing after it.
    let passed = Schedule::parse("2026-01-01T00:00:00Z", Tz::UTC, Utc::now()).unwrap();
    assert_eq!(passed.next_after(utc("2026-01-01T00:00:00Z")), None);
}

#[test]
fn every_counts_whole_periods_from_its_anchor() {
    let anchor = utc("2026-06-05T10:00:00Z");
    let s = Schedule::parse("every 90s", Tz::UTC, anchor).unwrap();
    assert_eq!(s.kind(), ScheduleKind::Every);
    assert_eq!(s.period(), Some(std::time::Duration::from_secs(90)));
    assert_eq!(
        s.next_n(anchor, 3),
        [
            utc("2026-06-05T10:01:30Z"),
            utc("2026-06-05T10:03:00Z"),
            utc("2026-06-05T10:04:30Z")
        ]
    );
    // From any instant: the next whole period, strictly after it.
    assert_eq!(
        s.next_after(utc("2026-06-05T10:03:00Z")),
        Some(utc("2026-06-05T10:04:30Z"))
    );
    assert_eq!(
        s.next_after(utc("2026-06-05T10:02:59.900Z")),
        Some(utc("2026-06-05T10:03:00Z"))
    );
    assert_eq!(
        s.next_after(utc("2026-06-01T00:00:00Z")),
        Some(utc("2026-06-05T10:01:30Z")),
        "nothing before the first period"
    );
    for (text, secs) in [
        ("every 15m", 900),
        ("every 2h", 7200),
        ("every 1d", 86_400),
        ("Every 1h30m", 5400),
        ("every 1h 30m", 5400),
        ("every 2 hours", 7200),
        ("every hour", 3600),
        ("every 10 minutes", 600),
        ("every 1w", 604_800),
    ] {
        let s = Schedule::parse(text, Tz::UTC, anchor).unwrap();
        assert_eq!(s.period().map(|p| p.as_secs()), Some(secs), "{text}");
    }
    // An interval is elapsed time: across a DST change the local time moves by an hour.
    let s = Schedule::parse("every 1d", berlin(), utc("2026-03-28T08:00:00Z")).unwrap();
    assert_eq!(
        s.next_n(utc("2026-03-28T08:00:00Z"), 2)
            .iter()
            .map(|t| s.local(*t))
            .collect::<Vec<_>>(),
        ["2026-03-29T10:00:00+02:00", "2026-03-30T10:00:00+02:00"]
    );
}

#[test]
fn bad_schedules_are_refused_with_a_reason() {
    let tz = Tz::UTC;
    assert!(refused("", tz).contains("empty"), "{}", refused("", tz));
    assert!(refused("   ", tz).contains("empty"));
    let r = refused("* * * *", tz);
    assert!(r.contains("has 4 fields") && r.contains("5"), "{r}");
    let r = refused("0 0 9 * * * 2027", tz);
    assert!(r.contains("has 7 fields"), "{r}");
    let r = refused("61 * * * *", tz);
    assert!(r.contains("not a valid cron expression"), "{r}");
    let r = refused("0 25 * * *", tz);
    assert!(r.contains("not a valid cron expression"), "{r}");
    let r = refused("tomorrow at nine", tz);
    assert!(r.contains("fields"), "{r}");
    let r = refused("every", tz);
    assert!(r.contains("missing or zero"), "{r}");
    let r = refused("every 0m", tz);
    assert!(r.contains("missing or zero"), "{r}");
    let r = refused("every 5 parsecs", tz);
    assert!(r.contains("unknown unit \"parsecs\""), "{r}");
    let r = refused("every 5", tz);
    assert!(r.contains("unit is missing"), "{r}");
    let r = refused("every 400d", tz);
    assert!(r.contains("longer than a year"), "{r}");
    let r = refused("every 99999999999999999999s", tz);
    assert!(r.contains("too large"), "{r}");
    let r = refused("2026-13-01T00:00", tz);
    assert!(r.contains("not a date-time"), "{r}");
    // 02:30 does not exist in Berlin on the spring-forward day.
    let r = refused("2026-03-29T02:30", berlin());
    assert!(r.contains("does not exist in Europe/Berlin"), "{r}");
}

#[test]
fn a_pattern_that_never_matches_has_no_next_time() {
    let s = Schedule::parse("0 0 30 2 *", Tz::UTC, Utc::now()).unwrap();
    let started = std::time::Instant::now();
    assert_eq!(s.next_after(utc("2026-01-01T00:00:00Z")), None);
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// Europe/Berlin springs forward on 2026-03-29 at 02:00 CET -> 03:00 CEST.
#[test]
fn berlin_spring_forward_day() {
    let tz = berlin();
    // A fixed time inside the gap fires at the first real instant after it (03:00 CEST),
    // then back at 02:30 the days after.
    assert_eq!(
        next("30 2 * * *", tz, "2026-03-28T12:00:00Z", 3),
        [
            "2026-03-29T01:00:00Z",
            "2026-03-30T00:30:00Z",
            "2026-03-31T00:30:00Z"
        ]
    );
    // 09:00 local is 08:00 UTC in winter and 07:00 UTC in summer.
    assert_eq!(
        next("0 9 * * *", tz, "2026-03-27T12:00:00Z", 3),
        [
            "2026-03-28T08:00:00Z",
            "2026-03-29T07:00:00Z",
            "2026-03-30T07:00:00Z"
        ]
    );
    // An interval pattern skips the wall-clock times that do not exist.
    assert_eq!(
        next("*/30 * * * *", tz, "2026-03-29T00:00:00Z", 3),
        [
            "2026-03-29T00:30:00Z",
            "2026-03-29T01:00:00Z",
            "2026-03-29T01:30:00Z"
        ]
    );
    let s = Schedule::parse("*/30 * * * *", tz, Utc::now()).unwrap();
    assert_eq!(
        s.local(utc("2026-03-29T01:00:00Z")),
        "2026-03-29T03:00:00+02:00"
    );
}

/// Europe/Berlin falls back on 2026-10-25 at 03:00 CEST -> 02:00 CET.
#[test]
fn berlin_fall_back_day() {
    let tz = berlin();
    // A fixed time in the repeated hour fires once, on its first pass (CEST).
    assert_eq!(
        next("30 2 * * *", tz, "2026-10-24T12:00:00Z", 3),
        [
            "2026-10-25T00:30:00Z",
            "2026-10-26T01:30:00Z",
            "2026-10-27T01:30:00Z"
        ]
    );
    assert_eq!(
        next("0 9 * * *", tz, "2026-10-23T12:00:00Z", 3),
        [
            "2026-10-24T07:00:00Z",
            "2026-10-25T08:00:00Z",
            "2026-10-26T08:00:00Z"
        ]
    );
    // An interval pattern fires on both passes through the repeated hour.
    assert_eq!(
        next("*/30 * * * *", tz, "2026-10-24T23:59:00Z", 5),
        [
            "2026-10-25T00:00:00Z",
            "2026-10-25T00:30:00Z",
            "2026-10-25T01:00:00Z",
            "2026-10-25T01:30:00Z",
            "2026-10-25T02:00:00Z"
        ]
    );
    let s = Schedule::parse("*/30 * * * *", tz, Utc::now()).unwrap();
    assert_eq!(
        s.local(utc("2026-10-25T00:30:00Z")),
        "2026-10-25T02:30:00+02:00"
    );
    assert_eq!(
        s.local(utc("2026-10-25T01:30:00Z")),
        "2026-10-25T02:30:00+01:00"
    );
}
