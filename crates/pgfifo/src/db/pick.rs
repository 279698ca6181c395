//! The pick: the statement that locks the next jobs of a runner's lane, and
//! the jobs it returns (with the trace context each carries, if any).

use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::statement::{bind, cached};
use super::trace::TraceContext;
use crate::JobId;

/// A job locked by `pgfifo.pick`, with the backend pid of the connection that
/// holds it (to cancel a runaway query of a timed-out handler).
#[derive(Debug)]
pub(crate) struct PickedJob {
    pub id: JobId,
    pub queue: String,
    pub group_id: Option<String>,
    pub kind: String,
    pub payload: serde_json::Value,
    pub max_attempts: i32,
    /// The group's place in the pick's round-robin order (`None`: ungrouped).
    pub sweep_slot: Option<i32>,
    pub backend_pid: i32,
    /// The trace context stored with the job at its enqueue (always `None`
    /// without the `otel` feature, which does not read it).
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub trace: Option<TraceContext>,
    /// The job's batch (`docs/batches.md`), read at its pick so that its
    /// completion need not look it up: a job's batch never changes.
    pub batch_id: Option<i64>,
    /// Whether the pick's transaction holds a slot of a queue with a
    /// concurrency limit (`docs/queue-limits.md`): the jobs picked with it
    /// run under that slot, and no other lane could start them before this
    /// one commits and frees it.
    pub under_queue_slot: bool,
    /// On the distributed layout, the parts of the shard the pick took the
    /// job from (`pgfifo.pick_parts`, as PostgreSQL's text of an array):
    /// the bookkeeper records the attempts of the jobs of one shard with a
    /// statement routed there. `None` on a plain database.
    pub shard_parts: Option<std::sync::Arc<str>>,
}

impl PickedJob {
    /// Whether `other` is of the same group (ungrouped jobs have none).
    pub(crate) fn same_group(&self, other: &PickedJob) -> bool {
        self.group_id.is_some() && self.group_id == other.group_id && self.queue == other.queue
    }
}

/// What a pick found.
#[derive(Debug)]
pub(crate) enum Picked {
    /// Jobs to run, each locked: the heads of different groups, then the
    /// followers of some (their groups' next jobs, in order; see
    /// `pgfifo.pick`).
    Jobs {
        jobs: Vec<PickedJob>,
        /// The pick stopped before it ran out of candidates (at its limit or
        /// its cap): more groups may be free and ready now.
        more: bool,
    },
    /// A group was locked that turned out to have nothing to run (it changed
    /// after the candidate read, or was parked): commit to release it and
    /// pick again. Carries the group's sweep slot.
    ReleaseAndPickAgain(Option<i32>),
    /// Nothing to run.
    Nothing,
}

#[derive(QueryableByName)]
struct PickRow {
    #[diesel(sql_type = Nullable<BigInt>)]
    id: Option<i64>,
    #[diesel(sql_type = Text)]
    queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    group_id: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    kind: Option<String>,
    #[diesel(sql_type = Nullable<Jsonb>)]
    payload: Option<serde_json::Value>,
    #[diesel(sql_type = Nullable<Integer>)]
    max_attempts: Option<i32>,
    #[diesel(sql_type = Nullable<Integer>)]
    slot: Option<i32>,
    #[diesel(sql_type = Nullable<Bool>)]
    more: Option<bool>,
    #[diesel(sql_type = Integer)]
    backend_pid: i32,
    #[diesel(sql_type = Bool)]
    queue_slot: bool,
    #[diesel(sql_type = Nullable<BigInt>)]
    batch_id: Option<i64>,
    #[diesel(sql_type = Nullable<Text>)]
    traceparent: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    tracestate: Option<String>,
    #[diesel(sql_type = Nullable<Text>)]
    parts: Option<String>,
}

