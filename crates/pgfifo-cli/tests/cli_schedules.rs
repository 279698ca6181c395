//! `pgfifo schedules` and `pgfifo schedule show|pause|resume|delete`, run
//! as an operator would, against a runner that declares a schedule.

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use std::time::Duration;

use pgfifo::schedule::Schedule;
use pgfifo_tests::{test_config, TestDb};

use support::{pgfifo, CliJob};

fn every_second() -> Schedule {
    Schedule::new("cli-every-second", "* * * * * *", || CliJob { n: 0 }).group("tenant-1")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_listed_paused_resumed_and_deleted_once_stale() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    let empty = pgfifo(Some(url), &["schedules"]).expect(0).stdout;
    assert!(empty.starts_with("no schedules"), "{empty}");

    let runner = db
        .start_runner(test_config().schedule(every_second()))
        .await;
    db.wait_for(
        "SELECT count(*) FROM pgfifo.schedule WHERE last_job_id IS NOT NULL",
        1,
        Duration::from_secs(10),
    )
    .await;

    let listed = pgfifo(Some(url), &["schedules", "--json"]).expect(0).json();
    let s = &listed[0];
    assert_eq!(s["name"], "cli-every-second", "{listed}");
    assert_eq!(s["expression"], "* * * * * *");
    assert_eq!(s["time_zone"], "UTC");
    assert_eq!(s["group"], "tenant-1");
    assert_eq!(s["on_missed"], "run once");
    assert_eq!(s["stale"], false);
    assert_eq!(s["paused"], false);
    assert!(s["next_tick"].as_str().unwrap().ends_with('Z'), "{s}");
    assert!(s["last_job"].as_i64().unwrap() > 0, "{s}");
    let table = pgfifo(Some(url), &["schedules"]).expect(0).stdout;
    assert!(
        table.contains("NAME") && table.contains("cli-every-second"),
        "{table}"
    );
    assert!(table.contains("active"), "{table}");

    let paused = pgfifo(Some(url), &["schedule", "pause", "cli-every-second"]).expect(0);
    assert!(
        paused
            .stdout
            .starts_with("paused schedule cli-every-second"),
        "{}",
        paused.stdout
    );
    let again = pgfifo(
        Some(url),
        &["schedule", "pause", "cli-every-second", "--json"],
    )
    .expect(0)
    .json();
    assert_eq!(
        again,
        serde_json::json!({"schedule": "cli-every-second", "paused": true, "changed": false})
    );
    let json = pgfifo(
        Some(url),
        &["schedule", "show", "cli-every-second", "--json"],
    )
    .expect(0)
    .json();
    assert_eq!(json["name"], "cli-every-second", "{json}");
    let recent = json["recent_ticks"].as_array().expect("recent ticks");
    assert!(!recent.is_empty(), "{json}");
    assert_eq!(recent[0]["job"], json["last_job"], "{json}");
    let shown = pgfifo(Some(url), &["schedule", "show", "cli-every-second"])
        .expect(0)
        .stdout;
    assert!(
        shown.contains("paused") && shown.contains("tenant-1"),
        "{shown}"
    );

    let refused = pgfifo(Some(url), &["schedule", "delete", "cli-every-second"]).expect(1);
    assert!(
        refused.stderr.contains("declared by live runners"),
        "{}",
        refused.stderr
    );
    let resumed = pgfifo(Some(url), &["schedule", "resume", "cli-every-second"]).expect(0);
    assert!(
        resumed.stdout.starts_with("resumed schedule"),
        "{}",
        resumed.stdout
    );

    runner.shutdown().await.unwrap();
    let stale = pgfifo(Some(url), &["schedules", "--json"]).expect(0).json();
    assert_eq!(stale[0]["stale"], true, "{stale}");
    let deleted = pgfifo(Some(url), &["schedule", "delete", "cli-every-second"]).expect(0);
    assert!(
        deleted.stdout.starts_with("deleted schedule"),
        "{}",
        deleted.stdout
    );
    let missing = pgfifo(Some(url), &["schedule", "show", "cli-every-second"]).expect(1);
    assert!(
        missing
            .stderr
            .contains("no schedule named \"cli-every-second\""),
        "{}",
        missing.stderr
    );
}
