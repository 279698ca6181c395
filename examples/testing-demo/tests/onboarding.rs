//! The application's jobs under `pgfifo::testing`: a database per test,
//! what was enqueued, drains, a handler called directly, and the order
//! checks. Run with: cargo test -p pgfifo-testing-demo

use pgfifo::diesel::sql_types::{BigInt, Text};
use pgfifo::diesel::QueryableByName;
use pgfifo::diesel_async::{
    AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection,
};
use pgfifo::testing::{
    assert_enqueued, assert_group_ran_in_order, enqueued, enqueued_jobs, Call, Drain, Jobs,
    TestDatabase,
};
use pgfifo::{Job, JobId};
use pgfifo_testing_demo::{CreateAccount, Export, Reminder, SendWelcome, SyncCrm, SCHEMA};

async fn db() -> TestDatabase {
    let db = TestDatabase::new().await.expect("a test database");
    db.connect()
        .await
        .unwrap()
        .batch_execute(SCHEMA)
        .await
        .unwrap();
    db
}

async fn enqueue<J: Job>(db: &TestDatabase, job: J, group: &str) -> JobId {
    let mut conn = db.pool().get().await.unwrap();
    job.enqueue(&mut conn, group).await.unwrap()
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

async fn count(conn: &mut AsyncPgConnection, sql: &str, tenant: &str) -> i64 {
    pgfifo::diesel::sql_query(sql)
        .bind::<Text, _>(tenant)
        .get_result::<Count>(conn)
        .await
        .unwrap()
        .n
}

#[tokio::test]
async fn a_handler_enqueues_the_next_job_of_its_tenant() {
    let db = db().await;
    let first = enqueue(&db, CreateAccount { name: "Ada".into() }, "t1").await;

    // Without recursion the welcome it enqueued stays queued, to assert on.
    let summary = Drain::queue("onboarding").run(db.pool()).await.unwrap();
    assert_eq!(summary.succeeded, 1);
    assert_eq!(summary.order("t1"), vec![first]);
    assert_eq!(summary.left_queued, 1);
    let mut conn = db.connect().await.unwrap();
    assert_enqueued(
        &mut conn,
        &Jobs::all().group("t1").state("queued"),
        &[SendWelcome {
            greeting: "Welcome, Ada!".into(),
        }],
    )
    .await;

    // With recursion it runs too, after its parent, in the same group.
    let summary = Drain::queue("onboarding")
        .with_recursion(true)
        .run(db.pool())
        .await
        .unwrap();
    assert_eq!(summary.kinds("t1"), vec![SendWelcome::KIND]);
    let welcomed = count(
        &mut conn,
        "SELECT count(*) AS n FROM account WHERE tenant = $1 AND welcomed",
        "t1",
    )
    .await;
    assert_eq!(welcomed, 1);
    assert_group_ran_in_order(&mut conn, "onboarding", "t1").await;
}

#[tokio::test]
async fn each_group_runs_in_enqueue_order_one_at_a_time() {
    let db = db().await;
    let mut ids = Vec::new();
    for tenant in ["a", "b", "c"] {
        for n in 0..3 {
            ids.push(
                enqueue(
                    &db,
                    SyncCrm {
                        label: format!("{tenant}{n}"),
                    },
                    tenant,
                )
                .await,
            );
        }
    }
    // Every first attempt fails and waits an hour: without with_scheduled
    // the drain leaves the retries waiting.
    let summary = Drain::queue("crm").run(db.pool()).await.unwrap();
    assert_eq!((summary.retried, summary.succeeded), (3, 0));
    assert_eq!((summary.left_queued, summary.left_scheduled), (9, 3));

    let summary = Drain::queue("crm")
        .with_scheduled(true)
        .run(db.pool())
        .await
        .unwrap();
    summary.assert_fifo();
    assert_eq!(summary.succeeded, 9);
    // Group a: its head's retry first, then its later jobs' two attempts each.
    assert_eq!(
        summary.order("a"),
        vec![ids[0], ids[1], ids[1], ids[2], ids[2]]
    );
    let mut conn = db.connect().await.unwrap();
    for tenant in ["a", "b", "c"] {
        assert_group_ran_in_order(&mut conn, "crm", tenant).await;
    }
    let jobs = enqueued::<SyncCrm>(&mut conn, &Jobs::all().group("a"))
        .await
        .unwrap();
    let attempts: Vec<(u32, &str)> = jobs
        .iter()
        .map(|j| (j.attempts, j.state.as_str()))
        .collect();
    assert_eq!(attempts, vec![(2, "succeeded"); 3]);
}

#[tokio::test]
async fn one_group_drains_alone_and_snooze_and_cancel_follow_pgfifo() {
    let db = db().await;
    let snoozer = enqueue(
        &db,
        Reminder {
            nobody: false,
            snooze_first: true,
        },
        "r1",
    )
    .await;
    let after = enqueue(
        &db,
        Reminder {
            nobody: true,
            snooze_first: false,
        },
        "r1",
    )
    .await;
    let other = enqueue(
        &db,
        Reminder {
            nobody: false,
            snooze_first: false,
        },
        "r2",
    )
    .await;

    let summary = Drain::queue("reminders")
        .group("r1")
        .run(db.pool())
        .await
        .unwrap();
    // Snoozed: the group waits, the job behind it too; r2 is not touched.
    assert_eq!((summary.snoozed, summary.left_queued), (1, 2));
    assert_eq!(summary.order("r1"), vec![snoozer]);
    assert!(summary.order("r2").is_empty());

    let summary = Drain::queue("reminders")
        .group("r1")
        .with_scheduled(true)
        .run(db.pool())
        .await
        .unwrap();
    assert_eq!(summary.order("r1"), vec![snoozer, after]);
    assert_eq!((summary.succeeded, summary.cancelled), (1, 1));
    let mut conn = db.connect().await.unwrap();
    let left = enqueued_jobs(&mut conn, &Jobs::in_queue("reminders").state("queued"))
        .await
        .unwrap();
    assert_eq!(left.iter().map(|j| j.id).collect::<Vec<_>>(), vec![other]);
    // The snoozed attempt did not count.
    let jobs = enqueued::<Reminder>(&mut conn, &Jobs::all().group("r1"))
        .await
        .unwrap();
    assert_eq!(jobs[0].attempts, 1);
}

#[tokio::test]
async fn a_handler_called_directly_writes_in_the_tests_transaction() {
    let db = db().await;
    let mut conn = db.connect().await.unwrap();
    conn.begin_test_transaction().await.unwrap();
    let outcome = Call::new()
        .group("t9")
        .run(
            &mut conn,
            &CreateAccount {
                name: "Grace".into(),
            },
        )
        .await;
    assert_eq!(outcome.unwrap(), Some(serde_json::json!("t9")));
    // Its writes and its enqueue are visible in the transaction...
    let accounts = count(
        &mut conn,
        "SELECT count(*) AS n FROM account WHERE tenant = $1",
        "t9",
    )
    .await;
    assert_eq!(accounts, 1);
    assert_enqueued(
        &mut conn,
        &Jobs::all().group("t9"),
        &[SendWelcome {
            greeting: "Welcome, Grace!".into(),
        }],
    )
    .await;
    // ...and a handler's error comes back as its Result.
    let err = Call::new()
        .run(&mut conn, &CreateAccount { name: "x".into() })
        .await
        .unwrap_err();
    assert!(err.to_string().contains("needs a tenant group"), "{err}");
    drop(conn); // rolled back: nothing was stored
    let mut fresh = db.connect().await.unwrap();
    let jobs = enqueued_jobs(&mut fresh, &Jobs::all()).await.unwrap();
    assert!(jobs.is_empty());
}

#[tokio::test]
async fn bad_input_is_refused_clearly() {
    let db = db().await;
    let err = Drain::queue("").run(db.pool()).await.unwrap_err();
    assert!(err.to_string().contains("queue"), "{err}");
    let err = Drain::queue("crm")
        .max_attempts(0)
        .run(db.pool())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("max_attempts"), "{err}");
    let mut conn = db.connect().await.unwrap();
    let err = enqueued_jobs(&mut conn, &Jobs::all().state("running"))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("unknown job state"), "{err}");
    assert!(Call::new().attempt(0).is_err());
}

