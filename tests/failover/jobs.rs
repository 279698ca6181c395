//! The failover tests' jobs, the tables they write, and the checks of
//! what committed.

use std::time::Duration;

use diesel::sql_types::{BigInt, Integer};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

/// The test's job: writes its run to `fo_log` through the job's
/// transaction, so a row exists if and only if the run committed.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "fo.job",
    queue = "fo",
    max_attempts = 25,
    backoff = "20ms",
    timeout = "60s"
)]
pub(crate) struct FoJob {
    pub(crate) group: u32,
    pub(crate) seq: u32,
}

/// The table [`FoJob`] writes to.
pub(crate) const FO_LOG: &str =
    "CREATE TABLE fo_log (job_id bigint NOT NULL, grp int NOT NULL, seq int NOT NULL, \
     started_ns bigint NOT NULL, ended_ns bigint NOT NULL, \
     port int NOT NULL DEFAULT inet_server_port())";

/// A handler's run: waits `work`, then writes the run to `table` through
/// the job's connection (in its transaction, or at once in long mode).
async fn log_run(
    ctx: &mut JobContext<'_>,
    table: &str,
    group: u32,
    seq: u32,
    work: Duration,
) -> Result<(), JobError> {
    let started = now_ns();
    tokio::time::sleep(work).await;
    diesel::sql_query(format!(
        "INSERT INTO {table} (job_id, grp, seq, started_ns, ended_ns) VALUES ($1, $2, $3, $4, $5)"
    ))
    .bind::<BigInt, _>(ctx.id())
    .bind::<Integer, _>(i32::try_from(group)?)
    .bind::<Integer, _>(i32::try_from(seq)?)
    .bind::<BigInt, _>(started)
    .bind::<BigInt, _>(now_ns())
    .execute(ctx.conn())
    .await?;
    Ok(())
}

pub(crate) fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64
}

#[async_trait]
impl Handler for FoJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        log_run(
            ctx,
            "fo_log",
            self.group,
            self.seq,
            Duration::from_millis(2),
        )
        .await
    }
}

/// A schedule's job, fired every second: writes when and where it ran.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "fo.tick", queue = "fo_tick")]
pub(crate) struct FoTick {}

#[async_trait]
impl Handler for FoTick {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        diesel::sql_query("INSERT INTO fo_ticks (job_id) VALUES ($1)")
            .bind::<BigInt, _>(ctx.id())
            .execute(ctx.conn())
            .await?;
        Ok(())
    }
}

#[derive(QueryableByName, Debug)]
pub(crate) struct LogRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) job_id: i64,
    #[diesel(sql_type = Integer)]
    pub(crate) grp: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) seq: i32,
    #[diesel(sql_type = BigInt)]
    pub(crate) started_ns: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) ended_ns: i64,
    /// The server's port: which server the run committed on.
    #[diesel(sql_type = Integer)]
    pub(crate) port: i32,
}

pub(crate) async fn connect(url: &str) -> AsyncPgConnection {
    AsyncPgConnection::establish(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"))
}

/// The table [`FoTick`] writes to.
pub(crate) const FO_TICKS: &str =
    "CREATE TABLE fo_ticks (job_id bigint NOT NULL, port int NOT NULL DEFAULT inet_server_port())";

/// A job of a group that runs up to two jobs at once (group concurrency
/// 2): writes its run to `fo_wide_log` through the job's transaction.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "fo.wide",
    queue = "fo_wide",
    max_attempts = 25,
    backoff = "20ms",
    timeout = "60s"
)]
pub(crate) struct FoWide {
    pub(crate) group: u32,
    pub(crate) seq: u32,
}

/// The table [`FoWide`] writes to.
pub(crate) const FO_WIDE_LOG: &str = "CREATE TABLE fo_wide_log (LIKE fo_log INCLUDING DEFAULTS)";

#[async_trait]
impl Handler for FoWide {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        log_run(
            ctx,
            "fo_wide_log",
            self.group,
            self.seq,
            Duration::from_millis(5),
        )
        .await
    }
}

/// The committed runs in `table`, by group and start.
pub(crate) async fn committed_runs(conn: &mut AsyncPgConnection, table: &str) -> Vec<LogRow> {
    diesel::sql_query(format!(
        "SELECT job_id, grp, seq, started_ns, ended_ns, port FROM {table} ORDER BY grp, started_ns"
    ))
    .load(conn)
    .await
    .unwrap_or_else(|e| panic!("read {table}: {e}"))
}

/// The most runs of one group that overlapped in time.
pub(crate) fn peak_overlap(rows: &[LogRow]) -> usize {
    let mut peak = 0;
    for (i, row) in rows.iter().enumerate() {
        let at_once = rows[..i]
            .iter()
            .filter(|earlier| earlier.grp == row.grp && earlier.ended_ns > row.started_ns)
            .count()
            + 1;
        peak = peak.max(at_once);
    }
    peak
}

/// A long-mode job (`#[job(long)]`): holds its group without an open
/// transaction; its write to `fo_long_log` commits at once (autocommit), so
/// a run cut off by the failover may have written its row and run again.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "fo.long",
    queue = "fo_long",
    long,
    max_attempts = 25,
    backoff = "20ms",
    timeout = "60s"
)]
pub(crate) struct FoLong {
    pub(crate) group: u32,
    pub(crate) seq: u32,
}

/// The table [`FoLong`] writes to.
pub(crate) const FO_LONG_LOG: &str = "CREATE TABLE fo_long_log (LIKE fo_log INCLUDING DEFAULTS)";

#[async_trait]
impl Handler for FoLong {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        log_run(
            ctx,
            "fo_long_log",
            self.group,
            self.seq,
            Duration::from_millis(20),
        )
        .await
    }
}

/// Checks the rows of long-mode runs (ordered by group and start): every
/// group's runs in order, a job's reruns only right after it, no two runs
/// of a group overlapping. Returns (order violations, overlaps, reruns).
pub(crate) fn long_checks(rows: &[LogRow]) -> (usize, usize, usize) {
    let (mut order, mut overlaps, mut reruns) = (0, 0, 0);
    for pair in rows.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        if a.grp != b.grp {
            continue;
        }
        if b.job_id == a.job_id {
            reruns += 1;
        } else if b.seq != a.seq + 1 {
            order += 1;
        }
        if b.started_ns < a.ended_ns {
            overlaps += 1;
        }
    }
    (order, overlaps, reruns)
}