/// The batch (`$1`), the jobs soon free (`$2`, an array's text) and the
/// batch under a queue's slot (`$3`) go to `pick` in the transaction-local
/// settings `pgfifo.pick_batch`, `pgfifo.pick_soon` and
/// `pgfifo.pick_slot_batch` (0.1.0's runners call the same function without
/// them), set in this statement: `pick`'s last argument depends on the
/// settings' values, so the call cannot come before them.
///
/// The trace context of each job (table `pgfifo.job_trace`, see
/// `docs/tracing.md`) is read here, by job id, with the `otel` feature only,
/// and not by `pick`, whose result type released runners depend on; and so
/// is each job's batch (table `pgfifo.batch_job`), for its completion. Each
/// through a function (`pgfifo.job_trace_context`, `pgfifo.job_batch`)
/// called per row of `pick` (in the select list, or a lateral subquery
/// without a table), not a join with the tables: that keeps `pick`'s row
/// order, which matters (heads first, then followers in order); and each
/// function's query takes its own snapshot, where a
/// subquery here would use the statement's, taken before `pick` ran, and
/// miss the batch or the context of a job enqueued meanwhile (a batch then
/// never counted). In the distributed layout they look on the shard of the
/// pick (docs/scaling.md).
///
/// Whether the transaction holds a queue's slot is read from the setting
/// `pgfifo.queue_slot`, which `pick` sets when it takes one: a PL/pgSQL
/// function in FROM returns its rows once it has run, so the setting is
/// read after it. So is `pgfifo.pick_parts`, the parts of the shard the
/// distributed layout's pick took its jobs from (unset on a plain
/// database).
macro_rules! pick_sql {
    ($trace:literal, $trace_from:literal) => {
        concat!(
            "SELECT p.id, p.queue, p.group_id, p.kind, p.payload, p.max_attempts, p.slot, \
                    p.more, pg_backend_pid() AS backend_pid, \
                    coalesce(current_setting('pgfifo.queue_slot', true), '') <> '' AS queue_slot, \
                    nullif(current_setting('pgfifo.pick_parts', true), '') AS parts, \
                    pgfifo.job_batch(p.id) AS batch_id, ",
            $trace,
            " FROM (SELECT set_config('pgfifo.pick_batch', $1::text, true) AS batch, \
                           set_config('pgfifo.pick_soon', $2, true) AS soon, \
                           set_config('pgfifo.pick_slot_batch', $3::text, true) AS slot_batch) AS s \
              CROSS JOIN LATERAL pgfifo.pick($4, $5, $6, $7, $8, $9, $10, \
                                             CASE WHEN s.batch IS NOT NULL AND s.soon IS NOT NULL \
                                                   AND s.slot_batch IS NOT NULL THEN $11 END) AS p",
            $trace_from
        )
    };
}
#[cfg(feature = "otel")]
const PICK: &str = pick_sql!(
    "c.ctx[1] AS traceparent, c.ctx[2] AS tracestate",
    " CROSS JOIN LATERAL (SELECT pgfifo.job_trace_context(p.id) AS ctx) AS c"
);
#[cfg(not(feature = "otel"))]
const PICK: &str = pick_sql!("NULL::text AS traceparent, NULL::text AS tracestate", "");

/// What a pick asks for.
#[derive(Debug)]
pub(crate) struct PickRequest<'a> {
    pub queues: &'a [String],
    /// Rotates the queue and the kind of job a pick starts with.
    pub turn: i32,
    /// Where the round-robin sweep over the groups continues.
    pub sweep_from: i32,
    pub idle: &'a IdleBounds,
    /// The most jobs of different groups.
    pub limit: i32,
    /// The most jobs in all, followers included (at least `limit`; the
    /// same means none).
    pub batch: i32,
    /// The most jobs in all when the pick takes a slot of a queue with a
    /// concurrency limit (heads of different groups and followers): the
    /// slot is what such a queue is short of, so it carries a longer batch
    /// (see `Batching::slot_batch`). At least `batch`.
    pub slot_batch: i32,
    /// Jobs the caller's other lanes hold (not work left for later).
    pub held_elsewhere: &'a [i64],
    /// Those of them whose handlers are done: their groups are free again
    /// as soon as those lanes commit (see "Weights" in `pgfifo.pick`).
    pub finishing_elsewhere: &'a [i64],
    /// Whether the caller can start a handler at once (a permit is free):
    /// only then may the pick take a job of a group whose concurrency is
    /// above 1. Sent with the transaction's opener.
    pub start_at_once: bool,
}

