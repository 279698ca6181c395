//! `backlog`: the cost of one pick against the size of the backlog.
//!
//! For each size (`SIZES=jobs:groups,…`; default 10k/100, 100k/1k, 1M/10k,
//! plus 10M/100k with `FULL=1`), on a fresh database:
//! 1. fill the tables with set-based statements (see [`FILL_JOBS`]); no
//!    `ANALYZE` is run, as on a queue whose tables were just created;
//! 2. `EXPLAIN (ANALYZE, BUFFERS)` the pick's group lookups and the head
//!    advance's job lookup, custom and generic plans, under the settings the
//!    functions run with, to show they are index-driven;
//! 3. on one connection, run `PICKS` job cycles the way the runner does —
//!    `BEGIN`, `pgfifo.pick`, `pgfifo.start_attempts` on a second
//!    (autocommit) connection, `pgfifo.complete`, `COMMIT` — timing the pick
//!    alone and the whole cycle.
//!
//! Before the sizes, the fill is checked against the library: a small backlog
//! filled by [`fill`] must leave exactly the rows that `pgfifo::enqueue_batch`
//! followed by the runner's promotion leaves (see [`check_fill`]).
//!
//! The goal is a flat line: the median pick at 1M jobs at most 1.5 times the
//! median at 10k.

use std::collections::HashMap;
use std::time::Instant;

use diesel::sql_types::{Array, BigInt, Bool, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{EnqueueOptions, Job, NewJob};
use serde_json::{json, Value};

use crate::common::{self, round3, BenchJob, Inputs};
use crate::progress;

/// The database this scenario recreates for each size (and drops at the end).
const DATABASE: &str = "pgfifo_bench_backlog";
/// Cycles run before timing starts (plan caching, first touches of the indexes).
const WARMUP: usize = 20;
/// The goal: median pick at the largest size / at the smallest.
const GOAL_RATIO: f64 = 1.5;

/// Inserts the jobs of a backlog in one statement: job k (0-based) gets id
/// `$1 + k`, group `g{k % groups}` and payload `{"g": k % groups, "s": k / groups}`,
/// exactly the rows `fifo-groups` enqueues for job k.
///
/// Why this is what one `pgfifo.enqueue` call of the same jobs, in input
/// order k = 0, 1, … and in one transaction, would leave behind:
/// * ids: enqueue takes its n ids from `pgfifo.job_id_seq` in one ascending
///   run (`ORDER BY 1`), so input order is id order; on this fresh database
///   nobody else uses the sequence, and [`fill`] reserves the same contiguous
///   block (`nextval` then `setval` to the block's last id), so later
///   `nextval`s still return larger ids than every row's;
/// * columns: queue, kind, priority and max_attempts are `BenchJob`'s
///   (bound from its `Job` constants), group and payload as above (jsonb
///   stores `{"g":…,"s":…}` identically whichever way it was built),
///   `run_after = now()` as `pgfifo.run_after(NULL, NULL)` gives, and the
///   column defaults for the rest (`state = 'queued'`, `attempts = 0`,
///   `created_at = now()`; no unique key, i.e. enqueue's fast path);
/// * rows are inserted in id order (a plain function scan of
///   `generate_series`, no sort), as successive enqueues would append them.
///
/// Not reproduced: the shared advisory locks of the groups (released at
/// commit; nobody else is enqueueing) and `pg_notify` (nobody is listening).
/// [`check_fill`] verifies the equivalence against the live library.
const FILL_JOBS: &str = "\
INSERT INTO pgfifo.job (id, queue, group_id, kind, payload, priority, max_attempts, run_after)
SELECT $1 + k, $2, 'g' || (k % $3), $4,
       jsonb_build_object('g', k % $3, 's', k / $3),
       $5, $6, now()
FROM generate_series(0::bigint, $7 - 1) AS k";

/// Inserts the `queue_group` rows of the backlog's groups, active, as the
/// runner's promotion leaves them. Enqueue writes no group row: for each new
/// group it appends a `pgfifo.group_wake` row, and `pgfifo.promote` (run by a
/// runner after the commit) consumes it, inserts the group row with
/// `slot = pgfifo.group_lock_key(queue, group)` and sets `head_id` = the
/// group's oldest queued job, `priority` and `ready_at` = that job's priority
/// and `run_after`. This statement writes that end state directly (no wake
/// rows left, as after the promotion). Job k is in group `k % groups`, so the
/// smallest k of group g is k = g (groups with g >= jobs get no job and no
/// row): head id `$1 + g`. `now()` is the same as in [`FILL_JOBS`] because
/// both run in one transaction.
const FILL_GROUPS: &str = "\
INSERT INTO pgfifo.queue_group (queue, group_id, slot, head_id, priority, ready_at)
SELECT $2, 'g' || g, pgfifo.group_lock_key($2, 'g' || g), $1 + g, $3, now()
FROM generate_series(0::bigint, least($4, $5) - 1) AS g";

/// Everything [`check_fill`] compares, one sorted line per row: every column
/// of every job and group row (timestamps as their relations: a job's
/// `run_after` equals its `created_at`, a group's `ready_at` equals its head's
/// `run_after`), the wake rows left and the sequence's position.
const DUMP: &str = "\
SELECT coalesce(string_agg(line, E'\\n' ORDER BY line), '') AS dump FROM (
    SELECT 'job ' || (to_jsonb(j) - 'run_after' - 'created_at')::text
           || ' run_after=created_at:' || (j.run_after = j.created_at)::text AS line
    FROM pgfifo.job AS j
    UNION ALL
    SELECT 'group ' || (to_jsonb(g) - 'ready_at' - 'created_at')::text
           || ' ready_at=head.run_after:'
           || coalesce((g.ready_at = (SELECT run_after FROM pgfifo.job WHERE id = g.head_id))::text, 'null')
    FROM pgfifo.queue_group AS g
    UNION ALL
    SELECT 'wake rows ' || count(*) FROM pgfifo.group_wake
    UNION ALL
    SELECT 'sequence ' || last_value || ' ' || is_called FROM pgfifo.job_id_seq
) AS rows";

