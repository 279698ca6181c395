//! The statements of dependencies between jobs: the enqueue of dependents
//! (`pgfifo.enqueue_after`) and the runner's sweep
//! (`pgfifo.release_dependents`). See `functions/18_dependencies.sql`.

use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::pooler::pinned;
use super::statement::{bind, cached};
use crate::db::enqueue::EnqueueArrays;
use crate::JobId;

/// The dependencies of a call of `pgfifo.enqueue_after`: edge k says that
/// row `row[k]` (1-based) waits for job `job[k]` or batch `batch[k]`.
#[derive(Debug, Default)]
pub(crate) struct Edges {
    pub row: Vec<i32>,
    pub job: Vec<Option<i64>>,
    pub batch: Vec<Option<i64>>,
}

#[derive(QueryableByName)]
struct IdsRow {
    #[diesel(sql_type = Array<BigInt>)]
    ids: Vec<i64>,
}

/// What one page of the sweep did.
#[derive(QueryableByName, Debug)]
pub(crate) struct Swept {
    /// Dependents released or cancelled.
    #[diesel(sql_type = Integer)]
    pub settled: i32,
    /// Where the next page starts (0: from the start again).
    #[diesel(sql_type = BigInt)]
    pub next_after: i64,
}

const ENQUEUE_AFTER: &str =
    "SELECT pgfifo.enqueue_after($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) AS ids";

/// Enqueues jobs with their dependencies in one round trip (the jobs'
/// unique keys and trace context are not passed: dependents have none);
/// returns their ids in input order. `on_failure` holds one policy per job.
pub(crate) async fn enqueue_after(
    conn: &mut AsyncPgConnection,
    jobs: EnqueueArrays,
    on_failure: Vec<&'static str>,
    edges: Edges,
) -> diesel::QueryResult<Vec<JobId>> {
    let statement = cached(
        ENQUEUE_AFTER,
        (
            bind::<Array<Text>, _>(jobs.queue),
            bind::<Array<Nullable<Text>>, _>(jobs.group),
            bind::<Array<Text>, _>(jobs.kind),
            bind::<Array<Jsonb>, _>(jobs.payload),
            bind::<Array<SmallInt>, _>(jobs.priority),
            bind::<Array<Integer>, _>(jobs.max_attempts),
            bind::<Array<Nullable<BigInt>>, _>(jobs.run_at_us),
            bind::<Array<Nullable<BigInt>>, _>(jobs.delay_us),
            bind::<Array<Text>, _>(on_failure),
            bind::<Array<Integer>, _>(edges.row),
            bind::<Array<Nullable<BigInt>>, _>(edges.job),
            bind::<Array<Nullable<BigInt>>, _>(edges.batch),
        ),
    );
    let row: IdsRow = pinned(conn, async |conn| statement.get_result(conn).await).await?;
    Ok(row.ids)
}

const RELEASE_DEPENDENTS: &str =
    "SELECT settled, next_after FROM pgfifo.release_dependents($1, $2)";

/// One page of the sweep: looks at up to `scan` waiting dependents after
/// job id `after` and decides those that no hook did.
pub(crate) async fn release_dependents(
    conn: &mut AsyncPgConnection,
    after: i64,
    scan: i32,
) -> diesel::QueryResult<Swept> {
    let statement = cached(
        RELEASE_DEPENDENTS,
        (bind::<BigInt, _>(after), bind::<Integer, _>(scan)),
    );
    pinned(conn, async |conn| statement.get_result(conn).await).await
}
