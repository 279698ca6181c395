//! What every scenario shares: inputs, a fresh database, the benchmark job
//! and its in-memory run records, and the checks run over them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::{async_trait, Handler, Job, JobContext, JobError, Pool, RunnerConfig};
use serde::{Deserialize, Serialize};

/// A scenario's inputs: environment variables, overridden by `--name value`
/// flags (`--jobs 5000` sets `JOBS`).
pub struct Inputs {
    overrides: HashMap<String, String>,
}

impl Inputs {
    /// Reads the flags that follow the scenario name.
    pub fn from_args(args: &[String]) -> Result<Self, String> {
        let mut overrides = HashMap::new();
        let mut iter = args.iter();
        while let Some(flag) = iter.next() {
            let name = flag.strip_prefix("--").ok_or_else(|| {
                format!("unexpected argument {flag:?}; flags look like --jobs 1000")
            })?;
            let value = iter
                .next()
                .ok_or_else(|| format!("flag {flag} needs a value"))?;
            overrides.insert(name.replace('-', "_").to_uppercase(), value.clone());
        }
        Ok(Self { overrides })
    }

    /// The value of `name`, or `default`.
    pub fn string(&self, name: &str, default: &str) -> String {
        self.overrides
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
            .unwrap_or_else(|| default.to_owned())
    }

    /// The number `name`, or `default`.
    pub fn number(&self, name: &str, default: u64) -> Result<u64, String> {
        let raw = self.string(name, &default.to_string());
        raw.parse()
            .map_err(|_| format!("{name}={raw:?} is not a non-negative integer"))
    }

    /// `config` with the runner settings given as inputs, if any:
    /// `MAX_BATCH`, `BATCH_WINDOW_MS`, `PREFETCH` (the runner's defaults
    /// otherwise), for comparing settings in the same build.
    pub fn tune(&self, mut config: RunnerConfig) -> Result<RunnerConfig, String> {
        if self.is_set("MAX_BATCH") {
            config = config.max_batch(self.number("MAX_BATCH", 0)? as usize);
        }
        if self.is_set("BATCH_WINDOW_MS") {
            let ms = self.number("BATCH_WINDOW_MS", 0)?;
            config = config.batch_window(Duration::from_millis(ms));
        }
        if self.is_set("PREFETCH") {
            config = config.prefetch(self.number("PREFETCH", 0)? as usize);
        }
        Ok(config)
    }

    fn is_set(&self, name: &str) -> bool {
        self.overrides.contains_key(name) || std::env::var_os(name).is_some()
    }

    /// The server URL (`DATABASE_URL`).
    pub fn database_url(&self) -> String {
        self.string(
            "DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/postgres",
        )
    }
}

/// Prints progress on stderr.
#[macro_export]
macro_rules! progress {
    ($($arg:tt)*) => { eprintln!("[bench] {}", format!($($arg)*)) };
}

/// Recreates database `name` on the server of `server_url`, migrates it and
/// returns a pool of `pool_size` connections to it. `BENCH_DB_SUFFIX`, when
/// set, is appended to the name, so that two runs of one scenario (two
/// builds, two people) can share a server without dropping each other's
/// database.
pub async fn fresh_database(
    server_url: &str,
    name: &str,
    pool_size: u32,
) -> Result<(Pool, String), String> {
    let name = &database_name(name)?;
    let mut admin = AsyncPgConnection::establish(server_url)
        .await
        .map_err(|e| format!("connect to {server_url}: {e}"))?;
    recreate(&mut admin, name).await?;
    let url = database_url(server_url, name);
    let pool = pgfifo::connect(&url, pool_size)
        .await
        .map_err(|e| e.to_string())?;
    pgfifo::migrate(&pool).await.map_err(|e| e.to_string())?;
    Ok((pool, url))
}

