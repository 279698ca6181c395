//! `status`: how long `pgfifo::admin::status` (what `pgfifo status` shows)
//! takes on a large job table, and how close its figures are.
//!
//! On a fresh database, one statement fills `JOBS` jobs (default 1,000,000)
//! over `NGROUPS` groups (default 10,000) in one queue, in the proportions of
//! a queue that has run for a while: 70 % succeeded, 20 % queued, 6 % failed,
//! 2 % cancelled, 2 % queued after a failed attempt (retrying, due in an
//! hour). Each group gets its row, active with its oldest queued job as head.
//! Then `status` runs `RUNS` times (default 5) twice: right after the fill
//! (no VACUUM or ANALYZE yet, as after a burst) and after
//! `VACUUM (ANALYZE)` (what autovacuum leaves). The JSON line has the median
//! and worst time of each, and every figure `status` returned next to the
//! true count.

use std::time::Instant;

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use serde_json::{json, Value};

use crate::common::{self, percentile, round3, Inputs};
use crate::progress;

const DATABASE: &str = "pgfifo_bench_status";
const QUEUE: &str = "status-bench";
/// The goal: well under a second.
const GOAL_MS: f64 = 1_000.0;

/// Job k: group `g{k % groups}`; its state by `k % 50` (35/50 succeeded,
/// 10/50 queued, 3/50 failed, 1/50 cancelled, 1/50 retrying: queued with an
/// attempt made and its next one due in an hour).
const FILL: &str = "\
INSERT INTO pgfifo.job (queue, group_id, kind, payload, max_attempts, state, attempts,
                        run_after, finished_at, last_error)
SELECT $1, 'g' || (k % $2), 'bench', jsonb_build_object('k', k), 3,
       CASE WHEN s.state = 'retrying' THEN 'queued' ELSE s.state END,
       CASE WHEN s.state IN ('failed', 'retrying') THEN 1 ELSE 0 END,
       CASE WHEN s.state = 'retrying' THEN now() + interval '1 hour' ELSE now() END,
       CASE WHEN s.state IN ('queued', 'retrying') THEN NULL ELSE now() END,
       CASE WHEN s.state IN ('failed', 'retrying') THEN 'boom' END
FROM generate_series(0::bigint, $3 - 1) AS k
CROSS JOIN LATERAL (SELECT CASE WHEN k % 50 < 35 THEN 'succeeded'
                                WHEN k % 50 < 45 THEN 'queued'
                                WHEN k % 50 < 48 THEN 'failed'
                                WHEN k % 50 < 49 THEN 'cancelled'
                                ELSE 'retrying' END AS state) AS s";

const FILL_GROUPS: &str = "\
INSERT INTO pgfifo.queue_group (queue, group_id, slot, head_id, ready_at)
SELECT j.queue, j.group_id, pgfifo.group_hash(j.queue, j.group_id), min(j.id), now()
FROM pgfifo.job AS j WHERE j.state = 'queued'
GROUP BY j.queue, j.group_id";

/// Fills `queue` with `jobs` jobs over `groups` groups ([`FILL`]) and gives
/// each group its row ([`FILL_GROUPS`]).
pub(crate) async fn fill(
    conn: &mut AsyncPgConnection,
    queue: &str,
    jobs: i64,
    groups: i64,
) -> Result<(), String> {
    let err = |e: diesel::result::Error| e.to_string();
    diesel::sql_query(FILL)
        .bind::<Text, _>(queue)
        .bind::<BigInt, _>(groups)
        .bind::<BigInt, _>(jobs)
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    conn.batch_execute(FILL_GROUPS).await.map_err(err)
}

#[derive(QueryableByName)]
struct Truth {
    #[diesel(sql_type = Text)]
    state: String,
    #[diesel(sql_type = BigInt)]
    n: i64,
}

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let jobs = inputs.number("JOBS", 1_000_000)?.max(50) as i64;
    let groups = inputs.number("NGROUPS", 10_000)?.max(1) as i64;
    let runs = inputs.number("RUNS", 5)?.max(1) as usize;
    let server = inputs.database_url();
    let err = |e: diesel::result::Error| e.to_string();

    let (pool, _url) = common::fresh_database(&server, DATABASE, 2).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    progress!("status: filling {jobs} jobs over {groups} groups");
    let started = Instant::now();
    fill(&mut conn, QUEUE, jobs, groups).await?;
    progress!("filled in {:.1}s", started.elapsed().as_secs_f64());

    let truth: Vec<Truth> = diesel::sql_query(
        "SELECT CASE WHEN state = 'queued' AND attempts > 0 THEN 'retrying' ELSE state END AS state,
                count(*) AS n
         FROM pgfifo.job GROUP BY 1 ORDER BY 1",
    )
    .load(&mut *conn)
    .await
    .map_err(err)?;
    let truth: serde_json::Map<String, Value> =
        truth.into_iter().map(|t| (t.state, json!(t.n))).collect();

    let fresh = measure(&mut conn, runs).await?;
    progress!("VACUUM (ANALYZE)");
    conn.batch_execute("VACUUM (ANALYZE) pgfifo.job, pgfifo.queue_group")
        .await
        .map_err(err)?;
    let vacuumed = measure(&mut conn, runs).await?;
    drop(conn);
    drop(pool);
    common::drop_database(&server, DATABASE).await?;

    let worst = fresh["max_ms"]
        .as_f64()
        .unwrap_or(0.0)
        .max(vacuumed["max_ms"].as_f64().unwrap_or(0.0));
    Ok(json!({
        "scenario": "status",
        "jobs": jobs,
        "groups": groups,
        "runs": runs,
        "true_counts": truth,
        "fresh": fresh,
        "vacuumed": vacuumed,
        "goal_ms": GOAL_MS,
        "under_goal": worst < GOAL_MS,
    }))
}

/// Runs `status` `runs` times; returns timings and the last figures.
async fn measure(conn: &mut AsyncPgConnection, runs: usize) -> Result<Value, String> {
    let only = [QUEUE.to_owned()];
    let mut times = Vec::with_capacity(runs);
    let mut last = None;
    for _ in 0..runs {
        let started = Instant::now();
        let status = pgfifo::admin::status(conn, Some(&only), 5)
            .await
            .map_err(|e| e.to_string())?;
        times.push(started.elapsed().as_secs_f64() * 1_000.0);
        last = status.into_iter().next();
    }
    times.sort_by(f64::total_cmp);
    let median = percentile(&times, 0.5);
    let max = times.last().copied().unwrap_or(0.0);
    progress!("status: median {median:.1} ms, max {max:.1} ms");
    Ok(json!({
        "median_ms": round3(median),
        "max_ms": round3(max),
        "status": last,
    }))
}
