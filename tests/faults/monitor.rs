//! The suite's own database access, the rows its checks load, and the
//! server log's times.

use std::time::{Duration, Instant};

use diesel::sql_types::{BigInt, Integer, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

// --- The suite's own database access ---------------------------------------

/// A connection of the suite's own (not a worker's: its application name
/// does not match theirs) that reconnects after faults.
pub(crate) struct Monitor {
    url: String,
    pub(crate) conn: Option<AsyncPgConnection>,
}

#[derive(QueryableByName)]
struct Scalar {
    #[diesel(sql_type = BigInt)]
    v: i64,
}

impl Monitor {
    pub(crate) fn new(url: &str) -> Monitor {
        Monitor {
            url: format!("{url}?application_name=pgfifo-faults-monitor"),
            conn: None,
        }
    }

    async fn try_scalar(&mut self, sql: &str) -> Result<i64, String> {
        if self.conn.is_none() {
            self.conn = Some(
                AsyncPgConnection::establish(&self.url)
                    .await
                    .map_err(|e| e.to_string())?,
            );
        }
        let conn = self.conn.as_mut().expect("set above");
        let result: Result<Scalar, _> = diesel::sql_query(format!("SELECT ({sql})::bigint AS v"))
            .get_result(conn)
            .await;
        match result {
            Ok(row) => Ok(row.v),
            Err(e) => {
                self.conn = None;
                Err(e.to_string())
            }
        }
    }

    /// `sql`'s bigint, retrying through faults for up to a minute.
    pub(crate) async fn scalar(&mut self, sql: &str) -> i64 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match self.try_scalar(sql).await {
                Ok(v) => return v,
                Err(e) => {
                    assert!(Instant::now() < deadline, "{sql}: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// The time of a server log line (`log_line_prefix` starts with `%m`, in
/// UTC), as ns since the epoch.
pub(crate) fn log_line_ns(line: &str) -> Option<i64> {
    // "2026-11-21 16:38:12.928 UTC [pid] app ..."
    let stamp = line.get(..27)?;
    if !stamp.ends_with(" UTC") {
        return None;
    }
    let num = |a: usize, b: usize| stamp.get(a..b).and_then(|s| s.parse::<i64>().ok());
    let (y, m, d) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hh, mm, ss, ms) = (num(11, 13)?, num(14, 16)?, num(17, 19)?, num(20, 23)?);
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (m + if m > 2 { -3 } else { 9 }) + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((((days * 24 + hh) * 60 + mm) * 60 + ss) * 1_000_000_000 + ms * 1_000_000)
}

pub(crate) fn us(ns: i64) -> i64 {
    ns / 1_000
}

#[derive(QueryableByName, Debug)]
pub(crate) struct JobRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) id: i64,
    #[diesel(sql_type = Text)]
    pub(crate) state: String,
    #[diesel(sql_type = Integer)]
    pub(crate) attempts: i32,
    #[diesel(sql_type = Text)]
    pub(crate) last_error: String,
}

#[derive(QueryableByName, Debug, Clone)]
pub(crate) struct LogRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) job_id: i64,
    #[diesel(sql_type = Integer)]
    pub(crate) attempt: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) grp: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) seq: i32,
    #[diesel(sql_type = Integer)]
    pub(crate) pid: i32,
    #[diesel(sql_type = BigInt)]
    pub(crate) start_ns: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) end_ns: i64,
    /// The start of the job's transaction: when its runner picked it.
    #[diesel(sql_type = BigInt)]
    pub(crate) picked_ns: i64,
    /// The id of the transaction that committed the run.
    #[diesel(sql_type = BigInt)]
    pub(crate) xact: i64,
}

#[derive(QueryableByName, Debug)]
pub(crate) struct AttemptCount {
    #[diesel(sql_type = BigInt)]
    pub(crate) job_id: i64,
    #[diesel(sql_type = BigInt)]
    pub(crate) n: i64,
}

#[derive(QueryableByName, Debug)]
pub(crate) struct AttemptRow {
    #[diesel(sql_type = BigInt)]
    pub(crate) job_id: i64,
    #[diesel(sql_type = Integer)]
    pub(crate) attempt: i32,
    #[diesel(sql_type = Text)]
    pub(crate) runner: String,
    #[diesel(sql_type = BigInt)]
    pub(crate) started_us: i64,
    #[diesel(sql_type = Text)]
    pub(crate) error: String,
}
