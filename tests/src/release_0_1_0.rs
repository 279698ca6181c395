//! pgfifo 0.1.0 as the database sees it: its schema (the frozen fixture) and
//! a client that speaks its SQL protocol, statement for statement as the
//! 0.1.0 library sent them. The upgrade tests use it to fill a 0.1.0
//! database with jobs in every state, and to play a runner of the previous
//! release that keeps working while `migrate` runs under it.
//!
//! Only what 0.1.0 sent is written here: a later release must keep every one
//! of these calls working until the release notes say otherwise.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

/// The `pgfifo` schema as `pgfifo migrate up` of release 0.1.0 leaves it.
pub const SCHEMA: &str = include_str!("../fixtures/schema-0.1.0.sql");

/// Installs [`SCHEMA`] in the database at `url`, on a connection of its own
/// (the dump's session settings, such as an empty `search_path`, leave with
/// it).
pub async fn install(url: &str) {
    let mut conn = AsyncPgConnection::establish(url)
        .await
        .expect("connect to install the 0.1.0 schema");
    conn.batch_execute(SCHEMA)
        .await
        .expect("load the 0.1.0 schema");
}

/// What 0.1.0 began a job's transaction with.
const BEGIN_JOB: &str = "BEGIN; SET LOCAL pgfifo.job_transaction = on";

/// A job as enqueued through 0.1.0's `pgfifo.enqueue`.
#[derive(Debug, Clone)]
pub struct OldJob<'a> {
    /// Its queue.
    pub queue: &'a str,
    /// Its group (`None`: ungrouped).
    pub group: Option<&'a str>,
    /// Its kind (the job type's name).
    pub kind: &'a str,
    /// Its payload.
    pub payload: serde_json::Value,
    /// How many attempts it gets.
    pub max_attempts: i32,
    /// Its unique key, if any.
    pub unique_key: Option<&'a str>,
    /// How long to wait before it may start.
    pub delay: Option<Duration>,
}

#[derive(QueryableByName)]
struct IdsRow {
    #[diesel(sql_type = Array<BigInt>)]
    ids: Vec<i64>,
}

/// Enqueues `job` with 0.1.0's nine-array call; returns its id (the existing
/// job's id when its unique key is taken).
pub async fn enqueue(conn: &mut AsyncPgConnection, job: &OldJob<'_>) -> i64 {
    let delay_us = job.delay.map(|d| d.as_micros() as i64);
    let row: IdsRow =
        diesel::sql_query("SELECT pgfifo.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9) AS ids")
            .bind::<Array<Text>, _>(vec![job.queue])
            .bind::<Array<Nullable<Text>>, _>(vec![job.group])
            .bind::<Array<Text>, _>(vec![job.kind])
            .bind::<Array<Jsonb>, _>(vec![&job.payload])
            .bind::<Array<SmallInt>, _>(vec![0i16])
            .bind::<Array<Integer>, _>(vec![job.max_attempts])
            .bind::<Nullable<Array<Nullable<Text>>>, _>(job.unique_key.map(|key| vec![Some(key)]))
            .bind::<Array<Nullable<BigInt>>, _>(vec![None::<i64>])
            .bind::<Array<Nullable<BigInt>>, _>(vec![delay_us])
            .get_result(conn)
            .await
            .unwrap_or_else(|e| panic!("0.1.0 enqueue of {job:?}: {e}"));
    row.ids[0]
}

/// A job an [`OldRunner`] took: locked in its open transaction, its attempt
/// recorded.
#[derive(Debug, Clone)]
pub struct Taken {
    /// The job's id.
    pub id: i64,
    /// Its queue.
    pub queue: String,
    /// Its group.
    pub group: Option<String>,
    /// Its kind.
    pub kind: String,
    /// Its payload.
    pub payload: serde_json::Value,
    /// The number of this attempt.
    pub attempt: i32,
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
}

