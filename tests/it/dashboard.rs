//! The dashboard's pages and actions over HTTP, against a real database:
//! every page, each action and its effect, what an action that loses a race
//! says, escaping of user data, bad parameters (400), the mount prefix.

use axum::http::StatusCode;
use pgfifo::admin::{self, FailurePolicy};
use pgfifo::dashboard;

use crate::admin_support::{Fx, Mode, QUEUE};
use crate::dashboard_support::{enc, Client};

const SCRIPT: &str = "<script>alert(1)</script>";

/// A queue with a held group (its head failed for good under `hold`),
/// a waiting group, and a failed job; no runner left running.
async fn held_fixture() -> (Fx, i64, i64) {
    let fx = Fx::new().await;
    fx.set_policy(FailurePolicy::Hold).await;
    fx.break_seqs(&[1]).await;
    let head = fx.push("held", 1, Mode::Ok).await;
    let behind = fx.push("held", 2, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_held("held").await;
    runner.shutdown().await.unwrap();
    (fx, head, behind)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_page_answers_and_shows_why_a_group_waits() {
    let (fx, head, behind) = held_fixture().await;
    let mut client = Client::new(dashboard::router(fx.pool.clone()));

    let overview = client.get("/").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(overview
        .set_cookie
        .as_deref()
        .unwrap()
        .contains("SameSite=Strict"));
    assert!(
        overview.body.contains(&format!("href=\"/queues/{QUEUE}\"")),
        "{}",
        overview.body
    );
    assert!(overview.body.contains("1 held"), "{}", overview.body);

    let groups = client.get(&format!("/queues/{QUEUE}")).await;
    assert_eq!(groups.status, StatusCode::OK);
    assert!(
        groups.body.contains("policy hold: retry or skip it"),
        "{}",
        groups.body
    );
    let blocked = client.get(&format!("/queues/{QUEUE}?blocked=1&q=he")).await;
    assert!(blocked.body.contains("/groups/held"), "{}", blocked.body);
    let none = client.get(&format!("/queues/{QUEUE}?q=zzz")).await;
    assert!(none.body.contains("No group matches"), "{}", none.body);

    let group = client.get(&format!("/queues/{QUEUE}/groups/held")).await;
    assert_eq!(group.status, StatusCode::OK);
    assert!(
        group
            .body
            .contains(&format!("head job {head} failed for good (1/1 attempts)")),
        "{}",
        group.body
    );
    assert!(
        group.body.contains(&format!("/jobs/{behind}")),
        "the next job is listed"
    );
    assert!(
        group.body.contains("/actions/skip-head"),
        "a held group offers skip"
    );
    assert!(
        group.body.contains("/actions/retry"),
        "a held group offers retry"
    );
    let limits = pgfifo::GroupLimits::new()
        .rate(pgfifo::Rate::per_second(10).unwrap())
        .burst(20)
        .concurrency(4)
        .weight(3);
    let mut conn = fx.conn().await;
    admin::set_group_limits(&mut conn, QUEUE, "held", limits)
        .await
        .unwrap();
    drop(conn);
    let limited = client.get(&format!("/queues/{QUEUE}/groups/held")).await;
    let section = limited.body.split("id=\"limits\"").nth(1).unwrap_or("");
    assert!(
        [
            "<dd>4 at a time, 0 running now<span class=\"muted\"> · set for this group",
            "<dt>rate</dt><dd>10/s<span class=\"muted\"> · set for this group",
            "<dt>burst</dt><dd>20<",
            "<dt>tokens now</dt><dd>20.0<",
            "<dt>weight</dt><dd>3<",
        ]
        .iter()
        .all(|shown| section.contains(shown)),
        "the group's limits: {section}"
    );

    let job = client.get(&format!("/jobs/{head}")).await;
    assert_eq!(job.status, StatusCode::OK);
    assert!(
        job.body.contains("seq 1 is broken"),
        "the attempt's error: {}",
        job.body
    );
    assert!(
        job.body.contains("&quot;seq&quot;: 1"),
        "the payload: {}",
        job.body
    );

    let failed = client.get(&format!("/queues/{QUEUE}/failed")).await;
    assert_eq!(failed.status, StatusCode::OK);
    assert!(
        failed.body.contains(&format!("/jobs/{head}")),
        "{}",
        failed.body
    );

    assert_eq!(
        client.get("/assets/dashboard.css").await.status,
        StatusCode::OK
    );
    assert_eq!(client.get("/nowhere").await.status, StatusCode::NOT_FOUND);
    assert_eq!(
        client.get("/jobs/999999").await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client
            .get(&format!("/queues/{QUEUE}/groups/nope"))
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_parameters_are_400_not_500() {
    let fx = Fx::new().await;
    let mut client = Client::new(dashboard::router(fx.pool.clone()));
    for path in [
        "/jobs/abc".to_owned(),
        "/jobs/1.5".to_owned(),
        format!("/queues/{QUEUE}?blocked=7"),
        format!("/queues/{QUEUE}?sort=evil"),
        format!("/queues/{QUEUE}/failed?after=x"),
        format!("/queues/{}", "q".repeat(400)),
    ] {
        let answer = client.get(&path).await;
        assert_eq!(
            answer.status,
            StatusCode::BAD_REQUEST,
            "{path}: {}",
            answer.body
        );
    }
    client.get("/").await;
    let bad = client.act("retry", "id=notanumber").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    let unknown = client.act("drop-everything", "queue=admin").await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actions_move_the_group_and_a_lost_race_changes_nothing() {
    let (fx, _head, behind) = held_fixture().await;
    let mut client = Client::new(dashboard::router(fx.pool.clone()));
    client.get("/").await;

    // Skip the held head: it is cancelled, the next job becomes the head.
    let skipped = client
        .act("skip-head", &format!("queue={QUEUE}&group=held"))
        .await;
    assert_eq!(skipped.status, StatusCode::SEE_OTHER, "{}", skipped.body);
    assert_eq!(
        skipped.location.as_deref(),
        Some(format!("/queues/{QUEUE}/groups/held").as_str())
    );
    let info = fx.group_info("held").await;
    assert_eq!(info.head, Some(behind));
    let group = client.get(&format!("/queues/{QUEUE}/groups/held")).await;
    assert!(
        group.body.contains(&format!("head job {behind}")),
        "{}",
        group.body
    );

    // Retrying the job that is now the head loses: it is not failed (it
    // waits to run).
    let lost = client.act("retry", &format!("id={behind}")).await;
    assert_eq!(lost.status, StatusCode::CONFLICT);
    assert!(lost.body.contains("not failed"), "{}", lost.body);

    // Pause and resume the group and the queue.
    let paused = client
        .act("pause-group", &format!("queue={QUEUE}&group=held"))
        .await;
    assert_eq!(paused.status, StatusCode::SEE_OTHER);
    assert_eq!(fx.group_info("held").await.state, admin::GroupState::Paused);
    client
        .act("resume-group", &format!("queue={QUEUE}&group=held"))
        .await;
    assert_ne!(fx.group_info("held").await.state, admin::GroupState::Paused);
    client.act("pause-queue", &format!("queue={QUEUE}")).await;
    let mut conn = fx.conn().await;
    assert!(
        admin::queue_status(&mut conn, QUEUE, 1)
            .await
            .unwrap()
            .paused
    );
    drop(conn);
    client.act("resume-queue", &format!("queue={QUEUE}")).await;

    // Cancel a waiting job, then cancel it again: the second loses.
    let cancelled = client.act("cancel", &format!("id={behind}")).await;
    assert_eq!(
        cancelled.status,
        StatusCode::SEE_OTHER,
        "{}",
        cancelled.body
    );
    let again = client.act("cancel", &format!("id={behind}")).await;
    assert_eq!(again.status, StatusCode::CONFLICT, "{}", again.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bulk_retry_puts_failed_jobs_back_in_group_order() {
    let fx = Fx::new().await;
    fx.break_seqs(&[1, 2, 3]).await;
    let a = fx.push("g", 1, Mode::Ok).await;
    let b = fx.push("g", 2, Mode::Ok).await;
    let c = fx.push("g", 3, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_state(&[a, b, c], "failed").await;
    runner.shutdown().await.unwrap();
    fx.fix_all().await;

    let mut client = Client::new(dashboard::router(fx.pool.clone()));
    client.get(&format!("/queues/{QUEUE}/failed")).await;
    let retried = client
        .act("retry", &format!("queue={QUEUE}&id={c}&id={a}"))
        .await;
    assert_eq!(retried.status, StatusCode::SEE_OTHER, "{}", retried.body);
    let all = client.act("retry-failed", &format!("queue={QUEUE}")).await;
    assert_eq!(all.status, StatusCode::SEE_OTHER, "{}", all.body);
    let runner = fx.runner().await;
    fx.wait_state(&[a, b, c], "succeeded").await;
    runner.shutdown().await.unwrap();
    assert_eq!(
        fx.run_order("g").await,
        "1:2,2:2,3:2",
        "retried jobs run in their group's order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_data_is_escaped_everywhere() {
    let fx = Fx::new().await;
    let group = format!("g{SCRIPT}");
    let id = fx
        .push_with(7, Mode::Ok, pgfifo::EnqueueOptions::group(group.as_str()))
        .await;
    let mut conn = fx.conn().await;
    admin::cancel_job(&mut conn, id, Some(SCRIPT))
        .await
        .unwrap();
    admin::pause_group(&mut conn, QUEUE, &group).await.unwrap();
    drop(conn);
    fx.exec(&format!(
        "UPDATE pgfifo.job SET payload = jsonb_set(payload, '{{tag}}', to_jsonb('{SCRIPT}'::text)) WHERE id = {id}"
    ))
    .await;

    let mut client = Client::new(dashboard::router(fx.pool.clone()));
    for path in [
        "/".to_owned(),
        format!("/queues/{QUEUE}"),
        format!("/queues/{QUEUE}/groups/{}", enc(&group)),
        format!("/jobs/{id}"),
    ] {
        let answer = client.get(&path).await;
        assert_eq!(answer.status, StatusCode::OK, "{path}");
        assert!(
            !answer.body.contains(SCRIPT),
            "{path} has raw user data: {}",
            answer.body
        );
    }
    let job = client.get(&format!("/jobs/{id}")).await;
    assert!(
        job.body.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
        "{}",
        job.body
    );
    let groups = client.get(&format!("/queues/{QUEUE}")).await;
    assert!(
        groups.body.contains(&enc(&group)),
        "the link's path is percent-encoded"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mounted_under_a_prefix_its_links_keep_the_prefix() {
    let (fx, head, _) = held_fixture().await;
    let app = axum::Router::new().nest("/ops/jobs", dashboard::router(fx.pool.clone()));
    let mut client = Client::new(app);
    let overview = client.get("/ops/jobs").await;
    assert_eq!(overview.status, StatusCode::OK);
    assert!(
        overview.body.contains("href=\"/ops/jobs/queues/admin\""),
        "{}",
        overview.body
    );
    assert!(overview
        .body
        .contains("href=\"/ops/jobs/assets/dashboard.css\""));
    let group = client.get("/ops/jobs/queues/admin/groups/held").await;
    assert!(
        group
            .body
            .contains(&format!("href=\"/ops/jobs/jobs/{head}\"")),
        "{}",
        group.body
    );
    assert!(group
        .body
        .contains("action=\"/ops/jobs/actions/skip-head\""));
    let missing = client.get("/ops/jobs/jobs/999999").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert!(
        missing
            .body
            .contains("href=\"/ops/jobs/assets/dashboard.css\""),
        "error pages keep the prefix too: {}",
        missing.body
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_overview_charts_what_runners_finished() {
    let fx = Fx::new().await;
    fx.break_seqs(&[9]).await;
    let mut ids = Vec::new();
    for seq in 0..5 {
        ids.push(fx.push(&format!("g{seq}"), seq, Mode::Ok).await);
    }
    let broken = fx.push("g9", 9, Mode::Ok).await;
    let runner = fx.runner().await;
    fx.wait_state(&ids, "succeeded").await;
    fx.wait_state(&[broken], "failed").await;
    // Shutdown records what the last heartbeat did not.
    runner.shutdown().await.unwrap();

    let mut conn = fx.conn().await;
    let counts = admin::throughput(&mut conn).await.unwrap();
    drop(conn);
    let ok: i64 = counts.iter().map(|c| c.succeeded).sum();
    let failed: i64 = counts.iter().map(|c| c.failed).sum();
    assert_eq!((ok, failed), (5, 1), "{counts:?}");
    assert!(counts.iter().all(|c| c.queue == QUEUE));

    let mut client = Client::new(dashboard::router(fx.pool.clone()));
    let overview = client.get("/").await;
    assert!(
        overview
            .body
            .contains("5 succeeded and 1 failed in the last hour"),
        "{}",
        overview.body
    );
    assert!(overview.body.contains("<svg id=\"throughput\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_sort_by_name_longest_waiting_or_backlog_and_page_by_keyset() {
    let fx = Fx::new().await;
    for group in ["c", "a", "d", "b", "b", "c", "b"] {
        fx.push(group, 1, Mode::Ok).await;
    }
    // What a runner's listener would do: make the woken groups active.
    fx.exec(&format!("SELECT pgfifo.promote(ARRAY['{QUEUE}'], 100)"))
        .await;
    let mut client = Client::new(dashboard::router(fx.pool.clone()));
    // The groups table's links, in order (the largest backlogs above it
    // link groups too).
    let order = |body: &str| -> Vec<String> {
        let table = body.split("<table id=\"groups\"").nth(1).unwrap_or("");
        table
            .split(&format!("href=\"/queues/{QUEUE}/groups/"))
            .skip(1)
            .filter_map(|rest| rest.split('"').next())
            .map(str::to_owned)
            .collect()
    };
    let by_name = client.get(&format!("/queues/{QUEUE}")).await;
    assert_eq!(order(&by_name.body), ["a", "b", "c", "d"]);
    let by_lag = client.get(&format!("/queues/{QUEUE}?sort=lag")).await;
    assert_eq!(by_lag.status, StatusCode::OK);
    assert_eq!(
        order(&by_lag.body),
        ["c", "a", "d", "b"],
        "oldest head first"
    );
    let mut conn = fx.conn().await;
    let a = admin::group(&mut conn, QUEUE, "a").await.unwrap().unwrap();
    drop(conn);
    let after_a = client
        .get(&format!(
            "/queues/{QUEUE}?sort=lag&after_head={}",
            a.head.unwrap()
        ))
        .await;
    assert_eq!(order(&after_a.body), ["d", "b"]);
    let by_backlog = client.get(&format!("/queues/{QUEUE}?sort=backlog")).await;
    assert_eq!(
        order(&by_backlog.body),
        ["b", "c", "a", "d"],
        "3, 2, 1, 1 waiting"
    );
    let after_c = client
        .get(&format!(
            "/queues/{QUEUE}?sort=backlog&after_backlog=2&after=c"
        ))
        .await;
    assert_eq!(order(&after_c.body), ["a", "d"]);
    let bad = client.get(&format!("/queues/{QUEUE}?sort=evil")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}
