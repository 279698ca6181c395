//! Recurring jobs as stored: listing them with their next and last ticks,
//! pausing, resuming and deleting them.

use std::time::SystemTime;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::status::RUNNER_ALIVE;
use crate::db;
use crate::db::pooler::pinned;
use crate::db::schedule::ScheduleRow;
use crate::schedule::{next_tick, parse};
use crate::time::{from_micros, ser_opt_time, ser_time};
use crate::{Error, JobId, Result};

/// A stored schedule (see [`schedules`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScheduleInfo {
    /// Its name.
    pub name: String,
    /// The cron expression.
    pub expression: String,
    /// The IANA time zone it is read in.
    pub time_zone: String,
    /// The kind of job it enqueues.
    pub kind: String,
    /// The queue its jobs go to.
    pub queue: String,
    /// The group its jobs go to (`None`: ungrouped).
    pub group: Option<String>,
    /// Its missed-tick policy: `skip`, `run once` or `run each (up to N)`.
    pub on_missed: String,
    /// Paused by an operator: its ticks pass without jobs.
    pub paused: bool,
    /// No live runner declares it as stored (they were all stopped, or the
    /// schedule was removed from their code): it does not fire.
    pub stale: bool,
    /// The live runners that declare it.
    pub declared_by: Vec<String>,
    /// The next tick it fires (in the past when it is overdue: stale, or
    /// about to catch up).
    #[serde(serialize_with = "ser_opt_time")]
    pub next_tick: Option<SystemTime>,
    /// The latest tick that fired.
    #[serde(serialize_with = "ser_opt_time")]
    pub last_tick: Option<SystemTime>,
    /// When it fired.
    #[serde(serialize_with = "ser_opt_time")]
    pub last_fired_at: Option<SystemTime>,
    /// The job it enqueued last.
    pub last_job: Option<JobId>,
    /// That job's state now (`None` when there is none, or it was purged).
    pub last_job_state: Option<String>,
    /// Due ticks that got no job of their own (skipped, or folded into
    /// one), in total.
    pub missed_ticks: i64,
    /// When its current definition was stored.
    #[serde(serialize_with = "ser_time")]
    pub declared_at: SystemTime,
    /// The runner that stored it.
    pub stored_by: String,
}

impl ScheduleInfo {
    fn from_row(row: ScheduleRow) -> Self {
        let next = parse(&row.expression, &row.time_zone)
            .ok()
            .and_then(|(cron, zone)| next_tick(&cron, zone, row.fired_through_us));
        let on_missed = match row.missed.as_str() {
            "skip" => "skip".to_owned(),
            "once" => "run once".to_owned(),
            _ => format!("run each (up to {})", row.max_catch_up),
        };
        Self {
            stale: row.live_runners.is_empty(),
            name: row.name,
            expression: row.expression,
            time_zone: row.time_zone,
            kind: row.kind,
            queue: row.queue,
            group: row.group_id,
            on_missed,
            paused: row.paused,
            declared_by: row.live_runners,
            next_tick: next.map(from_micros),
            last_tick: row.last_tick_us.map(from_micros),
            last_fired_at: row.last_fired_at_us.map(from_micros),
            last_job: row.last_job_id,
            last_job_state: row.last_job_id.and(row.last_job_state),
            missed_ticks: row.missed_ticks,
            declared_at: from_micros(row.declared_at_us),
            stored_by: row.declared_by,
        }
    }
}

/// Every stored schedule, by name.
pub async fn schedules(conn: &mut AsyncPgConnection) -> Result<Vec<ScheduleInfo>> {
    pinned(conn, async |conn| {
        let rows = db::schedule::list(conn, None, RUNNER_ALIVE).await?;
        Ok(rows.into_iter().map(ScheduleInfo::from_row).collect())
    })
    .await
}

/// The schedule named `name`.
pub async fn schedule(conn: &mut AsyncPgConnection, name: &str) -> Result<ScheduleInfo> {
    pinned(conn, async |conn| {
        let rows = db::schedule::list(conn, Some(name), RUNNER_ALIVE).await?;
        rows.into_iter()
            .next()
            .map(ScheduleInfo::from_row)
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))
    })
    .await
}

/// One fired tick of a schedule (see [`schedule_ticks`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TickInfo {
    /// The tick.
    #[serde(serialize_with = "ser_time")]
    pub tick: SystemTime,
    /// The job it enqueued.
    pub job: JobId,
    /// When it fired (the firing transaction's time).
    #[serde(serialize_with = "ser_time")]
    pub fired_at: SystemTime,
    /// The runner that fired it.
    pub fired_by: String,
    /// Due ticks right before it that got no job of their own.
    pub missed: i64,
}

/// The latest `limit` fired ticks of schedule `name` (at most 100 are
/// kept), newest first.
pub async fn schedule_ticks(
    conn: &mut AsyncPgConnection,
    name: &str,
    limit: u32,
) -> Result<Vec<TickInfo>> {
    pinned(conn, async |conn| {
        let rows = db::schedule::recent_ticks(conn, name, i64::from(limit)).await?;
        if rows.is_empty() {
            // Tell a schedule without ticks from no schedule.
            schedule(conn, name).await?;
        }
        Ok(rows
            .into_iter()
            .map(|r| TickInfo {
                tick: from_micros(r.tick_us),
                job: r.job_id,
                fired_at: from_micros(r.fired_at_us),
                fired_by: r.fired_by,
                missed: r.missed,
            })
            .collect())
    })
    .await
}

/// Pauses schedule `name`: its ticks pass without jobs until
/// [`resume_schedule`]. Returns whether it was running (`false`: already
/// paused). The pause is stored, so it outlives restarts and deploys.
pub async fn pause_schedule(conn: &mut AsyncPgConnection, name: &str) -> Result<bool> {
    pinned(conn, async |conn| {
        db::schedule::set_paused(conn, name, true)
            .await?
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))
    })
    .await
}

/// Resumes schedule `name`: it fires again from its next tick on. The ticks
/// that passed while it was paused are skipped, whatever its missed-tick
/// policy. Returns whether it was paused.
pub async fn resume_schedule(conn: &mut AsyncPgConnection, name: &str) -> Result<bool> {
    pinned(conn, async |conn| {
        db::schedule::set_paused(conn, name, false)
            .await?
            .ok_or_else(|| Error::ScheduleNotFound(name.to_owned()))
    })
    .await
}

/// Deletes a stale schedule (and its tick history; the jobs it enqueued
/// stay). Fails with [`Error::ScheduleDeclared`] while a live runner
/// declares it: a runner would store it again.
pub async fn delete_schedule(conn: &mut AsyncPgConnection, name: &str) -> Result<()> {
    pinned(conn, async |conn| {
        match db::schedule::delete(conn, name, RUNNER_ALIVE).await? {
            None => Err(Error::ScheduleNotFound(name.to_owned())),
            Some(runners) if runners.is_empty() => Ok(()),
            Some(runners) => Err(Error::ScheduleDeclared {
                name: name.to_owned(),
                runners,
            }),
        }
    })
    .await
}
