//! The scheduler: fires the ticks of the schedules this runner declares.
//!
//! At start every schedule is stored (or its changed definition replaces
//! the stored one) in `pgfifo.schedule`. Then one loop reads the states of
//! the runner's schedules, fires those whose next tick has come (by the
//! database's clock), and sleeps until the earliest next tick or
//! [`REFRESH`], whichever is sooner, so that a pause, a resume or a
//! redeclaration by another runner is seen within that time.
//!
//! Firing (`fire.rs`) is one transaction that locks the schedule's row
//! without waiting (another runner's firing makes it skip and look again
//! soon), works out the due ticks, enqueues their jobs and moves the
//! schedule past them. Two runners can never both fire a tick: the second
//! one locks the row only after the first committed and then finds the
//! tick dealt with; and `schedule_tick`'s primary key refuses a tick twice.
//! A runner that dies mid-firing rolls back, and the others fire the tick.

mod fire;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use diesel_async::AsyncPgConnection;
use metrics::Counter;
use tokio_util::sync::CancellationToken;

use super::maintenance::{pooled, Complaints};
use super::metrics::{SCHEDULE_TICKS_FIRED, SCHEDULE_TICKS_MISSED};
use crate::db;
use crate::db::schedule::Declaration;
use crate::db::Pool;
use crate::schedule::Compiled;
use crate::Result;
use fire::Outcome;

/// The longest the scheduler sleeps between two looks at its schedules.
pub(crate) const REFRESH: Duration = Duration::from_secs(1);
/// How soon it looks again after another runner's firing held a schedule.
const BUSY_RETRY: Duration = Duration::from_millis(100);

/// Stores the runner's schedules, or replaces stored definitions that
/// differ (a deploy changed them), logging whose declaration it replaced.
pub(crate) async fn declare(
    conn: &mut AsyncPgConnection,
    runner: &str,
    schedules: &[Arc<Compiled>],
) -> Result<()> {
    for s in schedules {
        let declared = db::schedule::declare(
            conn,
            Declaration {
                name: &s.name,
                expression: &s.expression,
                time_zone: &s.time_zone,
                kind: s.kind,
                queue: &s.queue,
                group: s.group.as_deref(),
                missed: s.missed.as_str(),
                max_catch_up: i32::try_from(s.missed.max_catch_up()).unwrap_or(i32::MAX),
                definition: &s.definition,
                runner,
            },
        )
        .await?;
        match declared {
            Some(d) if !d.inserted => tracing::warn!(
                schedule = %s.name,
                previous_declared_by = d.previous_by.as_deref().unwrap_or("?"),
                "pgfifo: this runner's definition of the schedule replaces a different one; \
                 runners that still declare the old one stop firing it"
            ),
            Some(_) => tracing::info!(schedule = %s.name, "pgfifo: schedule stored"),
            None => {}
        }
    }
    Ok(())
}