/// Drops database `name` (ending its sessions) and creates it empty, on
/// the server of `admin`.
pub async fn recreate(admin: &mut AsyncPgConnection, name: &str) -> Result<(), String> {
    for sql in [
        format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"),
        format!("CREATE DATABASE \"{name}\""),
    ] {
        admin
            .batch_execute(&sql)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    Ok(())
}

/// A scenario's database `name`, with `BENCH_DB_SUFFIX` appended.
pub fn database_name(name: &str) -> Result<String, String> {
    let suffix = std::env::var("BENCH_DB_SUFFIX").unwrap_or_default();
    if !suffix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_')
    {
        return Err(format!(
            "BENCH_DB_SUFFIX={suffix:?}: use letters, digits and underscores only"
        ));
    }
    Ok(format!("{name}{suffix}"))
}

/// `server_url` with its database replaced by `name`.
pub fn database_url(server_url: &str, name: &str) -> String {
    let (base, query) = match server_url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (server_url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let base = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// One handler execution.
#[derive(Debug, Clone, Copy)]
pub struct Record {
    /// The job's group number.
    pub group: u32,
    /// Its position in the group.
    pub seq: u32,
    /// Start, ns since [`epoch`].
    pub start_ns: u64,
    /// End, ns since [`epoch`].
    pub end_ns: u64,
}

static EPOCH: OnceLock<Instant> = OnceLock::new();
static RECORDS: Mutex<Vec<Record>> = Mutex::new(Vec::new());
static FINISHED: AtomicUsize = AtomicUsize::new(0);
static WORK_MS: AtomicUsize = AtomicUsize::new(0);

/// The one monotonic clock all records use.
pub fn epoch() -> Instant {
    *EPOCH.get_or_init(Instant::now)
}

/// Nanoseconds since [`epoch`].
pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// Sets how long each [`BenchJob`] works (sleeps), in ms.
pub fn set_work_ms(ms: u64) {
    WORK_MS.store(ms as usize, Ordering::Relaxed);
}

/// Handler executions so far.
pub fn finished() -> usize {
    FINISHED.load(Ordering::Relaxed)
}

/// Takes every record collected so far.
pub fn take_records() -> Vec<Record> {
    FINISHED.store(0, Ordering::Relaxed);
    std::mem::take(&mut *RECORDS.lock().expect("records"))
}

/// The benchmark job: records its run in memory (and sleeps `WORK_MS`).
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(
    kind = "bench.job",
    queue = "bench",
    max_attempts = 3,
    timeout = "60s",
    backoff = "10ms"
)]
pub struct BenchJob {
    /// Group number.
    pub g: u32,
    /// Position in the group.
    pub s: u32,
}

#[async_trait]
impl Handler for BenchJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start_ns = now_ns();
        let work = WORK_MS.load(Ordering::Relaxed);
        if work > 0 {
            // Tokio's timer works in whole milliseconds and rounds up, so a
            // 5 ms `tokio::time::sleep` lasts 5.9 ms on average (measured):
            // the ideal the scenario compares with would be off by 18 %. A
            // thread's sleep keeps to the requested time within tens of µs.
            let work = Duration::from_millis(work as u64);
            tokio::task::spawn_blocking(move || std::thread::sleep(work))
                .await
                .map_err(JobError::retry)?;
        }
        let record = Record {
            group: self.g,
            seq: self.s,
            start_ns,
            end_ns: now_ns(),
        };
        RECORDS.lock().expect("records").push(record);
        FINISHED.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// What the checks found in a set of records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Checked {
    /// Jobs that never ran.
    pub lost: u64,
    /// Runs beyond the first of a job.
    pub duplicates: u64,
    /// Jobs that started before an earlier job of their group.
    pub order_violations: u64,
    /// Runs that started before the previous run of their group ended.
    pub overlaps: u64,
}

/// Checks records of `jobs` jobs where job k is group `k % groups`, seq `k / groups`.
pub fn check(records: &[Record], jobs: u64, groups: u64) -> Checked {
    let mut seen = vec![0u32; jobs as usize];
    let mut by_group: HashMap<u32, Vec<&Record>> = HashMap::new();
    for r in records {
        let k = u64::from(r.seq) * groups + u64::from(r.group);
        if let Some(count) = seen.get_mut(k as usize) {
            *count += 1;
        }
        by_group.entry(r.group).or_default().push(r);
    }
    let mut out = Checked {
        lost: seen.iter().filter(|c| **c == 0).count() as u64,
        duplicates: seen.iter().map(|c| u64::from(c.saturating_sub(1))).sum(),
        ..Checked::default()
    };
    for runs in by_group.values_mut() {
        runs.sort_by_key(|r| (r.start_ns, r.end_ns));
        let mut highest_seq: Option<u32> = None;
        for pair in runs.windows(2) {
            if pair[1].start_ns < pair[0].end_ns {
                out.overlaps += 1;
            }
        }
        for r in runs.iter() {
            if highest_seq.is_some_and(|h| r.seq < h) {
                out.order_violations += 1;
            }
            highest_seq = Some(highest_seq.map_or(r.seq, |h| h.max(r.seq)));
        }
    }
    out
}

/// [`check`] for groups that may run `concurrency` jobs at once (above 1):
/// `overlaps` counts runs that began while `concurrency` others of their
/// group ran, and `order_violations` runs that began after a younger run of
/// their group had ended (jobs picked a moment apart may begin in either
/// order; a younger one never runs through while an older one waits).
pub fn check_concurrent(records: &[Record], jobs: u64, groups: u64, concurrency: u64) -> Checked {
    let mut out = check(records, jobs, groups);
    if concurrency <= 1 {
        return out;
    }
    out.overlaps = 0;
    out.order_violations = 0;
    let mut by_group: HashMap<u32, Vec<&Record>> = HashMap::new();
    for r in records {
        by_group.entry(r.group).or_default().push(r);
    }
    for runs in by_group.values() {
        // (time, 0 = end before a start at the same time, 1 = start)
        let mut events: Vec<(u64, u8)> = runs
            .iter()
            .flat_map(|r| [(r.start_ns, 1), (r.end_ns, 0)])
            .collect();
        events.sort_unstable();
        let mut running = 0u64;
        for (_, kind) in events {
            if kind == 1 {
                if running >= concurrency {
                    out.overlaps += 1;
                }
                running += 1;
            } else {
                running = running.saturating_sub(1);
            }
        }
        let mut by_seq: Vec<&Record> = runs.clone();
        by_seq.sort_unstable_by_key(|r| std::cmp::Reverse(r.seq));
        let mut first_end_of_younger = u64::MAX;
        for r in by_seq {
            if r.start_ns > first_end_of_younger {
                out.order_violations += 1;
            }
            first_end_of_younger = first_end_of_younger.min(r.end_ns);
        }
    }
    out
}

/// Writes `group<TAB>seq<TAB>start_ns<TAB>end_ns` lines to `path`.
pub fn write_records(path: &str, records: &[Record]) -> Result<(), String> {
    use std::io::Write;
    let file = std::fs::File::create(path).map_err(|e| format!("create {path}: {e}"))?;
    let mut out = std::io::BufWriter::new(file);
    for r in records {
        writeln!(out, "{}\t{}\t{}\t{}", r.group, r.seq, r.start_ns, r.end_ns)
            .map_err(|e| format!("write {path}: {e}"))?;
    }
    out.flush().map_err(|e| format!("write {path}: {e}"))
}

/// Drops database `name` on the server of `server_url` (closing its sessions).
pub async fn drop_database(server_url: &str, name: &str) -> Result<(), String> {
    let name = &database_name(name)?;
    let mut admin = AsyncPgConnection::establish(server_url)
        .await
        .map_err(|e| format!("connect to {server_url}: {e}"))?;
    let sql = format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)");
    admin
        .batch_execute(&sql)
        .await
        .map_err(|e| format!("{sql}: {e}"))
}

