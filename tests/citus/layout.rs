//! The premises of the distributed layout (docs/scaling.md, "On Citus"),
//! checked on the real cluster with a miniature of it: groups and jobs in
//! tables distributed by a bucket (a fixed hash of queue and group modulo
//! 1024) and co-located, so that a group's row and its jobs share a shard.
//!
//! These are the facts the layout stands on; if a Citus release changes
//! one of them, the plan must change, and this test says which.

use std::time::Duration;

use diesel::sql_types::Integer;
use diesel::QueryableByName;

use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo_tests::citus::Cluster;
use pgfifo_tests::eventually;
use pgfifo_tests::query::{scalar, text};

/// The miniature: 32 shards, 1024 buckets, 400 groups of 5 jobs.
pub(crate) const SCHEMA: &str = "
    CREATE SCHEMA probe;
    CREATE FUNCTION probe.bucket(p_queue text, p_group text) RETURNS integer
        LANGUAGE sql IMMUTABLE PARALLEL SAFE
        RETURN (hashtext(p_queue || chr(31) || p_group) & 1023);
    CREATE TABLE probe.queue_group (
        bucket integer NOT NULL, queue text NOT NULL, group_id text NOT NULL,
        head_seq bigint, PRIMARY KEY (bucket, queue, group_id));
    CREATE TABLE probe.job (
        bucket integer NOT NULL, id bigint NOT NULL, queue text NOT NULL,
        group_id text NOT NULL, seq bigint NOT NULL, state text NOT NULL DEFAULT 'queued',
        PRIMARY KEY (bucket, id));
    SELECT create_distributed_table('probe.queue_group', 'bucket', shard_count := 32);
    SELECT create_distributed_table('probe.job', 'bucket', colocate_with := 'probe.queue_group');
    INSERT INTO probe.queue_group (bucket, queue, group_id, head_seq)
        SELECT probe.bucket('q', 'g' || g), 'q', 'g' || g, 1 FROM generate_series(1, 400) g;
    INSERT INTO probe.job (bucket, id, queue, group_id, seq)
        SELECT probe.bucket('q', 'g' || g), g * 10 + s, 'q', 'g' || g, s
        FROM generate_series(1, 400) g, generate_series(1, 5) s;
    -- The per-bucket pick: lock a ready group of the bucket and its head.
    CREATE FUNCTION probe.pick(p_bucket integer) RETURNS TABLE (port integer, job_id bigint)
    LANGUAGE plpgsql AS $$
    DECLARE v_group record;
    BEGIN
        SELECT g.queue, g.group_id, g.head_seq INTO v_group FROM probe.queue_group AS g
        WHERE g.bucket = p_bucket AND g.head_seq IS NOT NULL
        ORDER BY g.group_id LIMIT 1 FOR UPDATE SKIP LOCKED;
        RETURN QUERY SELECT inet_server_port(), j.id FROM probe.job AS j
        WHERE j.bucket = p_bucket AND j.queue = v_group.queue
          AND j.group_id = v_group.group_id AND j.seq = v_group.head_seq
        FOR UPDATE SKIP LOCKED;
    END $$;
    SELECT create_distributed_function('probe.pick(integer)', 'p_bucket',
                                       colocate_with := 'probe.queue_group');
    -- The per-shard pick: the same over every bucket of one shard, called
    -- with one of them for the delegation.
    CREATE FUNCTION probe.pick_shard(p_bucket integer, p_buckets integer[])
    RETURNS TABLE (port integer, job_id bigint)
    LANGUAGE plpgsql AS $$
    DECLARE v_group record;
    BEGIN
        SELECT g.bucket, g.queue, g.group_id, g.head_seq INTO v_group FROM probe.queue_group AS g
        WHERE g.bucket = ANY (p_buckets) AND g.head_seq IS NOT NULL
        ORDER BY g.group_id LIMIT 1 FOR UPDATE SKIP LOCKED;
        RETURN QUERY SELECT inet_server_port(), j.id FROM probe.job AS j
        WHERE j.bucket = v_group.bucket AND j.queue = v_group.queue
          AND j.group_id = v_group.group_id AND j.seq = v_group.head_seq
        FOR UPDATE SKIP LOCKED;
    END $$;
    SELECT create_distributed_function('probe.pick_shard(integer, integer[])', 'p_bucket',
                                       colocate_with := 'probe.queue_group');
    -- EXPLAIN as rows of text, for the plan's task count.
    CREATE FUNCTION probe.explain(p_query text) RETURNS SETOF text LANGUAGE plpgsql AS $$
    DECLARE v_line text;
    BEGIN
        FOR v_line IN EXECUTE 'EXPLAIN ' || p_query LOOP
            RETURN NEXT v_line;
        END LOOP;
    END $$;
";

#[derive(QueryableByName, Debug)]
struct Pick {
    #[diesel(sql_type = Integer)]
    port: i32,
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    job_id: i64,
}

