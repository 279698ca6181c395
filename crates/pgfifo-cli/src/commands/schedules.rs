//! `pgfifo schedules` and `pgfifo schedule pause|resume|delete NAME`:
//! recurring jobs as stored.

use clap::Subcommand;
use pgfifo::admin::{self, ScheduleInfo, TickInfo};
use pgfifo::diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::error::CliResult;
use crate::output::{fields, or_dash, time, yes_no, Output, Table};

/// `pgfifo schedule ...`.
#[derive(Debug, Subcommand)]
pub enum ScheduleAction {
    /// Everything stored about one schedule
    Show {
        /// The schedule's name.
        name: String,
    },
    /// Stop firing a schedule: its ticks pass without jobs until resumed
    Pause {
        /// The schedule's name.
        name: String,
    },
    /// Fire a paused schedule again, from its next tick (ticks that passed
    /// while it was paused are skipped)
    Resume {
        /// The schedule's name.
        name: String,
    },
    /// Delete a stale schedule and its tick history (the jobs it enqueued
    /// stay)
    ///
    /// Refused (exit 1) while a live runner declares it: remove it from the
    /// runners' code first.
    Delete {
        /// The schedule's name.
        name: String,
    },
}

/// `pgfifo schedules`: every stored schedule, by name.
pub async fn list(conn: &mut AsyncPgConnection, out: Output) -> CliResult {
    let schedules = admin::schedules(conn).await?;
    out.emit(&schedules, |schedules| {
        if schedules.is_empty() {
            return "no schedules (a runner stores the schedules it declares when it starts)"
                .to_owned();
        }
        let mut table = Table::new(&[
            "NAME",
            "EXPRESSION",
            "ZONE",
            "STATE",
            "NEXT",
            "LAST",
            "LAST JOB",
        ]);
        for s in schedules {
            table.row(vec![
                s.name.clone(),
                s.expression.clone(),
                s.time_zone.clone(),
                state(s),
                or_dash(s.next_tick.map(time)),
                or_dash(s.last_tick.map(time)),
                last_job(s),
            ]);
        }
        table.render()
    })
}

/// How many recent ticks `schedule show` lists.
const RECENT_TICKS: u32 = 10;

/// `schedule show`'s document: the schedule and its latest ticks.
#[derive(Serialize)]
struct Shown {
    #[serde(flatten)]
    schedule: ScheduleInfo,
    recent_ticks: Vec<TickInfo>,
}

/// `pgfifo schedule show NAME`: one schedule in full, with its latest ticks.
pub async fn show(conn: &mut AsyncPgConnection, out: Output, name: &str) -> CliResult {
    let schedule = admin::schedule(conn, name).await?;
    let recent_ticks = admin::schedule_ticks(conn, name, RECENT_TICKS).await?;
    let shown = Shown {
        schedule,
        recent_ticks,
    };
    out.emit(&shown, |shown| {
        let s = &shown.schedule;
        let mut text = fields(&[
            ("name", s.name.clone()),
            ("expression", s.expression.clone()),
            ("time zone", s.time_zone.clone()),
            ("job", format!("{} in queue {}", s.kind, s.queue)),
            ("group", or_dash(s.group.as_deref())),
            ("missed-tick policy", s.on_missed.clone()),
            ("state", state(s)),
            (
                "declared by",
                or_dash(Some(s.declared_by.join(", ")).filter(|d| !d.is_empty())),
            ),
            ("next tick", or_dash(s.next_tick.map(time))),
            ("last tick", or_dash(s.last_tick.map(time))),
            ("last fired", or_dash(s.last_fired_at.map(time))),
            ("last job", last_job(s)),
            ("ticks missed so far", s.missed_ticks.to_string()),
            (
                "stored",
                format!("{} by {}", time(s.declared_at), s.stored_by),
            ),
            ("paused", yes_no(s.paused)),
        ]);
        if !shown.recent_ticks.is_empty() {
            let mut table = Table::new(&["TICK", "JOB", "FIRED", "BY", "MISSED BEFORE"]);
            for t in &shown.recent_ticks {
                table.row(vec![
                    time(t.tick),
                    t.job.to_string(),
                    time(t.fired_at),
                    t.fired_by.clone(),
                    t.missed.to_string(),
                ]);
            }
            text.push_str("\nlatest ticks:\n");
            text.push_str(&table.render());
        }
        text
    })
}

/// `active`, `paused`, `stale` or both of the last.
fn state(s: &ScheduleInfo) -> String {
    match (s.paused, s.stale) {
        (false, false) => "active".to_owned(),
        (true, false) => "paused".to_owned(),
        (false, true) => "stale".to_owned(),
        (true, true) => "paused, stale".to_owned(),
    }
}

/// `812 (succeeded)`.
fn last_job(s: &ScheduleInfo) -> String {
    match s.last_job {
        None => "-".to_owned(),
        Some(id) => format!("{id} ({})", s.last_job_state.as_deref().unwrap_or("purged")),
    }
}

/// What `schedule pause|resume` did.
#[derive(Serialize)]
struct PauseChange<'a> {
    schedule: &'a str,
    paused: bool,
    changed: bool,
}

/// `pgfifo schedule pause NAME` (`pause`) or `resume NAME`.
pub async fn pause(
    conn: &mut AsyncPgConnection,
    out: Output,
    name: &str,
    pause: bool,
) -> CliResult {
    let changed = if pause {
        admin::pause_schedule(conn, name).await?
    } else {
        admin::resume_schedule(conn, name).await?
    };
    let report = PauseChange {
        schedule: name,
        paused: pause,
        changed,
    };
    out.emit(&report, |p| match (p.changed, p.paused) {
        (true, true) => format!("paused schedule {name}: its ticks pass without jobs"),
        (true, false) => format!("resumed schedule {name}: it fires from its next tick"),
        (false, true) => format!("schedule {name} was already paused"),
        (false, false) => format!("schedule {name} was not paused"),
    })
}

/// What `schedule delete` did.
#[derive(Serialize)]
struct Deleted<'a> {
    deleted: &'a str,
}

/// `pgfifo schedule delete NAME`.
pub async fn delete(conn: &mut AsyncPgConnection, out: Output, name: &str) -> CliResult {
    admin::delete_schedule(conn, name).await?;
    out.emit(&Deleted { deleted: name }, |_| {
        format!("deleted schedule {name} (the jobs it enqueued stay)")
    })
}
