//! Which ticks are due and which of them fire: pure functions of a
//! schedule's expression, zone and policy, the instant up to which its
//! ticks were dealt with, and the database's clock.
//!
//! Ticks come from croner, walked forward in real time in the schedule's
//! zone. Its daylight saving rules, checked by the tests below:
//!
//! * **Skipped hour** (spring forward): a tick at a fixed time inside the
//!   gap fires at the first instant after it (02:30 → 03:00 on that day);
//!   ticks of an interval or wildcard field that fall in the gap do not
//!   exist.
//! * **Repeated hour** (fall back): a fixed-time tick fires once, in the
//!   first pass; interval and wildcard ticks fire in both passes.

use std::collections::VecDeque;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;

use super::{MakeJob, Missed, Schedule, Tick, MAX_CATCH_UP, MAX_SCHEDULE_NAME_LEN};
use crate::{EnqueueOptions, NewJob, Result};

/// At most this many due ticks are walked in one firing; a longer backlog
/// (a one-second schedule after a day without runners) is worked through
/// over several firings, each dropping what it walked.
const WALK_LIMIT: u64 = 100_000;

/// A schedule checked and ready to fire.
pub(crate) struct Compiled {
    pub name: String,
    pub expression: String,
    pub time_zone: String,
    pub kind: &'static str,
    pub queue: String,
    pub group: Option<String>,
    pub missed: Missed,
    pub grace: Duration,
    /// The declaration as stored and compared: equal definitions are the
    /// same schedule.
    pub definition: serde_json::Value,
    cron: Cron,
    zone: Tz,
    options: EnqueueOptions,
    make: Arc<MakeJob>,
}

impl std::fmt::Debug for Compiled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compiled")
            .field("name", &self.name)
            .field("definition", &self.definition)
            .finish_non_exhaustive()
    }
}

/// One tick to fire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Firing {
    /// The tick, in µs since the epoch.
    pub at_us: i64,
    /// Due ticks right before it that get no job of their own.
    pub missed: u64,
}

/// What one firing does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Due {
    /// Ticks to enqueue a job for, oldest first.
    pub fire: Vec<Firing>,
    /// Due ticks that get no job of their own.
    pub missed: u64,
    /// The new `fired_through`: every tick up to it is dealt with.
    pub through_us: i64,
}

/// Parses an expression and a zone: the checks shared by `runner::start`
/// and the admin views.
pub(crate) fn parse(expression: &str, zone: &str) -> std::result::Result<(Cron, Tz), String> {
    let cron = Cron::from_str(expression.trim())
        .map_err(|e| format!("invalid cron expression {expression:?}: {e}"))?;
    let zone = Tz::from_str(zone).map_err(|_| {
        format!(
            "unknown time zone {zone:?} (use an IANA name such as \"Europe/Berlin\" or \"UTC\")"
        )
    })?;
    Ok((cron, zone))
}

/// The first tick strictly after `after_us` (µs since the epoch), if the
/// expression has one before the year 5000.
pub(crate) fn next_tick(cron: &Cron, zone: Tz, after_us: i64) -> Option<i64> {
    let from = zone.from_utc_datetime(&utc(after_us).naive_utc());
    cron.find_next_occurrence(&from, false)
        .ok()
        .map(|t| t.with_timezone(&Utc).timestamp_micros())
}