#[tokio::test]
async fn the_cap_stops_a_drain_that_would_not_end() {
    let db = db().await;
    for n in 0..3 {
        enqueue(
            &db,
            SyncCrm {
                label: n.to_string(),
            },
            "g",
        )
        .await;
    }
    let err = Drain::queue("crm")
        .with_scheduled(true)
        .max_attempts(2)
        .run(db.pool())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("cap of 2"), "{err}");
}

#[tokio::test]
async fn a_long_job_runs_claimed_and_its_writes_commit_as_they_go() {
    let db = db().await;
    let id = enqueue(
        &db,
        Export {
            name: "march".into(),
        },
        "t1",
    )
    .await;
    let summary = Drain::queue("exports")
        .with_scheduled(true)
        .run(db.pool())
        .await
        .unwrap();
    assert_eq!((summary.retried, summary.succeeded), (1, 1));
    assert_eq!(summary.order("t1"), vec![id, id]);
    // Long mode: the failed first attempt's write was not rolled back.
    let mut conn = db.connect().await.unwrap();
    let steps = count(
        &mut conn,
        "SELECT count(*) AS n FROM export_step WHERE name = $1",
        "march",
    )
    .await;
    assert_eq!(steps, 2);
    // And its claim is gone: no run row is left behind.
    let runs = count(
        &mut conn,
        "SELECT count(*) AS n FROM pgfifo.job_run WHERE queue = $1",
        "exports",
    )
    .await;
    assert_eq!(runs, 0);
}
