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

use diesel::sql_types::{BigInt, Bool, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde::Serialize;

use super::ops::FailurePolicy;
use super::time::{age_from_micros, ser_opt_secs};
use crate::enqueue::validate_queue;
use crate::Result;

/// Counting stops here: a larger figure is an estimate.
pub const COUNT_CAP: i64 = 2_000_000;

/// Settings of the status transaction (see [`queue_status`]).
const COUNTING_SETTINGS: &str = "SET LOCAL enable_bitmapscan = off;
     SET LOCAL enable_seqscan = off;
     SET LOCAL enable_sort = off;
     SET LOCAL jit = off;";

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
}

impl BlockedGroups {
    /// All blocked groups.
    pub fn total(&self) -> i64 {
        self.paused + self.held + self.retrying
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
}

/// Every queue pgfifo knows of: with groups (or groups waiting for a runner
/// to activate them), unfinished ungrouped or failed jobs, a setting, or a
/// live runner.
pub async fn queues(conn: &mut AsyncPgConnection) -> Result<Vec<String>> {
    #[derive(QueryableByName)]
    struct Row {
        #[diesel(sql_type = Text)]
        queue: String,
    }
    // Loose index scans: one index probe per distinct queue, not per row.
    let rows: Vec<Row> = diesel::sql_query(
        "WITH RECURSIVE
             g(q) AS (SELECT min(queue) FROM pgfifo.queue_group
                      UNION ALL
                      SELECT (SELECT min(queue) FROM pgfifo.queue_group WHERE queue > g.q)
                      FROM g WHERE g.q IS NOT NULL),
             u(q) AS (SELECT min(queue) FROM pgfifo.job WHERE state = 'queued' AND group_id IS NULL
                      UNION ALL
                      SELECT (SELECT min(queue) FROM pgfifo.job
                              WHERE state = 'queued' AND group_id IS NULL AND queue > u.q)
                      FROM u WHERE u.q IS NOT NULL),
             f(q) AS (SELECT min(queue) FROM pgfifo.job WHERE state = 'failed'
                      UNION ALL
                      SELECT (SELECT min(queue) FROM pgfifo.job WHERE state = 'failed' AND queue > f.q)
                      FROM f WHERE f.q IS NOT NULL)
         SELECT q AS queue FROM g WHERE q IS NOT NULL
         UNION SELECT q FROM u WHERE q IS NOT NULL
         UNION SELECT q FROM f WHERE q IS NOT NULL
         UNION SELECT DISTINCT queue FROM pgfifo.group_wake
         UNION SELECT queue FROM pgfifo.queue_setting
         UNION SELECT unnest(queues) FROM pgfifo.runner
               WHERE heartbeat_at > now() - make_interval(secs => 30)
         ORDER BY 1",
    )
    .load(conn)
    .await?;
    Ok(rows.into_iter().map(|r| r.queue).collect())
}

#[derive(QueryableByName)]
struct UnfinishedRow {
    #[diesel(sql_type = BigInt)]
    total: i64,
    #[diesel(sql_type = Bool)]
    capped: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    oldest_age_us: Option<i64>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    top: Option<serde_json::Value>,
}

/// Unfinished jobs of a queue: how many (both queued indexes, capped), the
/// oldest one's age, and the `top` groups by backlog.
async fn unfinished(conn: &mut AsyncPgConnection, queue: &str, top: i64) -> Result<UnfinishedRow> {
    Ok(diesel::sql_query(
        "WITH per AS (
             SELECT s.group_id, count(*) AS n, min(s.id) AS oldest
             FROM (SELECT j.group_id, j.id FROM pgfifo.job AS j
                   WHERE j.queue = $1 AND j.state = 'queued' AND j.group_id IS NOT NULL
                   LIMIT $2) AS s
             GROUP BY s.group_id),
         solo AS (
             SELECT count(*) AS n, min(s.id) AS oldest
             FROM (SELECT j.id FROM pgfifo.job AS j
                   WHERE j.queue = $1 AND j.state = 'queued' AND j.group_id IS NULL
                   LIMIT $2) AS s),
         sums AS (
             SELECT coalesce((SELECT sum(n) FROM per), 0)::bigint AS grouped,
                    (SELECT n FROM solo) AS ungrouped,
                    least((SELECT min(oldest) FROM per), (SELECT oldest FROM solo)) AS oldest)
         SELECT s.grouped + s.ungrouped AS total,
                s.grouped >= $2 OR s.ungrouped >= $2 AS capped,
                (SELECT (extract(epoch FROM now() - j.created_at) * 1e6)::bigint
                 FROM pgfifo.job AS j WHERE j.id = s.oldest) AS oldest_age_us,
                (SELECT jsonb_agg(jsonb_build_object('group', t.group_id, 'backlog', t.n))
                 FROM (SELECT group_id, n FROM per ORDER BY n DESC, group_id LIMIT $3) AS t) AS top
         FROM sums AS s",
    )
    .bind::<Text, _>(queue)
    .bind::<BigInt, _>(COUNT_CAP)
    .bind::<BigInt, _>(top)
    .get_result(conn)
    .await?)
}