#[derive(QueryableByName)]
struct AttemptRow {
    #[diesel(sql_type = BigInt)]
    job_id: i64,
    #[diesel(sql_type = Integer)]
    attempt: i32,
}

#[derive(QueryableByName)]
struct ReadyRow {
    #[diesel(sql_type = Bool)]
    #[allow(dead_code)]
    ready_now: bool,
}

#[derive(QueryableByName)]
struct PidRow {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

/// One lane of a 0.1.0 runner: a connection for the jobs' transactions and
/// one for its autocommit bookkeeping, as 0.1.0 used them.
pub struct OldRunner {
    jobs: AsyncPgConnection,
    side: AsyncPgConnection,
    name: String,
}

impl OldRunner {
    /// Connects to `url`; `name` is the runner name its attempts record.
    pub async fn connect(url: &str, name: &str) -> OldRunner {
        let jobs = AsyncPgConnection::establish(url)
            .await
            .expect("0.1.0 runner: job connection");
        let side = AsyncPgConnection::establish(url)
            .await
            .expect("0.1.0 runner: side connection");
        OldRunner {
            jobs,
            side,
            name: name.to_owned(),
        }
    }

    /// The backend pid of the connection that holds the taken job's locks.
    pub async fn job_backend_pid(&mut self) -> i32 {
        let row: PidRow = diesel::sql_query("SELECT pg_backend_pid() AS pid")
            .get_result(&mut self.jobs)
            .await
            .expect("backend pid");
        row.pid
    }

    /// Promotes woken groups, begins a job transaction and picks one job of
    /// `queues`, recording its attempt. `None` (transaction ended): nothing
    /// to run now. With `Some`, the transaction stays open, holding the
    /// job's and its group's locks, until [`finish`](Self::finish).
    pub async fn take(&mut self, queues: &[&str]) -> Option<Taken> {
        let queues: Vec<String> = queues.iter().map(|q| (*q).to_owned()).collect();
        loop {
            diesel::sql_query("SELECT promoted FROM pgfifo.promote($1, $2)")
                .bind::<Array<Text>, _>(&queues)
                .bind::<Integer, _>(100)
                .execute(&mut self.side)
                .await
                .expect("0.1.0 promote");
            self.jobs
                .batch_execute(BEGIN_JOB)
                .await
                .expect("0.1.0 BEGIN");
            let rows: Vec<PickRow> = diesel::sql_query(
                "SELECT id, queue, group_id, kind, payload, max_attempts, slot, more, \
                    pg_backend_pid() AS backend_pid \
                 FROM pgfifo.pick($1, $2, $3, $4, $5, $6, $7, $8)",
            )
            .bind::<Array<Text>, _>(&queues)
            .bind::<Integer, _>(0)
            .bind::<Integer, _>(0)
            .bind::<Array<Text>, _>(Vec::<String>::new())
            .bind::<Array<Integer>, _>(Vec::<i32>::new())
            .bind::<Integer, _>(60_000)
            .bind::<Integer, _>(1)
            .bind::<Array<BigInt>, _>(Vec::<i64>::new())
            .load(&mut self.jobs)
            .await
            .expect("0.1.0 pick");
            let Some(row) = rows.into_iter().next() else {
                self.jobs.batch_execute("COMMIT").await.expect("COMMIT");
                return None;
            };
            let (Some(id), Some(kind), Some(payload), Some(max_attempts)) =
                (row.id, row.kind, row.payload, row.max_attempts)
            else {
                // A group that changed after the candidate read: release it
                // and pick again, as 0.1.0 did.
                self.jobs.batch_execute("COMMIT").await.expect("COMMIT");
                continue;
            };
            let started: Vec<AttemptRow> =
                diesel::sql_query("SELECT job_id, attempt FROM pgfifo.start_attempts($1, $2, $3)")
                    .bind::<Array<BigInt>, _>(vec![id])
                    .bind::<Array<Integer>, _>(vec![max_attempts])
                    .bind::<Text, _>(&self.name)
                    .load(&mut self.side)
                    .await
                    .expect("0.1.0 start_attempts");
            let attempt = started
                .iter()
                .find(|r| r.job_id == id)
                .map(|r| r.attempt)
                .unwrap_or_else(|| panic!("job {id} has no attempts left"));
            return Some(Taken {
                id,
                queue: row.queue,
                group: row.group_id,
                kind,
                payload,
                attempt,
            });
        }
    }

