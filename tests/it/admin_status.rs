//! What operators see: queue status (exact counts of unfinished and failed
//! jobs, estimates of succeeded ones, blocked groups, largest backlogs), job
//! listings and details, and the gauges the runner samples.

use std::time::{Duration, SystemTime};

use pgfifo::admin::{
    self, BlockedGroups, Count, GroupBacklog, GroupQuery, JobQuery, JobStateFilter, JobStatus,
};
use pgfifo::{EnqueueOptions, Error, JobId};

use crate::admin_support::{Fx, Mode, LIMIT, QUEUE};

/// Rows written directly, with their queue_group rows where they are heads:
///  * group gr waits for its head's retry (attempt 1 failed, retry in an hour);
///  * group gh is held at its failed head, one queued job behind it;
///  * two ungrouped failed jobs;
///  * 300 succeeded jobs in the test queue, 50 in queue "other".
const STATUS_ROWS: &str = "
    WITH j AS (
        INSERT INTO pgfifo.job (queue, group_id, kind, payload, max_attempts, attempts,
                                run_after, last_error)
        VALUES ('admin', 'gr', 'AdminJob', '{}', 3, 1, now() + interval '1 hour', 'boom')
        RETURNING id),
    a AS (
        INSERT INTO pgfifo.job_attempt (job_id, attempt, runner, finished_at, error)
        SELECT id, 1, 'test', now(), 'boom' FROM j)
    INSERT INTO pgfifo.queue_group (queue, group_id, slot, head_id, ready_at)
    SELECT 'admin', 'gr', pgfifo.group_hash('admin', 'gr'), id, now() + interval '1 hour' FROM j;

    WITH j AS (
        INSERT INTO pgfifo.job (queue, group_id, kind, payload, max_attempts, attempts, state,
                                last_error, finished_at)
        VALUES ('admin', 'gh', 'AdminJob', '{}', 1, 1, 'failed', 'held here', now())
        RETURNING id)
    INSERT INTO pgfifo.queue_group (queue, group_id, slot, head_id, ready_at)
    SELECT 'admin', 'gh', pgfifo.group_hash('admin', 'gh'), id, NULL FROM j;
    INSERT INTO pgfifo.job (queue, group_id, kind, payload, max_attempts)
    VALUES ('admin', 'gh', 'AdminJob', '{}', 1);

    INSERT INTO pgfifo.job (queue, kind, payload, max_attempts, attempts, state, finished_at)
    SELECT 'admin', 'AdminJob', '{}', 1, 1, 'failed', now() FROM generate_series(1, 2);
    INSERT INTO pgfifo.job (queue, kind, payload, max_attempts, attempts, state, finished_at)
    SELECT CASE WHEN i <= 300 THEN 'admin' ELSE 'other' END, 'AdminJob', '{}', 1, 1,
           'succeeded', now()
    FROM generate_series(1, 350) AS i;
    ANALYZE pgfifo.job;";

/// A queue with known numbers and no runner: 14 unfinished jobs (g1: 5 with
/// the oldest, enqueued ten minutes ago; g2: 3, paused; g3: 2; 2 ungrouped;
/// gr's retrying head; gh's job behind its held head), 3 failed, ~300
/// succeeded.
async fn status_fixture(fx: &Fx) {
    let first = fx.push_many(Some("g1"), 0..5).await[0];
    fx.push_many(Some("g2"), 10..13).await;
    fx.push_many(Some("g3"), 20..22).await;
    fx.push_many(None, 30..32).await;
    fx.exec(&format!(
        "UPDATE pgfifo.job SET created_at = now() - interval '10 minutes' WHERE id = {first}"
    ))
    .await;
    fx.exec(STATUS_ROWS).await;
    let mut conn = fx.conn().await;
    assert!(admin::pause_group(&mut conn, QUEUE, "g2").await.unwrap());
}

fn exact(value: i64) -> Count {
    Count { value, exact: true }
}