/// The port of the worker holding `bucket`'s shard of `probe.queue_group`.
async fn holder(conn: &mut AsyncPgConnection, bucket: i32) -> i64 {
    scalar(
        conn,
        &format!(
            "SELECT p.nodeport FROM pg_dist_shard_placement p
             WHERE p.shardid = get_shard_id_for_distribution_column('probe.queue_group', {bucket})"
        ),
    )
    .await
}

/// A query for the buckets (of 0..1024) on the shard of `bucket`, as an
/// array literal.
fn buckets_of_shard_of(bucket: i32) -> String {
    format!(
        "SELECT array_agg(b ORDER BY b)::text FROM generate_series(0, 1023) AS b
         WHERE get_shard_id_for_distribution_column('probe.queue_group', b)
             = get_shard_id_for_distribution_column('probe.queue_group', {bucket})"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn a_bucket_pick_runs_on_one_shard_and_buckets_spread_over_both_workers() {
    let cluster = Cluster::start().await.expect("start the Citus cluster");
    let mut conn = cluster.coordinator_conn().await.expect("coordinator");
    conn.batch_execute(SCHEMA)
        .await
        .expect("the miniature layout");
    let workers: Vec<i64> = cluster
        .workers
        .iter()
        .map(|w| i64::from(w.port()))
        .collect();

    // 1. A locking read that names its bucket is a router query: one task,
    //    on one shard.
    let plan = text(
        &mut conn,
        "SELECT string_agg(p, E'\\n') FROM probe.explain(
             'SELECT group_id FROM probe.queue_group WHERE bucket = 7 AND head_seq IS NOT NULL
              LIMIT 1 FOR UPDATE SKIP LOCKED') AS p",
    )
    .await;
    let plan = plan.unwrap_or_default();
    assert!(
        plan.contains("Task Count: 1"),
        "the bucket's pick is not a single-shard query:\n{plan}"
    );

    // 1b. So is one that names every bucket of one shard (about 32 of the
    //     1024): a runner can visit shards, not buckets.
    let bucket = i32::try_from(scalar(&mut conn, "SELECT probe.bucket('q', 'g1')").await)
        .expect("bucket fits");
    let shard_buckets = text(&mut conn, &buckets_of_shard_of(bucket))
        .await
        .expect("the shard's buckets");
    let plan = text(
        &mut conn,
        &format!(
            "SELECT string_agg(p, E'\\n') FROM probe.explain(
                 'SELECT group_id FROM probe.queue_group WHERE bucket = ANY (''{shard_buckets}'')
                  AND head_seq IS NOT NULL LIMIT 1 FOR UPDATE SKIP LOCKED') AS p"
        ),
    )
    .await
    .unwrap_or_default();
    assert!(
        plan.contains("Task Count: 1"),
        "the pick over one shard's buckets is not a single-shard query:\n{plan}"
    );

    // 2. The same without the bucket is refused: a pick across buckets
    //    cannot lock rows on Citus.
    let refused = diesel::sql_query(
        "SELECT group_id FROM probe.queue_group WHERE head_seq IS NOT NULL
         LIMIT 1 FOR UPDATE SKIP LOCKED",
    )
    .execute(&mut conn)
    .await
    .expect_err("a multi-shard FOR UPDATE ran");
    assert!(
        refused.to_string().contains("FOR UPDATE"),
        "refused for another reason: {refused}"
    );

    // 3. A distributed function called with its bucket runs whole on the
    //    worker that holds the bucket's shard, and locks there.
    for bucket in [3, 100, 517, 1000] {
        let expected = holder(&mut conn, bucket).await;
        let picks: Vec<Pick> = diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
            .bind::<Integer, _>(bucket)
            .load(&mut conn)
            .await
            .expect("pick");
        // An empty bucket returns no row; the port check needs one that has groups.
        if let [pick, ..] = picks.as_slice() {
            assert_eq!(
                i64::from(pick.port),
                expected,
                "bucket {bucket}'s pick ran elsewhere than its shard"
            );
            assert!(workers.contains(&expected));
            assert!(pick.job_id > 0);
        }
    }
    // One bucket that surely has a group: that of g1.
    let delegated: Pick = diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
        .bind::<Integer, _>(bucket)
        .get_result(&mut conn)
        .await
        .expect("pick of g1's bucket");
    assert_eq!(
        i64::from(delegated.port),
        holder(&mut conn, bucket).await,
        "the pick was not delegated to the worker holding its bucket"
    );
    // The per-shard pick is delegated the same way and finds g1's job among
    // its shard's buckets.
    let shard_pick: Vec<Pick> =
        diesel::sql_query("SELECT port, job_id FROM probe.pick_shard($1, $2)")
            .bind::<Integer, _>(bucket)
            .bind::<diesel::sql_types::Array<Integer>, _>(
                shard_buckets
                    .trim_matches(|c| c == '{' || c == '}')
                    .split(',')
                    .map(|b| b.parse::<i32>().expect("a bucket"))
                    .collect::<Vec<i32>>(),
            )
            .load(&mut conn)
            .await
            .expect("pick of g1's shard");
    assert_eq!(shard_pick.len(), 1, "{shard_pick:?}");
    assert_eq!(
        i64::from(shard_pick[0].port),
        holder(&mut conn, bucket).await,
        "the per-shard pick was not delegated to the worker holding the shard"
    );
    assert_eq!(
        scalar(
            &mut conn,
            &format!(
                "SELECT count(*) FROM probe.job WHERE id = {} AND bucket = ANY ('{shard_buckets}')",
                shard_pick[0].job_id
            )
        )
        .await,
        1,
        "the per-shard pick returned a job of another shard"
    );

    // In a transaction block (a job's transaction) the call in FROM is
    // delegated too, and the row locks it takes on the worker last until
    // the coordinator's transaction ends: a second pick of the bucket skips
    // the group meanwhile, and gets it once the first rolls back.
    conn.batch_execute("BEGIN").await.expect("begin");
    let in_block: Pick = diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
        .bind::<Integer, _>(bucket)
        .get_result(&mut conn)
        .await
        .expect("pick in a transaction block");
    assert_eq!(i64::from(in_block.port), holder(&mut conn, bucket).await);
    assert_eq!(in_block.job_id, delegated.job_id);
    let mut other = cluster.coordinator_conn().await.expect("coordinator");
    let meanwhile: Vec<Pick> = diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
        .bind::<Integer, _>(bucket)
        .load(&mut other)
        .await
        .expect("a second pick");
    assert!(
        meanwhile.iter().all(|p| p.job_id != in_block.job_id),
        "a second pick got a job whose group the first holds: {meanwhile:?}"
    );
    conn.batch_execute("ROLLBACK").await.expect("rollback");
    let after: Pick = diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
        .bind::<Integer, _>(bucket)
        .get_result(&mut other)
        .await
        .expect("a pick after the rollback");
    assert_eq!(after.job_id, in_block.job_id);

    // 4. Groups spread by bucket: each worker holds 35–65 % of the jobs.
    let total = scalar(&mut conn, "SELECT count(*) FROM probe.job").await;
    for port in &workers {
        // Rows counted in each shard, where it lives.
        let here = scalar(
            &mut conn,
            &format!(
                "SELECT coalesce(sum(r.result::bigint), 0) FROM
                     run_command_on_shards('probe.job', 'SELECT count(*) FROM %s') AS r
                 JOIN pg_dist_shard_placement AS p USING (shardid)
                 WHERE r.success AND p.nodeport = {port}"
            ),
        )
        .await;
        let share = here as f64 / total as f64;
        eprintln!(
            "citus layout: worker on port {port} holds {here} of {total} jobs ({:.1} %)",
            share * 100.0
        );
        assert!(
            (0.35..=0.65).contains(&share),
            "worker {port} holds {:.1} % of the jobs",
            share * 100.0
        );
    }

    // 5. A worker that stops takes its buckets with it: picks of the other
    //    worker's buckets go on, and the stopped worker's buckets come back
    //    with it.
    let mut on = [None, None];
    for g in 1..=400 {
        let bucket =
            i32::try_from(scalar(&mut conn, &format!("SELECT probe.bucket('q', 'g{g}')")).await)
                .expect("bucket fits");
        let port = holder(&mut conn, bucket).await;
        let i = usize::from(port != workers[0]);
        on[i].get_or_insert(bucket);
    }
    let [Some(on_stopped), Some(on_running)] = on else {
        panic!("no group on one of the workers: {on:?}");
    };
    cluster.workers[0].stop_fast().expect("stop worker 1");
    let running: Pick = diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
        .bind::<Integer, _>(on_running)
        .get_result(&mut conn)
        .await
        .expect("a pick on the running worker");
    assert_eq!(i64::from(running.port), workers[1]);
    let failed = diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
        .bind::<Integer, _>(on_stopped)
        .load::<Pick>(&mut conn)
        .await;
    assert!(failed.is_err(), "a pick of a stopped worker's bucket ran");
    cluster.workers[0].start().expect("restart worker 1");
    let url = cluster.url();
    let back = eventually(
        "a pick on the restarted worker",
        Duration::from_secs(60),
        || {
            let url = url.clone();
            async move {
                let mut conn = AsyncPgConnection::establish(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                diesel::sql_query("SELECT port, job_id FROM probe.pick($1)")
                    .bind::<Integer, _>(on_stopped)
                    .get_result::<Pick>(&mut conn)
                    .await
                    .map_err(|e| e.to_string())
            }
        },
    )
    .await;
    assert_eq!(i64::from(back.port), workers[0]);
}
