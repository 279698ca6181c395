//! Group limits on the distributed layout: a queue's default rate from the
//! runner's configuration spaces a group's starts by its tokens, a group's
//! own rate changed while it waits applies at once, a queue's default
//! concurrency runs its groups' jobs side by side in FIFO start order, the
//! operator reads the limits and the group's tokens, retention cleans a
//! gone group's bucket and slots, and weights refuse by name (concurrency
//! 3 with the failure policy is in `controls`).

use std::time::{Duration, Instant};

use diesel_async::{AsyncConnection, AsyncPgConnection};
use pgfifo::admin::{self, GroupState};
use pgfifo::migrate::Layout;
use pgfifo::{EnqueueOptions, GroupLimits, GroupLimitsChange, LimitChange, NewJob, Rate};
use pgfifo_tests::query::text;
use pgfifo_tests::{eventually, test_config};

use crate::coordinator::{cluster_with, count, job, wait_for};
use crate::jobs::LogJob;

const LIMIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn group_limits_on_the_distributed_layout() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let url = cluster.url();

    // Weights refuse, from the admin API and from a runner's configuration,
    // naming them; nothing is written.
    let refused = admin::set_group_limits(&mut conn, "citus", "x", GroupLimits::new().weight(3))
        .await
        .expect_err("weights on the distributed layout");
    assert!(refused.to_string().contains("weights"), "{refused}");
    let pool = pgfifo::connect(&url, 12).await.expect("pool");
    let refused = pgfifo::runner::start(
        pool.clone(),
        test_config().group_limits("citus", GroupLimits::new().weight(2)),
    )
    .await
    .expect_err("a runner with weights on the distributed layout");
    assert!(refused.to_string().contains("weights"), "{refused}");
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.group_control").await,
        0
    );

    // Group "slow" has a rate of its own, one start a minute: its second
    // job would wait a minute. Groups "d1" and "d2" run two jobs at once
    // by their own limits (and a rate that does not bind); "r" has the queue's default rate, 2 a second
    // with a burst of 2, set by the runner's configuration (slower than
    // this cluster runs one group's jobs one after another, so that its
    // starts wait for tokens).
    // (Its own burst too: it would take the queue's default, 2.)
    let per_minute = GroupLimits::new()
        .rate(Rate::per_minute(1).unwrap())
        .burst(1);
    admin::set_group_limits(&mut conn, "citus", "slow", per_minute)
        .await
        .expect("limits");
    let wide = GroupLimits::new()
        .concurrency(2)
        .rate(Rate::per_second(1000).unwrap())
        .burst(100);
    for group in ["d1", "d2"] {
        admin::set_group_limits(&mut conn, "citus", group, wide)
            .await
            .expect("limits");
    }
    let mut jobs: Vec<NewJob> = (0..8).map(|seq| job("r", seq, false)).collect();
    jobs.extend((0..2).map(|seq| job("slow", seq, false)));
    for group in ["d1", "d2"] {
        jobs.extend((0..8).map(|seq| held_job(group, seq)));
    }
    let ids = pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .expect("enqueue");
    let config = test_config().concurrency(6).group_limits(
        "citus",
        GroupLimits::new()
            .rate(Rate::per_second(2).unwrap())
            .burst(2),
    );
    let runner = pgfifo::runner::start(pool, config)
        .await
        .expect("a runner with group limits on the distributed layout");

    // While "r" drains it waits for tokens, and the operator reads so.
    let waiting = eventually("group r to wait for a token", LIMIT, || {
        in_state(&url, "r", GroupState::RateLimited)
    })
    .await;
    assert_eq!(waiting.rate, Some(Rate::per_second(2).unwrap()));
    assert_eq!(waiting.burst, Some(2));
    assert!(!waiting.own_limits);
    assert!(waiting.tokens.expect("tokens") < 1.0, "{waiting:?}");
    assert!(waiting.waiting_until.is_some(), "{waiting:?}");

    // "slow" ran its first job and waits about a minute for the second.
    let slow = eventually("group slow to wait for its next token", LIMIT, || {
        in_state(&url, "slow", GroupState::RateLimited)
    })
    .await;
    assert!(slow.own_limits);
    assert!(
        slow.waiting_until.expect("until") > std::time::SystemTime::now() + Duration::from_secs(30),
        "{slow:?}"
    );
    // A faster rate applies at once: the waiting group is timed again.
    let changed = Instant::now();
    let change = GroupLimitsChange {
        rate: LimitChange::Set(Rate::per_second(100).unwrap()),
        ..Default::default()
    };
    admin::change_group_limits(&mut conn, "citus", Some("slow"), change)
        .await
        .expect("change");
    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE group_id = 'slow' AND state = 'succeeded'",
        2,
    )
    .await;
    assert!(
        changed.elapsed() < Duration::from_secs(10),
        "the second job waited {:?} after the rate was raised",
        changed.elapsed()
    );

    wait_for(
        &url,
        "SELECT count(*) FROM pgfifo.job WHERE state = 'succeeded'",
        ids.len() as i64,
    )
    .await;
    runner.shutdown().await.expect("shutdown");

    rate_checks(&mut conn).await;
    concurrency_checks(&mut conn).await;

    // The operator's listing of the queue's limits: its defaults, then
    // the groups with their own.
    let set = admin::limits(&mut conn, "citus", None, 10)
        .await
        .expect("limits");
    let groups: Vec<Option<&str>> = set.iter().map(|l| l.group.as_deref()).collect();
    assert_eq!(groups, [None, Some("d1"), Some("d2"), Some("slow")]);
    assert_eq!(set[3].rate, Some(Rate::per_second(100).unwrap()));

    // A start handed back unstarted (forget_attempts, as a runner's
    // shutdown does) deletes its attempt record and gives its group's
    // token back, on the group's shard.
    let before = count(
        &mut conn,
        "SELECT count(*) FROM pgfifo.job_attempt a JOIN pgfifo.job j
           ON j.part = a.part AND j.id = a.job_id WHERE j.group_id = 'r'",
    )
    .await;
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE pgfifo.group_bucket SET tokens = 0, at = now() + interval '1 hour'
             WHERE group_id = 'r'", // (no refill meanwhile)
        ),
        &mut conn,
    )
    .await
    .expect("empty r's bucket");
    assert_eq!(
        count(
            &mut conn,
            "SELECT pgfifo.forget_attempts(ARRAY[max(j.id)], ARRAY[1])::bigint
             FROM pgfifo.job j WHERE j.group_id = 'r'"
        )
        .await,
        1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job_attempt a JOIN pgfifo.job j
               ON j.part = a.part AND j.id = a.job_id WHERE j.group_id = 'r'",
        )
        .await,
        before - 1
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT (tokens * 10)::bigint FROM pgfifo.group_bucket WHERE group_id = 'r'"
        )
        .await,
        10,
        "the token went back"
    );
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query("UPDATE pgfifo.group_bucket SET at = now() WHERE group_id = 'r'"),
        &mut conn,
    )
    .await
    .expect("r's bucket back in time");

    // Retention: once the groups are gone, their buckets (refilled) and
    // slots go too; the limits set for them stay.
    assert!(count(&mut conn, "SELECT count(*) FROM pgfifo.group_slot").await >= 4);
    assert!(count(&mut conn, "SELECT count(*) FROM pgfifo.group_bucket").await >= 2);
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query(
            "UPDATE pgfifo.queue_group SET idle_since = now() - interval '2 hours'
             WHERE head_id IS NULL",
        ),
        &mut conn,
    )
    .await
    .expect("age the groups");
    // (The rate's burst refills in a second.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let cleaned = admin::clean_groups(&mut conn, Duration::from_secs(3600), 100)
        .await
        .expect("clean");
    assert_eq!(cleaned, 4);
    for table in ["queue_group", "group_slot", "group_bucket"] {
        assert_eq!(
            count(&mut conn, &format!("SELECT count(*) FROM pgfifo.{table}")).await,
            0,
            "{table}"
        );
    }
    assert_eq!(
        count(&mut conn, "SELECT count(*) FROM pgfifo.group_control").await,
        4
    );
}