fn assert_estimate(count: Option<Count>, expected: i64) {
    let count = count.expect("an estimate once the job table was analyzed");
    assert!(!count.exact, "{count:?} should be an estimate");
    let tolerance = expected / 10;
    assert!(
        (count.value - expected).abs() <= tolerance,
        "estimate {count:?}, expected {expected} ± {tolerance}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_unfinished_failed_and_blocked_exactly_and_estimates_succeeded() {
    let fx = Fx::new().await;
    let mut conn = fx.conn().await;
    // Before the job table was ever analyzed there is no estimate.
    let s = admin::queue_status(&mut conn, QUEUE, 3).await.unwrap();
    assert_eq!((s.succeeded, s.cancelled), (None, None), "{s:?}");
    assert_eq!((s.queued, s.failed), (exact(0), exact(0)), "{s:?}");
    status_fixture(&fx).await;

    assert_eq!(
        admin::queues(&mut conn).await.unwrap(),
        vec![QUEUE.to_owned()]
    );
    let s = admin::queue_status(&mut conn, QUEUE, 3).await.unwrap();
    assert_eq!((s.paused, s.running, s.runners), (false, 0, 0), "{s:?}");
    assert_eq!(s.failure_policy, admin::FailurePolicy::Continue);
    assert_eq!(
        s.queued,
        exact(13),
        "14 unfinished, one of them retrying: {s:?}"
    );
    assert_eq!(s.retrying, exact(1), "{s:?}");
    assert_eq!(s.failed, exact(3), "{s:?}");
    assert_estimate(s.succeeded, 300);
    let cancelled = s.cancelled.expect("an estimate");
    assert!(!cancelled.exact && cancelled.value <= 1, "{s:?}");
    let age = s.oldest_queued_age.expect("an oldest job");
    assert!(
        age >= Duration::from_secs(600) && age < Duration::from_secs(660),
        "oldest job's age {age:?}"
    );
    assert_eq!(
        s.blocked_groups,
        BlockedGroups {
            paused: 1,
            held: 1,
            retrying: 1,
            snoozed: 0
        }
    );
    let backlog = |group: &str, backlog| GroupBacklog {
        group: group.into(),
        backlog,
    };
    assert_eq!(
        s.largest_backlogs,
        vec![backlog("g1", 5), backlog("g2", 3), backlog("g3", 2)]
    );
    assert!(s.largest_backlogs_exact);

    // All queues: only the known one ("other" has nothing but finished jobs).
    let all = admin::status(&mut conn, None, 3).await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].queued, all[0].failed), (exact(13), exact(3)));
    // A queue named explicitly.
    let other = admin::status(&mut conn, Some(&["other".to_owned()]), 3)
        .await
        .unwrap();
    assert_eq!(other.len(), 1);
    let other = &other[0];
    assert_eq!(
        (other.queued, other.failed),
        (exact(0), exact(0)),
        "{other:?}"
    );
    assert_estimate(other.succeeded, 50);
    assert_eq!(other.oldest_queued_age, None);
    assert!(other.largest_backlogs.is_empty());
    assert_eq!(other.blocked_groups.total(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_report_depth_and_blocked_groups() {
    let fx = Fx::new().await;
    status_fixture(&fx).await;
    let mut conn = fx.conn().await;
    let gauges = admin::gauges(&mut conn, &[QUEUE.to_owned(), "nothing".to_owned()])
        .await
        .unwrap();
    assert_eq!(gauges.len(), 2);
    assert_eq!(
        (gauges[0].queue.as_str(), gauges[0].depth),
        (QUEUE, 14),
        "{gauges:?}"
    );
    assert_eq!(
        gauges[0].blocked_groups, 3,
        "paused, held, retrying: {gauges:?}"
    );
    assert!(gauges[0].oldest_head_age.is_some(), "{gauges:?}");
    assert_eq!(
        (
            gauges[1].depth,
            gauges[1].blocked_groups,
            gauges[1].oldest_head_age
        ),
        (0, 0, None),
        "{gauges:?}"
    );
}

/// Every job of the test queue, page by page (`limit` a page).
async fn all_pages(fx: &Fx, limit: i64, oldest_first: bool) -> Vec<JobId> {
    let mut conn = fx.conn().await;
    let mut query = JobQuery {
        queue: Some(QUEUE.into()),
        oldest_first,
        limit: Some(limit),
        ..JobQuery::default()
    };
    let mut out = Vec::new();
    loop {
        let page = admin::jobs(&mut conn, &query).await.unwrap();
        let Some(last) = page.last() else {
            return out;
        };
        assert!(page.len() as i64 <= limit);
        query.after = Some(last.id);
        out.extend(page.iter().map(|j| j.id));
    }
}

async fn list(fx: &Fx, query: JobQuery) -> Vec<(JobId, JobStatus)> {
    let mut conn = fx.conn().await;
    let jobs = admin::jobs(&mut conn, &query).await.unwrap();
    jobs.into_iter().map(|j| (j.id, j.status)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_lists_filters_and_pages_and_job_shows_details() {
    let fx = Fx::new().await;
    fx.break_seqs(&[1]).await;
    let a = fx.push_many(Some("a"), 0..3).await;
    let b = fx.push_many(Some("b"), 10..12).await;
    let u = fx.push_many(None, 20..21).await[0];
    let runner = fx.runner().await;
    fx.wait_state(&[a[0], a[2], b[0], b[1], u], "succeeded")
        .await;
    fx.wait_state(&[a[1]], "failed").await;
    let hour = EnqueueOptions::group("c").run_in(Duration::from_secs(3600));
    let scheduled = fx.push_with(40, Mode::Ok, hour).await;
    let behind = fx.push("c", 41, Mode::Ok).await;
    fx.wait_head(scheduled).await;
    runner.shutdown().await.unwrap();
    let d = fx.push_many(Some("d"), 50..52).await;
    let all = [a.clone(), b, vec![u, scheduled, behind], d.clone()].concat();

    use JobStatus::{Failed, Queued, Scheduled, Succeeded};
    let q = |group: Option<&str>, state, oldest_first| JobQuery {
        queue: Some(QUEUE.into()),
        group: group.map(Into::into),
        state,
        oldest_first,
        ..JobQuery::default()
    };
    assert_eq!(
        list(&fx, q(Some("a"), None, false)).await,
        vec![(a[2], Succeeded), (a[1], Failed), (a[0], Succeeded)]
    );
    assert_eq!(
        list(&fx, q(Some("a"), None, true)).await,
        vec![(a[0], Succeeded), (a[1], Failed), (a[2], Succeeded)]
    );
    let failed = JobQuery {
        state: Some(JobStateFilter::Failed),
        ..JobQuery::default()
    };
    assert_eq!(list(&fx, failed).await, vec![(a[1], Failed)]);
    assert_eq!(
        list(&fx, q(None, Some(JobStateFilter::Queued), true)).await,
        vec![
            (scheduled, Scheduled),
            (behind, Queued),
            (d[0], Queued),
            (d[1], Queued)
        ]
    );
    assert_eq!(
        list(&fx, q(Some("c"), None, false)).await,
        vec![(behind, Queued), (scheduled, Scheduled)]
    );
    let other = JobQuery {
        queue: Some("other".into()),
        ..JobQuery::default()
    };
    assert!(list(&fx, other).await.is_empty());

    // Paging, both ways.
    let newest = all.iter().rev().copied().collect::<Vec<_>>();
    assert_eq!(all_pages(&fx, 4, false).await, newest);
    assert_eq!(all_pages(&fx, 3, true).await, all);

    let mut conn = fx.conn().await;
    let bad = [
        JobQuery {
            group: Some("a".into()),
            ..JobQuery::default()
        },
        JobQuery {
            limit: Some(0),
            ..JobQuery::default()
        },
    ];
    for query in bad {
        let result = admin::jobs(&mut conn, &query).await;
        assert!(
            matches!(result, Err(Error::InvalidArgument(_))),
            "{query:?}: {result:?}"
        );
    }

    // The failed job: payload, error, its attempt.
    let detail = admin::job(&mut conn, a[1]).await.unwrap().expect("job a1");
    assert_eq!(
        detail.payload,
        serde_json::to_value(fx.job(1, Mode::Ok)).unwrap()
    );
    let s = &detail.summary;
    assert_eq!(
        (s.id, s.queue.as_str(), s.group.as_deref()),
        (a[1], QUEUE, Some("a"))
    );
    assert_eq!((s.kind.as_str(), s.status), ("AdminJob", Failed));
    assert_eq!((s.attempts, s.max_attempts), (1, 1));
    assert!(
        s.last_error
            .as_deref()
            .unwrap_or_default()
            .contains("seq 1 is broken"),
        "{s:?}"
    );
    assert!(s.finished_at.is_some() && s.created_at <= SystemTime::now());
    assert!(!detail.is_head);
    assert_eq!(detail.attempt_log.len(), 1, "{detail:?}");
    let attempt = &detail.attempt_log[0];
    assert_eq!(attempt.attempt, 1);
    assert!(
        !attempt.runner.is_empty() && attempt.finished_at.is_some(),
        "{attempt:?}"
    );
    assert!(
        attempt
            .error
            .as_deref()
            .unwrap_or_default()
            .contains("seq 1 is broken"),
        "{attempt:?}"
    );

    // A succeeded job: one attempt without an error.
    let detail = admin::job(&mut conn, a[0]).await.unwrap().expect("job a0");
    assert_eq!((detail.summary.status, detail.is_head), (Succeeded, false));
    assert_eq!(detail.attempt_log.len(), 1);
    assert_eq!(detail.attempt_log[0].error, None);

    // The scheduled head of c, and the job behind it.
    let detail = admin::job(&mut conn, scheduled)
        .await
        .unwrap()
        .expect("scheduled");
    assert_eq!((detail.summary.status, detail.is_head), (Scheduled, true));
    assert!(detail.attempt_log.is_empty());
    assert!(detail.summary.run_after > SystemTime::now() + Duration::from_secs(3000));
    let detail = admin::job(&mut conn, behind)
        .await
        .unwrap()
        .expect("behind");
    assert_eq!((detail.summary.status, detail.is_head), (Queued, false));

    let missing = d[1] + 1_000;
    assert_eq!(admin::job(&mut conn, missing).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reports_running_jobs_and_live_runners_from_heartbeats() {
    let fx = Fx::new().await;
    let held = fx.push("r", 0, Mode::Hold).await;
    let runner = fx.runner().await;
    fx.gate().wait_started(1).await;
    let mut conn = fx.conn().await;
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let s = admin::queue_status(&mut conn, QUEUE, 3).await.unwrap();
        if (s.running, s.runners) == (1, 1) {
            assert_eq!(s.queued, exact(0), "the running job is not queued: {s:?}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no heartbeat reported the running job within {LIMIT:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    fx.release(1);
    fx.wait_state(&[held], "succeeded").await;
    runner.shutdown().await.unwrap();
    let s = admin::queue_status(&mut conn, QUEUE, 3).await.unwrap();
    assert_eq!(
        (s.running, s.runners),
        (0, 0),
        "a stopped runner is gone: {s:?}"
    );
}

/// The oldest head's age counts heads still to run: a group left active on
/// its finished head (for a pick to move on, or released from a hold while
/// an enqueue was in flight) is not work waiting since that job's enqueue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_leave_out_finished_heads() {
    let db = pgfifo_tests::TestDb::new().await;
    let queue = "finished_head";
    let id = db
        .scalar(&format!(
            "(pgfifo.enqueue(ARRAY['{queue}'], ARRAY['g'], ARRAY['k'], ARRAY['{{}}'::jsonb], \
                             ARRAY[0::smallint], ARRAY[3], ARRAY[NULL::text], NULL, NULL))[1]"
        ))
        .await;
    db.scalar(&format!(
        "(SELECT promoted FROM pgfifo.promote(ARRAY['{queue}'], 100))"
    ))
    .await;
    let mut conn = db.direct().await;
    let age = |gauges: Vec<pgfifo::admin::QueueGauges>| gauges[0].oldest_head_age;
    let before = age(admin::gauges(&mut conn, &[queue.to_owned()]).await.unwrap());
    assert!(before.is_some(), "the head waits");
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'succeeded', finished_at = now() WHERE id = {id}"
    ))
    .await;
    let after = age(admin::gauges(&mut conn, &[queue.to_owned()]).await.unwrap());
    assert_eq!(after, None, "a finished head counted as waiting");
}

/// `pgfifo.group_row`, which the distributed layout's listings read each
/// group with, says what the plain listing says of every group.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_row_agrees_with_the_plain_listing() {
    let fx = Fx::new().await;
    status_fixture(&fx).await;
    let mut conn = fx.conn().await;
    let groups = admin::groups(&mut conn, QUEUE, &GroupQuery::default())
        .await
        .unwrap();
    assert!(groups.len() >= 5, "{groups:?}");
    for g in &groups {
        let listed = format!(
            "{:?}|{}|{:?}|{:?}|{:?}|{}|{}|{}|{}",
            g.head,
            g.backlog,
            g.head_attempts,
            g.head_max_attempts,
            g.head_error,
            g.paused_at.is_some(),
            g.snoozed_until.is_some(),
            g.concurrency,
            g.weight
        );
        let read = fx
            .text(&format!(
                "SELECT format('%s|%s|%s|%s|%s|%s|%s|%s|%s',
                               CASE WHEN head_id IS NULL THEN 'None' ELSE 'Some(' || head_id || ')' END,
                               backlog,
                               CASE WHEN head_attempts IS NULL THEN 'None'
                                    ELSE 'Some(' || head_attempts || ')' END,
                               CASE WHEN head_max_attempts IS NULL THEN 'None'
                                    ELSE 'Some(' || head_max_attempts || ')' END,
                               CASE WHEN head_error IS NULL THEN 'None'
                                    ELSE 'Some(' || to_json(head_error)::text || ')' END,
                               (paused_at_us IS NOT NULL)::text, (snoozed_until_us IS NOT NULL)::text,
                               concurrency, weight)
                 FROM pgfifo.group_row('{QUEUE}', '{}')",
                g.group
            ))
            .await
            .unwrap();
        assert_eq!(read, listed, "group {}", g.group);
    }
}
