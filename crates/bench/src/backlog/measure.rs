//! One backlog size: fill, explain the lookups, then time the pick cycles.

use std::collections::HashMap;
use std::time::Instant;

use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, Text};
use diesel::QueryableByName;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use serde_json::{json, Value};

use super::fill::fill;
use super::plans::{explain, EXPLAIN_FUNCTION, LOOKUPS};
use super::{DATABASE, WARMUP};
use crate::common::{self, round3};
use crate::progress;

/// The runner's pick (`db::sql::pick`), with no per-kind idle bounds and no
/// other lanes (`p_held` left to its default).
const PICK: &str = "\
SELECT id, queue, group_id, kind, payload, max_attempts, slot, more, pg_backend_pid() AS backend_pid
FROM pgfifo.pick(ARRAY['bench'], $1, $2, ARRAY[]::text[], ARRAY[]::int[], 60000, 1)";

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    b: bool,
}

/// A picked job, with the columns the runner loads.
#[derive(QueryableByName)]
#[allow(dead_code)] // loaded (and transferred) as the runner does; only some are used
struct Picked {
    #[diesel(sql_type = BigInt)]
    id: i64,
    #[diesel(sql_type = Text)]
    queue: String,
    #[diesel(sql_type = Nullable<Text>)]
    group_id: Option<String>,
    #[diesel(sql_type = Text)]
    kind: String,
    #[diesel(sql_type = Jsonb)]
    payload: Value,
    #[diesel(sql_type = Integer)]
    max_attempts: i32,
    #[diesel(sql_type = Nullable<Integer>)]
    slot: Option<i32>,
    #[diesel(sql_type = Integer)]
    backend_pid: i32,
}

#[derive(QueryableByName)]
struct Attempt {
    #[diesel(sql_type = Integer)]
    attempt: i32,
}

