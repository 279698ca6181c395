//! Semantic 11, group controls: a handler snoozes its group without using
//! an attempt; a rate limit spaces a group's starts by its tokens (the
//! runner wakes for the next token instead of waiting for a poll); limits
//! change at run time; bad settings are refused and change nothing. The
//! multi-process check of a rate limit is in `multiprocess/rate.rs`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use pgfifo::admin::{self, GroupInfo, GroupState};
use pgfifo::runner::{JobEvent, JobOutcome};
use pgfifo::{async_trait, GroupLimits, Handler, Job, JobContext, JobError, Rate};
use pgfifo_tests::rates::{starts_of, worst_excess};
use pgfifo_tests::{eventually, test_config, TestDb};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

const LIMIT: Duration = Duration::from_secs(20);
/// Longer than any wait below: a group that moves on time was woken by its
/// runner, not found by a poll.
const SLOW_POLL: Duration = Duration::from_secs(30);

/// Handler runs of this module: (database, job id) → (start, end, attempt)
/// of each run. Runs are recorded here, outside the job's transaction,
/// because a snoozed run's writes and attempt record are discarded. Keyed
/// by database too: tests run side by side in one process, and job ids
/// start at 1 in each test's database.
type RunKey = (String, i64);
static RUNS: Mutex<Vec<(RunKey, SystemTime, SystemTime, u32)>> = Mutex::new(Vec::new());
/// Jobs that snoozed already (each snoozes on its first run only).
static SNOOZED: Mutex<Option<HashMap<RunKey, ()>>> = Mutex::new(None);

fn runs_of(db: &TestDb, id: i64) -> Vec<(SystemTime, SystemTime, u32)> {
    RUNS.lock()
        .unwrap()
        .iter()
        .filter(|r| r.0 == (db.name.clone(), id))
        .map(|r| (r.1, r.2, r.3))
        .collect()
}

fn job(db: &TestDb, snooze_ms: u64) -> ControlsJob {
    ControlsJob {
        db: db.name.clone(),
        snooze_ms,
    }
}

/// Snoozes its group for `snooze_ms` on its first run; succeeds after.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "controls", max_attempts = 1)]
struct ControlsJob {
    db: String,
    snooze_ms: u64,
}

#[async_trait]
impl Handler for ControlsJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let start = SystemTime::now();
        let first = SNOOZED
            .lock()
            .unwrap()
            .get_or_insert_with(HashMap::new)
            .insert((self.db.clone(), ctx.id()), ())
            .is_none();
        let result = if first && self.snooze_ms > 0 {
            Err(JobError::snooze(
                Duration::from_millis(self.snooze_ms),
                "upstream throttled",
            ))
        } else {
            Ok(())
        };
        RUNS.lock().unwrap().push((
            (self.db.clone(), ctx.id()),
            start,
            SystemTime::now(),
            ctx.attempt(),
        ));
        result
    }
}

