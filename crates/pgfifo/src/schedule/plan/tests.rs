use super::*;

use chrono::NaiveDate;

/// A schedule with a job type that needs no registry (its job is never made).
fn schedule(expression: &str, zone: &str, missed: Missed) -> Schedule {
    Schedule {
        name: "test".into(),
        expression: expression.into(),
        time_zone: zone.into(),
        options: EnqueueOptions::group("test"),
        missed,
        grace: super::super::DEFAULT_GRACE,
        kind: "test_job",
        queue: "default",
        registered: || Ok(()),
        check_options: |_| Ok(()),
        make: Arc::new(|_: &Tick, _: EnqueueOptions| unreachable!("no job is made here")),
    }
}

fn compiled(expression: &str, zone: &str, missed: Missed) -> Compiled {
    compile(&schedule(expression, zone, missed)).expect("a valid schedule")
}

/// µs since the epoch of a wall-clock time in `zone`, taking the first of
/// two (a repeated hour) or failing on none (a skipped hour).
fn wall(zone: &str, y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
    let zone: Tz = zone.parse().unwrap();
    let naive = NaiveDate::from_ymd_opt(y, mo, d)
        .unwrap()
        .and_hms_opt(h, mi, s)
        .unwrap();
    zone.from_local_datetime(&naive)
        .earliest()
        .expect("an existing wall time")
        .timestamp_micros()
}

