//! `dashboard`: how long each dashboard page takes on a large queue.
//!
//! Fills `JOBS` jobs (default 1,000,000) over `NGROUPS` groups (default
//! 100,000) as the `status` scenario does (70 % succeeded, 20 % queued, 6 %
//! failed, 2 % cancelled, 2 % retrying), pauses `PAUSED` groups (default
//! 200), runs `VACUUM (ANALYZE)`, then requests each page `RUNS` times
//! (default 10) through the dashboard's router in this process (no socket:
//! the figures are the server's work) and reports the median and worst
//! time of each. The goal is under 300 ms for every page.

use std::time::Instant;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use serde_json::{json, Value};
use tower::ServiceExt;

use crate::common::{self, percentile, round3, Inputs};
use crate::progress;
use crate::status::fill;

const DATABASE: &str = "pgfifo_bench_dashboard";
const QUEUE: &str = "status-bench";
const GOAL_MS: f64 = 300.0;

#[derive(QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let jobs = inputs.number("JOBS", 1_000_000)?.max(50) as i64;
    let groups = inputs.number("NGROUPS", 100_000)?.max(10) as i64;
    let paused = inputs.number("PAUSED", 200)? as i64;
    let runs = inputs.number("RUNS", 10)?.max(1) as usize;
    let server = inputs.database_url();
    let err = |e: diesel::result::Error| e.to_string();

    let (pool, _url) = common::fresh_database(&server, DATABASE, 4).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    progress!("dashboard: filling {jobs} jobs over {groups} groups");
    let started = Instant::now();
    fill(&mut conn, QUEUE, jobs, groups).await?;
    for g in 0..paused.min(groups) {
        let group = format!("g{}", g * (groups / paused.max(1)).max(1));
        pgfifo::admin::pause_group(&mut conn, QUEUE, &group)
            .await
            .map_err(|e| e.to_string())?;
    }
    conn.batch_execute("VACUUM (ANALYZE) pgfifo.job, pgfifo.queue_group, pgfifo.group_pause")
        .await
        .map_err(err)?;
    progress!("filled in {:.1}s", started.elapsed().as_secs_f64());
    let head: Id = diesel::sql_query(
        "SELECT head_id AS id FROM pgfifo.queue_group WHERE queue = $1 AND group_id = 'g4242'",
    )
    .bind::<Text, _>(QUEUE)
    .get_result(&mut *conn)
    .await
    .map_err(err)?;
    let failed: Id = diesel::sql_query(
        "SELECT max(id) AS id FROM pgfifo.job WHERE queue = $1 AND state = 'failed'",
    )
    .bind::<Text, _>(QUEUE)
    .get_result(&mut *conn)
    .await
    .map_err(err)?;
    drop(conn);

    let app = pgfifo::dashboard::router(pool.clone());
    let pages = [
        ("overview", "/".to_owned()),
        ("groups", format!("/queues/{QUEUE}")),
        (
            "groups, a later page",
            format!("/queues/{QUEUE}?after=g50000"),
        ),
        ("groups, searched", format!("/queues/{QUEUE}?q=g4242")),
        ("groups, blocked only", format!("/queues/{QUEUE}?blocked=1")),
        (
            "groups, longest waiting",
            format!("/queues/{QUEUE}?sort=lag"),
        ),
        (
            "groups, largest backlog",
            format!("/queues/{QUEUE}?sort=backlog"),
        ),
        ("group", format!("/queues/{QUEUE}/groups/g4242")),
        ("job (a head)", format!("/jobs/{}", head.id)),
        ("job (failed)", format!("/jobs/{}", failed.id)),
        ("failed jobs", format!("/queues/{QUEUE}/failed")),
    ];
    let mut results = serde_json::Map::new();
    let mut worst = 0.0f64;
    for (name, path) in pages {
        let mut times = Vec::with_capacity(runs);
        for _ in 0..runs {
            let started = Instant::now();
            let response = app
                .clone()
                .oneshot(Request::get(&path).body(Body::empty()).unwrap())
                .await
                .map_err(|e| e.to_string())?;
            let status = response.status();
            axum::body::to_bytes(response.into_body(), 16 << 20)
                .await
                .map_err(|e| e.to_string())?;
            if status != StatusCode::OK {
                return Err(format!("{path} answered {status}"));
            }
            times.push(started.elapsed().as_secs_f64() * 1_000.0);
        }
        times.sort_by(f64::total_cmp);
        let median = percentile(&times, 0.5);
        let max = times.last().copied().unwrap_or(0.0);
        worst = worst.max(max);
        progress!("{name} ({path}): median {median:.1} ms, max {max:.1} ms");
        results.insert(
            name.to_owned(),
            json!({ "path": path, "median_ms": round3(median), "max_ms": round3(max) }),
        );
    }
    drop(app);
    drop(pool);
    common::drop_database(&server, DATABASE).await?;
    Ok(json!({
        "scenario": "dashboard",
        "jobs": jobs,
        "groups": groups,
        "paused_groups": paused,
        "runs": runs,
        "pages": results,
        "goal_ms": GOAL_MS,
        "under_goal": worst < GOAL_MS,
    }))
}
