//! Bad input at enqueue time: invalid queue and group names, unregistered job
//! types, a transaction that is not READ COMMITTED, out-of-range options.
//! Each is a clear error and writes nothing.

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::{async_trait, EnqueueOptions, Error, Handler, Job, JobContext, JobError, NewJob};
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};

/// A valid, registered job type of this module. It never runs here.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "bad_input", max_attempts = 3)]
pub struct BadInputJob {
    n: i64,
}

#[async_trait]
impl Handler for BadInputJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

/// Implements `Job` by hand: no derive, so it is not registered.
#[derive(Serialize, Deserialize, Debug)]
pub struct BadInputUnregistered {
    n: i64,
}

impl Job for BadInputUnregistered {
    const KIND: &'static str = "BadInputUnregistered";
    const QUEUE: &'static str = "bad_input";
    const MAX_ATTEMPTS: u32 = 3;
    const TIMEOUT: Option<Duration> = None;
    const BACKOFF: Duration = Duration::from_millis(10);
    const PRIORITY: i16 = 0;
}

/// Implements `Job` by hand under the name of a registered type: still not
/// registered (the registration belongs to another Rust type).
#[derive(Serialize, Deserialize, Debug)]
pub struct BadInputImpostor {
    n: i64,
}

impl Job for BadInputImpostor {
    const KIND: &'static str = "BadInputJob";
    const QUEUE: &'static str = "bad_input";
    const MAX_ATTEMPTS: u32 = 3;
    const TIMEOUT: Option<Duration> = None;
    const BACKOFF: Duration = Duration::from_millis(10);
    const PRIORITY: i16 = 0;
}

async fn assert_nothing_written(db: &TestDb) {
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.job").await,
        0,
        "no job row"
    );
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_group").await,
        0,
        "no group row"
    );
}

