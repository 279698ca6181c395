//! Recurring jobs in one process: a schedule fires each tick once, with the
//! tick's time in its job; pausing, resuming and a stale schedule; a bad
//! schedule is refused at start with nothing stored.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pgfifo::admin;
use pgfifo::schedule::{Missed, Schedule, Tick};
use pgfifo::{async_trait, EnqueueOptions, Error, Handler, Job, JobContext, JobError};
use pgfifo_tests::{eventually, test_config, TestDb};
use serde::{Deserialize, Serialize};

/// The job of this module's schedules: its tick, in ms since the epoch.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "schedules.tick", queue = "schedules")]
struct TickJob {
    tick_ms: i64,
    missed: u64,
}

#[async_trait]
impl Handler for TickJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn tick_job(tick: &Tick) -> TickJob {
    let tick_ms = tick.at.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    TickJob {
        tick_ms,
        missed: tick.missed,
    }
}

fn every_second(name: &str) -> Schedule {
    Schedule::for_tick(name, "* * * * * *", tick_job)
}

/// The ticks (s since the epoch) of the jobs enqueued so far, in job order.
async fn job_ticks(db: &TestDb) -> Vec<i64> {
    let text = db
        .text(
            "SELECT coalesce(string_agg((payload->>'tick_ms')::bigint / 1000 || '', ',' ORDER BY id), '')
             FROM pgfifo.job WHERE kind = 'schedules.tick'",
        )
        .await
        .unwrap_or_default();
    text.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_fires_each_tick_once_in_its_group() {
    let db = TestDb::new().await;
    let runner = db
        .start_runner(test_config().schedule(every_second("each-second").group("tenant-7")))
        .await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.job WHERE kind = 'schedules.tick' AND state = 'succeeded'",
        3,
        Duration::from_secs(10),
    )
    .await;
    runner.shutdown().await.unwrap();

    let ticks = job_ticks(&db).await;
    assert!(ticks.len() >= 3, "{ticks:?}");
    for pair in ticks.windows(2) {
        assert_eq!(
            pair[1],
            pair[0] + 1,
            "consecutive seconds, each once: {ticks:?}"
        );
    }
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE kind = 'schedules.tick' AND group_id IS DISTINCT FROM 'tenant-7'")
            .await,
        0,
        "every job went into the schedule's group"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.schedule_tick AS t JOIN pgfifo.job AS j ON j.id = t.job_id
                   WHERE t.schedule = 'each-second' AND (j.payload->>'tick_ms')::bigint = (extract(epoch FROM t.tick) * 1000)::bigint")
            .await,
        ticks.len() as i64,
        "each fired tick is recorded with its job"
    );

    let mut conn = db.conn().await;
    let info = admin::schedule(&mut conn, "each-second").await.unwrap();
    assert_eq!(info.expression, "* * * * * *");
    assert_eq!(info.time_zone, "UTC");
    assert_eq!(info.group.as_deref(), Some("tenant-7"));
    assert_eq!(info.on_missed, "run once");
    assert!(!info.paused);
    assert!(info.stale, "its only runner stopped: {info:?}");
    assert_eq!(
        info.last_job_state.as_deref(),
        Some("succeeded"),
        "{info:?}"
    );
    let last = info
        .last_tick
        .unwrap()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    assert_eq!(last, *ticks.last().unwrap());
    assert!(info.next_tick.unwrap() > info.last_tick.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_schedule_is_refused_at_start_and_nothing_is_stored() {
    let db = TestDb::new().await;
    let config = test_config()
        .schedule(every_second("fine"))
        .schedule(Schedule::new("bad-cron", "61 * * * *", || TickJob {
            tick_ms: 0,
            missed: 0,
        }))
        .schedule(every_second("bad-zone").time_zone("Mars/Olympus"))
        .schedule(every_second("twice"))
        .schedule(every_second("twice").on_missed(Missed::Skip))
        .schedule(every_second("bound").on_missed(Missed::RunEach { max: 0 }))
        .schedule(every_second("no-attempts").options(EnqueueOptions::group("g").max_attempts(0)));
    let err = pgfifo::runner::start(db.pool.clone(), config)
        .await
        .unwrap_err();
    let Error::InvalidSchedules(problems) = &err else {
        panic!("expected InvalidSchedules, got {err}");
    };
    let named: Vec<&str> = problems.iter().map(|p| p.schedule.as_str()).collect();
    assert_eq!(
        named,
        ["bad-cron", "bad-zone", "twice", "bound", "no-attempts"],
        "{err}"
    );
    assert!(message_has(&err, "max_attempts must be between 1"), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("schedule \"bad-cron\": invalid cron expression"),
        "{message}"
    );
    assert!(
        message.contains("unknown time zone \"Mars/Olympus\""),
        "{message}"
    );
    assert!(
        message.contains("declared twice with different definitions"),
        "{message}"
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.schedule").await, 0);
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.runner").await, 0);
}

fn message_has(err: &Error, text: &str) -> bool {
    err.to_string().contains(text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_schedule_skips_its_ticks_and_resumes_from_the_next() {
    let db = TestDb::new().await;
    let runner = db
        .start_runner(
            test_config()
                .schedule(every_second("pausable").on_missed(Missed::RunEach { max: 100 })),
        )
        .await;
    let count = "SELECT count(*) FROM pgfifo.job WHERE kind = 'schedules.tick'";
    db.wait_for(count, 1, Duration::from_secs(10)).await;
    let mut conn = db.conn().await;
    assert!(admin::pause_schedule(&mut conn, "pausable").await.unwrap());
    assert!(!admin::pause_schedule(&mut conn, "pausable").await.unwrap());
    // A firing that began before the pause may still commit: take the count
    // once the schedule's row is free.
    let paused_at = SystemTime::now();
    let before = eventually("the pause to hold", Duration::from_secs(5), || async {
        let n = db.scalar(count).await;
        let mut conn = db.conn().await;
        let info = admin::schedule(&mut conn, "pausable").await.unwrap();
        if info.paused {
            Ok(n)
        } else {
            Err("not paused".to_owned())
        }
    })
    .await;
    // Three ticks pass while paused: none fires, even under RunEach.
    wait_until(paused_at + Duration::from_millis(3_200)).await;
    assert_eq!(db.scalar(count).await, before, "no job while paused");
    let info = admin::schedule(&mut conn, "pausable").await.unwrap();
    assert!(info.paused && !info.stale, "{info:?}");

    assert!(admin::resume_schedule(&mut conn, "pausable").await.unwrap());
    let resumed = SystemTime::now();
    db.wait_for(
        &format!(
            "SELECT (count(*) > {before})::int::int8 FROM pgfifo.job WHERE kind = 'schedules.tick'"
        ),
        1,
        Duration::from_secs(5),
    )
    .await;
    runner.shutdown().await.unwrap();
    let ticks = job_ticks(&db).await;
    let resumed_s = resumed.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let after: Vec<i64> = ticks[before as usize..].to_vec();
    assert!(
        after.iter().all(|t| *t >= resumed_s),
        "no tick of the pause caught up after resuming: {ticks:?} (resumed at {resumed_s})"
    );
}

/// Sleeps until `at` by the wall clock (ticks are wall-clock seconds).
async fn wait_until(at: SystemTime) {
    if let Ok(left) = at.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_schedule_does_not_fire_and_can_be_deleted() {
    let db = TestDb::new().await;
    let runner = db
        .start_runner(test_config().schedule(every_second("gone")))
        .await;
    let count = "SELECT count(*) FROM pgfifo.job WHERE kind = 'schedules.tick'";
    db.wait_for(count, 1, Duration::from_secs(10)).await;
    let mut conn = db.conn().await;
    let live = admin::schedule(&mut conn, "gone").await.unwrap();
    assert!(!live.stale, "{live:?}");
    assert_eq!(live.declared_by.len(), 1, "{live:?}");
    let err = admin::delete_schedule(&mut conn, "gone").await.unwrap_err();
    assert!(matches!(err, Error::ScheduleDeclared { .. }), "{err}");

    // Its only runner stops; another runner that does not declare it runs on.
    runner.shutdown().await.unwrap();
    let other = db.start_runner(test_config()).await;
    let stopped = db.scalar(count).await;
    let info = admin::schedule(&mut conn, "gone").await.unwrap();
    assert!(info.stale && info.declared_by.is_empty(), "{info:?}");
    wait_until(SystemTime::now() + Duration::from_millis(2_500)).await;
    assert_eq!(
        db.scalar(count).await,
        stopped,
        "a stale schedule does not fire"
    );
    let overdue = admin::schedule(&mut conn, "gone").await.unwrap();
    assert!(
        overdue.next_tick.unwrap() < SystemTime::now(),
        "{overdue:?}"
    );
    other.shutdown().await.unwrap();

    admin::delete_schedule(&mut conn, "gone").await.unwrap();
    assert!(matches!(
        admin::schedule(&mut conn, "gone").await,
        Err(Error::ScheduleNotFound(_))
    ));
    assert!(matches!(
        admin::pause_schedule(&mut conn, "gone").await,
        Err(Error::ScheduleNotFound(_))
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_definition_replaces_the_stored_one_and_the_old_runner_stops_firing() {
    let db = TestDb::new().await;
    let old = db
        .start_runner(
            test_config()
                .name("old")
                .schedule(every_second("redeployed")),
        )
        .await;
    let count = "SELECT count(*) FROM pgfifo.job WHERE kind = 'schedules.tick'";
    db.wait_for(count, 1, Duration::from_secs(10)).await;

    // A deploy changes the schedule's group: the new runner's declaration
    // replaces the stored one while the old runner still runs.
    let new = db
        .start_runner(
            test_config()
                .name("new")
                .schedule(every_second("redeployed").group("moved")),
        )
        .await;
    let switched = db
        .scalar("SELECT coalesce(max(id), 0) FROM pgfifo.job WHERE kind = 'schedules.tick'")
        .await;
    db.wait_for(
        &format!(
            "SELECT least(count(*), 2) FROM pgfifo.job WHERE kind = 'schedules.tick' AND id > {switched}"
        ),
        2,
        Duration::from_secs(10),
    )
    .await;
    let info = eventually(
        "only the new runner to declare it",
        Duration::from_secs(10),
        || async {
            let mut conn = db.conn().await;
            let info = admin::schedule(&mut conn, "redeployed").await.unwrap();
            if info.declared_by == ["new"] {
                Ok(info)
            } else {
                Err(format!("{info:?}"))
            }
        },
    )
    .await;
    assert_eq!(info.group.as_deref(), Some("moved"));
    assert_eq!(info.stored_by, "new");
    new.shutdown().await.unwrap();
    old.shutdown().await.unwrap();

    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE kind = 'schedules.tick' AND id > {switched}
             AND group_id IS DISTINCT FROM 'moved'"
        ))
        .await,
        0,
        "after the new declaration, every tick went to its group"
    );
    assert_eq!(
        db.scalar(&format!(
            "SELECT count(*) FROM pgfifo.schedule_tick AS t JOIN pgfifo.job AS j ON j.id = t.job_id
             WHERE j.id > {switched} AND t.fired_by <> 'new'"
        ))
        .await,
        0,
        "the old runner fired nothing after the new declaration"
    );
    let ticks = job_ticks(&db).await;
    for pair in ticks.windows(2) {
        assert!(
            pair[1] > pair[0],
            "no tick twice across the switch: {ticks:?}"
        );
    }
}