fn utc_us(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> i64 {
    wall("UTC", y, mo, d, h, mi, s)
}

/// The next `n` ticks after `from`, as UTC `HH:MM:SS` plus the day.
fn ticks(c: &Compiled, from: i64, n: usize) -> Vec<String> {
    let mut at = from;
    (0..n)
        .map(|_| {
            at = c.next_after(at).expect("a next tick");
            utc(at).format("%d %H:%M:%S").to_string()
        })
        .collect()
}

const SECOND: i64 = 1_000_000;
const BERLIN: &str = "Europe/Berlin";

// Europe/Berlin in 2026: clocks jump from 02:00 CET to 03:00 CEST on 29
// March (UTC 01:00) and fall back from 03:00 CEST to 02:00 CET on 25
// October (UTC 01:00).

#[test]
fn a_fixed_tick_in_the_skipped_hour_fires_when_the_gap_ends() {
    let c = compiled("30 2 * * *", BERLIN, Missed::RunOnce);
    let from = wall(BERLIN, 2026, 3, 28, 12, 0, 0);
    // 28 Mar 02:30 CET is gone; 29 Mar 02:30 does not exist: it fires at
    // 03:00 CEST (01:00 UTC); 30 Mar is back to 02:30 CEST (00:30 UTC).
    assert_eq!(
        ticks(&c, from, 3),
        ["29 01:00:00", "30 00:30:00", "31 00:30:00"]
    );
}

#[test]
fn interval_ticks_in_the_skipped_hour_do_not_exist() {
    let c = compiled("*/30 * * * *", BERLIN, Missed::RunOnce);
    let from = wall(BERLIN, 2026, 3, 29, 1, 0, 0);
    // 01:30 CET, then 03:00 CEST: 02:00 and 02:30 never happen.
    assert_eq!(
        ticks(&c, from, 3),
        ["29 00:30:00", "29 01:00:00", "29 01:30:00"]
    );
}

#[test]
fn a_fixed_tick_in_the_repeated_hour_fires_once() {
    let c = compiled("30 2 * * *", BERLIN, Missed::RunOnce);
    let from = wall(BERLIN, 2026, 10, 24, 12, 0, 0);
    // 02:30 CEST (00:30 UTC) in the first pass only; 02:30 CET next day.
    assert_eq!(ticks(&c, from, 2), ["25 00:30:00", "26 01:30:00"]);
    // Starting inside the second pass does not fire it again.
    // 01:00 CEST + 2 h 1 min = 02:01 CET, in the second pass.
    let second_pass = wall(BERLIN, 2026, 10, 25, 1, 0, 0) + 2 * 3600 * SECOND + 60 * SECOND;
    assert_eq!(ticks(&c, second_pass, 1), ["26 01:30:00"]);
}

#[test]
fn interval_ticks_in_the_repeated_hour_fire_in_both_passes() {
    let c = compiled("0 * * * *", BERLIN, Missed::RunOnce);
    let from = wall(BERLIN, 2026, 10, 25, 1, 30, 0);
    // 02:00 CEST, 02:00 CET, 03:00 CET: one hour apart in real time.
    assert_eq!(
        ticks(&c, from, 3),
        ["25 00:00:00", "25 01:00:00", "25 02:00:00"]
    );
}

#[test]
fn utc_is_the_default_zone_and_seconds_are_optional() {
    let mut s = schedule("*/15 * * * * *", "UTC", Missed::RunOnce);
    s.time_zone = "UTC".into();
    let c = compile(&s).unwrap();
    let from = utc_us(2026, 1, 1, 0, 0, 0);
    assert_eq!(ticks(&c, from, 2), ["01 00:00:15", "01 00:00:30"]);
    let daily = compiled("@daily", "UTC", Missed::RunOnce);
    assert_eq!(ticks(&daily, from, 1), ["02 00:00:00"]);
}

#[test]
fn bad_schedules_name_every_problem() {
    let mut s = schedule("61 * * * *", "Europe/Berln", Missed::RunEach { max: 0 });
    s.grace = Duration::ZERO;
    s.name = String::new();
    let problems = compile(&s).unwrap_err();
    let all = problems.join("\n");
    assert_eq!(problems.len(), 4, "{all}");
    assert!(all.contains("name must be 1 to"), "{all}");
    assert!(
        all.contains("invalid cron expression \"61 * * * *\""),
        "{all}"
    );
    assert!(all.contains("grace must be at least 1 second"), "{all}");
    assert!(
        all.contains("RunEach { max } must be between 1 and"),
        "{all}"
    );

    let zone = compile(&schedule("* * * * *", "Europe/Berln", Missed::Skip)).unwrap_err();
    assert!(
        zone[0].contains("unknown time zone \"Europe/Berln\""),
        "{zone:?}"
    );
    let never = compile(&schedule("0 0 30 2 *", "UTC", Missed::Skip)).unwrap_err();
    assert!(never[0].contains("never matches"), "{never:?}");
    let fields = compile(&schedule("* * *", "UTC", Missed::Skip)).unwrap_err();
    assert!(fields[0].contains("between 5 and 7 fields"), "{fields:?}");
}

#[test]
fn equal_declarations_have_equal_definitions() {
    let a = compiled("0 3 * * *", BERLIN, Missed::RunOnce);
    let b = compiled(" 0 3 * * * ", BERLIN, Missed::RunOnce);
    assert_eq!(a.definition, b.definition);
    let other_zone = compiled("0 3 * * *", "UTC", Missed::RunOnce);
    let other_policy = compiled("0 3 * * *", BERLIN, Missed::Skip);
    let mut grouped = schedule("0 3 * * *", BERLIN, Missed::RunOnce);
    grouped.options = EnqueueOptions::group("tenant-7");
    let other_group = compile(&grouped).unwrap();
    for other in [other_zone, other_policy, other_group] {
        assert_ne!(a.definition, other.definition);
    }
}

/// Every second; the last fire was at `through`; `late` seconds after tick
/// `through + n`.
fn every_second(missed: Missed) -> Compiled {
    compiled("* * * * * *", "UTC", missed)
}

fn fired_at(due: &Due) -> Vec<(i64, u64)> {
    due.fire
        .iter()
        .map(|f| (f.at_us / SECOND, f.missed))
        .collect()
}

#[test]
fn an_on_time_tick_fires_alone_under_every_policy() {
    let through = 1_000 * SECOND;
    let now = through + SECOND + 2_000; // 2 ms after tick 1001
    for missed in [Missed::Skip, Missed::RunOnce, Missed::RunEach { max: 5 }] {
        let due = every_second(missed).due(through, now);
        assert_eq!(fired_at(&due), [(1001, 0)], "{missed:?}");
        assert_eq!(due.missed, 0);
        assert_eq!(due.through_us, now);
    }
    // Nothing due: nothing fires, and fired_through moves to now.
    let due = every_second(Missed::RunOnce).due(through, through + 500_000);
    assert!(due.fire.is_empty());
    assert_eq!(due.through_us, through + 500_000);
}

#[test]
fn five_missed_ticks_follow_the_policy() {
    // Ticks 1001..=1005 passed with no runner; now is 0.3 s after 1006.
    let through = 1_000 * SECOND;
    let now = 1_006 * SECOND + 300_000;
    let skip = every_second(Missed::Skip).due(through, now);
    assert_eq!(fired_at(&skip), [(1006, 5)]);
    assert_eq!(skip.missed, 5);
    let once = every_second(Missed::RunOnce).due(through, now);
    assert_eq!(fired_at(&once), [(1005, 4), (1006, 0)]);
    assert_eq!(once.missed, 4);
    let each = every_second(Missed::RunEach { max: 10 }).due(through, now);
    assert_eq!(
        fired_at(&each),
        [
            (1001, 0),
            (1002, 0),
            (1003, 0),
            (1004, 0),
            (1005, 0),
            (1006, 0)
        ]
    );
    let bounded = every_second(Missed::RunEach { max: 3 }).due(through, now);
    assert_eq!(fired_at(&bounded), [(1004, 3), (1005, 0), (1006, 0)]);
    assert_eq!(bounded.missed, 3);
}

#[test]
fn a_tick_later_than_the_grace_is_missed() {
    // A daily 03:00 tick, and the first runner starts at 03:30.
    let c = compiled("0 3 * * *", "UTC", Missed::Skip);
    let through = utc_us(2026, 5, 1, 12, 0, 0);
    let now = utc_us(2026, 5, 2, 3, 30, 0);
    let skip = c.due(through, now);
    assert!(skip.fire.is_empty());
    assert_eq!(skip.missed, 1);
    let once = compiled("0 3 * * *", "UTC", Missed::RunOnce).due(through, now);
    assert_eq!(once.fire.len(), 1);
    assert_eq!(once.fire[0].at_us, utc_us(2026, 5, 2, 3, 0, 0));
    // Within the grace it is on time.
    let now = utc_us(2026, 5, 2, 3, 0, 40);
    assert_eq!(c.due(through, now).fire.len(), 1);
}

#[test]
fn a_huge_backlog_is_walked_in_bounded_steps() {
    // Two days of a one-second schedule: more than the walk limit.
    let c = every_second(Missed::RunEach { max: 3 });
    let mut through = 0;
    let now = 2 * 86_400 * SECOND + 500_000;
    let mut missed = 0;
    let mut steps = 0;
    let due = loop {
        let due = c.due(through, now);
        steps += 1;
        missed += due.missed;
        if !due.fire.is_empty() || due.through_us == now {
            break due;
        }
        assert!(due.through_us > through, "progress");
        through = due.through_us;
    };
    assert!(steps > 1);
    // The last step fires the three most recent ticks; the first of them
    // counts the ticks this step dropped (earlier steps counted theirs).
    let fired = fired_at(&due);
    assert_eq!(
        fired.iter().map(|f| f.0).collect::<Vec<_>>(),
        [172_798, 172_799, 172_800]
    );
    assert_eq!(fired[0].1, due.missed);
    // Every tick is either fired or counted as missed, once.
    assert_eq!(missed + due.fire.len() as u64, 172_800);
}