#[derive(QueryableByName)]
struct SmallCounts {
    #[diesel(sql_type = Bool)]
    paused: bool,
    #[diesel(sql_type = Text)]
    policy: String,
    #[diesel(sql_type = BigInt)]
    running: i64,
    #[diesel(sql_type = BigInt)]
    runners: i64,
    #[diesel(sql_type = BigInt)]
    retrying: i64,
    #[diesel(sql_type = BigInt)]
    failed: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    succeeded_est: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    cancelled_est: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    queued_est: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    failed_est: Option<i64>,
    #[diesel(embed)]
    blocked: BlockedRow,
}

/// The blocked groups of queue `$1`, as select items (see [`BlockedRow`]);
/// a macro so that it can be `concat!`ed into the statements that use it.
macro_rules! blocked_groups_sql {
    () => {
        "(SELECT count(*) FROM pgfifo.queue_group AS g
          WHERE g.queue = $1 AND g.ready_at IS NULL AND g.head_id IS NOT NULL) AS held_groups,
         (SELECT count(*) FROM pgfifo.group_pause AS p WHERE p.queue = $1) AS paused_groups,
         (SELECT count(*) FROM pgfifo.queue_group AS g
          JOIN pgfifo.job AS j ON j.id = g.head_id
          WHERE g.queue = $1 AND g.ready_at IS NOT NULL AND g.ready_at > now()
            AND j.state = 'queued' AND j.attempts > 0) AS retrying_groups"
    };
}

#[derive(QueryableByName)]
struct BlockedRow {
    #[diesel(sql_type = BigInt)]
    held_groups: i64,
    #[diesel(sql_type = BigInt)]
    paused_groups: i64,
    #[diesel(sql_type = BigInt)]
    retrying_groups: i64,
}

impl From<BlockedRow> for BlockedGroups {
    fn from(row: BlockedRow) -> Self {
        BlockedGroups {
            paused: row.paused_groups,
            held: row.held_groups,
            retrying: row.retrying_groups,
        }
    }
}

