//! The `pgfifo` binary run as an operator would, against a database of its
//! own per test (`pgfifo_tests::TestDb`, or an empty one for migrations).

mod support;

use pgfifo_tests::TestDb;
use serde_json::Value;

use support::{enqueue, fail, pgfifo, FreshDb, QUEUE};

/// `migrate status --json` as (version, applied) pairs.
fn migrations(url: &str) -> Vec<(i64, bool)> {
    pgfifo(Some(url), &["migrate", "status", "--json"])
        .expect(0)
        .json()["migrations"]
        .as_array()
        .expect("array")
        .iter()
        .map(|m| {
            (
                m["version"].as_i64().unwrap(),
                m["applied"].as_bool().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn migrate_status_up_down_round_trip_on_an_empty_database() {
    let db = FreshDb::new("cli").await;
    let url = db.url.as_str();
    let latest = pgfifo::migrate::latest_version();
    let all = |applied: bool| (1..=latest).map(|v| (v, applied)).collect::<Vec<_>>();

    assert_eq!(migrations(url), all(false));
    let text = pgfifo(Some(url), &["migrate", "status"]).expect(0).stdout;
    assert!(
        text.contains("pending migrations: run `pgfifo migrate up`"),
        "{text}"
    );

    let up = pgfifo(Some(url), &["migrate", "up"]).expect(0).stdout;
    assert!(up.contains("applied:") && up.contains("init"), "{up}");
    assert_eq!(migrations(url), all(true));
    let again = pgfifo(Some(url), &["migrate", "up", "--json"])
        .expect(0)
        .json();
    assert_eq!(again["migrations"], serde_json::json!([]));

    let too_many = (latest + 1).to_string();
    let refused = pgfifo(Some(url), &["migrate", "down", &too_many]).expect(1);
    assert!(
        refused.stderr.contains("nothing was reverted"),
        "{}",
        refused.stderr
    );
    assert_eq!(migrations(url), all(true));

    let down = pgfifo(Some(url), &["migrate", "down", "1", "--json"])
        .expect(0)
        .json();
    assert_eq!(down["action"], "reverted");
    assert_eq!(down["migrations"][0]["version"], latest);
    let mut expected = all(true);
    expected.last_mut().unwrap().1 = false;
    assert_eq!(migrations(url), expected);

    pgfifo(Some(url), &["migrate", "down", &(latest - 1).to_string()]).expect(0);
    assert_eq!(migrations(url), all(false));
    pgfifo(Some(url), &["migrate", "down", "0"]).expect(2);

    pgfifo(Some(url), &["migrate", "up"]).expect(0);
    assert_eq!(migrations(url), all(true));
    drop(db);
}

#[tokio::test]
async fn status_json_counts_enqueued_jobs() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, QUEUE, &["a", "a", "a", "b", "b"]).await;
    enqueue(&db, "cli-other", &["x"]).await;
    fail(&db, &ids[4..]).await;

    let all = pgfifo(Some(&db.url), &["status", "--json"])
        .expect(0)
        .json();
    let queues: Vec<&str> = all
        .as_array()
        .expect("an array of queues")
        .iter()
        .map(|q| q["queue"].as_str().unwrap())
        .collect();
    assert_eq!(queues, ["cli", "cli-other"]);

    let one = pgfifo(
        Some(&db.url),
        &["status", "--queue", QUEUE, "--top", "1", "--json"],
    )
    .expect(0)
    .json();
    let q = &one[0];
    assert_eq!(one.as_array().unwrap().len(), 1);
    assert_eq!(q["queue"], QUEUE);
    assert_eq!(q["queued"], serde_json::json!({"value": 4, "exact": true}));
    assert_eq!(q["failed"], serde_json::json!({"value": 1, "exact": true}));
    assert_eq!(
        q["retrying"],
        serde_json::json!({"value": 0, "exact": true})
    );
    assert_eq!(q["running"], 0);
    // Succeeded and cancelled jobs are only estimated, and not before the
    // job table was first analyzed (a fresh test database never was).
    assert_eq!(q["succeeded"], Value::Null);
    assert_eq!(q["cancelled"], Value::Null);
    assert!(q["oldest_queued_age_secs"].as_f64().unwrap() >= 0.0);
    assert_eq!(
        q["blocked_groups"],
        serde_json::json!({"paused": 0, "held": 0, "retrying": 0, "snoozed": 0})
    );
    assert_eq!(q["paused"], false);
    assert_eq!(q["failure_policy"], "continue");
    assert_eq!(q["runners"], 0);
    assert_eq!(
        q["largest_backlogs"],
        serde_json::json!([{"group": "a", "backlog": 3}])
    );

    let text = pgfifo(Some(&db.url), &["status", "--queue", QUEUE])
        .expect(0)
        .stdout;
    assert!(text.contains("largest backlogs"), "{text}");
    assert!(text.contains("? not estimated yet"), "{text}");
    assert!(!text.contains("~ marks an estimate"), "{text}");

    db.exec("ANALYZE pgfifo.job").await;
    let after = pgfifo(Some(&db.url), &["status", "--queue", QUEUE, "--json"])
        .expect(0)
        .json();
    assert_eq!(after[0]["succeeded"]["exact"], false, "{after}");
    assert_eq!(after[0]["cancelled"]["exact"], false, "{after}");
    let text = pgfifo(Some(&db.url), &["status", "--queue", QUEUE])
        .expect(0)
        .stdout;
    assert!(text.contains("~ marks an estimate"), "{text}");
    assert!(!text.contains("? not estimated yet"), "{text}");
}

#[tokio::test]
async fn groups_show_why_a_group_is_blocked() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, QUEUE, &["a", "b", "b", "c", "d"]).await;
    pgfifo(Some(&db.url), &["pause", "--queue", QUEUE, "--group", "b"]).expect(0);
    // c: held at its failed head; d: its head waits for a retry. As a
    // runner leaves them.
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'failed', finished_at = now(), attempts = 3,
                last_error = 'card declined' WHERE id = {c};
         UPDATE pgfifo.queue_group SET ready_at = NULL WHERE queue = 'cli' AND group_id = 'c';
         UPDATE pgfifo.job SET attempts = 1, run_after = now() + interval '1 hour',
                last_error = 'timeout\nat line 2' WHERE id = {d};
         UPDATE pgfifo.queue_group SET ready_at = now() + interval '1 hour'
         WHERE queue = 'cli' AND group_id = 'd';",
        c = ids[3],
        d = ids[4],
    ))
    .await;

    let text = pgfifo(Some(&db.url), &["groups", "--queue", QUEUE])
        .expect(0)
        .stdout;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].starts_with("GROUP") && lines[0].contains("DETAIL"),
        "{text}"
    );
    assert!(
        lines[1].starts_with("a ") && lines[1].contains("ready"),
        "{text}"
    );
    assert!(
        lines[2].starts_with("b ") && lines[2].contains("paused since 20"),
        "{text}"
    );
    let held = format!("held: head {} failed: card declined", ids[3]);
    assert!(
        lines[3].starts_with("c ") && lines[3].ends_with(&held),
        "{text}"
    );
    assert!(
        lines[4].starts_with("d ") && lines[4].contains("retrying until 20"),
        "{text}"
    );
    assert!(lines[4].ends_with(": timeout…"), "{text}");

    let blocked = pgfifo(
        Some(&db.url),
        &["groups", "--queue", QUEUE, "--blocked", "--json"],
    )
    .expect(0)
    .json();
    let states: Vec<(&str, &str)> = blocked
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["group"].as_str().unwrap(), g["state"].as_str().unwrap()))
        .collect();
    assert_eq!(states, [("b", "paused"), ("c", "held"), ("d", "retrying")]);
    assert_eq!(blocked[0]["backlog"], 2);

    let page = pgfifo(Some(&db.url), &["groups", "--queue", QUEUE, "--limit", "2"]).expect(0);
    assert!(
        page.stdout.ends_with("more may follow: --after \"b\"\n"),
        "{}",
        page.stdout
    );
    let rest = pgfifo(
        Some(&db.url),
        &["groups", "--queue", QUEUE, "--after", "b", "--json"],
    );
    assert_eq!(rest.expect(0).json().as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn pause_and_resume_a_group() {
    let db = TestDb::new().await;
    enqueue(&db, QUEUE, &["a"]).await;
    let paused = "SELECT count(*) FROM pgfifo.group_pause WHERE queue = 'cli' AND group_id = 'a'";
    let args = |verb: &'static str| [verb, "--queue", QUEUE, "--group", "a"];

    let out = pgfifo(Some(&db.url), &args("pause")).expect(0).stdout;
    assert_eq!(out.trim(), "paused group a of queue cli");
    assert_eq!(db.scalar(paused).await, 1);
    let again = pgfifo(Some(&db.url), &[&args("pause")[..], &["--json"]].concat())
        .expect(0)
        .json();
    assert_eq!(
        again,
        serde_json::json!({"queue": "cli", "group": "a", "paused": true, "changed": false})
    );

    let out = pgfifo(Some(&db.url), &args("resume")).expect(0).stdout;
    assert_eq!(out.trim(), "resumed group a of queue cli");
    assert_eq!(db.scalar(paused).await, 0);
    let out = pgfifo(Some(&db.url), &args("resume")).expect(0).stdout;
    assert_eq!(out.trim(), "group a of queue cli was not paused");
    let none = pgfifo(Some(&db.url), &["groups", "--queue", QUEUE, "--blocked"]).expect(0);
    assert_eq!(none.stdout.trim(), "no blocked groups in queue cli");
}

#[tokio::test]
async fn job_shows_one_job_and_a_missing_id_exits_1() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, QUEUE, &["a"]).await;

    let missing = pgfifo(Some(&db.url), &["job", "999999"]).expect(1);
    assert_eq!(missing.stderr.trim(), "error: no job with id 999999");
    assert!(missing.stdout.is_empty(), "{}", missing.stdout);

    let id = ids[0].to_string();
    let text = pgfifo(Some(&db.url), &["job", &id]).expect(0).stdout;
    assert!(text.starts_with(&format!("id:          {id}\n")), "{text}");
    assert!(text.contains("status:      queued"), "{text}");
    assert!(text.contains("payload:\n  {\n    \"n\": 0\n  }"), "{text}");
    assert!(text.contains("attempts: none recorded"), "{text}");
    let json = pgfifo(Some(&db.url), &["job", &id, "--json"])
        .expect(0)
        .json();
    assert_eq!(json["id"], ids[0]);
    assert_eq!(json["payload"], serde_json::json!({"n": 0}));
    assert_eq!(json["attempt_log"], serde_json::json!([]));

    let listed = pgfifo(Some(&db.url), &["jobs", "--queue", QUEUE, "--json"])
        .expect(0)
        .json();
    assert_eq!(listed[0]["id"], ids[0]);
}