/// The size of the backlog [`check_fill`] compares (odd sizes on purpose:
/// the last round of groups is incomplete).
const CHECK_JOBS: u64 = 1_003;
const CHECK_GROUPS: u64 = 17;

/// The runner's pick (`db::sql::pick`), with no per-kind idle bounds.
const PICK: &str = "\
SELECT id, queue, group_id, kind, payload, max_attempts, pg_backend_pid() AS backend_pid
FROM pgfifo.pick(ARRAY['bench'], $1, ARRAY[]::text[], ARRAY[]::int[], 60000)";

/// A statement of one of the schema's functions, copied from
/// `migrations/0001_init/up.sql`, to be explained on its own: its variables
/// become parameters of the given types, bound to the given values.
struct Lookup {
    /// Name in the output.
    label: &'static str,
    /// The function that runs it (its settings, e.g. `enable_sort = off`,
    /// apply; its source must still contain the statement).
    function: &'static str,
    /// The statement as written in the function (whitespace aside).
    sql: &'static str,
    /// The statement's variables: name, SQL type, value for the EXPLAIN.
    params: &'static [(&'static str, &'static str, &'static str)],
}

/// The pick's statements on `queue_group` (find the highest priority with
/// ready groups; lock the first free group at or after a slot) and
/// `advance_head`'s look-up of a group's next head (run by every completion).
/// The slot is fixed at 0 here (the pick draws it at random); the job id of
/// the next-head lookup is the first job's, substituted at run time.
const LOOKUPS: &[Lookup] = &[
    Lookup {
        label: "priority_lookup",
        function: "pgfifo.pick",
        sql: "SELECT priority INTO v_prio FROM pgfifo.queue_group
              WHERE queue = v_q AND ready_at IS NOT NULL AND priority < v_bound
              ORDER BY priority DESC LIMIT 1",
        params: &[("v_q", "text", "'bench'"), ("v_bound", "integer", "32768")],
    },
    Lookup {
        label: "group_lookup",
        function: "pgfifo.pick",
        sql: "SELECT queue, group_id, head_id INTO v_group FROM pgfifo.queue_group
              WHERE queue = v_q AND ready_at IS NOT NULL AND priority = v_prio
                AND slot >= v_slot AND ready_at <= v_now
              ORDER BY slot LIMIT 1
              FOR UPDATE SKIP LOCKED",
        params: &[
            ("v_q", "text", "'bench'"),
            ("v_prio", "smallint", "0"),
            ("v_slot", "integer", "0"),
            ("v_now", "timestamptz", "statement_timestamp()"),
        ],
    },
    Lookup {
        label: "next_head_lookup",
        function: "pgfifo.advance_head",
        sql: "SELECT id, priority, run_after INTO v_next FROM pgfifo.job
              WHERE queue = p_queue AND group_id = p_group AND state = 'queued' AND id <> p_done
              ORDER BY id LIMIT 1",
        params: &[
            ("p_queue", "text", "'bench'"),
            ("p_group", "text", "'g0'"),
            ("p_done", "bigint", "$FIRST"),
        ],
    },
];

