//! `pgfifo queue set|reset|limits` (docs/queue-limits.md), run as an
//! operator would, against a database of its own per test; `pgfifo status`
//! shows what they set.

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use pgfifo_tests::TestDb;
use serde_json::{json, Value};

use support::{pgfifo, QUEUE};

/// `pgfifo queue limits cli --json`.
fn limits(url: &str) -> Value {
    pgfifo(Some(url), &["queue", "limits", QUEUE, "--json"])
        .expect(0)
        .json()
}

#[tokio::test]
async fn set_changes_only_the_limits_given_and_reset_removes_them() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let set = |args: &[&str]| pgfifo(Some(url), &[&["queue", "set", QUEUE], args].concat());

    let first = set(&["--concurrency", "20", "--rate", "100/m"])
        .expect(0)
        .stdout;
    assert_eq!(
        first,
        "queue cli:\n\
         concurrency:  20\n\
         rate:         100/m\n\
         burst:        - (the rate's count)\n"
    );
    // Only the limits given change; `none` clears one.
    set(&["--burst", "10"]).expect(0);
    let cleared = set(&["--concurrency", "none", "--json"]).expect(0).json();
    assert_eq!(
        cleared,
        json!({"queue": "cli", "concurrency": null, "rate": "100/m", "burst": 10})
    );
    // What the library reads back is what the command set.
    let mut conn = db.conn().await;
    let now = pgfifo::admin::queue_limits(&mut conn, QUEUE)
        .await
        .unwrap()
        .expect("limits set");
    assert_eq!((now.concurrency, now.burst), (None, Some(10)));
    assert_eq!(now.rate.map(|r| r.to_string()).as_deref(), Some("100/m"));

    let reset = pgfifo(Some(url), &["queue", "reset", QUEUE]).expect(0);
    assert_eq!(reset.stdout, "queue cli: limits removed\n");
    assert_eq!(
        limits(url),
        json!({"queue": "cli", "concurrency": null, "rate": null, "burst": null})
    );
    let again = pgfifo(Some(url), &["queue", "reset", QUEUE]).expect(0);
    assert_eq!(again.stdout, "queue cli had no limits\n");
}

#[tokio::test]
async fn bad_values_name_the_limit_and_change_nothing() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    pgfifo(Some(url), &["queue", "set", QUEUE, "--concurrency", "3"]).expect(0);
    let before = limits(url);
    let cases: &[(&[&str], &str)] = &[
        (
            &["--concurrency", "0"],
            "concurrency: 0 is outside 1 to 10000",
        ),
        (&["--concurrency", "10001"], "concurrency: 10001 is outside"),
        (&["--rate", "0/s"], "rate: 0 starts per period"),
        (&["--burst", "-1"], "burst: -1 is outside"),
        // A burst without a rate is refused by the library, writing nothing.
        (&["--concurrency", "5", "--burst", "4"], "burst"),
        (&[], "the following required arguments were not provided"),
    ];
    for (args, expected) in cases {
        let run = pgfifo(Some(url), &[&["queue", "set", QUEUE], *args].concat()).expect(2);
        assert!(
            run.stderr.starts_with("error: ") && run.stderr.contains(expected),
            "{args:?}: {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
    }
    assert_eq!(limits(url), before, "nothing changed");
}

/// `pgfifo groups` shows the queue's limits above its groups, and beside
/// each ready group the reason it waits for its queue: every slot held
/// (here by a session holding slot 0's lock, as a runner's lane does while
/// it runs the queue's jobs), or an empty bucket. Once the slot is free,
/// the reason is gone.
#[tokio::test]
async fn groups_say_when_they_wait_for_the_queue() {
    use pgfifo::diesel_async::SimpleAsyncConnection;

    let db = TestDb::new().await;
    let url = db.url.as_str();
    support::enqueue(&db, QUEUE, &["a", "b"]).await;
    pgfifo(Some(url), &["queue", "set", QUEUE, "--concurrency", "1"]).expect(0);
    let groups = || {
        pgfifo(Some(url), &["groups", "--queue", QUEUE])
            .expect(0)
            .stdout
    };

    let free = groups();
    assert!(
        free.starts_with("queue cli: 1 at once (0 running)\n\n"),
        "{free}"
    );
    assert!(!free.contains("waiting:"), "{free}");

    let mut lane = db.direct().await;
    lane.batch_execute("SELECT pg_advisory_lock(1885824625, pgfifo.queue_slot_key('cli', 0))")
        .await
        .unwrap();
    let full = groups();
    assert!(
        full.starts_with("queue cli: 1 at once (1 running, at its limit)\n\n"),
        "{full}"
    );
    let reasons = full
        .lines()
        .filter(|l| {
            l.contains("ready") && l.ends_with("waiting: the queue is at its limit of 1 running")
        })
        .count();
    assert_eq!(reasons, 2, "{full}");
    let json = pgfifo(Some(url), &["groups", "--queue", QUEUE, "--json"])
        .expect(0)
        .json();
    assert_eq!(
        json[0]["queue_wait"],
        json!({"kind": "concurrency", "limit": 1, "running": 1})
    );
    drop(lane);

    // A rate whose bucket is empty (a start took its only token).
    pgfifo(
        Some(url),
        &[
            "queue",
            "set",
            QUEUE,
            "--concurrency",
            "none",
            "--rate",
            "1/h",
            "--burst",
            "1",
        ],
    )
    .expect(0);
    db.exec(
        "SELECT pgfifo.take_queue_tokens(ARRAY(SELECT min(id) FROM pgfifo.job), clock_timestamp())",
    )
    .await;
    let empty = groups();
    assert!(
        empty.starts_with("queue cli: 1/h, burst 1 (0.0 tokens, next at "),
        "{empty}"
    );
    assert!(
        empty.contains("waiting: the queue's rate (1/h, burst 1) has no token left; next at "),
        "{empty}"
    );
    let json = pgfifo(Some(url), &["groups", "--queue", QUEUE, "--json"])
        .expect(0)
        .json();
    assert_eq!(json[1]["queue_wait"]["kind"], "rate");
    assert_eq!(json[1]["queue_wait"]["rate"], "1/h");
}
