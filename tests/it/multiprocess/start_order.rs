//! Start order of a group of concurrency N across runner processes (issue
//! 29): no job of the group waits, picked (its attempt recorded) but not
//! begun, while a younger job of its group begins and ends in another slot.
//!
//! Three `fifo-worker` processes of one slot each drain a group of
//! concurrency 3 beside twenty groups at the default, jobs of 5 to 30 ms,
//! and two of them are killed with SIGKILL (and replaced) along the way.
//! The check pairs each attempt record of the wide group (when its runner
//! picked the job) with the handler run it led to (the handler's own begin
//! and end records), and looks for a younger job of the group whose whole
//! run fell between the two. Before the lanes reserved their permit ahead
//! of the pick, two lanes of one runner could both see the one free permit:
//! the job picked by the second waited for the first's handler, 8 to 23
//! times a run.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use pgfifo::GroupLimits;
use pgfifo_tests::records::{self, Run};
use pgfifo_tests::TestDb;

use super::harness::{mp_job, Workers, MP_LOG};

const WIDE_JOBS: u32 = 200;
const NARROW_GROUPS: u32 = 20;
const NARROW_JOBS: u32 = 20;

/// An attempt of a job of the wide group: when it was recorded, by which
/// process.
struct Attempt {
    job_id: i64,
    pid: u32,
    recorded_ns: i64,
}

/// The process id in a runner's default name (`host:pid:tag`).
fn pid_of(runner: &str) -> u32 {
    runner.rsplit(':').nth(1).unwrap().parse().unwrap()
}

/// Handler work of job `k`: 5 to 30 ms, varied.
fn work_us(k: u32) -> u64 {
    5_000 + u64::from(k.wrapping_mul(7919) % 25) * 1_000
}

async fn attempts_of_group(db: &TestDb, group: &str) -> Vec<Attempt> {
    let text = db
        .text(&format!(
            "SELECT string_agg(a.job_id || ' ' || a.runner || ' ' || \
                    (extract(epoch FROM a.started_at) * 1000000)::bigint, ',') \
             FROM pgfifo.job_attempt AS a JOIN pgfifo.job AS j ON j.id = a.job_id \
             WHERE j.group_id = '{group}'"
        ))
        .await
        .unwrap_or_default();
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let mut parts = s.split(' ');
            let job_id = parts.next().unwrap().parse().unwrap();
            let pid = pid_of(parts.next().unwrap());
            let micros: i64 = parts.next().unwrap().parse().unwrap();
            Attempt {
                job_id,
                pid,
                recorded_ns: micros * 1_000,
            }
        })
        .collect()
}

/// What the attempts of a wide group came to.
#[derive(Default)]
struct Waits {
    /// From each attempt's record to its handler's begin, in ns, sorted.
    waited: Vec<i64>,
    /// Younger jobs of the group that began and ended while a picked job
    /// waited for its runner's slot (another handler of its process ran
    /// meanwhile): what the reserved permit rules out.
    for_a_slot: Vec<String>,
    /// The same while nothing else of its process ran: the attempt
    /// record's reply and the process's scheduling (documented).
    otherwise: Vec<String>,
}

