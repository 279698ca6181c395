//! One firing of a schedule: a transaction on the schedule's row lock.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::db;
use crate::db::schedule::Fired;
use crate::schedule::Compiled;
use crate::{Error, Result};

/// How long a firing's transaction may sit idle, or wait for a lock, before
/// PostgreSQL ends it: a frozen runner frees the schedule within this.
const FIRING_LIMIT: Duration = Duration::from_secs(30);

/// What a firing came to.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Committed: every tick up to `through_us` is dealt with; `now_us` is
    /// the database's clock when the firing began; `fired` ticks got a job,
    /// `missed` due ones did not.
    Fired {
        through_us: i64,
        now_us: i64,
        fired: u64,
        missed: u64,
    },
    /// Another runner's firing holds the schedule.
    Busy,
    /// Paused or redeclared by another runner since the state was read.
    Skipped,
}

/// Fires schedule `schedule`'s due ticks, as runner `runner`.
pub(super) async fn fire(
    conn: &mut AsyncPgConnection,
    schedule: &Compiled,
    runner: &str,
) -> Result<Outcome> {
    conn.transaction::<_, Error, _>(async |conn| {
        db::schedule::limit_firing(conn, FIRING_LIMIT).await?;
        let Some(state) = db::schedule::lock(conn, &schedule.name, &schedule.definition).await?
        else {
            return Ok(Outcome::Busy);
        };
        if !state.ours || state.paused {
            return Ok(Outcome::Skipped);
        }
        let due = schedule.due(state.fired_through_us, state.now_us);
        let jobs = due
            .fire
            .iter()
            .map(|firing| schedule.job(firing))
            .collect::<Result<Vec<_>>>()?;
        let job_ids = crate::enqueue_batch(conn, jobs).await?;
        let fired = Fired {
            ticks_us: due.fire.iter().map(|f| f.at_us).collect(),
            job_ids,
            missed: due
                .fire
                .iter()
                .map(|f| i64::try_from(f.missed).unwrap_or(i64::MAX))
                .collect(),
        };
        let missed = i64::try_from(due.missed).unwrap_or(i64::MAX);
        db::schedule::record(conn, &schedule.name, runner, &fired, due.through_us, missed).await?;
        if due.missed > 0 {
            tracing::info!(
                schedule = %schedule.name,
                missed = due.missed,
                fired = fired.ticks_us.len(),
                policy = schedule.missed.as_str(),
                "pgfifo: schedule caught up on ticks that passed while no runner fired them"
            );
        }
        Ok(Outcome::Fired {
            through_us: due.through_us,
            now_us: state.now_us,
            fired: fired.ticks_us.len() as u64,
            missed: due.missed,
        })
    })
    .await
}