/// Locks and returns up to `limit` jobs of `queues`, of different groups,
/// and their groups' next jobs up to `batch` in all, in the caller's
/// transaction. See `pgfifo.pick` for the locking contract.
///
/// Takes a shared reference so that it can be pipelined behind the previous
/// jobs' `COMMIT; BEGIN` (see the lanes).
pub(crate) async fn pick(
    mut conn: &AsyncPgConnection,
    request: &PickRequest<'_>,
) -> diesel::QueryResult<Picked> {
    let rows: Vec<PickRow> = cached(
        PICK,
        (
            bind::<Integer, _>(request.batch),
            bind::<Text, _>(array_text(request.finishing_elsewhere)),
            bind::<Integer, _>(request.slot_batch),
            bind::<Array<Text>, _>(request.queues),
            bind::<Integer, _>(request.turn),
            bind::<Integer, _>(request.sweep_from),
            bind::<Array<Text>, _>(&request.idle.kinds),
            bind::<Array<Integer>, _>(&request.idle.idle_ms),
            bind::<Integer, _>(request.idle.default_idle_ms),
            bind::<Integer, _>(request.limit),
            bind::<Array<BigInt>, _>(request.held_elsewhere),
        ),
    )
    .load(&mut conn)
    .await?;
    let mut jobs = Vec::with_capacity(rows.len());
    let mut more = false;
    let parts: Option<std::sync::Arc<str>> =
        rows.iter().find_map(|r| r.parts.as_deref().map(Into::into));
    for row in rows {
        more |= row.more.unwrap_or(false);
        match (row.id, row.kind, row.payload, row.max_attempts) {
            (Some(id), Some(kind), Some(payload), Some(max_attempts)) => jobs.push(PickedJob {
                id,
                queue: row.queue,
                group_id: row.group_id,
                kind,
                payload,
                max_attempts,
                sweep_slot: row.slot,
                backend_pid: row.backend_pid,
                under_queue_slot: row.queue_slot,
                batch_id: row.batch_id,
                shard_parts: parts.clone(),
                trace: row.traceparent.map(|traceparent| TraceContext {
                    traceparent,
                    tracestate: row.tracestate,
                }),
            }),
            // pick returns such a row only alone.
            _ => return Ok(Picked::ReleaseAndPickAgain(row.slot)),
        }
    }
    Ok(if jobs.is_empty() {
        Picked::Nothing
    } else {
        Picked::Jobs { jobs, more }
    })
}

/// An array of ids as PostgreSQL's text form (`{1,2}`), for a setting.
fn array_text(ids: &[i64]) -> String {
    let items: Vec<String> = ids.iter().map(i64::to_string).collect();
    format!("{{{}}}", items.join(","))
}

/// How long a job's transaction may sit idle, per job type, before the server
/// ends the session (see `pgfifo.pick`): the type's timeout plus a grace.
#[derive(Debug, Clone, Default)]
pub(crate) struct IdleBounds {
    pub kinds: Vec<String>,
    pub idle_ms: Vec<i32>,
    pub default_idle_ms: i32,
}

#[cfg(test)]
mod tests {
    use super::PICK;
    use crate::db::statement::placeholders_in_order;

    /// With the feature or without it, the pick binds the same eleven
    /// values and returns the two columns of the trace context.
    #[test]
    fn the_pick_binds_eleven_values_and_returns_the_trace_columns() {
        assert!(placeholders_in_order(PICK, 11), "{PICK}");
        assert!(PICK.contains("AS traceparent") && PICK.contains("AS tracestate"));
        // Not a subquery: it would read the statement's snapshot, older
        // than the jobs `pick` may lock (see `pick_sql!`).
        assert!(PICK.contains("pgfifo.job_batch(p.id) AS batch_id"));
        assert!(!PICK.contains("pgfifo.batch_job"));
        assert!(
            !PICK.contains("pgfifo.job_trace AS"),
            "a subquery: see pick_sql!"
        );
        assert_eq!(
            PICK.contains("pgfifo.job_trace_context(p.id)"),
            cfg!(feature = "otel"),
            "the context is read with the feature only"
        );
    }
}
