//! The backlog's fill: set-based statements that leave the rows enqueue and
//! promotion would, and the check of that against the library.

use diesel::sql_types::{BigInt, Integer, SmallInt, Text};
use diesel_async::{AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::{EnqueueOptions, Job, NewJob};

use super::{Dump, Number, DATABASE};
use crate::common::{self, BenchJob};
use crate::progress;

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
pub(super) const FILL_JOBS: &str = "\
INSERT INTO pgfifo.job (id, queue, group_id, kind, payload, priority, max_attempts, run_after)
SELECT $1 + k, $2, 'g' || (k % $3), $4,
       jsonb_build_object('g', k % $3, 's', k / $3),
       $5, $6, now()
FROM generate_series(0::bigint, $7 - 1) AS k";

/// Inserts the `queue_group` rows of the backlog's groups, active, as the
/// runner's promotion leaves them. Enqueue writes no group row: for each new
/// group it appends a `pgfifo.group_wake` row, and `pgfifo.promote` (run by a
/// runner after the commit) consumes it, inserts the group row with
/// `slot = pgfifo.group_hash(queue, group)` and sets `head_id` = the
/// group's oldest queued job, `priority` and `ready_at` = that job's priority
/// and `run_after`. This statement writes that end state directly (no wake
/// rows left, as after the promotion). Job k is in group `k % groups`, so the
/// smallest k of group g is k = g (groups with g >= jobs get no job and no
/// row): head id `$1 + g`. `now()` is the same as in [`FILL_JOBS`] because
/// both run in one transaction.
const FILL_GROUPS: &str = "\
INSERT INTO pgfifo.queue_group (queue, group_id, slot, head_id, priority, ready_at)
SELECT $2, 'g' || g, pgfifo.group_hash($2, 'g' || g), $1 + g, $3, now()
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

/// Checks that [`fill`] leaves the rows the library would: fills a small
/// backlog in one database, enqueues the same jobs with
/// `pgfifo::enqueue_batch` (one call, one transaction) in another and makes
/// their groups active with `pgfifo.promote` as a runner would, then compares
/// every row ([`DUMP`]). Fails on any difference.
pub(super) async fn check_fill(server: &str) -> Result<(), String> {
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
    diesel::sql_query("SELECT promoted AS n FROM pgfifo.promote(ARRAY['bench'], 1000000)")
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

/// Fills the backlog in one transaction; returns the first job id.
pub(super) async fn fill(
    conn: &mut AsyncPgConnection,
    jobs: u64,
    groups: u64,
) -> Result<i64, String> {
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
        .bind::<Text, _>(BenchJob::KIND)
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