#[tokio::test]
async fn retry_puts_failed_jobs_back() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, QUEUE, &["a", "a", "a"]).await;
    fail(&db, &ids[1..]).await;

    let by_id = pgfifo(Some(&db.url), &["retry", &ids[1].to_string(), "999999"]).expect(0);
    assert!(by_id.stdout.contains("retried 1 of 2"), "{}", by_id.stdout);
    assert!(by_id.stdout.contains("999999  missing"), "{}", by_id.stdout);
    assert_eq!(db.job_state(ids[1]).await, "queued 0");

    let none = pgfifo(Some(&db.url), &["retry", &ids[0].to_string()]).expect(1);
    assert!(
        none.stderr.contains("was not retried: not failed"),
        "{}",
        none.stderr
    );

    let all = pgfifo(
        Some(&db.url),
        &["retry", "--queue", QUEUE, "--failed", "--json"],
    )
    .expect(0)
    .json();
    assert_eq!(
        all,
        serde_json::json!([{"id": ids[2], "result": "retried"}])
    );
    assert_eq!(db.job_state(ids[2]).await, "queued 0");
    let empty = pgfifo(
        Some(&db.url),
        &["retry", "--queue", QUEUE, "--group", "a", "--failed"],
    );
    assert_eq!(
        empty.expect(0).stdout.trim(),
        "no failed jobs in group a of queue cli"
    );
}

