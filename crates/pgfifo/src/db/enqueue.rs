//! The statement of [`enqueue_batch`](crate::enqueue_batch).

use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::pooler::{in_transaction, pinned};
use super::statement::{bind, cached};
use super::trace::TraceContext;
use crate::JobId;

/// The arguments of `pgfifo.enqueue`, one array element per job.
#[derive(Debug, Default)]
pub(crate) struct EnqueueArrays {
    pub queue: Vec<String>,
    pub group: Vec<Option<String>>,
    pub kind: Vec<&'static str>,
    pub payload: Vec<serde_json::Value>,
    pub priority: Vec<i16>,
    pub max_attempts: Vec<i32>,
    pub unique_key: Vec<Option<String>>,
    pub run_at_us: Vec<Option<i64>>,
    pub delay_us: Vec<Option<i64>>,
    /// The trace context every job of the batch carries (`None`: none is
    /// stored, and the nine-argument `pgfifo.enqueue` is called).
    pub trace: Option<TraceContext>,
}

#[derive(QueryableByName)]
struct IdsRow {
    #[diesel(sql_type = Array<BigInt>)]
    ids: Vec<i64>,
}

const ENQUEUE: &str = "SELECT pgfifo.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9) AS ids";

/// [`ENQUEUE`] as the only statement of its transaction: it tells
/// `pgfifo.enqueue`, through the transaction-local setting
/// `pgfifo.enqueue_alone` (set before the call, gone with the commit that
/// follows), that it may make an idle group active itself, holding the
/// group's row until that commit.
const ENQUEUE_ALONE: &str = "SELECT pgfifo.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9) AS ids \
     FROM (SELECT set_config('pgfifo.enqueue_alone', 'on', true) AS alone) AS s \
     WHERE s.alone = 'on'";

/// [`ENQUEUE`] for jobs that carry a trace context: the overload of
/// `pgfifo.enqueue` that keeps it in `pgfifo.job_trace`.
const ENQUEUE_TRACED: &str =
    "SELECT pgfifo.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS ids";

/// [`ENQUEUE_ALONE`] for jobs that carry a trace context.
const ENQUEUE_TRACED_ALONE: &str =
    "SELECT pgfifo.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS ids \
     FROM (SELECT set_config('pgfifo.enqueue_alone', 'on', true) AS alone) AS s \
     WHERE s.alone = 'on'";

/// Inserts a batch of jobs in one round trip; returns their ids in input
/// order. Runs in the caller's transaction, if one is open (through a
/// transaction-mode pooler, in one of its own otherwise). Outside one (as
/// diesel sees it: a transaction opened with `BEGIN` sent by hand counts as
/// none) the statement commits by itself, and says so to the function.
pub(crate) async fn enqueue(
    conn: &mut AsyncPgConnection,
    jobs: EnqueueArrays,
) -> diesel::QueryResult<Vec<JobId>> {
    let alone = !in_transaction(conn);
    let n = jobs.queue.len();
    // NULL rather than an array of NULLs: the function's fast path.
    let unique_keys = jobs
        .unique_key
        .iter()
        .any(Option::is_some)
        .then_some(jobs.unique_key);
    let args = (
        bind::<Array<Text>, _>(jobs.queue),
        bind::<Array<Nullable<Text>>, _>(jobs.group),
        bind::<Array<Text>, _>(jobs.kind),
        bind::<Array<Jsonb>, _>(jobs.payload),
        bind::<Array<SmallInt>, _>(jobs.priority),
        bind::<Array<Integer>, _>(jobs.max_attempts),
        bind::<Nullable<Array<Nullable<Text>>>, _>(unique_keys),
        bind::<Array<Nullable<BigInt>>, _>(jobs.run_at_us),
        bind::<Array<Nullable<BigInt>>, _>(jobs.delay_us),
    );
    let row: IdsRow = match jobs.trace {
        None => {
            let sql = if alone { ENQUEUE_ALONE } else { ENQUEUE };
            let statement = cached(sql, args);
            pinned(conn, async |conn| statement.get_result(conn).await).await?
        }
        Some(trace) => {
            let sql = if alone {
                ENQUEUE_TRACED_ALONE
            } else {
                ENQUEUE_TRACED
            };
            let (a, b, c, d, e, f, g, h, i) = args;
            let statement = cached(
                sql,
                (
                    a,
                    b,
                    c,
                    d,
                    e,
                    f,
                    g,
                    h,
                    i,
                    bind::<Array<Text>, _>(vec![trace.traceparent; n]),
                    bind::<Array<Nullable<Text>>, _>(vec![trace.tracestate; n]),
                ),
            );
            pinned(conn, async |conn| statement.get_result(conn).await).await?
        }
    };
    Ok(row.ids)
}