fn utc(us: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(us).unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// Checks a schedule: its name, expression, zone, grace, policy, job type
/// and options. Every problem is a sentence naming what is wrong.
pub(crate) fn compile(schedule: &Schedule) -> std::result::Result<Compiled, Vec<String>> {
    let mut problems = Vec::new();
    if schedule.name.is_empty() || schedule.name.len() > MAX_SCHEDULE_NAME_LEN {
        problems.push(format!(
            "the name must be 1 to {MAX_SCHEDULE_NAME_LEN} bytes"
        ));
    }
    let parsed = parse(&schedule.expression, &schedule.time_zone)
        .map_err(|problem| problems.push(problem))
        .ok();
    if let Some((cron, zone)) = &parsed {
        // An expression such as "0 0 30 2 *" (30 February) parses but never fires.
        if next_tick(cron, *zone, micros_now()).is_none() {
            problems.push(format!(
                "cron expression {:?} never matches a time",
                schedule.expression
            ));
        }
    }
    if schedule.grace < Duration::from_secs(1) {
        problems.push("grace must be at least 1 second".to_owned());
    }
    if let Missed::RunEach { max } = schedule.missed {
        if max == 0 || max > MAX_CATCH_UP {
            problems.push(format!(
                "Missed::RunEach {{ max }} must be between 1 and {MAX_CATCH_UP}, got {max}"
            ));
        }
    }
    if let Err(err) = (schedule.registered)() {
        problems.push(err.to_string());
    }
    if let Err(err) = (schedule.check_options)(&schedule.options) {
        problems.push(err.to_string());
    }
    let queue = schedule
        .options
        .queue_name()
        .unwrap_or(schedule.queue)
        .to_owned();
    // (The options' queue and group names were checked with the options.)
    let Some((cron, zone)) = parsed.filter(|_| problems.is_empty()) else {
        return Err(problems);
    };
    let definition = serde_json::json!({
        "expression": schedule.expression.trim(),
        "time_zone": zone.name(),
        "kind": schedule.kind,
        "queue": queue,
        "missed": schedule.missed.as_str(),
        "max_catch_up": schedule.missed.max_catch_up(),
        "grace_ms": u64::try_from(schedule.grace.as_millis()).unwrap_or(u64::MAX),
        "options": schedule.options.to_json(),
    });
    Ok(Compiled {
        name: schedule.name.clone(),
        expression: schedule.expression.trim().to_owned(),
        time_zone: zone.name().to_owned(),
        kind: schedule.kind,
        queue,
        group: schedule.options.group_name().map(str::to_owned),
        missed: schedule.missed,
        grace: schedule.grace,
        definition,
        cron,
        zone,
        options: schedule.options.clone(),
        make: schedule.make.clone(),
    })
}

/// Now by this machine's clock, in µs since the epoch (only to check that
/// an expression ever matches; firing goes by the database's clock).
fn micros_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

impl Compiled {
    /// The first tick after `after_us`.
    pub(crate) fn next_after(&self, after_us: i64) -> Option<i64> {
        next_tick(&self.cron, self.zone, after_us)
    }

    /// Which ticks in `(through_us, now_us]` fire, under the policy.
    pub(crate) fn due(&self, through_us: i64, now_us: i64) -> Due {
        // The most recent ticks that may still fire: one for RunOnce (the
        // stand-in) and Skip, `max` for RunEach, plus the latest.
        let keep = self.missed.max_catch_up() as usize + 1;
        let mut recent: VecDeque<i64> = VecDeque::with_capacity(keep + 1);
        let mut count: u64 = 0;
        let mut at = through_us;
        while let Some(tick) = self.next_after(at).filter(|t| *t <= now_us) {
            count += 1;
            recent.push_back(tick);
            if recent.len() > keep {
                recent.pop_front();
            }
            at = tick;
            if count == WALK_LIMIT {
                // More may follow: drop what was walked, keeping the last
                // `keep` due for the next firing, which sees them again.
                let through_us = recent.front().map_or(at, |first| first - 1);
                let kept = recent.len() as u64;
                return Due {
                    fire: Vec::new(),
                    missed: count - kept,
                    through_us,
                };
            }
        }
        let mut due = Due {
            fire: Vec::new(),
            missed: 0,
            through_us: now_us.max(through_us),
        };
        let Some(&latest) = recent.back() else {
            return due;
        };
        let grace_us = i64::try_from(self.grace.as_micros()).unwrap_or(i64::MAX);
        let on_time = now_us - latest <= grace_us;
        match self.missed {
            Missed::Skip => {
                if on_time {
                    due.fire.push(Firing {
                        at_us: latest,
                        missed: count - 1,
                    });
                }
            }
            Missed::RunOnce => {
                // The missed ticks: all but an on-time latest one.
                let missed = if on_time { count - 1 } else { count };
                if missed > 0 {
                    let stand_in = recent[recent.len() - 1 - usize::from(on_time)];
                    due.fire.push(Firing {
                        at_us: stand_in,
                        missed: missed - 1,
                    });
                }
                if on_time {
                    due.fire.push(Firing {
                        at_us: latest,
                        missed: 0,
                    });
                }
            }
            Missed::RunEach { max } => {
                let fired = count.min(u64::from(max));
                let first = recent.len() - fired as usize;
                for (i, &at_us) in recent.iter().enumerate().skip(first) {
                    due.fire.push(Firing {
                        at_us,
                        missed: if i == first { count - fired } else { 0 },
                    });
                }
            }
        }
        due.missed = count - due.fire.len() as u64;
        due
    }

    /// The job of one tick, with the schedule's options.
    pub(crate) fn job(&self, firing: &Firing) -> Result<NewJob> {
        let tick = Tick {
            schedule: self.name.clone(),
            at: UNIX_EPOCH + Duration::from_micros(firing.at_us.max(0).unsigned_abs()),
            missed: firing.missed,
        };
        // The closure is the application's: a panic in it fails this
        // firing (it rolls back and is tried again), not the scheduler.
        let make = std::panic::AssertUnwindSafe(|| (self.make)(&tick, self.options.clone()));
        std::panic::catch_unwind(make).unwrap_or_else(|_| {
            Err(crate::Error::InvalidOption(format!(
                "the job closure of schedule {:?} panicked",
                self.name
            )))
        })
    }
}

#[cfg(test)]
mod tests;