/// Runs `EXPLAIN` of a statement given as text and returns the JSON plan as
/// text (diesel cannot read EXPLAIN's column, named "QUERY PLAN").
const EXPLAIN_FUNCTION: &str = "\
CREATE OR REPLACE FUNCTION pg_temp.bench_explain(p_sql text) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE v_plan text;
BEGIN
    EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ' || p_sql INTO v_plan;
    RETURN v_plan;
END
$$";

#[derive(QueryableByName)]
struct Number {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[derive(QueryableByName)]
struct Flag {
    #[diesel(sql_type = Bool)]
    b: bool,
}

#[derive(QueryableByName)]
struct Dump {
    #[diesel(sql_type = Text)]
    dump: String,
}

#[derive(QueryableByName)]
struct PlanText {
    #[diesel(sql_type = Text)]
    plan: String,
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
    #[diesel(sql_type = Integer)]
    backend_pid: i32,
}

#[derive(QueryableByName)]
struct Attempt {
    #[diesel(sql_type = Integer)]
    attempt: i32,
}

pub async fn run(inputs: &Inputs) -> Result<Value, String> {
    let full = matches!(inputs.string("FULL", "0").as_str(), "1" | "true" | "yes");
    let default_sizes = if full {
        "10000:100,100000:1000,1000000:10000,10000000:100000"
    } else {
        "10000:100,100000:1000,1000000:10000"
    };
    let sizes = parse_sizes(&inputs.string("SIZES", default_sizes))?;
    let picks = inputs.number("PICKS", 3000)?.max(1) as usize;
    let server = inputs.database_url();

    check_fill(&server).await?;
    let mut results = Vec::new();
    for &(jobs, groups) in &sizes {
        results.push(measure(&server, jobs, groups, picks).await?);
    }
    common::drop_database(&server, DATABASE).await?;

    let median = |r: &Value| r["pick_median_ms"].as_f64().unwrap_or(0.0);
    // (Slice patterns: diesel's RunQueryDsl::first would shadow `first()`.)
    let ratio = match results.as_slice() {
        [first, .., last] if median(first) > 0.0 => round3(median(last) / median(first)),
        _ => 1.0,
    };
    progress!("median pick, largest vs smallest backlog: {ratio}x (goal <= {GOAL_RATIO}x)");
    Ok(json!({
        "scenario": "backlog",
        "picks": picks,
        "warmup": WARMUP,
        "fill_matches_enqueue": true,
        "pick_median_ratio_largest_vs_smallest": ratio,
        "goal_ratio": GOAL_RATIO,
        "flat": ratio <= GOAL_RATIO,
        "results": results,
    }))
}

/// Parses `jobs:groups,jobs:groups,…`.
fn parse_sizes(text: &str) -> Result<Vec<(u64, u64)>, String> {
    let sizes = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|pair| {
            let bad = || format!("SIZES: {pair:?} is not jobs:groups (e.g. 100000:1000)");
            let (jobs, groups) = pair.split_once(':').ok_or_else(bad)?;
            let jobs: u64 = jobs.trim().parse().map_err(|_| bad())?;
            let groups: u64 = groups.trim().parse().map_err(|_| bad())?;
            if jobs == 0 || groups == 0 || jobs > i32::MAX as u64 {
                return Err(bad());
            }
            Ok((jobs, groups))
        })
        .collect::<Result<Vec<_>, String>>()?;
    if sizes.is_empty() {
        return Err("SIZES is empty".into());
    }
    Ok(sizes)
}

