//! A binary whose job registrations conflict: two types share a job name.
//! It is a test target of its own so that the conflict does not poison the
//! registry of the main test binary.
//!
//! Every registry lookup fails with every problem listed: the runner refuses
//! to start before running anything, and enqueueing fails, even for the valid
//! type.

use std::time::Duration;

use pgfifo::{async_trait, EnqueueOptions, Error, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::{test_config, TestDb};
use serde::{Deserialize, Serialize};

/// The first of two types named `registry_dup`.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "registry_dup", queue = "registry_conflicts")]
pub struct RegDupA {
    n: i64,
}

/// The second type named `registry_dup`.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(kind = "registry_dup", queue = "registry_conflicts")]
pub struct RegDupB {
    s: String,
}

/// A valid type with a name of its own.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "registry_conflicts")]
pub struct RegValid {
    n: i64,
}

#[async_trait]
impl Handler for RegDupA {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[async_trait]
impl Handler for RegDupB {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[async_trait]
impl Handler for RegValid {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

/// Checks that `err` lists exactly the duplicate, naming both types.
fn assert_lists_the_duplicate(err: &Error) {
    let Error::InvalidRegistrations(problems) = err else {
        panic!("expected InvalidRegistrations, got {err:?}");
    };
    assert_eq!(problems.len(), 1, "one problem: {problems:?}");
    let problem = &problems[0];
    assert_eq!(problem.kind, "registry_dup");
    let message = err.to_string();
    for needle in ["registry_dup", "RegDupA", "RegDupB"] {
        assert!(
            message.contains(needle),
            "`{needle}` missing from: {message}"
        );
    }
    assert!(
        !message.contains("RegValid"),
        "the valid type is not a problem: {message}"
    );
    // The problem is one of the two types, and names the other.
    let (this, other) = if problem.rust_type.ends_with("RegDupA") {
        ("RegDupA", "RegDupB")
    } else {
        ("RegDupB", "RegDupA")
    };
    assert!(problem.rust_type.ends_with(this), "{problem:?}");
    assert!(problem.problem.contains(other), "{problem:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_refuses_to_start_with_duplicate_names() {
    let db = TestDb::new().await;
    // A stored job of the valid type (written with SQL: the API refuses, see below).
    db.exec(
        "SELECT pgfifo.enqueue(ARRAY['registry_conflicts'], ARRAY['g'], ARRAY['RegValid'],
                               ARRAY['{\"n\": 1}'::jsonb], ARRAY[0::smallint], ARRAY[3],
                               NULL, ARRAY[NULL::bigint], ARRAY[NULL::bigint])",
    )
    .await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued'")
            .await,
        1
    );

    let started = tokio::time::timeout(
        Duration::from_secs(10),
        pgfifo::runner::start(db.pool.clone(), test_config().concurrency(2)),
    )
    .await
    .expect("start returns at once");
    let err = started.expect_err("the runner must not start with conflicting registrations");
    assert_lists_the_duplicate(&err);

    // Serving explicit queues does not get around the check.
    let err = pgfifo::runner::start(
        db.pool.clone(),
        test_config().queues(["registry_conflicts"]),
    )
    .await
    .expect_err("the runner must not start");
    assert_lists_the_duplicate(&err);

    // Nothing ran.
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job_attempt").await,
        0
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job WHERE state = 'queued' AND attempts = 0")
            .await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_fails_with_duplicate_names() {
    let db = TestDb::new().await;
    for err in [
        NewJob::new(&RegValid { n: 1 }, EnqueueOptions::group("g")).unwrap_err(),
        NewJob::new(&RegDupA { n: 1 }, EnqueueOptions::group("g")).unwrap_err(),
        NewJob::new(&RegDupB { s: "x".into() }, EnqueueOptions::ungrouped()).unwrap_err(),
    ] {
        assert_lists_the_duplicate(&err);
    }
    let mut conn = db.conn().await;
    let err = RegValid { n: 1 }.enqueue(&mut conn, "g").await.unwrap_err();
    assert_lists_the_duplicate(&err);
    let err = RegDupA { n: 2 }.enqueue(&mut conn, "g").await.unwrap_err();
    assert_lists_the_duplicate(&err);
    drop(conn);
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job").await,
        0,
        "nothing written"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_group").await,
        0
    );
}
