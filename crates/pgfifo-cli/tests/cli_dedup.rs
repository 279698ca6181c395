//! `pgfifo job ID` shows the de-duplication window a job carries.

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use pgfifo_tests::TestDb;

use support::{enqueue, pgfifo, QUEUE};

#[tokio::test]
async fn job_shows_its_window_key_mode_and_end() {
    let db = TestDb::new().await;
    let id = db
        .scalar(&format!(
            "SELECT pgfifo.add_job(kind => 'CliJob', queue => '{QUEUE}', payload => '{{}}', \
             group_id => 'g', window_key => 'sync-42', window_mode => 'throttle', \
             window_period => '1 hour')"
        ))
        .await;
    let text = pgfifo(Some(&db.url), &["job", &id.to_string()])
        .expect(0)
        .stdout;
    let line = text
        .lines()
        .find(|l| l.starts_with("window:"))
        .unwrap_or_else(|| panic!("no window line: {text}"));
    assert!(
        line.contains("throttle \"sync-42\" for 1h, until ") && line.ends_with("(holds its key)"),
        "{line}"
    );
    let json = pgfifo(Some(&db.url), &["job", &id.to_string(), "--json"])
        .expect(0)
        .json();
    assert_eq!(json["window"]["key"], "sync-42", "{json}");
    assert_eq!(json["window"]["mode"], "throttle", "{json}");
    assert_eq!(json["window"]["period_us"], 3_600_000_000_i64, "{json}");
    assert_eq!(json["window"]["holds"], true, "{json}");

    // Ended (as if the hour had passed): shown, and said so.
    db.exec("UPDATE pgfifo.job_window SET until = now() - interval '1 second'")
        .await;
    let text = pgfifo(Some(&db.url), &["job", &id.to_string()])
        .expect(0)
        .stdout;
    assert!(text.contains("(ended)"), "{text}");

    // A job without a window.
    let plain = enqueue(&db, QUEUE, &["a"]).await[0].to_string();
    let text = pgfifo(Some(&db.url), &["job", &plain]).expect(0).stdout;
    assert!(
        text.lines()
            .any(|l| l.starts_with("window:") && l.ends_with(" -")),
        "{text}"
    );
    let json = pgfifo(Some(&db.url), &["job", &plain, "--json"])
        .expect(0)
        .json();
    assert_eq!(json["window"], serde_json::Value::Null);
}