/// Checks that [`fill`] leaves the rows the library would: fills a small
/// backlog in one database, enqueues the same jobs with
/// `pgfifo::enqueue_batch` (one call, one transaction) in another and makes
/// their groups active with `pgfifo.promote` as a runner would, then compares
/// every row ([`DUMP`]). Fails on any difference.
async fn check_fill(server: &str) -> Result<(), String> {
    let err = |e: diesel::result::Error| e.to_string();
    let reference_db = format!("{DATABASE}_reference");
    let (pool, _) = common::fresh_database(server, DATABASE, 1).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    fill(&mut conn, CHECK_JOBS, CHECK_GROUPS).await?;
    let filled: Dump = diesel::sql_query(DUMP)
        .get_result(&mut conn)
        .await
        .map_err(err)?;
    drop(conn);
    drop(pool);

    let (pool, _) = common::fresh_database(server, &reference_db, 1).await?;
    let mut conn = pool.get().await.map_err(|e| e.to_string())?;
    let jobs = (0..CHECK_JOBS)
        .map(|k| {
            let (g, s) = (k % CHECK_GROUPS, k / CHECK_GROUPS);
            let job = BenchJob {
                g: g as u32,
                s: s as u32,
            };
            NewJob::new(&job, EnqueueOptions::group(format!("g{g}")))
        })
        .collect::<pgfifo::Result<Vec<_>>>()
        .map_err(|e| e.to_string())?;
    pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .map_err(|e| e.to_string())?;
    diesel::sql_query("SELECT pgfifo.promote(ARRAY['bench'], 1000000) AS n")
        .execute(&mut conn)
        .await
        .map_err(|e| {
            format!("pgfifo.promote (the fill check mirrors the runner's promotion): {e}")
        })?;
    let enqueued: Dump = diesel::sql_query(DUMP)
        .get_result(&mut conn)
        .await
        .map_err(err)?;
    drop(conn);
    drop(pool);
    common::drop_database(server, &reference_db).await?;

    if filled.dump != enqueued.dump {
        let (f, e): (Vec<&str>, Vec<&str>) = (
            filled.dump.lines().collect(),
            enqueued.dump.lines().collect(),
        );
        let at = f
            .iter()
            .zip(&e)
            .position(|(a, b)| a != b)
            .unwrap_or(f.len().min(e.len()));
        return Err(format!(
            "the backlog fill no longer matches what enqueue_batch + promote leave; first difference \
             (line {at} of {} / {}):\n  fill:    {}\n  enqueue: {}\nupdate FILL_JOBS / FILL_GROUPS in backlog.rs",
            f.len(),
            e.len(),
            f.get(at).unwrap_or(&"(none)"),
            e.get(at).unwrap_or(&"(none)"),
        ));
    }
    progress!("fill check: {CHECK_JOBS} jobs / {CHECK_GROUPS} groups filled = enqueued + promoted");
    Ok(())
}

