//! Why waiting dependents wait, for the job and group views
//! (`pgfifo.dependency_waits`).

use diesel::sql_types::{Array, BigInt, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// One waiting dependent.
#[derive(QueryableByName, Debug)]
pub(crate) struct WaitRow {
    #[diesel(sql_type = BigInt)]
    pub job_id: i64,
    #[diesel(sql_type = Text)]
    pub on_failure: String,
    #[diesel(sql_type = Array<BigInt>)]
    pub jobs: Vec<i64>,
    #[diesel(sql_type = Array<BigInt>)]
    pub batches: Vec<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub held_by_job: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    pub held_by_batch: Option<i64>,
}

/// The waiting dependents among `ids`, in id order.
pub(crate) async fn waits(
    conn: &mut AsyncPgConnection,
    ids: &[i64],
) -> diesel::QueryResult<Vec<WaitRow>> {
    diesel::sql_query(
        "SELECT job_id, on_failure, jobs, batches, held_by_job, held_by_batch \
         FROM pgfifo.dependency_waits($1)",
    )
    .bind::<Array<BigInt>, _>(ids)
    .load(conn)
    .await
}