    /// Runs `sql` in the taken job's transaction (the handler's work).
    pub async fn in_job(&mut self, sql: &str) {
        self.jobs
            .batch_execute(sql)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Writes the taken job's outcome (`succeeded`, `retry`, `failed` or
    /// `cancelled`) with 0.1.0's eight-array `complete`, and commits.
    pub async fn finish(
        &mut self,
        job: &Taken,
        outcome: &str,
        error: Option<&str>,
        retry_delay: Option<Duration>,
    ) {
        let _: ReadyRow = diesel::sql_query(
            "SELECT ready_now, ready_later_us FROM pgfifo.complete($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind::<Array<BigInt>, _>(vec![job.id])
        .bind::<Array<Integer>, _>(vec![job.attempt])
        .bind::<Array<Text>, _>(vec![outcome])
        .bind::<Array<Nullable<Text>>, _>(vec![error])
        .bind::<Array<Nullable<Jsonb>>, _>(vec![None::<serde_json::Value>])
        .bind::<Array<Nullable<BigInt>>, _>(vec![retry_delay.map(|d| d.as_micros() as i64)])
        .bind::<Array<Text>, _>(vec![job.queue.as_str()])
        .bind::<Array<Nullable<Text>>, _>(vec![job.group.as_deref()])
        .get_result(&mut self.jobs)
        .await
        .unwrap_or_else(|e| panic!("0.1.0 complete of job {}: {e}", job.id));
        self.jobs.batch_execute("COMMIT").await.expect("COMMIT");
    }
}

/// 0.1.0's admin calls that set up the paused and held states.
pub mod admin {
    use super::*;

    #[derive(QueryableByName)]
    struct Value {
        #[diesel(sql_type = Nullable<Text>)]
        #[allow(dead_code)]
        value: Option<String>,
    }

    /// `pgfifo pause --queue Q --group G`.
    pub async fn pause_group(conn: &mut AsyncPgConnection, queue: &str, group: &str) {
        let _: Value = diesel::sql_query("SELECT pgfifo.pause_group($1, $2)::text AS value")
            .bind::<Text, _>(queue)
            .bind::<Text, _>(group)
            .get_result(conn)
            .await
            .expect("0.1.0 pause_group");
    }

    /// `pgfifo pause --queue Q`.
    pub async fn pause_queue(conn: &mut AsyncPgConnection, queue: &str) {
        let _: Value = diesel::sql_query("SELECT pgfifo.set_queue_paused($1, $2)::text AS value")
            .bind::<Text, _>(queue)
            .bind::<Bool, _>(true)
            .get_result(conn)
            .await
            .expect("0.1.0 set_queue_paused");
    }

    /// `pgfifo policy --queue Q hold|continue`.
    pub async fn set_failure_policy(conn: &mut AsyncPgConnection, queue: &str, policy: &str) {
        let _: Value = diesel::sql_query("SELECT pgfifo.set_failure_policy($1, $2)::text AS value")
            .bind::<Text, _>(queue)
            .bind::<Text, _>(policy)
            .get_result(conn)
            .await
            .expect("0.1.0 set_failure_policy");
    }

    /// `pgfifo cancel ID`.
    pub async fn cancel_job(conn: &mut AsyncPgConnection, id: i64) {
        let _: Value = diesel::sql_query("SELECT pgfifo.cancel_job($1, $2) AS value")
            .bind::<BigInt, _>(id)
            .bind::<Nullable<Text>, _>(Some("cancelled before the upgrade"))
            .get_result(conn)
            .await
            .expect("0.1.0 cancel_job");
    }
}