async fn measure(server: &str, jobs: u64, groups: u64, picks: usize) -> Result<Value, String> {
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
    for i in 0..total {
        let cycle_started = Instant::now();
        job_conn.batch_execute("BEGIN").await.map_err(err)?;
        let pick_started = Instant::now();
        let mut picked: Vec<Picked> = diesel::sql_query(PICK)
            .bind::<Integer, _>(i as i32 + 1)
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
        diesel::sql_query("SELECT pgfifo.complete($1, $2, 'succeeded', NULL, NULL, NULL)")
            .bind::<BigInt, _>(job.id)
            .bind::<Integer, _>(attempt)
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

/// Fills the backlog in one transaction; returns the first job id.
async fn fill(conn: &mut AsyncPgConnection, jobs: u64, groups: u64) -> Result<i64, String> {
    let err = |e: diesel::result::Error| e.to_string();
    let (jobs, groups) = (jobs as i64, groups as i64);
    conn.batch_execute("BEGIN").await.map_err(err)?;
    let first: Number = diesel::sql_query("SELECT nextval('pgfifo.job_id_seq') AS n")
        .get_result(conn)
        .await
        .map_err(err)?;
    let first = first.n;
    diesel::sql_query("SELECT setval('pgfifo.job_id_seq', $1) AS n")
        .bind::<BigInt, _>(first + jobs - 1)
        .get_result::<Number>(conn)
        .await
        .map_err(err)?;
    diesel::sql_query(FILL_JOBS)
        .bind::<BigInt, _>(first)
        .bind::<Text, _>(BenchJob::QUEUE)
        .bind::<BigInt, _>(groups)
        .bind::<Text, _>(BenchJob::NAME)
        .bind::<SmallInt, _>(BenchJob::PRIORITY)
        .bind::<Integer, _>(BenchJob::MAX_ATTEMPTS as i32)
        .bind::<BigInt, _>(jobs)
        .execute(conn)
        .await
        .map_err(err)?;
    diesel::sql_query(FILL_GROUPS)
        .bind::<BigInt, _>(first)
        .bind::<Text, _>(BenchJob::QUEUE)
        .bind::<SmallInt, _>(BenchJob::PRIORITY)
        .bind::<BigInt, _>(groups)
        .bind::<BigInt, _>(jobs)
        .execute(conn)
        .await
        .map_err(err)?;
    conn.batch_execute("COMMIT").await.map_err(err)?;
    Ok(first)
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of one lookup: with a custom and with the
/// generic plan (PL/pgSQL settles on the generic plan after a few calls)
/// under the settings its function runs with, and the generic plan under the
/// session's defaults (does the plan depend on those settings?). Each run is
/// rolled back (the group lookup takes a row lock). Also says whether the
/// statement still appears in the function's source, i.e. whether the copy
/// here is current.
async fn explain(
    conn: &mut AsyncPgConnection,
    lookup: &Lookup,
    first_id: i64,
) -> Result<Value, String> {
    let err = |e: diesel::result::Error| e.to_string();
    let source: Dump = diesel::sql_query(
        "SELECT coalesce((SELECT pg_get_functiondef(to_regproc($1))), '') AS dump",
    )
    .bind::<Text, _>(lookup.function)
    .get_result(conn)
    .await
    .map_err(err)?;
    let in_source = squeeze(&source.dump).contains(&squeeze(lookup.sql));
    if !in_source {
        progress!(
            "warning: {} is no longer in {}'s source; the plan shown is of the copy in backlog.rs",
            lookup.label,
            lookup.function
        );
    }
    let names: Vec<&str> = lookup.params.iter().map(|p| p.0).collect();
    let types: Vec<&str> = lookup.params.iter().map(|p| p.1).collect();
    let first = first_id.to_string();
    let args: Vec<String> = lookup
        .params
        .iter()
        .map(|p| format!("{}::{}", p.2.replace("$FIRST", &first), p.1))
        .collect();
    conn.batch_execute(&format!(
        "PREPARE pgfifo_bench_explain({}) AS {}",
        types.join(", "),
        parameterize(lookup.sql, &names)
    ))
    .await
    .map_err(err)?;
    let mut out = serde_json::Map::new();
    let mut settings = serde_json::Map::new();
    for (label, mode, function_settings) in [
        ("custom", "force_custom_plan", true),
        ("generic", "force_generic_plan", true),
        ("generic_default_settings", "force_generic_plan", false),
    ] {
        conn.batch_execute(&format!("BEGIN; SET LOCAL plan_cache_mode = {mode}"))
            .await
            .map_err(err)?;
        let plan = async {
            if function_settings {
                diesel::sql_query(
                    "SELECT count(set_config(split_part(c, '=', 1), substr(c, strpos(c, '=') + 1), true)) AS n \
                     FROM pg_proc, unnest(proconfig) AS c WHERE oid = to_regproc($1)",
                )
                .bind::<Text, _>(lookup.function)
                .get_result::<Number>(conn)
                .await?;
            }
            diesel::sql_query("SELECT pg_temp.bench_explain($1) AS plan")
                .bind::<Text, _>(format!("EXECUTE pgfifo_bench_explain({})", args.join(", ")))
                .get_result::<PlanText>(conn)
                .await
        }
        .await;
        conn.batch_execute("ROLLBACK").await.map_err(err)?;
        let plan: Value =
            serde_json::from_str(&plan.map_err(err)?.plan).map_err(|e| e.to_string())?;
        if function_settings {
            settings.insert(label.to_owned(), summarize(&plan));
        } else {
            out.insert(label.to_owned(), summarize(&plan));
        }
    }
    conn.batch_execute("DEALLOCATE pgfifo_bench_explain")
        .await
        .map_err(err)?;
    out.insert("function_settings".to_owned(), Value::Object(settings));
    out.insert("function".to_owned(), json!(lookup.function));
    out.insert("copy_is_current".to_owned(), json!(in_source));
    Ok(Value::Object(out))
}

/// `text` with runs of whitespace made single spaces.
fn squeeze(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A PL/pgSQL statement as a standalone one: its `INTO var` clause dropped
/// and its variables `names[i]` replaced by `$i+1` (whole identifiers only).
fn parameterize(sql: &str, names: &[&str]) -> String {
    let mut out = String::new();
    let mut words = sql.split_whitespace().peekable();
    while let Some(word) = words.next() {
        if word.eq_ignore_ascii_case("INTO") {
            words.next();
            continue;
        }
        let mut ident = String::new();
        for c in word.chars().chain(std::iter::once(' ')) {
            if c.is_ascii_alphanumeric() || c == '_' {
                ident.push(c);
                continue;
            }
            match names.iter().position(|n| *n == ident) {
                Some(i) => out.push_str(&format!("${}", i + 1)),
                None => out.push_str(&ident),
            }
            ident.clear();
            if c != ' ' {
                out.push(c);
            }
        }
        out.push(' ');
    }
    out.trim_end().to_owned()
}

/// The gist of an `EXPLAIN (FORMAT JSON)` result: the node chain from the top
/// (`Limit > LockRows > Index Scan using …`), the indexes used, whether the
/// plan is index-driven (an index scan, no sequential scan, no sort), timings
/// and buffers.
fn summarize(explain: &Value) -> Value {
    fn walk<'a>(node: &'a Value, nodes: &mut Vec<&'a Value>) {
        nodes.push(node);
        for child in node["Plans"].as_array().into_iter().flatten() {
            walk(child, nodes);
        }
    }
    fn label(node: &Value) -> String {
        let kind = node["Node Type"].as_str().unwrap_or("?");
        match node["Index Name"].as_str() {
            Some(index) => format!("{kind} using {index}"),
            None => kind.to_owned(),
        }
    }
    let top = &explain[0];
    let plan = &top["Plan"];
    let mut nodes = Vec::new();
    walk(plan, &mut nodes);
    let chain: Vec<String> = nodes.iter().map(|n| label(n)).collect();
    let indexes: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n["Index Name"].as_str())
        .collect();
    let kinds: Vec<&str> = nodes
        .iter()
        .filter_map(|n| n["Node Type"].as_str())
        .collect();
    let index_driven = kinds.iter().any(|k| k.starts_with("Index"))
        && !kinds
            .iter()
            .any(|k| matches!(*k, "Seq Scan" | "Sort" | "Incremental Sort"));
    json!({
        "plan": chain.join(" > "),
        "top_node": plan["Node Type"],
        "index": nodes.iter().find_map(|n| n["Index Name"].as_str()),
        "indexes": indexes,
        "index_driven": index_driven,
        "execution_ms": top["Execution Time"],
        "planning_ms": top["Planning Time"],
        "shared_hit_blocks": plan["Shared Hit Blocks"],
        "shared_read_blocks": plan["Shared Read Blocks"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(
            parse_sizes("10000:100, 100000:1000").unwrap(),
            [(10_000, 100), (100_000, 1000)]
        );
        assert!(parse_sizes("10000").is_err());
        assert!(parse_sizes("0:10").is_err());
        assert!(parse_sizes("").is_err());
    }

    #[test]
    fn statements_become_standalone() {
        assert_eq!(
            parameterize(LOOKUPS[1].sql, &["v_q", "v_prio", "v_slot", "v_now"]),
            "SELECT queue, group_id, head_id FROM pgfifo.queue_group WHERE queue = $1 AND ready_at IS NOT NULL \
             AND priority = $2 AND slot >= $3 AND ready_at <= $4 ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED"
        );
        assert_eq!(
            parameterize("SELECT f(v_a,v_ab) INTO x FROM t", &["v_a"]),
            "SELECT f($1,v_ab) FROM t"
        );
    }

    #[test]
    fn plans_summarize() {
        let plan = json!([{"Plan": {"Node Type": "Limit", "Shared Hit Blocks": 3, "Plans": [
            {"Node Type": "LockRows", "Plans": [
                {"Node Type": "Index Scan", "Index Name": "queue_group_ready_idx"}]}]},
            "Execution Time": 0.05, "Planning Time": 0.1}]);
        let s = summarize(&plan);
        assert_eq!(
            s["plan"],
            "Limit > LockRows > Index Scan using queue_group_ready_idx"
        );
        assert_eq!(s["index"], "queue_group_ready_idx");
        assert_eq!(s["index_driven"], true);
        let seq = json!([{"Plan": {"Node Type": "Limit", "Plans": [{"Node Type": "Sort", "Plans": [
            {"Node Type": "Seq Scan"}]}]}}]);
        assert_eq!(summarize(&seq)["index_driven"], false);
    }
}