/// The nearest-rank percentile `p` (0 < p <= 1) of `sorted` (ascending); 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// `x` rounded to 3 decimals (for JSON output in ms).
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(group: u32, seq: u32, start_ns: u64, end_ns: u64) -> Record {
        Record {
            group,
            seq,
            start_ns,
            end_ns,
        }
    }

    #[test]
    fn clean_runs_pass() {
        let records = [
            r(0, 0, 0, 10),
            r(1, 0, 5, 15),
            r(0, 1, 10, 20),
            r(1, 1, 15, 25),
        ];
        assert_eq!(check(&records, 4, 2), Checked::default());
    }

    #[test]
    fn finds_every_kind_of_violation() {
        // job 3 (group 1, seq 1) missing; job 0 twice; group 0 overlaps and reorders.
        let records = [
            r(0, 1, 0, 10),
            r(0, 0, 5, 15),
            r(0, 0, 20, 30),
            r(1, 0, 0, 5),
        ];
        let found = check(&records, 4, 2);
        assert_eq!(found.lost, 1);
        assert_eq!(found.duplicates, 1);
        assert_eq!(found.overlaps, 1);
        assert_eq!(found.order_violations, 2);
    }

    #[test]
    fn concurrent_groups_allow_n_at_once_and_a_moment_out_of_order() {
        // One group, two at a time: seq 1 begins a moment before seq 0.
        let ok = [
            r(0, 1, 0, 10),
            r(0, 0, 1, 11),
            r(0, 2, 10, 20),
            r(0, 3, 11, 21),
        ];
        assert_eq!(check_concurrent(&ok, 4, 1, 2), Checked::default());
        // A third at once, and seq 3 waited until seq 4 had ended.
        let bad = [
            r(0, 0, 0, 10),
            r(0, 1, 0, 10),
            r(0, 2, 5, 15),
            r(0, 4, 10, 12),
            r(0, 3, 13, 20),
        ];
        let found = check_concurrent(&bad, 5, 1, 2);
        assert_eq!((found.overlaps, found.order_violations), (1, 1));
    }
}