pub(super) async fn measure(
    server: &str,
    jobs: u64,
    groups: u64,
    picks: usize,
) -> Result<Value, String> {
    let err = |e: diesel::result::Error| e.to_string();
    let (pool, _url) = common::fresh_database(server, DATABASE, 4).await?;
    let mut job_conn = pool.get().await.map_err(|e| e.to_string())?;
    let mut attempt_conn = pool.get().await.map_err(|e| e.to_string())?;

    progress!("backlog {jobs} jobs / {groups} groups: filling");
    let started = Instant::now();
    let first_id = fill(&mut job_conn, jobs, groups).await?;
    let fill_secs = started.elapsed().as_secs_f64();
    // Flush the fill's dirty pages now rather than in a checkpoint that would
    // land in the middle of the measurement.
    let checkpointed = job_conn.batch_execute("CHECKPOINT").await.is_ok();
    progress!("filled in {fill_secs:.1}s; explaining the lookups");

    job_conn
        .batch_execute(EXPLAIN_FUNCTION)
        .await
        .map_err(err)?;
    let mut plans = serde_json::Map::new();
    for lookup in LOOKUPS {
        plans.insert(
            lookup.label.to_owned(),
            explain(&mut job_conn, lookup, first_id).await?,
        );
    }

    let total = picks.min(jobs as usize);
    let warmup = WARMUP.min(total / 2);
    progress!("running {total} pick cycles ({warmup} of them warm-up)");
    let mut pick_ms = Vec::with_capacity(total);
    let mut cycle_ms = Vec::with_capacity(total);
    let mut first_pick_ms = 0.0;
    // The last id picked in each group: ids must rise within a group.
    let mut last_in_group: HashMap<String, i64> = HashMap::new();
    let mut fifo_violations = 0u64;
    let mut cursor: i32 = 0;
    for i in 0..total {
        let cycle_started = Instant::now();
        // The runner's job transaction, with the marker pick and complete check.
        job_conn
            .batch_execute("BEGIN; SELECT set_config('pgfifo.job_transaction', 'on', true)")
            .await
            .map_err(err)?;
        let pick_started = Instant::now();
        let mut picked: Vec<Picked> = diesel::sql_query(PICK)
            .bind::<Integer, _>(i as i32 + 1)
            .bind::<Integer, _>(cursor)
            .load(&mut job_conn)
            .await
            .map_err(err)?;
        let pick_elapsed = pick_started.elapsed();
        let Some(job) = picked.pop() else {
            job_conn.batch_execute("ROLLBACK").await.map_err(err)?;
            return Err(format!("pick {i} found no job in a backlog of {jobs}"));
        };
        let mut attempts: Vec<Attempt> =
            diesel::sql_query("SELECT job_id, attempt FROM pgfifo.start_attempts($1, $2, $3)")
                .bind::<Array<BigInt>, _>(vec![job.id])
                .bind::<Array<Integer>, _>(vec![job.max_attempts])
                .bind::<Text, _>("pgfifo-bench")
                .load(&mut attempt_conn)
                .await
                .map_err(err)?;
        let attempt = attempts
            .pop()
            .map(|a| a.attempt)
            .ok_or("start_attempts: no attempt left")?;
        if let Some(slot) = job.slot {
            // The runner's round-robin cursor: continue after this group.
            cursor = slot.wrapping_add(1);
        }
        diesel::sql_query(
            "SELECT pgfifo.complete(ARRAY[$1], ARRAY[$2], '{succeeded}', '{NULL}', '{NULL}', \
             '{NULL}', ARRAY[$3], ARRAY[$4])",
        )
        .bind::<BigInt, _>(job.id)
        .bind::<Integer, _>(attempt)
        .bind::<Text, _>(&job.queue)
        .bind::<Nullable<Text>, _>(job.group_id.as_deref())
        .execute(&mut job_conn)
        .await
        .map_err(err)?;
        job_conn.batch_execute("COMMIT").await.map_err(err)?;
        let cycle_elapsed = cycle_started.elapsed();

        let group = job.group_id.unwrap_or_default();
        if last_in_group
            .get(&group)
            .is_some_and(|last| *last >= job.id)
        {
            fifo_violations += 1;
        }
        last_in_group.insert(group, job.id);
        if i == 0 {
            first_pick_ms = pick_elapsed.as_secs_f64() * 1e3;
        }
        if i >= warmup {
            pick_ms.push(pick_elapsed.as_secs_f64() * 1e3);
            cycle_ms.push(cycle_elapsed.as_secs_f64() * 1e3);
        }
    }
    pick_ms.sort_by(f64::total_cmp);
    cycle_ms.sort_by(f64::total_cmp);

    let analyzed_meanwhile: Flag = diesel::sql_query(
        "SELECT coalesce(bool_or(last_autoanalyze IS NOT NULL OR last_analyze IS NOT NULL), false) AS b \
         FROM pg_stat_user_tables WHERE schemaname = 'pgfifo' AND relname IN ('job', 'queue_group')",
    )
    .get_result(&mut job_conn)
    .await
    .map_err(err)?;

    let index_driven = plans.values().all(|p| {
        p.as_object().is_some_and(|modes| {
            modes
                .values()
                .all(|m| m.get("index_driven") != Some(&Value::Bool(false)))
        })
    });
    let result = json!({
        "jobs": jobs,
        "groups": groups,
        "fill_secs": round3(fill_secs),
        "picks": pick_ms.len(),
        "pick_median_ms": round3(common::percentile(&pick_ms, 0.5)),
        "pick_p99_ms": round3(common::percentile(&pick_ms, 0.99)),
        "pick_max_ms": round3(pick_ms.last().copied().unwrap_or(0.0)),
        "first_pick_ms": round3(first_pick_ms),
        "cycle_median_ms": round3(common::percentile(&cycle_ms, 0.5)),
        "cycle_p99_ms": round3(common::percentile(&cycle_ms, 0.99)),
        "groups_touched": last_in_group.len(),
        "fifo_violations": fifo_violations,
        "analyzed": false,
        "autoanalyzed_during_run": analyzed_meanwhile.b,
        "checkpointed_after_fill": checkpointed,
        "index_driven": index_driven,
        "group_lookup_index": plans["group_lookup"]["function_settings"]["generic"]["index"],
        "plans": plans,
    });
    progress!(
        "pick median {} ms, p99 {} ms; cycle median {} ms, p99 {} ms; plans index-driven: {index_driven} \
         (group lookup: {})",
        result["pick_median_ms"],
        result["pick_p99_ms"],
        result["cycle_median_ms"],
        result["cycle_p99_ms"],
        result["plans"]["group_lookup"]["function_settings"]["generic"]["plan"]
    );
    Ok(result)
}
