//! Per-queue status and the gauges the runner samples for metrics.
//!
//! Nothing here counts the whole job table. Unfinished and failed jobs are
//! counted exactly through their partial indexes (index-only scans; ~100 ms
//! per million on a small machine), up to [`COUNT_CAP`] rows each, beyond
//! which the figure is the planner's estimate. Succeeded and cancelled jobs,
//! the bulk of the table, are always estimates (kept by ANALYZE). Each
//! [`Count`] says which it is. Running jobs are what live runners report in
//! their heartbeats.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use super::ops::FailurePolicy;
use crate::db;
use crate::db::admin::status::BlockedRow;
use crate::db::layout::Layout;
use crate::db::pooler::pinned;
use crate::names::validate_queue;
use crate::time::{age_from_micros, ser_opt_secs};
use crate::Result;

/// Counting stops here: a larger figure is an estimate.
pub const COUNT_CAP: i64 = 2_000_000;

/// How recent a runner's heartbeat must be for it to count as alive.
pub const RUNNER_ALIVE: Duration = Duration::from_secs(30);

/// A number of jobs, exact or estimated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Count {
    /// The figure.
    pub value: i64,
    /// `false`: an estimate (from table statistics, or past [`COUNT_CAP`]).
    pub exact: bool,
}

impl std::fmt::Display for Count {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.exact {
            write!(f, "{}", self.value)
        } else {
            write!(f, "~{}", self.value)
        }
    }
}

/// Groups that cannot run now, by reason.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct BlockedGroups {
    /// Paused by an operator (with or without jobs waiting).
    pub paused: i64,
    /// Held at a failed head (failure policy `hold`).
    pub held: i64,
    /// Waiting for their head's next retry.
    pub retrying: i64,
    /// Snoozed by their head ([`JobError::snooze`](crate::JobError::snooze)).
    pub snoozed: i64,
}

impl BlockedGroups {
    /// All blocked groups.
    pub fn total(&self) -> i64 {
        self.paused + self.held + self.retrying + self.snoozed
    }
}

impl From<BlockedRow> for BlockedGroups {
    fn from(row: BlockedRow) -> Self {
        BlockedGroups {
            paused: row.paused_groups,
            held: row.held_groups,
            retrying: row.retrying_groups,
            snoozed: row.snoozed_groups,
        }
    }
}

/// A group and how many queued jobs it has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct GroupBacklog {
    /// The group.
    pub group: String,
    /// Its queued jobs.
    pub backlog: i64,
}

/// One queue at a glance (see [`status`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QueueStatus {
    /// The queue.
    pub queue: String,
    /// Whether the whole queue is paused.
    pub paused: bool,
    /// What a permanently failed head does to its group.
    pub failure_policy: FailurePolicy,
    /// Jobs waiting to start (ready or scheduled for later); excludes the
    /// running and retrying ones.
    pub queued: Count,
    /// Jobs running now, as reported by live runners.
    pub running: i64,
    /// Jobs waiting for a retry after a failed attempt.
    pub retrying: Count,
    /// Jobs that failed for good.
    pub failed: Count,
    /// Jobs that succeeded (not purged yet). Always an estimate; `None`
    /// until the job table has been analyzed once (autovacuum does it).
    pub succeeded: Option<Count>,
    /// Jobs that were cancelled. Always an estimate, as `succeeded`.
    pub cancelled: Option<Count>,
    /// The age of the oldest unfinished job.
    #[serde(serialize_with = "ser_opt_secs", rename = "oldest_queued_age_secs")]
    pub oldest_queued_age: Option<Duration>,
    /// Groups with jobs that cannot run now.
    pub blocked_groups: BlockedGroups,
    /// The groups with the most queued jobs, largest first.
    pub largest_backlogs: Vec<GroupBacklog>,
    /// Whether `largest_backlogs` is exact (false past [`COUNT_CAP`]).
    pub largest_backlogs_exact: bool,
    /// Live runners that serve this queue.
    pub runners: i64,
    /// The queue's own limits (`docs/queue-limits.md`), if it has any.
    pub limits: Option<crate::QueueLimits>,
}

/// Every queue pgfifo knows of: with groups (or groups waiting for a runner
/// to activate them), unfinished ungrouped or failed jobs, a setting, or a
/// live runner.
pub async fn queues(conn: &mut AsyncPgConnection) -> Result<Vec<String>> {
    pinned(conn, async |conn| {
        let layout = db::citus::layout(conn).await?;
        Ok(db::admin::status::queues(conn, layout, RUNNER_ALIVE).await?)
    })
    .await
}