/// A `LogJob` of `group` that works for 100 ms, so that runs overlap.
fn held_job(group: &str, seq: i64) -> NewJob {
    let job = LogJob {
        group: group.to_owned(),
        seq,
        fail_first: false,
        hold_ms: 100,
    };
    NewJob::new(&job, EnqueueOptions::group(group)).expect("new job")
}

async fn in_state(url: &str, group: &str, state: GroupState) -> Result<admin::GroupInfo, String> {
    let mut conn = AsyncPgConnection::establish(url)
        .await
        .map_err(|e| e.to_string())?;
    let info = admin::group(&mut conn, "citus", group)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("no group")?;
    if info.state == state {
        Ok(info)
    } else {
        Err(format!("{:?}", info.state))
    }
}

/// Group "r" started its 8 jobs in order, never more than the burst plus
/// the rate's tokens in any window, and over three seconds at least (six
/// of them waited for a token each): by its attempts' start times, those
/// at which the tokens were taken.
async fn rate_checks(conn: &mut AsyncPgConnection) {
    let starts = text(
        conn,
        "SELECT string_agg(extract(epoch FROM a.started_at)::text, ',' ORDER BY a.started_at)
         FROM pgfifo.job_attempt a JOIN pgfifo.job j ON j.part = a.part AND j.id = a.job_id
         WHERE j.group_id = 'r'",
    )
    .await
    .expect("group r ran");
    let starts: Vec<f64> = starts.split(',').map(|s| s.parse().unwrap()).collect();
    assert_eq!(starts.len(), 8);
    let worst = pgfifo_tests::rates::worst_excess(&starts, 2.0, 2.0);
    assert!(
        worst <= 0.01,
        "a window held {worst:.3} starts beyond 2 + 2 × t"
    );
    let span = starts[7] - starts[0];
    assert!((2.95..20.0).contains(&span), "8 starts took {span:.3} s");
    assert_eq!(
        text(
            conn,
            "SELECT string_agg(j.id::text, ',' ORDER BY a.started_at)
             FROM pgfifo.job_attempt a JOIN pgfifo.job j ON j.part = a.part AND j.id = a.job_id
             WHERE j.group_id = 'r'"
        )
        .await
        .expect("group r ran"),
        text(
            conn,
            "SELECT string_agg(id::text, ',' ORDER BY id) FROM pgfifo.job WHERE group_id = 'r'"
        )
        .await
        .expect("group r's jobs"),
        "group r's jobs started out of order"
    );
}