#[tokio::test]
async fn cancel_skip_head_and_purge() {
    let db = TestDb::new().await;
    let ids = enqueue(&db, QUEUE, &["a", "a", "a"]).await;

    let id = ids[2].to_string();
    pgfifo(Some(&db.url), &["cancel", &id, "--reason", "duplicate"]).expect(0);
    assert_eq!(db.job_state(ids[2]).await, "cancelled 0");
    assert_eq!(db.last_error(ids[2]).await.as_deref(), Some("duplicate"));
    let twice = pgfifo(Some(&db.url), &["cancel", &id]).expect(1);
    assert!(twice.stderr.contains("is cancelled"), "{}", twice.stderr);

    let skip = pgfifo(
        Some(&db.url),
        &["skip-head", "--queue", QUEUE, "--group", "a", "--json"],
    );
    assert_eq!(skip.expect(0).json()["skipped"], ids[0]);
    assert_eq!(db.job_state(ids[0]).await, "failed 0");
    let idle = pgfifo(
        Some(&db.url),
        &["skip-head", "--queue", QUEUE, "--group", "zz"],
    );
    assert_eq!(
        idle.expect(0).stdout.trim(),
        "group has no head (idle, or paused): nothing skipped"
    );

    db.exec(
        "UPDATE pgfifo.job SET finished_at = now() - interval '2 days' WHERE state <> 'queued'",
    )
    .await;
    let kept = pgfifo(Some(&db.url), &["purge", "--older-than", "3d"]).expect(0);
    assert!(kept.stdout.starts_with("deleted 0 jobs"), "{}", kept.stdout);
    let purged = pgfifo(Some(&db.url), &["purge", "--older-than", "1d"]).expect(0);
    assert_eq!(
        purged.stdout.trim(),
        "deleted 1 job (succeeded, cancelled) that finished more than 1d ago"
    );
    let failed = pgfifo(
        Some(&db.url),
        &["purge", "--older-than", "1d", "--state", "failed", "--json"],
    )
    .expect(0)
    .json();
    assert_eq!(
        failed,
        serde_json::json!({"deleted": 1, "states": ["failed"], "older_than_secs": 86400})
    );
    assert_eq!(db.scalar("SELECT count(*) FROM pgfifo.job").await, 1);
}