/// A count capped at [`COUNT_CAP`]: exact below it, the estimate above.
fn capped(counted: i64, estimate: Option<i64>) -> Count {
    if counted >= COUNT_CAP {
        Count {
            value: estimate.unwrap_or(0).max(counted),
            exact: false,
        }
    } else {
        Count {
            value: counted,
            exact: true,
        }
    }
}

fn estimate(value: i64) -> Count {
    Count {
        value: value.max(0),
        exact: false,
    }
}

/// The status of one queue, with its `top` largest group backlogs. Answers
/// in well under a second at millions of jobs (see the module docs for what
/// is counted and what is estimated).
pub async fn queue_status(
    conn: &mut AsyncPgConnection,
    queue: &str,
    top: usize,
) -> Result<QueueStatus> {
    pinned(conn, async |conn| {
        let layout = db::citus::layout(conn).await?;
        status_in(conn, layout, queue, top).await
    })
    .await
}

/// [`queue_status`] on a database whose layout the caller has read.
async fn status_in(
    conn: &mut AsyncPgConnection,
    layout: Layout,
    queue: &str,
    top: usize,
) -> Result<QueueStatus> {
    validate_queue(queue)?;
    let (small, unfinished) =
        db::admin::status::queue_figures(conn, layout, queue, COUNT_CAP, top as i64, RUNNER_ALIVE)
            .await?;
    let total = capped(
        if unfinished.capped {
            COUNT_CAP
        } else {
            unfinished.total
        },
        small.queued_est,
    );
    let retrying = capped(small.retrying, None);
    let waiting = (total.value - small.running - retrying.value).max(0);
    let largest_backlogs = match unfinished.top {
        Some(top) => serde_json::from_value(top).map_err(|err| {
            crate::Error::InvalidArgument(format!("unexpected backlog summary: {err}"))
        })?,
        None => Vec::new(),
    };
    Ok(QueueStatus {
        queue: queue.to_owned(),
        paused: small.paused,
        failure_policy: small.policy.parse().unwrap_or_default(),
        queued: Count {
            value: waiting,
            exact: total.exact,
        },
        running: small.running,
        retrying,
        failed: capped(small.failed, small.failed_est),
        succeeded: small.succeeded_est.map(estimate),
        cancelled: small.cancelled_est.map(estimate),
        oldest_queued_age: unfinished.oldest_age_us.map(age_from_micros),
        blocked_groups: small.blocked.into(),
        largest_backlogs,
        largest_backlogs_exact: !unfinished.capped,
        runners: small.runners,
        limits: super::queue_limits::read(conn, queue).await?,
    })
}

/// The status of every known queue ([`queues`]), or of `only` these.
pub async fn status(
    conn: &mut AsyncPgConnection,
    only: Option<&[String]>,
    top: usize,
) -> Result<Vec<QueueStatus>> {
    pinned(conn, async |conn| {
        let layout = db::citus::layout(conn).await?;
        let names = match only {
            Some(names) => names.to_vec(),
            None => db::admin::status::queues(conn, layout, RUNNER_ALIVE).await?,
        };
        let mut out = Vec::with_capacity(names.len());
        for name in &names {
            out.push(status_in(conn, layout, name, top).await?);
        }
        Ok(out)
    })
    .await
}

/// What the runner samples for its gauges, per queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueGauges {
    /// The queue.
    pub queue: String,
    /// Unfinished jobs (capped at [`COUNT_CAP`]).
    pub depth: i64,
    /// The age of the oldest head of an active group that is still to run
    /// (queued): how far the queue lags.
    #[serde(serialize_with = "ser_opt_secs", rename = "oldest_head_age_secs")]
    pub oldest_head_age: Option<Duration>,
    /// Groups with jobs that cannot run now (paused, held, retrying).
    pub blocked_groups: i64,
}

/// Samples the gauges of `queues`: one cheap statement per queue.
pub async fn gauges(conn: &mut AsyncPgConnection, queues: &[String]) -> Result<Vec<QueueGauges>> {
    pinned(conn, async |conn| {
        let layout = db::citus::layout(conn).await?;
        let mut out = Vec::with_capacity(queues.len());
        for queue in queues {
            let row = db::admin::status::gauges(conn, layout, queue, COUNT_CAP).await?;
            out.push(QueueGauges {
                queue: queue.clone(),
                depth: row.depth,
                oldest_head_age: row.lag_us.map(age_from_micros),
                blocked_groups: BlockedGroups::from(row.blocked).total(),
            });
        }
        Ok(out)
    })
    .await
}
