//! Recurring jobs across OS processes: `cron-worker` processes (see
//! `tests/src/bin/cron-worker.rs`) declare the same one-second schedule.
//! Three of them fire each tick once; after every runner was down, the one
//! that starts catches up as its missed-tick policy says; a runner killed
//! in the middle of a firing loses nothing and duplicates nothing.
//!
//! The evidence is in the database: `pgfifo.schedule_tick` (one row per
//! fired tick, with the runner that fired it and the ticks it stood for)
//! and the jobs' payloads (each carries its tick).

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use pgfifo_tests::TestDb;

const SCHEDULE: &str = "every-second";

/// One `cron-worker` process: killed (SIGKILL) when dropped still running.
struct Worker {
    name: String,
    child: Child,
    /// Held open: with `EXIT_WITH_STDIN=1` the worker exits when it closes.
    _stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Worker {
    /// Starts a worker named `name` with the schedule's policy `missed`
    /// and extra environment `env`, without waiting for it.
    fn spawn(db: &TestDb, name: &str, missed: &str, env: &[(&str, &str)]) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_cron-worker"))
            .env("DATABASE_URL", &db.url)
            .env("WORKER_NAME", name)
            .env("SCHEDULE_NAME", SCHEDULE)
            .env("SCHEDULE_MISSED", missed)
            .env("EXIT_WITH_STDIN", "1")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cron-worker");
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Worker {
            name: name.to_owned(),
            child,
            _stdin: stdin,
            lines,
        }
    }

    /// Starts a worker and waits until its runner runs.
    fn start(db: &TestDb, name: &str, missed: &str) -> Worker {
        let mut worker = Worker::spawn(db, name, missed, &[]);
        worker.wait_line("ready", Duration::from_secs(60));
        worker
    }

    /// Waits for a stdout line starting with `prefix` and returns it.
    fn wait_line(&mut self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.starts_with(prefix) => return line,
                Ok(_) => {}
                Err(_) => panic!(
                    "worker {} printed no {prefix:?} line within {limit:?} ({:?})",
                    self.name,
                    self.child.try_wait()
                ),
            }
        }
    }

    /// SIGTERM, then waits for a clean exit.
    fn terminate(mut self) {
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success());
        let exit = self.child.wait().expect("wait for the worker");
        assert!(exit.success(), "worker {} exited with {exit}", self.name);
    }

    /// SIGKILL: the process dies at once, its connections with it.
    fn kill(mut self) {
        self.child.kill().expect("kill -9");
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One fired tick as recorded, with its job's payload.
#[derive(QueryableByName, Debug, Clone, PartialEq)]
struct Fired {
    /// The tick, in s since the epoch.
    #[diesel(sql_type = BigInt)]
    tick: i64,
    #[diesel(sql_type = Text)]
    fired_by: String,
    /// `schedule_tick.missed`.
    #[diesel(sql_type = BigInt)]
    missed: i64,
    /// The firing's transaction time, in µs: equal for ticks fired together.
    #[diesel(sql_type = BigInt)]
    firing: i64,
    /// The tick in the job's payload, in s.
    #[diesel(sql_type = BigInt)]
    payload_tick: i64,
    /// `missed` in the job's payload.
    #[diesel(sql_type = BigInt)]
    payload_missed: i64,
}

/// Every fired tick of the schedule, oldest first.
async fn fired(db: &TestDb) -> Vec<Fired> {
    let mut conn = db.direct().await;
    diesel::sql_query(
        "SELECT extract(epoch FROM t.tick)::int8 AS tick, t.fired_by, t.missed,
                (extract(epoch FROM t.fired_at) * 1000000)::int8 AS firing,
                (j.payload->>'tick_ms')::int8 / 1000 AS payload_tick,
                (j.payload->>'missed')::int8 AS payload_missed
         FROM pgfifo.schedule_tick AS t JOIN pgfifo.job AS j ON j.id = t.job_id
         WHERE t.schedule = $1 ORDER BY t.tick",
    )
    .bind::<Text, _>(SCHEDULE)
    .load(&mut conn)
    .await
    .expect("read the fired ticks")
}

/// Checks what holds for every run: each fired tick has its own job, which
/// carries that tick; and no job of the schedule exists without its row.
async fn assert_one_job_per_tick(db: &TestDb, ticks: &[Fired]) {
    for t in ticks {
        assert_eq!(t.payload_tick, t.tick, "{t:?}");
        assert_eq!(t.payload_missed, t.missed, "{t:?}");
    }
    let jobs = db
        .scalar("SELECT count(*) FROM pgfifo.job WHERE kind = 'cron.tick'")
        .await;
    assert_eq!(
        jobs,
        ticks.len() as i64,
        "one job per fired tick: {ticks:?}"
    );
    let distinct = db
        .scalar(
            "SELECT count(DISTINCT payload->>'tick_ms') FROM pgfifo.job WHERE kind = 'cron.tick'",
        )
        .await;
    assert_eq!(distinct, jobs, "no tick has two jobs");
}

/// Asserts the ticks are consecutive seconds.
fn assert_consecutive(ticks: &[Fired]) {
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1].tick,
            pair[0].tick + 1,
            "no tick twice, none skipped: {:?}",
            ticks.iter().map(|t| t.tick).collect::<Vec<_>>()
        );
    }
}