#[tokio::test]
async fn policy_is_set_and_shown() {
    let db = TestDb::new().await;
    let set = pgfifo(Some(&db.url), &["policy", "--queue", QUEUE, "hold"]).expect(0);
    assert!(
        set.stdout.contains("failure policy is now hold"),
        "{}",
        set.stdout
    );
    let shown = pgfifo(Some(&db.url), &["policy", "--queue", QUEUE, "--json"])
        .expect(0)
        .json();
    assert_eq!(
        shown,
        serde_json::json!({"queue": "cli", "failure_policy": "hold"})
    );
    pgfifo(Some(&db.url), &["policy", "--queue", QUEUE, "sometimes"]).expect(2);
}

#[test]
fn purge_with_a_bad_duration_is_a_usage_error() {
    for bad in ["7x", "0d", "-1d", "abc", "7"] {
        let run = pgfifo(None, &["purge", "--older-than", bad]).expect(2);
        assert!(
            run.stderr.contains("--older-than")
                && run
                    .stderr
                    .contains("expected a positive whole number and a unit"),
            "{bad}: {}",
            run.stderr
        );
    }
}

#[test]
fn a_missing_database_url_is_a_usage_error() {
    let run = pgfifo(None, &["status"]).expect(2);
    assert!(
        run.stderr
            .contains("no database URL: pass --database-url URL or set DATABASE_URL"),
        "{}",
        run.stderr
    );
    pgfifo(None, &["--database-url", "", "status"]).expect(2);
}

#[test]
fn an_unreachable_database_exits_1() {
    let run = pgfifo(Some("postgres://u:secret@127.0.0.1:1/app"), &["jobs"]).expect(1);
    assert!(
        run.stderr
            .starts_with("error: cannot connect to the database at 127.0.0.1:1/app: "),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("secret"));
}

#[test]
fn every_command_has_help() {
    let commands: &[&[&str]] = &[
        &[],
        &["migrate"],
        &["migrate", "up"],
        &["migrate", "down"],
        &["migrate", "status"],
        &["status"],
        &["groups"],
        &["jobs"],
        &["job"],
        &["retry"],
        &["cancel"],
        &["skip-head"],
        &["purge"],
        &["pause"],
        &["resume"],
        &["policy"],
    ];
    for command in commands {
        let run = pgfifo(None, &[*command, &["--help"]].concat()).expect(0);
        assert!(
            run.stdout.contains("Usage: pgfifo"),
            "{command:?}: {}",
            run.stdout
        );
    }
    let retry = pgfifo(None, &["retry", "--help"]).expect(0).stdout;
    assert!(retry.contains("none of them could be retried"), "{retry}");
}

/// A reader that goes away before the output is written (`pgfifo status |
/// head -0`) ends the command quietly, with status 0, not with a panic.
#[tokio::test]
async fn a_closed_stdout_is_not_an_error() {
    let db = TestDb::new().await;
    enqueue(&db, QUEUE, &["a", "b"]).await;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pgfifo"))
        .args(["status"])
        .env("DATABASE_URL", &db.url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run pgfifo");
    // Closed before the command has even connected to the database.
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait for pgfifo");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "stderr: {stderr}");
}