/// The `{"name": definition}` object of a runner's heartbeat.
pub(crate) fn declarations(schedules: &[Arc<Compiled>]) -> serde_json::Value {
    schedules
        .iter()
        .map(|s| (s.name.clone(), s.definition.clone()))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The scheduler task.
pub(crate) struct Scheduler {
    pool: Pool,
    runner: String,
    /// How long the server gets to answer a round trip.
    round_trip: Duration,
    schedules: Vec<Arc<Compiled>>,
    /// Per schedule (in the order of `schedules`): ticks fired and missed.
    counters: Vec<(Counter, Counter)>,
}

impl Scheduler {
    /// The scheduler of runner `runner`'s schedules (registering their
    /// metrics), with the runner's round-trip deadline.
    pub(crate) fn new(
        pool: Pool,
        (runner, round_trip): (String, Duration),
        schedules: Vec<Arc<Compiled>>,
    ) -> Self {
        let counters = schedules
            .iter()
            .map(|s| {
                (
                    metrics::counter!(SCHEDULE_TICKS_FIRED, "schedule" => s.name.clone()),
                    metrics::counter!(SCHEDULE_TICKS_MISSED, "schedule" => s.name.clone()),
                )
            })
            .collect();
        Self {
            pool,
            runner,
            round_trip,
            schedules,
            counters,
        }
    }

    /// Fires ticks until `stop` is cancelled (the runner stops picking).
    pub(crate) async fn run(self, stop: CancellationToken) {
        let mut complaints = Complaints::new("scheduler");
        let mut foreign = HashSet::new();
        loop {
            let wait = complaints
                .report(self.round(&mut foreign).await)
                .unwrap_or(REFRESH);
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                () = stop.cancelled() => break,
            }
        }
    }

    /// Fires what is due; returns how long to sleep.
    async fn round(&self, foreign: &mut HashSet<String>) -> Result<Duration> {
        let mut conn = pooled(&self.pool, REFRESH).await?;
        let names: Vec<&str> = self.schedules.iter().map(|s| s.name.as_str()).collect();
        let definitions: Vec<&serde_json::Value> =
            self.schedules.iter().map(|s| &s.definition).collect();
        // Each statement within the round-trip deadline: on a hung server
        // the round fails, the pool closes the connection, and the next
        // round takes another one.
        let deadline = self.round_trip;
        let states = db::schedule::states(&mut conn, &names, &definitions);
        let Ok(states) = tokio::time::timeout(deadline, states).await else {
            db::discard(&mut conn);
            return Err(crate::Error::Database(db::error::timed_out(deadline)));
        };
        let states = states?;
        if states.len() < self.schedules.len() {
            // A schedule was deleted (`pgfifo schedule delete`) while this
            // runner's heartbeat lagged: it declares it, so it is back.
            let missing: Vec<Arc<Compiled>> = self
                .schedules
                .iter()
                .filter(|s| !states.iter().any(|state| state.name == s.name))
                .cloned()
                .collect();
            declare(&mut conn, &self.runner, &missing).await?;
            return Ok(Duration::ZERO);
        }
        let mut wait = REFRESH;
        for state in states {
            let Some(index) = self.schedules.iter().position(|s| s.name == state.name) else {
                continue;
            };
            let schedule = &self.schedules[index];
            if !state.ours {
                if foreign.insert(state.name.clone()) {
                    tracing::warn!(
                        schedule = %state.name,
                        "pgfifo: another runner declared this schedule differently since this \
                         one started; this runner no longer fires it (restart it with the new \
                         definition)"
                    );
                }
                continue;
            }
            foreign.remove(&state.name);
            if state.paused {
                continue;
            }
            let Some(next) = schedule.next_after(state.fired_through_us) else {
                continue;
            };
            let until_next = if next <= state.now_us {
                // One schedule's failure (its closure errs or panics, its
                // job is refused) must not keep the others from firing.
                let fired = fire::fire(&mut conn, schedule, &self.runner);
                let Ok(fired) = tokio::time::timeout(deadline, fired).await else {
                    db::discard(&mut conn);
                    return Err(crate::Error::Database(db::error::timed_out(deadline)));
                };
                let outcome = match fired {
                    Ok(outcome) => outcome,
                    Err(err) => {
                        tracing::warn!(
                            schedule = %schedule.name,
                            error = %err,
                            "pgfifo: firing a schedule's tick failed; trying again in a second"
                        );
                        wait = wait.min(REFRESH);
                        continue;
                    }
                };
                match outcome {
                    Outcome::Fired {
                        through_us,
                        now_us,
                        fired,
                        missed,
                    } => {
                        let (fired_total, missed_total) = &self.counters[index];
                        fired_total.increment(fired);
                        missed_total.increment(missed);
                        schedule
                            .next_after(through_us)
                            .map_or(REFRESH, |next| micros(next - now_us))
                    }
                    Outcome::Busy => BUSY_RETRY,
                    Outcome::Skipped => REFRESH,
                }
            } else {
                micros(next - state.now_us)
            };
            wait = wait.min(until_next);
        }
        Ok(wait)
    }
}

/// A wait of `us` µs (at least 1 ms: a tick is never early by the database's
/// clock, and the next look finds it due).
fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0)).max(Duration::from_millis(1))
}