/// Waits until the schedule has fired at least `n` ticks (and at most `limit`).
async fn wait_fired(db: &TestDb, n: i64, limit: Duration) {
    db.wait_for(
        &format!(
            "SELECT least(count(*), {n}) FROM pgfifo.schedule_tick WHERE schedule = '{SCHEDULE}'"
        ),
        n,
        limit,
    )
    .await;
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Sleeps until `at` (s since the epoch) by the wall clock: ticks are
/// wall-clock seconds, so their passing is waited for, not polled.
async fn wait_until(at: f64) {
    let left = at - unix_now();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_runners_fire_each_tick_of_ten_seconds_once() {
    let db = TestDb::new().await;
    let workers: Vec<Worker> = (0..3)
        .map(|i| Worker::spawn(&db, &format!("runner-{i}"), "each:100", &[]))
        .collect();
    let mut workers = workers;
    for w in &mut workers {
        w.wait_line("ready", Duration::from_secs(60));
    }
    let from = unix_now();
    wait_until(from + 10.0).await;
    let to = unix_now();
    for w in workers {
        w.terminate();
    }

    let ticks = fired(&db).await;
    assert_consecutive(&ticks);
    assert_one_job_per_tick(&db, &ticks).await;
    // The ticks of the ten seconds all three ran, ±1 at each edge (the
    // first runner was ready before the others; stopping takes a moment).
    let inside = ticks
        .iter()
        .filter(|t| (t.tick as f64) > from && (t.tick as f64) <= to)
        .count();
    assert!(
        (9..=11).contains(&inside),
        "{inside} ticks fired within {from:.3}..{to:.3}: {ticks:?}"
    );
    assert!(ticks.len() <= 14, "{} ticks in all: {ticks:?}", ticks.len());
    assert!(
        ticks.iter().all(|t| t.missed == 0),
        "no tick was missed while runners ran: {ticks:?}"
    );
    let firers: std::collections::BTreeSet<&str> =
        ticks.iter().map(|t| t.fired_by.as_str()).collect();
    eprintln!("ticks fired by {firers:?}");
}

/// Fires a tick or two with one runner, stops it, lets at least five ticks
/// pass, starts another, and returns the ticks before the stop and the
/// ticks of the new runner's first firing, with how many were due.
async fn stop_for_five_ticks(db: &TestDb, missed: &str) -> (Vec<Fired>, Vec<Fired>, i64) {
    let first = Worker::start(db, "before", missed);
    wait_fired(db, 2, Duration::from_secs(10)).await;
    first.terminate();
    let before = fired(db).await;
    let last = before.last().expect("ticks fired before the stop").tick;
    // Ticks last+1 ..= last+5 pass with no runner.
    wait_until((last + 5) as f64 + 0.3).await;
    let second = Worker::start(db, "after", missed);
    let after = eventually_fired_after(db, before.len()).await;
    second.terminate();
    // The new runner's first firing: the rows of one transaction.
    let firing = after[0].firing;
    let caught_up: Vec<Fired> = after.into_iter().filter(|t| t.firing == firing).collect();
    let due = caught_up.last().unwrap().tick - last;
    assert!(
        due >= 5,
        "at least five ticks were due: {caught_up:?} after {last}"
    );
    (before, caught_up, due)
}

/// The ticks fired after the first `n`, once there are some.
async fn eventually_fired_after(db: &TestDb, n: usize) -> Vec<Fired> {
    pgfifo_tests::eventually(
        "the restarted runner to fire",
        Duration::from_secs(15),
        || async {
            let all = fired(db).await;
            if all.len() > n {
                Ok(all[n..].to_vec())
            } else {
                Err(format!("{} ticks", all.len()))
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_skip_fires_only_the_current_tick() {
    let db = TestDb::new().await;
    let (before, first, due) = stop_for_five_ticks(&db, "skip").await;
    let last = before.last().unwrap().tick;
    // One job, for the latest tick (on time); the earlier ones dropped.
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!(first[0].tick, last + due);
    assert_eq!(first[0].missed, due - 1, "{first:?}");
    assert_eq!(
        db.scalar(&format!(
            "SELECT missed_ticks FROM pgfifo.schedule WHERE name = '{SCHEDULE}'"
        ))
        .await,
        due - 1
    );
    assert_one_job_per_tick(&db, &fired(&db).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_run_once_fires_one_job_for_the_missed_ticks() {
    let db = TestDb::new().await;
    let (before, first, due) = stop_for_five_ticks(&db, "once").await;
    let last = before.last().unwrap().tick;
    // A stand-in for the missed ticks (the latest of them, counting the
    // others), then the current tick on time.
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[0].tick, last + due - 1);
    assert_eq!(first[0].missed, due - 2, "{first:?}");
    assert_eq!(first[1].tick, last + due);
    assert_eq!(first[1].missed, 0);
    assert_one_job_per_tick(&db, &fired(&db).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_run_each_fires_every_missed_tick_up_to_its_bound() {
    let db = TestDb::new().await;
    let (before, first, due) = stop_for_five_ticks(&db, "each:100").await;
    let last = before.last().unwrap().tick;
    assert_eq!(first.len() as i64, due, "{first:?}");
    assert_eq!(first[0].tick, last + 1);
    assert!(first.iter().all(|t| t.missed == 0), "{first:?}");
    let all = fired(&db).await;
    assert_consecutive(&all);
    assert_one_job_per_tick(&db, &all).await;

    // With a bound of 3, only the three latest due ticks fire.
    let db = TestDb::new().await;
    let (before, first, due) = stop_for_five_ticks(&db, "each:3").await;
    let last = before.last().unwrap().tick;
    let got: Vec<(i64, i64)> = first.iter().map(|t| (t.tick - last, t.missed)).collect();
    assert_eq!(got, [(due - 2, due - 3), (due - 1, 0), (due, 0)]);
    assert_one_job_per_tick(&db, &fired(&db).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_killed_mid_firing_loses_and_duplicates_no_tick() {
    let db = TestDb::new().await;
    // Runner A blocks inside its first firing, holding the schedule's row.
    let mut a = Worker::spawn(&db, "a", "each:100", &[("BLOCK_FIRST_FIRE", "1")]);
    let line = a.wait_line("firing", Duration::from_secs(60));
    let held: i64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("tick="))
        .and_then(|ms| ms.parse::<i64>().ok())
        .expect("the tick A fires")
        / 1000;
    // B starts while A holds the row (its declaration may wait for it),
    // then A dies mid-firing: its transaction rolls back.
    let mut b = Worker::spawn(&db, "b", "each:100", &[]);
    wait_until(held as f64 + 1.5).await;
    a.kill();
    b.wait_line("ready", Duration::from_secs(60));
    wait_until(held as f64 + 4.5).await;
    db.wait_for(
        &format!(
            "SELECT count(*) FROM pgfifo.schedule_tick
             WHERE schedule = '{SCHEDULE}' AND tick = to_timestamp({held}) + interval '3 seconds'"
        ),
        1,
        Duration::from_secs(10),
    )
    .await;
    b.terminate();

    let ticks = fired(&db).await;
    assert_consecutive(&ticks);
    assert_one_job_per_tick(&db, &ticks).await;
    let of_held: Vec<&Fired> = ticks.iter().filter(|t| t.tick == held).collect();
    assert_eq!(of_held.len(), 1, "the held tick fired once: {ticks:?}");
    assert_eq!(of_held[0].fired_by, "b", "{ticks:?}");
    assert!(
        ticks.iter().all(|t| t.fired_by == "b"),
        "A committed nothing: {ticks:?}"
    );
    assert_eq!(
        ticks[0].tick, held,
        "nothing before the held tick: {ticks:?}"
    );
}