async fn small_counts(conn: &mut AsyncPgConnection, queue: &str) -> Result<SmallCounts> {
    Ok(diesel::sql_query(concat!(
        "SELECT
             coalesce((SELECT s.paused FROM pgfifo.queue_setting AS s WHERE s.queue = $1), false) AS paused,
             coalesce((SELECT s.failure_policy FROM pgfifo.queue_setting AS s WHERE s.queue = $1),
                      'continue') AS policy,
             coalesce((SELECT sum((r.running ->> $1)::bigint) FROM pgfifo.runner AS r
                       WHERE r.heartbeat_at > now() - make_interval(secs => $3)), 0)::bigint AS running,
             (SELECT count(*) FROM pgfifo.runner AS r
              WHERE r.heartbeat_at > now() - make_interval(secs => $3) AND $1 = ANY (r.queues)) AS runners,
             (SELECT count(*) FROM (SELECT 1 FROM pgfifo.job AS j
                                    WHERE j.queue = $1 AND j.state = 'queued' AND j.attempts > 0
                                      AND j.run_after > now() LIMIT $2) AS s) AS retrying,
             (SELECT count(*) FROM (SELECT 1 FROM pgfifo.job AS j
                                    WHERE j.queue = $1 AND j.state = 'failed' LIMIT $2) AS s) AS failed,
             pgfifo.estimate_jobs($1, 'succeeded') AS succeeded_est,
             pgfifo.estimate_jobs($1, 'cancelled') AS cancelled_est,
             pgfifo.estimate_jobs($1, 'queued') AS queued_est,
             pgfifo.estimate_jobs($1, 'failed') AS failed_est,",
        blocked_groups_sql!()
    ))
    .bind::<Text, _>(queue)
    .bind::<BigInt, _>(COUNT_CAP)
    .bind::<diesel::sql_types::Double, _>(RUNNER_ALIVE.as_secs_f64())
    .get_result(conn)
    .await?)
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
    validate_queue(queue)?;
    let (small, unfinished) = conn
        .transaction::<_, crate::Error, _>(async |conn| {
            // Index-driven plans even before the first ANALYZE: a bitmap
            // scan and a sort of a fresh table's backlog took twice as long
            // as walking the index. (SET LOCAL: gone with the transaction.)
            conn.batch_execute(COUNTING_SETTINGS).await?;
            let small = small_counts(conn, queue).await?;
            let unfinished = unfinished(conn, queue, top as i64).await?;
            Ok((small, unfinished))
        })
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
    })
}

/// The status of every known queue ([`queues`]), or of `only` these.
pub async fn status(
    conn: &mut AsyncPgConnection,
    only: Option<&[String]>,
    top: usize,
) -> Result<Vec<QueueStatus>> {
    let names = match only {
        Some(names) => names.to_vec(),
        None => queues(conn).await?,
    };
    let mut out = Vec::with_capacity(names.len());
    for name in &names {
        out.push(queue_status(conn, name, top).await?);
    }
    Ok(out)
}

/// What the runner samples for its gauges, per queue.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QueueGauges {
    /// The queue.
    pub queue: String,
    /// Unfinished jobs (capped at [`COUNT_CAP`]).
    pub depth: i64,
    /// The age of the oldest head of an active group: how far the queue lags.
    #[serde(serialize_with = "ser_opt_secs", rename = "oldest_head_age_secs")]
    pub oldest_head_age: Option<Duration>,
    /// Groups with jobs that cannot run now (paused, held, retrying).
    pub blocked_groups: i64,
}

#[derive(QueryableByName)]
struct GaugeRow {
    #[diesel(sql_type = BigInt)]
    depth: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    lag_us: Option<i64>,
    #[diesel(embed)]
    blocked: BlockedRow,
}

/// Samples the gauges of `queues`: one cheap statement per queue.
pub async fn gauges(conn: &mut AsyncPgConnection, queues: &[String]) -> Result<Vec<QueueGauges>> {
    let mut out = Vec::with_capacity(queues.len());
    for queue in queues {
        let row: GaugeRow = diesel::sql_query(concat!(
            "SELECT
                 (SELECT count(*) FROM (SELECT 1 FROM pgfifo.job AS j
                                        WHERE j.queue = $1 AND j.state = 'queued' LIMIT $2) AS s) AS depth,
                 (SELECT (extract(epoch FROM now() - min(j.created_at)) * 1e6)::bigint
                  FROM pgfifo.queue_group AS g JOIN pgfifo.job AS j ON j.id = g.head_id
                  WHERE g.queue = $1 AND g.ready_at IS NOT NULL) AS lag_us,",
            blocked_groups_sql!()
        ))
        .bind::<Text, _>(queue)
        .bind::<BigInt, _>(COUNT_CAP)
        .get_result(conn)
        .await?;
        out.push(QueueGauges {
            queue: queue.clone(),
            depth: row.depth,
            oldest_head_age: row.lag_us.map(age_from_micros),
            blocked_groups: BlockedGroups::from(row.blocked).total(),
        });
    }
    Ok(out)
}
