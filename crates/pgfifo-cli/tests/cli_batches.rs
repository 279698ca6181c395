//! `pgfifo batches` and `pgfifo batch show ID`, run as an operator would,
//! on a batch whose jobs wait (no runner): its counts, jobs and callbacks,
//! after an operator cancels one job; an unknown id and a bad limit.

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use pgfifo::{Batch, EnqueueOptions, NewJob};
use pgfifo_tests::TestDb;

use support::{pgfifo, CliJob};

fn job(n: i64) -> NewJob {
    NewJob::new(&CliJob { n }, EnqueueOptions::group("tenant-1")).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_listed_and_shown_with_their_counts_jobs_and_callbacks() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let empty = pgfifo(Some(url), &["batches"]).expect(0).stdout;
    assert!(empty.starts_with("no batches"), "{empty}");

    let mut conn = db.conn().await;
    let batch = Batch::new()
        .description("month <end> & close")
        .on_complete(job(99))
        .enqueue(&mut conn, [job(1), job(2)])
        .await
        .unwrap();
    // The second job is not its group's head: an operator may cancel it.
    pgfifo::admin::cancel_job(&mut conn, batch.job_ids[1], None)
        .await
        .unwrap();

    let listed = pgfifo(Some(url), &["batches", "--json"]).expect(0).json();
    let b = &listed[0];
    assert_eq!(b["id"], batch.id, "{listed}");
    assert_eq!(b["state"], "running");
    assert_eq!(
        (
            b["total"].as_i64(),
            b["cancelled"].as_i64(),
            b["pending"].as_i64()
        ),
        (Some(2), Some(1), Some(1))
    );
    let table = pgfifo(Some(url), &["batches"]).expect(0).stdout;
    assert!(
        table.contains("PENDING") && table.contains("month <end> & close"),
        "{table}"
    );
    let unfinished = pgfifo(Some(url), &["batches", "--unfinished", "--json"])
        .expect(0)
        .json();
    assert_eq!(unfinished.as_array().unwrap().len(), 1);

    let id = batch.id.to_string();
    let shown = pgfifo(Some(url), &["batch", "show", &id]).expect(0).stdout;
    assert!(
        shown.contains("2 in all: 0 succeeded, 0 failed, 1 cancelled, 1 pending"),
        "{shown}"
    );
    assert!(
        shown.contains("complete") && shown.contains("not fired"),
        "{shown}"
    );
    assert!(
        shown.contains(&batch.job_ids[1].to_string()) && shown.contains("cancelled"),
        "{shown}"
    );
    let json = pgfifo(Some(url), &["batch", "show", &id, "--json"])
        .expect(0)
        .json();
    assert_eq!(json["jobs"].as_array().unwrap().len(), 2, "{json}");
    assert_eq!(json["callbacks"][0]["event"], "complete");

    let missing = pgfifo(Some(url), &["batch", "show", "999999"]).expect(1);
    assert!(
        missing.stderr.contains("no batch has id 999999"),
        "{}",
        missing.stderr
    );
    pgfifo(Some(url), &["batch", "show", "0"]).expect(2);
    let bad = pgfifo(Some(url), &["batches", "--limit", "5000"]).expect(2);
    assert!(bad.stderr.contains("limit"), "{}", bad.stderr);
}
