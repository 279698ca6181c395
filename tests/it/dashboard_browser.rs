//! The dashboard in a real browser (headless Chromium, see
//! `pgfifo_tests::browser`): the overview, a blocked group and its reason,
//! skipping its head (with the confirmation), and the group moving on.
//!
//! It also takes the screenshots in `docs/`: with
//! `PGFIFO_SCREENSHOTS=<dir>` set, `dashboard-overview.png` and
//! `dashboard-group.png` are written there (`PGFIFO_SCREENSHOTS=docs` from
//! the repository root refreshes the committed ones); otherwise into a
//! temporary directory, and checked to be PNG images.

use std::path::PathBuf;
use std::time::Duration;

use pgfifo::admin::{self, FailurePolicy};
use pgfifo::dashboard::{self, Access, DashboardConfig};
use pgfifo_tests::browser::Browser;

use crate::admin_support::{Fx, Mode, LIMIT, QUEUE};

/// A queue that has run for a while: groups idle, running (held at the
/// test's gate), retrying, held at a failed head, paused and waiting; and an
/// hour of finished-job counts for the chart (as runners record them).
async fn lived_in() -> (Fx, pgfifo::RunnerHandle, i64, i64) {
    let fx = Fx::new().await;
    fx.set_policy(FailurePolicy::Hold).await;
    fx.break_seqs(&[13]).await;
    for (i, tenant) in ["acme", "globex", "initech", "umbrella", "hooli"]
        .iter()
        .enumerate()
    {
        for seq in 0..3 {
            fx.push(&format!("tenant-{tenant}"), (i * 10 + seq) as i64, Mode::Ok)
                .await;
        }
    }
    let failing = fx.push("tenant-stark", 13, Mode::Ok).await;
    let behind = fx.push("tenant-stark", 14, Mode::Ok).await;
    let retrying = pgfifo::EnqueueOptions::group("tenant-wayne").max_attempts(3);
    let wayne = fx.push_with(20, Mode::RetryLater, retrying).await;
    fx.push("tenant-wonka", 30, Mode::Hold).await;
    fx.push("tenant-wonka", 31, Mode::Ok).await;
    fx.push("tenant-tyrell", 40, Mode::Hold).await;
    let mut conn = fx.conn().await;
    admin::pause_group(&mut conn, QUEUE, "tenant-cyberdyne")
        .await
        .unwrap();
    drop(conn);
    fx.push("tenant-cyberdyne", 50, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_held("tenant-stark").await;
    fx.wait_retrying(wayne).await;
    fx.exec(&format!(
        "INSERT INTO pgfifo.queue_minute (queue, minute, succeeded, failed)
         SELECT '{QUEUE}', date_trunc('minute', now()) - make_interval(mins => m),
                (40 + 25 * sin(m / 7.0) + (m * 37 % 11))::bigint, (m % 9 = 0)::int
         FROM generate_series(1, 59) AS m
         ON CONFLICT DO NOTHING"
    ))
    .await;
    (fx, runner, failing, behind)
}

fn screenshot_path(name: &str) -> (PathBuf, bool) {
    match std::env::var("PGFIFO_SCREENSHOTS") {
        Ok(dir) => (PathBuf::from(dir).join(name), true),
        Err(_) => (
            std::env::temp_dir().join(format!("pgfifo-{}-{name}", std::process::id())),
            false,
        ),
    }
}

async fn shoot(browser: &Browser, name: &str) {
    let (path, keep) = screenshot_path(name);
    browser.screenshot_to(&path).await;
    let bytes = std::fs::read(&path).expect("screenshot written");
    assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "{name} is a PNG");
    if !keep {
        let _ = std::fs::remove_file(&path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_finds_a_blocked_group_and_unblocks_it() {
    let Some(browser) = Browser::start().await else {
        return;
    };
    let (fx, runner, failing, behind) = lived_in().await;
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(dashboard::serve(
        fx.pool.clone(),
        "127.0.0.1:0".parse().unwrap(),
        DashboardConfig::default(),
        Access::Open,
        move |addr| ready_tx.send(addr).unwrap(),
        async move {
            let _ = stop_rx.await;
        },
    ));
    let addr = ready_rx.await.unwrap();
    let base = format!("http://{addr}");

    // The overview: the queue, its blocked groups, the runner, the chart.
    browser.goto(&format!("{base}/")).await;
    browser.wait_for_text("#queues", QUEUE, LIMIT).await;
    browser
        .wait_for_text("#queues", "1 held, 1 retrying", LIMIT)
        .await;
    browser.wait_for_text("#runners", "admin", LIMIT).await;
    shoot(&browser, "dashboard-overview.png").await;

    // To the blocked groups, then the held one: its reason says why.
    browser.click("#queues a[href$='?blocked=1']").await;
    browser
        .wait_for_text("#groups", "tenant-stark", LIMIT)
        .await;
    browser
        .click("#groups a[href$='/groups/tenant-stark']")
        .await;
    browser
        .wait_for_text(
            "#reason",
            &format!("head job {failing} failed for good"),
            LIMIT,
        )
        .await;
    shoot(&browser, "dashboard-group.png").await;

    // Skip the head, confirming: the group goes on with its next job.
    browser
        .click("form[action$='/actions/skip-head'] button")
        .await;
    let question = browser.accept_alert(LIMIT).await;
    assert!(
        question.contains(&format!("Skip job {failing}")),
        "{question}"
    );
    fx.wait_state(&[behind], "succeeded").await;
    browser
        .goto(&format!("{base}/queues/{QUEUE}/groups/tenant-stark"))
        .await;
    browser
        .wait_for_text("#reason", "no job waiting", Duration::from_secs(20))
        .await;
    let history = browser.text_of("table.jobs").await;
    assert!(history.contains(&behind.to_string()), "{history}");

    fx.release(2);
    runner.shutdown().await.unwrap();
    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
    browser.close().await;
}
