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

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = Integer)]
    n: i32,
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

const RELEASE_DEPENDENTS: &str = "SELECT pgfifo.release_dependents($1) AS n";

/// The sweep: decides up to `limit` waiting dependents that no hook did;
/// returns how many it released or cancelled.
pub(crate) async fn release_dependents(
    conn: &mut AsyncPgConnection,
    limit: i32,
) -> diesel::QueryResult<i32> {
    let statement = cached(RELEASE_DEPENDENTS, (bind::<Integer, _>(limit),));
    let row: CountRow = pinned(conn, async |conn| statement.get_result(conn).await).await?;
    Ok(row.n)
}
