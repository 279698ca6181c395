//! The `pgfifo` binary through PgBouncer (a private instance, see
//! `pgfifo_tests::pgbouncer`): in transaction mode with
//! `--transaction-pooler` (or `PGFIFO_TRANSACTION_POOLER=1`) or a URL that
//! says `pgbouncer=true`, and in session mode as it is; and with a
//! multi-host URL whose first host refuses connections.

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use pgfifo_tests::pgbouncer::PgBouncer;
use pgfifo_tests::TestDb;
use support::{enqueue, pgfifo, QUEUE};

/// Reads and writes through `url` with `flags`: status, groups, pause and
/// resume of a group, migrate status.
fn commands_work(url: &str, flags: &[&str]) {
    let run = |args: &[&str]| {
        let all: Vec<&str> = flags.iter().chain(args).copied().collect();
        pgfifo(Some(url), &all)
    };
    let status = run(&["status", "--json"]).expect(0).json();
    assert_eq!(status[0]["queue"], QUEUE, "{status}");
    run(&["pause", "--queue", QUEUE, "--group", "a"]).expect(0);
    let groups = run(&["groups", "--queue", QUEUE, "--json"])
        .expect(0)
        .json();
    let a = groups
        .as_array()
        .unwrap_or_else(|| panic!("groups: {groups}"))
        .iter()
        .find(|g| g["group"] == "a")
        .unwrap_or_else(|| panic!("no group a in {groups}"));
    assert_eq!(a["state"], "paused", "{groups}");
    run(&["resume", "--queue", QUEUE, "--group", "a"]).expect(0);
    let migrations = run(&["migrate", "status", "--json"]).expect(0).json();
    assert!(migrations["migrations"]
        .as_array()
        .unwrap()
        .iter()
        .all(|m| m["applied"] == true));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_work_through_pgbouncer_in_both_modes() {
    let db = TestDb::new().await;
    let Some(bouncer) = PgBouncer::start(&db.name) else {
        return;
    };
    enqueue(&db, QUEUE, &["a", "a", "b"]).await;
    commands_work(&bouncer.transaction_url, &["--transaction-pooler"]);
    // The URL alone: `DATABASE_URL` is enough.
    commands_work(&format!("{}?pgbouncer=true", bouncer.transaction_url), &[]);
    commands_work(&bouncer.session_url, &[]);
    // Several hosts, the first one refusing: the second one answers.
    let multi = db.url.replacen('@', "@127.0.0.1:1,", 1);
    commands_work(&format!("{multi}?target_session_attrs=read-write"), &[]);
    assert!(
        !bouncer.log().contains("does not exist"),
        "{}",
        bouncer.log()
    );
}