/// Enqueues with `options` through both entry points (the job's `enqueue_with`
/// and `NewJob::new`), checks both fail the same way, and that nothing was
/// written. Returns the error.
async fn rejected(db: &TestDb, options: EnqueueOptions) -> Error {
    let mut conn = db.conn().await;
    let err = BadInputJob { n: 1 }
        .enqueue_with(&mut conn, options.clone())
        .await
        .expect_err("the enqueue must fail");
    let err2 = NewJob::new(&BadInputJob { n: 1 }, options).expect_err("NewJob::new must fail");
    assert_eq!(err.to_string(), err2.to_string());
    drop(conn);
    assert_nothing_written(db).await;
    err
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_queue_name_is_rejected() {
    let db = TestDb::new().await;
    let err = rejected(&db, EnqueueOptions::group("g").queue("")).await;
    match err {
        Error::InvalidQueue { name, reason } => {
            assert_eq!(name, "");
            assert!(reason.contains("empty"), "{reason}");
        }
        other => panic!("expected InvalidQueue, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_queue_name_is_rejected() {
    let db = TestDb::new().await;
    let long = "q".repeat(pgfifo::MAX_QUEUE_LEN + 1);
    assert_eq!(long.len(), 129);
    let err = rejected(&db, EnqueueOptions::group("g").queue(long.clone())).await;
    assert!(
        matches!(&err, Error::InvalidQueue { reason, .. } if reason.contains("128 bytes")),
        "expected InvalidQueue, got {err:?}"
    );
    // Bytes count, not characters: 43 × '€' (3 bytes) = 129 bytes.
    let wide = "€".repeat(43);
    let err = rejected(&db, EnqueueOptions::group("g").queue(wide)).await;
    assert!(matches!(err, Error::InvalidQueue { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_group_name_is_rejected() {
    let db = TestDb::new().await;
    let err = rejected(&db, EnqueueOptions::group("")).await;
    match err {
        Error::InvalidGroup { name, reason } => {
            assert_eq!(name, "");
            assert!(reason.contains("empty"), "{reason}");
        }
        other => panic!("expected InvalidGroup, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_group_name_is_rejected() {
    let db = TestDb::new().await;
    let long = "g".repeat(pgfifo::MAX_GROUP_LEN + 1);
    assert_eq!(long.len(), 257);
    let err = rejected(&db, EnqueueOptions::group(long)).await;
    assert!(
        matches!(&err, Error::InvalidGroup { reason, .. } if reason.contains("256 bytes")),
        "expected InvalidGroup, got {err:?}"
    );
    // 86 × '€' = 258 bytes in 86 characters.
    let err = rejected(&db, EnqueueOptions::group("€".repeat(86))).await;
    assert!(matches!(err, Error::InvalidGroup { .. }), "{err:?}");
    // A NUL cannot be stored in a PostgreSQL text value.
    let err = rejected(&db, EnqueueOptions::group("a\0b")).await;
    assert!(matches!(err, Error::InvalidGroup { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_at_the_limits_are_accepted() {
    let db = TestDb::new().await;
    let queue = "q".repeat(pgfifo::MAX_QUEUE_LEN);
    let group = "€".repeat(85) + "g"; // 256 bytes
    assert_eq!(group.len(), 256);
    let mut conn = db.conn().await;
    let id = BadInputJob { n: 1 }
        .enqueue_with(
            &mut conn,
            EnqueueOptions::group(group.clone()).queue(queue.clone()),
        )
        .await
        .unwrap();
    drop(conn);
    assert_eq!(
        db.text(&format!("SELECT queue FROM pgfifo.job WHERE id = {id}"))
            .await,
        Some(queue)
    );
    assert_eq!(
        db.text(&format!("SELECT group_id FROM pgfifo.job WHERE id = {id}"))
            .await,
        Some(group)
    );
    db.exec("SELECT pgfifo.promote(ARRAY[repeat('q', 128)], 1000)")
        .await;
    assert_eq!(
        db.scalar("SELECT count(*) FROM pgfifo.queue_group").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_job_type_is_rejected() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let err = BadInputUnregistered { n: 1 }
        .enqueue(&mut conn, "g")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownJobType(name) if name == "BadInputUnregistered"),
        "expected UnknownJobType, got {err:?}"
    );
    let err = NewJob::new(&BadInputUnregistered { n: 1 }, EnqueueOptions::ungrouped()).unwrap_err();
    assert!(matches!(err, Error::UnknownJobType(_)), "{err:?}");

    // Borrowing a registered type's name does not make a type registered.
    let err = BadInputImpostor { n: 1 }
        .enqueue(&mut conn, "g")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownJobType(name) if name == "BadInputJob"),
        "expected UnknownJobType, got {err:?}"
    );
    drop(conn);
    assert_nothing_written(&db).await;
}

/// Sets the session's default isolation level on a connection of its own.
async fn session_at(db: &TestDb, level: &str) -> AsyncPgConnection {
    let mut conn = db.direct().await;
    conn.batch_execute(&format!(
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL {level}"
    ))
    .await
    .unwrap();
    conn
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_outside_read_committed_is_rejected() {
    let db = TestDb::new().await;
    let mut conn = db.direct().await;

    // Inside an explicit REPEATABLE READ transaction.
    let err = conn
        .build_transaction()
        .repeatable_read()
        .run(async |c| BadInputJob { n: 1 }.enqueue(c, "g").await)
        .await
        .unwrap_err();
    match &err {
        Error::IsolationLevel(found) => assert_eq!(found, "repeatable read"),
        other => panic!("expected IsolationLevel, got {other:?}"),
    }
    let err = conn
        .build_transaction()
        .serializable()
        .run(async |c| BadInputJob { n: 1 }.enqueue(c, "g").await)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::IsolationLevel(found) if found == "serializable"),
        "{err:?}"
    );

    // In autocommit with a REPEATABLE READ session default: rejected, and
    // nothing was written (there is no transaction to roll back here).
    let mut rr = session_at(&db, "REPEATABLE READ").await;
    let err = BadInputJob { n: 1 }
        .enqueue(&mut rr, "g")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::IsolationLevel(found) if found == "repeatable read"),
        "{err:?}"
    );
    assert_nothing_written(&db).await;

    // The same connection works again at READ COMMITTED.
    rr.batch_execute("SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .await
        .unwrap();
    BadInputJob { n: 1 }.enqueue(&mut rr, "g").await.unwrap();
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_attempts_zero_is_rejected() {
    let db = TestDb::new().await;
    let err = rejected(&db, EnqueueOptions::group("g").max_attempts(0)).await;
    match err {
        Error::InvalidOption(message) => assert!(message.contains("max_attempts"), "{message}"),
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    let err = rejected(&db, EnqueueOptions::ungrouped().max_attempts(0)).await;
    assert!(matches!(err, Error::InvalidOption(_)), "{err:?}");
    // Beyond the column's range.
    let err = rejected(&db, EnqueueOptions::group("g").max_attempts(u32::MAX)).await;
    assert!(matches!(err, Error::InvalidOption(_)), "{err:?}");
}

/// A job whose payload has free text, for the NUL test.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "bad_input")]
pub struct BadInputText {
    lines: Vec<String>,
}

#[async_trait]
impl Handler for BadInputText {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nul_character_in_a_payload_or_unique_key_is_named_not_sent() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let job = BadInputText {
        lines: vec!["fine".into(), "a\u{0}b".into()],
    };
    let err = job
        .clone()
        .enqueue(&mut conn, "g")
        .await
        .expect_err("PostgreSQL cannot store it");
    match &err {
        Error::InvalidOption(message) => {
            assert!(message.contains("NUL"), "{message}");
            assert!(
                message.contains("$.lines[1]"),
                "the field is named: {message}"
            );
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    let batch = NewJob::new(&job, EnqueueOptions::group("g")).expect_err("NewJob::new too");
    assert_eq!(batch.to_string(), err.to_string());
    drop(conn);
    let err = rejected(&db, EnqueueOptions::group("g").unique_key("k\u{0}")).await;
    match err {
        Error::InvalidOption(message) => {
            assert!(
                message.contains("unique_key") && message.contains("NUL"),
                "{message}"
            )
        }
        other => panic!("expected InvalidOption, got {other:?}"),
    }
    assert_nothing_written(&db).await;
}