async fn wait_event(rx: &mut broadcast::Receiver<JobEvent>, id: i64) -> JobEvent {
    tokio::time::timeout(LIMIT, async {
        loop {
            match rx.recv().await {
                Ok(event) if event.id == id => return event,
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => panic!("runner events closed"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event for job {id} within {LIMIT:?}"))
}

/// The group of queue `controls`, if it is in `state`.
async fn in_state(db: &TestDb, group: &str, state: GroupState) -> Result<GroupInfo, String> {
    let mut conn = db.conn().await;
    let info = admin::group(&mut conn, "controls", group).await.unwrap();
    match info {
        Some(info) if info.state == state => Ok(info),
        other => Err(format!("{other:?}")),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snooze_keeps_the_head_uses_no_attempt_and_resumes_on_time() {
    let db = TestDb::new().await;
    let runner = db
        .start_runner(test_config().concurrency(4).poll_interval(SLOW_POLL))
        .await;
    let mut events = runner.subscribe();
    let head = db.enqueue(job(&db, 700), "s").await;
    let next = db.enqueue(job(&db, 0), "s").await;
    let other = db.enqueue(job(&db, 0), "t").await;

    let event = wait_event(&mut events, head).await;
    match &event.outcome {
        JobOutcome::Snoozed { reason, delay } => {
            assert_eq!(reason, "upstream throttled");
            assert_eq!(*delay, Duration::from_millis(700));
        }
        other => panic!("expected a snooze, got {other:?}"),
    }
    // While it sleeps: the head keeps its place, with no attempt used, and
    // status says why the group waits.
    let mut conn = db.conn().await;
    let info = admin::group(&mut conn, "controls", "s")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(info.state, GroupState::Snoozed, "{info:?}");
    assert_eq!(info.head, Some(head));
    assert!(info.state.is_blocked());
    let until = info.snoozed_until.expect("snoozed_until");
    let left = until.duration_since(SystemTime::now()).unwrap_or_default();
    assert!(left <= Duration::from_millis(700), "snoozed for {left:?}");
    assert_eq!(
        db.attempt_rows(head).await,
        0,
        "the snoozed attempt was kept"
    );
    assert_eq!(db.job_state(head).await, "queued 0");
    let status = admin::queue_status(&mut conn, "controls", 5).await.unwrap();
    assert_eq!(
        (
            status.blocked_groups.snoozed,
            status.blocked_groups.retrying
        ),
        (1, 0)
    );
    // Another group is not held back.
    db.wait_job_succeeded(other, LIMIT).await;

    db.wait_job_succeeded(next, LIMIT).await;
    runner.shutdown().await.unwrap();
    // One attempt in all: the snoozed run did not count (max_attempts is 1).
    assert_eq!(db.job_state(head).await, "succeeded 1");
    let runs = runs_of(&db, head);
    assert_eq!(runs.len(), 2, "{runs:?}");
    assert_eq!((runs[0].2, runs[1].2), (1, 1), "attempt numbers");
    let slept = runs[1].0.duration_since(runs[0].1).unwrap();
    assert!(
        slept >= Duration::from_millis(700),
        "ran again {slept:?} after snoozing for 700 ms"
    );
    // Woken by its runner when due, not by a poll (every 30 s here).
    assert!(
        slept < Duration::from_millis(1_500),
        "ran again after {slept:?}"
    );
    // The job behind it started only after the head's second run.
    let behind = runs_of(&db, next);
    assert_eq!(behind.len(), 1);
    assert!(
        behind[0].0 >= runs[1].1,
        "the next job overtook the snoozed head"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limit_spaces_starts_by_tokens_and_wakes_for_the_next() {
    let db = TestDb::new().await;
    let limits = GroupLimits::new()
        .rate(Rate::per_second(10).unwrap())
        .burst(2);
    // The queue's default, from the runner's configuration.
    let config = test_config()
        .concurrency(4)
        .poll_interval(SLOW_POLL)
        .group_limits("controls", limits);
    let runner = db.start_runner(config).await;
    let mut ids = Vec::new();
    for _ in 0..12 {
        ids.push(db.enqueue(job(&db, 0), "r").await);
    }
    // While it drains: the group waits for tokens, and says so.
    let waiting = eventually("the group to wait for a token", LIMIT, || {
        in_state(&db, "r", GroupState::RateLimited)
    })
    .await;
    assert_eq!(waiting.rate, Some(Rate::per_second(10).unwrap()));
    assert_eq!(waiting.burst, Some(2));
    assert!(!waiting.own_limits);
    assert!(waiting.tokens.unwrap() < 1.0, "{waiting:?}");
    assert!(waiting.waiting_until.is_some());
    db.wait_jobs_in(&ids, "succeeded", LIMIT).await;
    runner.shutdown().await.unwrap();

    let starts = starts_of(&db, "r").await;
    assert_eq!(starts.len(), 12);
    let worst = worst_excess(&starts, 10.0, 2.0);
    assert!(worst <= 0.001, "a window exceeded the bound by {worst}");
    // Ten starts had to wait for a token each: a second at least; woken by
    // the runner for each token (no poll within 30 s), so not much more.
    let span = starts[11] - starts[0];
    assert!((0.99..4.0).contains(&span), "12 starts took {span:.3} s");
    // The order held.
    let order = db
        .text("SELECT string_agg(j.id::text, ',' ORDER BY a.started_at) FROM pgfifo.job_attempt a JOIN pgfifo.job j ON j.id = a.job_id")
        .await
        .unwrap();
    let expected: Vec<String> = ids.iter().map(i64::to_string).collect();
    assert_eq!(order, expected.join(","));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_change_at_run_time_without_a_restart() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    // One start a minute: the second job would wait a minute.
    let slow = GroupLimits::new().rate(Rate::per_minute(1).unwrap());
    admin::set_group_limits(&mut conn, "controls", "w", slow)
        .await
        .unwrap();
    let runner = db
        .start_runner(test_config().concurrency(2).poll_interval(SLOW_POLL))
        .await;
    let first = db.enqueue(job(&db, 0), "w").await;
    let second = db.enqueue(job(&db, 0), "w").await;
    db.wait_job_succeeded(first, LIMIT).await;
    let info = eventually("the group to wait for its next token", LIMIT, || {
        in_state(&db, "w", GroupState::RateLimited)
    })
    .await;
    assert!(info.own_limits);
    let until = info.waiting_until.unwrap();
    assert!(
        until > SystemTime::now() + Duration::from_secs(30),
        "{info:?}"
    );

    // A faster rate applies at once: the waiting group is timed again.
    let fast = GroupLimits::new().rate(Rate::per_second(100).unwrap());
    let changed = std::time::Instant::now();
    admin::set_group_limits(&mut conn, "controls", "w", fast)
        .await
        .unwrap();
    db.wait_job_succeeded(second, LIMIT).await;
    assert!(
        changed.elapsed() < Duration::from_secs(5),
        "the second job waited {:?} after the rate was raised",
        changed.elapsed()
    );

    // Back to the queue's defaults (none): the group is unlimited.
    assert!(admin::reset_group_limits(&mut conn, "controls", "w")
        .await
        .unwrap());
    assert!(!admin::reset_group_limits(&mut conn, "controls", "w")
        .await
        .unwrap());
    let info = admin::group(&mut conn, "controls", "w")
        .await
        .unwrap()
        .unwrap();
    assert_eq!((info.rate, info.own_limits), (None, false));
    runner.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_limits_are_refused_by_name_and_change_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let ten = Rate::per_second(10).unwrap();
    admin::set_default_group_limits(&mut conn, "controls", GroupLimits::new().rate(ten))
        .await
        .unwrap();
    let before = admin::limits(&mut conn, "controls", None, 10)
        .await
        .unwrap();

    let err = Rate::per_second(0).unwrap_err().to_string();
    assert!(err.contains("rate:") && err.contains("pause"), "{err}");
    for (group, limits, names) in [
        ("g", GroupLimits::new().burst(0), "burst:"),
        ("g", GroupLimits::new().burst(2_000_000), "burst:"),
        ("", GroupLimits::new().rate(ten), "group"),
    ] {
        let err = admin::set_group_limits(&mut conn, "controls", group, limits)
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains(names), "{err}");
    }
    let err = admin::set_default_group_limits(&mut conn, "", GroupLimits::new().rate(ten))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("queue"), "{err}");
    // The SQL function refuses what its callers could send.
    for call in [
        "SELECT pgfifo.set_group_control('controls', 'g', 0, 1000, NULL)",
        "SELECT pgfifo.set_group_control('controls', 'g', 5, NULL, NULL)",
        "SELECT pgfifo.set_group_control('controls', '', 5, 1000, NULL)",
        "SELECT pgfifo.set_group_control('controls', 'g', 5, 1000, 0)",
    ] {
        let mut direct = db.direct().await;
        let result = diesel_async::RunQueryDsl::execute(diesel::sql_query(call), &mut direct).await;
        assert!(result.is_err(), "{call} was accepted");
    }
    assert_eq!(
        admin::limits(&mut conn, "controls", None, 10)
            .await
            .unwrap(),
        before,
        "a refused setting changed something"
    );

    // What is set, as listed: the queue's defaults, then groups'.
    admin::set_group_limits(&mut conn, "controls", "vip", GroupLimits::new().burst(50))
        .await
        .unwrap();
    let set = admin::limits(&mut conn, "controls", None, 10)
        .await
        .unwrap();
    assert_eq!(set.len(), 2);
    assert_eq!((set[0].group.as_deref(), set[0].rate), (None, Some(ten)));
    assert_eq!(
        (set[1].group.as_deref(), set[1].burst),
        (Some("vip"), Some(50))
    );
    // A group's own burst with its queue's rate.
    let rate = db
        .text("SELECT (r.rate_count || '/' || r.rate_period_ms || '/' || r.burst) FROM pgfifo.group_limits('controls', 'vip') AS r")
        .await;
    assert_eq!(rate.as_deref(), Some("10/1000/50"));
}
