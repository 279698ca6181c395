//! The distributed layout itself (`pgfifo::migrate::distribute`,
//! docs/scaling.md): a queue enqueued on the coordinator's plain layout is
//! spread over the cluster, every row of a group on the group's part, the
//! small tables copied to every node, and the database says which layout
//! it has.

use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use pgfifo::migrate::{self, Distributed, FunctionsStatus, Layout};
use pgfifo::{EnqueueOptions, NewJob};
use pgfifo_tests::query::{scalar, text};

use crate::coordinator::{job, migrated_cluster};
use crate::jobs::LogJob;

/// Each table's distribution: (table, method, column, colocated with
/// queue_group / batch / reference).
const EXPECTED: &str = "
    SELECT string_agg(format('%s %s %s', p.logicalrelid::text,
                             coalesce(column_to_column_name(p.logicalrelid, p.partkey), '-'),
                             CASE p.colocationid
                                 WHEN (SELECT colocationid FROM pg_dist_partition
                                       WHERE logicalrelid = 'pgfifo.queue_group'::regclass) THEN 'groups'
                                 WHEN (SELECT colocationid FROM pg_dist_partition
                                       WHERE logicalrelid = 'pgfifo.batch'::regclass) THEN 'batches'
                                 ELSE p.partmethod::text END),
                      ', ' ORDER BY p.logicalrelid::text)
    FROM pg_dist_partition AS p WHERE p.logicalrelid::text LIKE 'pgfifo.%'";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn distribute_spreads_a_queue_over_both_workers_by_group() {
    let (cluster, mut conn) = migrated_cluster().await;

    // A queue on the plain layout first: 300 groups of 3 jobs, 40
    // ungrouped jobs, a paused group and one with a concurrency; 250 of
    // the groups made active (rows in queue_group), the rest still
    // waiting to be (rows in group_wake).
    let mut jobs = Vec::new();
    for g in 0..300 {
        for seq in 0..3 {
            jobs.push(job(&format!("g{g:03}"), seq, false));
        }
    }
    for seq in 0..40 {
        let ungrouped = LogJob {
            group: String::new(),
            seq,
            fail_first: false,
            hold_ms: 0,
        };
        jobs.push(NewJob::new(&ungrouped, EnqueueOptions::default()).expect("new job"));
    }
    pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .expect("enqueue");
    conn.batch_execute(
        "SELECT pgfifo.pause_group('citus', 'g007');
         SELECT pgfifo.set_group_control('citus', 'g008', NULL, NULL, NULL, 2);
         SELECT pgfifo.promote(ARRAY['citus'], 250);",
    )
    .await
    .expect("a paused group and a controlled one");

    // Weights do not run on the distributed layout: a database that has
    // one is refused, naming its queue, and keeps its layout.
    conn.batch_execute(
        "SELECT pgfifo.set_group_control('citus', 'g009', NULL, NULL, NULL, NULL, 3)",
    )
    .await
    .expect("a weight");
    let refused = migrate::distribute(&mut conn)
        .await
        .expect_err("distribute with a weight set");
    assert!(
        refused.to_string().contains("weights") && refused.to_string().contains("citus"),
        "{refused}"
    );
    assert_eq!(
        migrate::layout(&mut conn).await.expect("layout"),
        Layout::Plain
    );
    conn.batch_execute(
        "SELECT pgfifo.set_group_control('citus', 'g009', NULL, NULL, NULL, p_reset => true)",
    )
    .await
    .expect("no weight");

    assert_eq!(
        migrate::distribute(&mut conn).await.expect("distribute"),
        Distributed::Now
    );
    assert_eq!(
        migrate::distribute(&mut conn).await.expect("again"),
        Distributed::Already,
        "a second call changes nothing"
    );

    // The tables, as docs/scaling.md lists them.
    let layout = text(&mut conn, EXPECTED).await.unwrap_or_default();
    for group_table in [
        "queue_group",
        "job",
        "job_attempt",
        "job_trace",
        "job_run",
        "group_pause",
        "group_wake",
        "group_bucket",
        "group_slot",
        "group_snooze",
        "group_share",
        "batch_job",
        "job_dependency",
        "job_wait",
        "job_window",
    ] {
        assert!(
            layout.contains(&format!("pgfifo.{group_table} part groups")),
            "{group_table} is not distributed by part with the groups: {layout}"
        );
    }
    assert!(layout.contains("pgfifo.batch id batches"), "{layout}");
    for batch_table in ["batch_shard", "batch_callback"] {
        assert!(
            layout.contains(&format!("pgfifo.{batch_table} batch_id batches")),
            "{layout}"
        );
    }
    for reference in ["queue_setting", "layout_shard"] {
        assert!(
            layout.contains(&format!("pgfifo.{reference} - n")),
            "{reference} is not a reference table: {layout}"
        );
    }
    for local in [
        "runner",
        "queue_minute",
        "schedule",
        "schedule_tick",
        "group_control",
        "queue_control",
        "queue_slot",
        "queue_bucket",
        "schema_migrations",
        "schema_functions",
    ] {
        assert!(
            !layout.contains(&format!("pgfifo.{local} ")),
            "{local} should stay on the coordinator: {layout}"
        );
    }

    // Nothing lost, and every row on its group's part (an ungrouped job's:
    // its id's).
    assert_eq!(
        scalar(&mut conn, "SELECT count(*) FROM pgfifo.job").await,
        940
    );
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE part <> pgfifo.job_part(queue, group_id, id, unique_key)"
        )
        .await,
        0
    );
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id IS NULL AND unique_key IS NULL AND part <> (id & 1023)"
        )
        .await,
        0
    );
    for table in ["queue_group", "group_wake", "group_pause", "group_slot"] {
        assert_eq!(
            scalar(
                &mut conn,
                &format!(
                    "SELECT count(*) FROM pgfifo.{table} WHERE part <> pgfifo.part_of(queue, group_id)"
                )
            )
            .await,
            0,
            "{table}"
        );
    }
    assert_eq!(
        scalar(&mut conn, "SELECT count(*) FROM pgfifo.group_pause").await,
        1
    );
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM (SELECT queue, group_id FROM pgfifo.queue_group
                                   UNION SELECT queue, group_id FROM pgfifo.group_wake) AS g"
        )
        .await,
        300
    );
    assert_eq!(
        scalar(&mut conn, "SELECT count(*) FROM pgfifo.queue_group").await,
        250
    );

    // The work spreads: each worker holds 35–65 % of the jobs, and each
    // group's row and jobs are on one worker.
    let per_worker = text(
        &mut conn,
        "SELECT string_agg(n::text, ',' ORDER BY port) FROM (
             SELECT p.nodeport AS port, count(*) AS n FROM pgfifo.job AS j
             JOIN pg_dist_shard_placement AS p
               ON p.shardid = get_shard_id_for_distribution_column('pgfifo.job', j.part)
             GROUP BY 1) AS w",
    )
    .await
    .unwrap_or_default();
    let counts: Vec<i64> = per_worker
        .split(',')
        .map(|n| n.parse().expect("a count"))
        .collect();
    assert_eq!(counts.len(), 2, "jobs on both workers: {per_worker}");
    for n in &counts {
        assert!(
            (329..=611).contains(n),
            "a worker holds {n} of 940 jobs, outside 35–65 %: {per_worker}"
        );
    }
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job AS j JOIN pgfifo.queue_group AS g
               ON g.part = j.part AND g.queue = j.queue AND g.group_id = j.group_id
             JOIN pg_dist_shard_placement AS jp
               ON jp.shardid = get_shard_id_for_distribution_column('pgfifo.job', j.part)
             JOIN pg_dist_shard_placement AS gp
               ON gp.shardid = get_shard_id_for_distribution_column('pgfifo.queue_group', g.part)
             WHERE jp.nodeport <> gp.nodeport"
        )
        .await,
        0,
        "a group's jobs on another worker than its row"
    );
    // The rows are where the metadata says: the worker's own shards hold
    // its share.
    let mut worker = cluster.worker_conn(0).await.expect("worker");
    // Citus hides shards from the catalog unless asked.
    worker
        .batch_execute("SET citus.show_shards_for_app_name_prefixes = '*'")
        .await
        .expect("show shards");
    let local = scalar(
        &mut worker,
        "SELECT coalesce(sum(n), 0)::bigint FROM (
             SELECT (xpath('/row/c/text()',
                     query_to_xml(format('SELECT count(*) AS c FROM pgfifo.%I', c.relname),
                                  false, true, '')))[1]::text::bigint AS n
             FROM pg_class AS c JOIN pg_namespace AS s ON s.oid = c.relnamespace
             WHERE s.nspname = 'pgfifo' AND c.relname ~ '^job_[0-9]+$') AS t",
    )
    .await;
    let port = i64::from(cluster.workers[0].port());
    let expected = scalar(
        &mut conn,
        &format!(
            "SELECT count(*) FROM pgfifo.job AS j JOIN pg_dist_shard_placement AS p
               ON p.shardid = get_shard_id_for_distribution_column('pgfifo.job', j.part)
             WHERE p.nodeport = {port}"
        ),
    )
    .await;
    assert_eq!(local, expected, "the first worker's shards of pgfifo.job");

    // The database says so, and its schema is current for a runner.
    let status = migrate::status(&mut conn).await.expect("status");
    assert_eq!(status.layout, Layout::Distributed);
    assert_eq!(
        migrate::layout(&mut conn).await.expect("layout"),
        Layout::Distributed
    );
    assert_eq!(status.functions, FunctionsStatus::Current);
    assert!(status.pending().next().is_none());
    migrate::check_current(&mut conn)
        .await
        .expect("current for a runner");
    // What is not ported refuses, naming it: reverting migrations, and
    // (below) weights.
    let refused = migrate::rollback(&mut conn, 1)
        .await
        .expect_err("a rollback of the distributed layout");
    assert!(
        matches!(refused, pgfifo::Error::NotDistributed(_)),
        "{refused}"
    );
    // The group limits set before stayed (a table of the coordinator); a
    // weight is refused, naming it.
    assert_eq!(
        text(
            &mut conn,
            "SELECT string_agg(group_id || ':' || concurrency, ',') FROM pgfifo.group_control"
        )
        .await
        .as_deref(),
        Some("g008:2")
    );
    let refused = diesel::sql_query(
        "SELECT pgfifo.set_group_control('citus', 'g009', NULL, NULL, NULL, NULL, 2)",
    )
    .execute(&mut conn)
    .await
    .expect_err("weights on the distributed layout");
    assert!(
        refused.to_string().contains("weights")
            && refused.to_string().contains("distributed layout"),
        "{refused}"
    );
    // migrate keeps the distributed form of the functions.
    let again = migrate::migrate_conn(&mut conn).await.expect("migrate");
    assert!(again.nothing_to_do(), "{again:?}");

    // On a worker, distribute and migrate refuse, and say where to go.
    let refused = migrate::distribute(&mut worker)
        .await
        .expect_err("distribute on a worker");
    assert!(matches!(refused, pgfifo::Error::CitusWorker), "{refused}");
    let refused = migrate::migrate_conn(&mut worker)
        .await
        .expect_err("migrate on a worker");
    assert!(refused.to_string().contains("coordinator"), "{refused}");
}
