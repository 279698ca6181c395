//! The statements of long runs (jobs of types in long mode, `#[job(long)]`):
//! claiming a picked job, renewing leases, ending or giving a run up, and
//! releasing the run's session lock. The functions they call are in
//! `functions/45_long_run.sql`.

use diesel::sql_types::{Array, BigInt, Bool, Integer, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::statement::{bind, cached};

/// A claimed long run: its fencing token and the second key of its
/// session-level advisory lock.
#[derive(QueryableByName, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    #[diesel(sql_type = BigInt)]
    pub token: i64,
    #[diesel(sql_type = Integer)]
    pub lock_key: i32,
}

/// (`pgfifo.long_queue_slot`: this runner releases the queue slot a claim
/// keeps, with `pgfifo.unlock_long_run`. Set in this statement; the
/// claim's last argument depends on it, so the call comes after it.)
const CLAIM: &str = "SELECT c.token, c.lock_key \
                     FROM (SELECT set_config('pgfifo.long_queue_slot', 'on', true) AS slot) AS s \
                     CROSS JOIN LATERAL pgfifo.claim_long_run($1, $2, $3, $4, $5, \
                         CASE WHEN s.slot IS NOT NULL THEN $6 END) AS c";

/// Claims picked job `job_id` for a long run, in the job transaction that
/// picked it (which must commit next): `None` when its lock is taken.
pub(crate) async fn claim(
    conn: &mut AsyncPgConnection,
    job_id: i64,
    queue: &str,
    group: Option<&str>,
    attempt: i32,
    runner: &str,
    lease_ms: i32,
) -> diesel::QueryResult<Option<Claim>> {
    let rows: Vec<Claim> = cached(
        CLAIM,
        (
            bind::<BigInt, _>(job_id),
            bind::<Text, _>(queue),
            bind::<Nullable<Text>, _>(group),
            bind::<Integer, _>(attempt),
            bind::<Text, _>(runner),
            bind::<Integer, _>(lease_ms),
        ),
    )
    .load(conn)
    .await?;
    Ok(rows.into_iter().next())
}

const RENEW: &str = "SELECT pgfifo.renew_long_runs($1, $2)";

/// Extends the leases of the runs with these tokens (autocommit, any
/// connection).
pub(crate) async fn renew(
    conn: &mut AsyncPgConnection,
    tokens: &[i64],
    lease_ms: i32,
) -> diesel::QueryResult<()> {
    cached(
        RENEW,
        (
            bind::<Array<BigInt>, _>(tokens),
            bind::<Integer, _>(lease_ms),
        ),
    )
    .execute(conn)
    .await
    .map(drop)
}

#[derive(QueryableByName)]
struct Ended {
    #[diesel(sql_type = Bool)]
    ok: bool,
}

const END: &str = "SELECT pgfifo.end_long_run($1, $2) AS ok";

/// Ends the run in the job transaction that writes its outcome: `false`
/// when the run was reclaimed meanwhile (the caller writes nothing).
pub(crate) async fn end(
    conn: &mut AsyncPgConnection,
    job_id: i64,
    token: i64,
) -> diesel::QueryResult<bool> {
    let row: Ended = cached(END, (bind::<BigInt, _>(job_id), bind::<BigInt, _>(token)))
        .get_result(conn)
        .await?;
    Ok(row.ok)
}

const RELEASE: &str = "SELECT pgfifo.release_long_run($1, $2) AS ok";

/// Gives the run up without an outcome (autocommit): its job runs again.
pub(crate) async fn release(
    conn: &mut AsyncPgConnection,
    job_id: i64,
    token: i64,
) -> diesel::QueryResult<bool> {
    let row: Ended = cached(
        RELEASE,
        (bind::<BigInt, _>(job_id), bind::<BigInt, _>(token)),
    )
    .get_result(conn)
    .await?;
    Ok(row.ok)
}

const UNLOCK: &str = "SELECT pgfifo.unlock_long_run($1) AS ok";

/// Releases the run's session-level lock, once its outcome has committed
/// (or it was given up). `false`: this session did not hold it.
pub(crate) async fn unlock(
    conn: &mut AsyncPgConnection,
    lock_key: i32,
) -> diesel::QueryResult<bool> {
    let row: Ended = cached(UNLOCK, (bind::<Integer, _>(lock_key),))
        .get_result(conn)
        .await?;
    Ok(row.ok)
}