/// Groups "d1" and "d2" never ran three jobs at once, one of them two at
/// some point (a run that overlaps the next depends on the machine's pace:
/// two chances), and no job of theirs ran through before an older one
/// began.
async fn concurrency_checks(conn: &mut AsyncPgConnection) {
    let mut peaks = Vec::new();
    for group in ["d1", "d2"] {
        let peak = count(
            conn,
            &format!(
                "SELECT max(c) FROM (SELECT (SELECT count(*) FROM citus_log b
                     WHERE b.grp = a.grp AND b.started_at <= a.started_at
                       AND b.ended_at > a.started_at) AS c
                 FROM citus_log a WHERE a.grp = '{group}') s"
            ),
        )
        .await;
        assert!(
            peak <= 2,
            "group {group} of concurrency 2 ran {peak} at once"
        );
        peaks.push(peak);
        assert_eq!(
            count(
                conn,
                &format!(
                    "SELECT count(*) FROM citus_log a JOIN citus_log b
                       ON a.grp = b.grp AND a.seq < b.seq
                     WHERE a.grp = '{group}' AND a.started_at >= b.ended_at"
                )
            )
            .await,
            0,
            "a younger job of group {group} ran through before an older one began"
        );
    }
    assert!(
        peaks.contains(&2),
        "no group of concurrency 2 ran two jobs at once: {peaks:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn a_limited_groups_buckets_and_slots_are_read_and_written_on_its_shard() {
    let (cluster, mut conn) = cluster_with(Layout::Distributed).await;
    let limits = GroupLimits::new()
        .concurrency(2)
        .rate(Rate::per_second(1000).unwrap())
        .burst(100);
    admin::set_group_limits(&mut conn, "citus", "shape", limits)
        .await
        .expect("limits");
    pgfifo::enqueue_batch(&mut conn, (0..8).map(|seq| held_job("shape", seq)))
        .await
        .expect("enqueue");
    // The runner's sessions log what they send to the workers.
    let url = format!(
        "{}?application_name=shape-runner&options=-c%20citus.log_remote_commands%3Don%20-c%20log_min_messages%3Dnotice",
        cluster.url()
    );
    let pool = pgfifo::connect(&url, 8).await.expect("pool");
    let runner = pgfifo::runner::start(pool, test_config().concurrency(4))
        .await
        .expect("runner");
    wait_for(
        &cluster.url(),
        "SELECT count(*) FROM pgfifo.job WHERE group_id = 'shape' AND state = 'succeeded'",
        8,
    )
    .await;
    runner.shutdown().await.expect("shutdown");

    // Every command on the group's bucket or slots names one shard: the
    // group's (a multi-shard statement names each of the 32).
    let log = cluster.coordinator.log_text();
    let commands: Vec<(String, Vec<i64>)> =
        crate::distributed_enqueue::remote_commands(&log, "shape-runner")
            .into_iter()
            .filter(|(command, _)| {
                command.contains("group_bucket_") || command.contains("group_slot_")
            })
            .collect();
    assert!(
        commands.len() >= 8,
        "{} commands on the group's bucket and slots: {commands:?}",
        commands.len()
    );
    let ranges = crate::distributed_enqueue::shard_ranges(&mut conn, &commands).await;
    let own = text(
        &mut conn,
        "SELECT shardminvalue FROM pg_dist_shard
         WHERE shardid = get_shard_id_for_distribution_column(
             'pgfifo.group_bucket', pgfifo.part_of('citus', 'shape'))",
    )
    .await
    .unwrap_or_default();
    assert_eq!(ranges, own, "commands on other shards: {commands:?}");
}
