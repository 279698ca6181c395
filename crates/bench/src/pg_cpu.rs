//! The CPU time PostgreSQL spends on a scenario's work: the user and system
//! time of the server processes that serve the scenario's database, read
//! from `/proc/<pid>/stat`. Only a server on this machine can be measured;
//! elsewhere the figure is `None`.
//!
//! Backends are found in `pg_stat_activity` by database, so the work of other
//! databases on a shared server is not counted. The server's own background
//! processes (WAL writer, checkpointer, …) are not counted either: they serve
//! every database at once.

use std::collections::HashMap;

use diesel::sql_types::{BigInt, Integer};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`, 100 on Linux).
const TICKS_PER_S: f64 = 100.0;

#[derive(QueryableByName)]
struct Backend {
    #[diesel(sql_type = Integer)]
    pid: i32,
}

#[derive(QueryableByName)]
struct Pid {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

/// The CPU ticks of a database's backends at one instant, by pid.
#[derive(Debug, Default, Clone)]
pub struct Sample(HashMap<i32, u64>);

impl Sample {
    /// The backends connected to `conn`'s database now, with their ticks.
    /// `None` when the server's processes cannot be read (another machine).
    pub async fn of_database(conn: &mut AsyncPgConnection) -> Option<Self> {
        let backends: Vec<Backend> = diesel::sql_query(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND backend_type = 'client backend'",
        )
        .load(conn)
        .await
        .ok()?;
        let mut ticks = HashMap::new();
        for backend in backends {
            ticks.insert(backend.pid, process_ticks(backend.pid)?);
        }
        Some(Sample(ticks))
    }

    /// The backend of `conn` alone.
    pub async fn of_session(conn: &mut AsyncPgConnection) -> Option<Self> {
        let me: Pid = diesel::sql_query("SELECT pg_backend_pid()::bigint AS n")
            .get_result(conn)
            .await
            .ok()?;
        let pid = i32::try_from(me.n).ok()?;
        Some(Sample(HashMap::from([(pid, process_ticks(pid)?)])))
    }

    /// The CPU seconds spent since `earlier` by the backends of `self` (a
    /// backend that `earlier` did not know is counted whole: it started in
    /// between). Backends that ended in between are lost: sample before
    /// closing connections.
    pub fn seconds_since(&self, earlier: &Sample) -> f64 {
        let ticks: u64 = self
            .0
            .iter()
            .map(|(pid, now)| now.saturating_sub(earlier.0.get(pid).copied().unwrap_or(0)))
            .sum();
        ticks as f64 / TICKS_PER_S
    }
}

/// A whole server on this machine: its postmaster and every process it
/// started, for a node of a Citus cluster, whose connections to other
/// nodes come and go within a run (a per-backend [`Sample`] would lose
/// them). Counts the server's background processes too, so it is meant
/// for a private server that serves only the scenario.
#[derive(Debug, Clone, Copy)]
pub struct Server {
    postmaster: i32,
}

impl Server {
    /// The server `conn` is connected to (its backend's parent). `None`
    /// when its processes cannot be read (another machine).
    pub async fn of(conn: &mut AsyncPgConnection) -> Option<Self> {
        let me: Pid = diesel::sql_query("SELECT pg_backend_pid()::bigint AS n")
            .get_result(conn)
            .await
            .ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", me.n)).ok()?;
        let postmaster = stat_fields(&stat)?.get(1)?.parse().ok()?;
        Some(Self { postmaster })
    }

    /// The ticks used so far by the postmaster, its live children, and
    /// the children it has reaped (its `cutime` and `cstime`). A child that
    /// exited but is not reaped yet counts in neither: compare readings
    /// with `saturating_sub`.
    pub fn ticks(&self) -> u64 {
        let mut ticks = 0;
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{}/stat", self.postmaster)) {
            if let Some(fields) = stat_fields(&stat) {
                // utime, stime, cutime, cstime: fields 14 to 17.
                ticks += (11..=14)
                    .filter_map(|i| fields.get(i)?.parse::<u64>().ok())
                    .sum::<u64>();
            }
        }
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return ticks;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
                continue;
            }
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
                continue;
            };
            let Some(fields) = stat_fields(&stat) else {
                continue;
            };
            if fields.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(self.postmaster) {
                ticks += ticks_of_stat(&stat).unwrap_or(0);
            }
        }
        ticks
    }

    /// Seconds of CPU between two [`Server::ticks`] readings.
    pub fn seconds(before: u64, after: u64) -> f64 {
        after.saturating_sub(before) as f64 / TICKS_PER_S
    }
}

/// User plus system ticks of process `pid`; `None` if it cannot be read.
fn process_ticks(pid: i32) -> Option<u64> {
    ticks_of_stat(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// User plus system ticks from the text of a `/proc/<pid>/stat`.
fn ticks_of_stat(stat: &str) -> Option<u64> {
    let fields = stat_fields(stat)?;
    // utime and stime are fields 14 and 15, so 11 and 12 from field 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The fields of a `/proc/<pid>/stat` from the third on (state, ppid, …).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    // The command name (field 2) is in parentheses and may hold spaces and
    // parentheses: the fields counted from 3 start after the last `)`.
    let rest = stat.get(stat.rfind(')')? + 1..)?;
    Some(rest.split_whitespace().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_read_past_a_command_name_with_spaces() {
        let stat = "4242 (postgres: a (b) c) S 1 4242 4242 0 -1 4194560 \
                    900 0 0 0 1234 567 0 0 20 0 1 0 100 0 0";
        assert_eq!(ticks_of_stat(stat), Some(1234 + 567));
        assert_eq!(ticks_of_stat("4242 (cut) S 1"), None);
        let me = i32::try_from(std::process::id()).expect("pid");
        assert!(process_ticks(me).is_some());
    }
}