/// For each attempt of the wide group that led to a handler run in its
/// process (`wide`): how long the picked job waited to begin, and the
/// younger jobs of its group that began and ended meanwhile. `all`: every
/// run, to tell whether the process ran another handler during the wait.
/// (An attempt whose process died before the handler began has no run: a
/// kill, not a wait.)
fn waits(attempts: &[Attempt], wide: &[Run], all: &[Run]) -> Waits {
    let mut found = Waits::default();
    let runs = wide;
    for a in attempts {
        // The run it led to: its job's first run in that process that
        // began after the record (a microsecond of slack for the clocks'
        // resolutions).
        let Some(run) = runs
            .iter()
            .filter(|r| {
                r.job_id == a.job_id && r.pid == a.pid && r.start_ns >= a.recorded_ns - 1_000
            })
            .min_by_key(|r| r.start_ns)
        else {
            continue;
        };
        found.waited.push(run.start_ns - a.recorded_ns);
        let slot_busy = all.iter().any(|o| {
            o.pid == a.pid
                && o.job_id != a.job_id
                && o.start_ns < run.start_ns
                && o.end_ns > a.recorded_ns
        });
        for y in runs {
            if y.job_id > a.job_id && y.start_ns > a.recorded_ns && y.end_ns < run.start_ns {
                let list = if slot_busy {
                    &mut found.for_a_slot
                } else {
                    &mut found.otherwise
                };
                list.push(format!(
                    "job {} (seq {}) recorded by pid {} at {}, began {} µs later; meanwhile job {} (seq {}) ran in pid {} from +{} to +{} µs",
                    a.job_id,
                    run.seq,
                    a.pid,
                    a.recorded_ns,
                    (run.start_ns - a.recorded_ns) / 1_000,
                    y.job_id,
                    y.seq,
                    y.pid,
                    (y.start_ns - a.recorded_ns) / 1_000,
                    (y.end_ns - a.recorded_ns) / 1_000,
                ));
            }
        }
    }
    found.waited.sort_unstable();
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_younger_job_of_a_wide_group_begins_and_ends_while_an_older_picked_one_waits() {
    let db = TestDb::new().await;
    db.exec(MP_LOG).await;
    let mut conn = db.conn().await;
    pgfifo::admin::set_group_limits(&mut conn, "mp", "g000", GroupLimits::new().concurrency(3))
        .await
        .unwrap();
    let env = [("CONCURRENCY", "1")];
    let mut fleets = vec![Workers::start(3, &db.url, &env).await];
    let jobs = (0..WIDE_JOBS)
        .map(|seq| mp_job(0, seq, work_us(seq)))
        .chain((0..NARROW_JOBS).flat_map(|seq| {
            (1..=NARROW_GROUPS).map(move |g| mp_job(g, seq, work_us(seq * 31 + g)))
        }));
    let ids = pgfifo::enqueue_batch(&mut conn, jobs).await.unwrap();
    let total = ids.len() as i64;

    // Two kills, at a quarter and at three fifths of the drain, each
    // replaced by a new process.
    let mut kills = vec![total * 3 / 5, total / 4];
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let done = db
            .scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'")
            .await;
        if done == total {
            break;
        }
        if kills.last().is_some_and(|&at| done >= at) {
            kills.pop();
            let fleet = fleets.iter_mut().find(|f| !f.pids().is_empty()).unwrap();
            let victim = fleet.pids()[0];
            fleet.kill(victim);
            fleets.push(Workers::start(1, &db.url, &env).await);
        }
        for fleet in &mut fleets {
            fleet.assert_running();
        }
        assert!(
            Instant::now() < deadline,
            "only {done} of {total} jobs succeeded after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for fleet in &mut fleets {
        fleet.terminate().await;
    }

    // Every job committed once.
    let committed = db.scalar("SELECT count(DISTINCT job_id) FROM mp_log").await;
    let rows = db.scalar("SELECT count(*) FROM mp_log").await;
    assert_eq!((committed, rows), (total, total), "lost or duplicated jobs");

    let runs: Vec<Run> = fleets.iter().flat_map(Workers::runs).collect();
    let wide: Vec<Run> = runs.iter().filter(|r| r.grp == 0).copied().collect();
    let peaks = records::peak_per_group(&runs);
    assert!(peaks[&0] <= 3, "the wide group's peak: {}", peaks[&0]);
    assert!(
        peaks.iter().all(|(&g, &p)| g == 0 || p == 1),
        "a narrow group ran two at once: {peaks:?}"
    );
    let reruns = runs.len() as i64 - total;

    let attempts = attempts_of_group(&db, "g000").await;
    let found = waits(&attempts, &wide, &runs);
    let waited = &found.waited;
    let quantile = |q: f64| waited[((waited.len() - 1) as f64 * q) as usize] / 1_000;
    println!(
        "start order: {} attempts of the wide group begun, record to begin p50 {} µs, p99 {} µs, max {} µs; {} runs cut by kills; passed over while waiting for a slot: {}, otherwise: {}",
        waited.len(),
        quantile(0.5),
        quantile(0.99),
        quantile(1.0),
        reruns,
        found.for_a_slot.len(),
        found.otherwise.len(),
    );
    for line in &found.otherwise {
        println!("  (scheduling) {line}");
    }
    let per_pid: BTreeMap<u32, usize> = wide.iter().fold(BTreeMap::new(), |mut m, r| {
        *m.entry(r.pid).or_default() += 1;
        m
    });
    assert!(per_pid.len() >= 3, "the wide group ran in {per_pid:?}");
    assert!(
        found.for_a_slot.is_empty(),
        "{} times a younger job began and ended while an older one waited for its runner's slot:\n{}",
        found.for_a_slot.len(),
        found.for_a_slot.join("\n")
    );
}
