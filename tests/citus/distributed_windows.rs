//! De-duplication windows on the distributed layout: a window's row on its
//! key's part and its job on the job's group's part (two shards, found
//! apart): 'unique' folds enqueues of its key into the first job,
//! 'throttle' one job per slot, 'debounce' replaces a queued job's payload
//! and moves its start, on its group's shard; the SQL enqueue API's
//! outcomes; what `admin::job` shows of a window; retention.

use std::time::Duration;

use diesel_async::AsyncPgConnection;
use pgfifo::migrate::Layout;
use pgfifo::{enqueue_batch_outcomes, EnqueueOptions, EnqueueOutcome, Enqueued, NewJob};
use pgfifo_tests::query::text;

use crate::coordinator::{cluster_with, count};
use crate::jobs::LogJob;

const HOUR: Duration = Duration::from_secs(3600);

/// A `LogJob` of `group` with sequence `seq` and `options` applied.
fn windowed(
    group: &str,
    seq: i64,
    options: impl FnOnce(EnqueueOptions) -> EnqueueOptions,
) -> NewJob {
    let job = LogJob {
        group: group.to_owned(),
        seq,
        fail_first: false,
        hold_ms: 0,
    };
    NewJob::new(&job, options(EnqueueOptions::group(group))).expect("new job")
}

async fn one(conn: &mut AsyncPgConnection, job: NewJob) -> Enqueued {
    let out = enqueue_batch_outcomes(conn, [job]).await.expect("enqueue");
    assert_eq!(out.len(), 1);
    out[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn dedup_windows_on_the_distributed_layout() {
    let (_cluster, mut conn) = cluster_with(Layout::Distributed).await;

    // A key and a group on different shards, so that each statement must
    // find the window and the job apart.
    let apart = count(
        &mut conn,
        "SELECT count(*) FROM (SELECT get_shard_id_for_distribution_column('pgfifo.job_window',
                                          pgfifo.part_of('citus', 'order-7')) AS w,
                                      get_shard_id_for_distribution_column('pgfifo.job',
                                          pgfifo.part_of('citus', 'g')) AS j) s
         WHERE s.w <> s.j",
    )
    .await;
    assert_eq!(apart, 1, "the key and the group share a shard");

    // Unique: later enqueues of the key, from any group, get the first job.
    let unique = |o: EnqueueOptions| o.unique_for("order-7", HOUR);
    let first = one(&mut conn, windowed("g", 0, unique)).await;
    assert_eq!(first.outcome, EnqueueOutcome::Created);
    let again = one(&mut conn, windowed("other", 1, unique)).await;
    assert_eq!(
        again,
        Enqueued {
            id: first.id,
            outcome: EnqueueOutcome::Deduplicated
        }
    );
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job_window
                 WHERE part = pgfifo.part_of('citus', 'order-7') AND key = 'order-7'
                   AND job_id = {} AND job_part = pgfifo.part_of('citus', 'g')",
                first.id
            )
        )
        .await,
        1,
        "the window on its key's part, naming its job's part"
    );

    // Throttle: one job per aligned slot of a day.
    let throttle = |o: EnqueueOptions| o.throttle("sync-42", 24 * HOUR);
    let slot = one(&mut conn, windowed("t", 0, throttle)).await;
    assert_eq!(slot.outcome, EnqueueOutcome::Created);
    let later = one(&mut conn, windowed("t", 1, throttle)).await;
    assert_eq!(
        later,
        Enqueued {
            id: slot.id,
            outcome: EnqueueOutcome::Throttled
        }
    );

    // Debounce: a queued job gets the newest payload and its start moves,
    // on its group's shard (its head's time with it).
    let debounce = |o: EnqueueOptions| o.debounce("doc-9", HOUR);
    let v1 = one(&mut conn, windowed("d", 1, debounce)).await;
    assert_eq!(v1.outcome, EnqueueOutcome::Created);
    let v2 = one(
        &mut conn,
        windowed("d", 2, |o: EnqueueOptions| o.debounce("doc-9", 2 * HOUR)),
    )
    .await;
    assert_eq!(
        v2,
        Enqueued {
            id: v1.id,
            outcome: EnqueueOutcome::Debounced
        }
    );
    assert_eq!(
        text(
            &mut conn,
            &format!(
                "SELECT payload->>'seq' FROM pgfifo.job WHERE id = {}",
                v1.id
            )
        )
        .await
        .as_deref(),
        Some("2")
    );
    assert_eq!(
        count(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job AS j WHERE j.id = {}
                   AND j.run_after > now() + interval '90 minutes'
                   AND j.run_after = (SELECT w.until FROM pgfifo.job_window AS w
                                      WHERE w.key = 'doc-9')",
                v1.id
            )
        )
        .await,
        1,
        "the start moved to the new quiet period's end, the window's with it"
    );
    assert_eq!(
        count(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id = 'd'"
        )
        .await,
        1
    );

    // What the operator reads of a window.
    let info = pgfifo::admin::job(&mut conn, v1.id)
        .await
        .expect("job")
        .expect("the job");
    let window = info.window.expect("its window");
    assert_eq!(window.key, "doc-9");
    assert!(window.holds, "{window:?}");

    // The SQL enqueue API: a window and the outcomes.
    let sql_first = text(
        &mut conn,
        "SELECT id || ' ' || outcome FROM pgfifo.add_job_outcome(
             kind => 'citus.log', queue => 'citus', group_id => 'sql',
             payload => '{\"group\": \"sql\", \"seq\": 0, \"fail_first\": false, \"hold_ms\": 0}',
             window_key => 'sql-key', window_mode => 'unique', window_period => '1 hour')",
    )
    .await
    .expect("add_job_outcome");
    assert!(sql_first.ends_with(" created"), "{sql_first}");
    let sql_again = text(
        &mut conn,
        "SELECT id || ' ' || outcome FROM pgfifo.add_job_outcome(
             kind => 'citus.log', queue => 'citus', group_id => 'sql',
             payload => '{\"group\": \"sql\", \"seq\": 1, \"fail_first\": false, \"hold_ms\": 0}',
             window_key => 'sql-key', window_mode => 'unique', window_period => '1 hour')",
    )
    .await
    .expect("add_job_outcome");
    assert_eq!(
        sql_again,
        sql_first.replace(" created", " deduplicated"),
        "the second gets the first job"
    );

    // Retention: ended windows go; a debounce window whose job has not
    // started stays, though its time has come.
    diesel_async::RunQueryDsl::execute(
        diesel::sql_query("UPDATE pgfifo.job_window SET until = now() - interval '1 second'"),
        &mut conn,
    )
    .await
    .expect("end the windows");
    assert_eq!(
        pgfifo::admin::clean_windows(&mut conn, 100)
            .await
            .expect("clean"),
        3
    );
    assert_eq!(
        text(
            &mut conn,
            "SELECT string_agg(key, ',') FROM pgfifo.job_window"
        )
        .await
        .as_deref(),
        Some("doc-9")
    );
}
