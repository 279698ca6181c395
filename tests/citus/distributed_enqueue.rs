//! Enqueue on the distributed layout: the same calls as on one server
//! (`Job::enqueue`, `enqueue_batch`, in the application's transaction or
//! alone), each job and wake-up on its group's part, unique keys kept
//! within a group, and a single enqueue's statements each on one shard.

use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Nullable, SmallInt, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use pgfifo::migrate::{self, Distributed};
use pgfifo::{EnqueueOptions, Job, NewJob};
use pgfifo_tests::citus::Cluster;
use pgfifo_tests::query::{scalar, text};

use crate::coordinator::{job, migrated_cluster};
use crate::jobs::LogJob;

/// A migrated cluster with the distributed layout.
pub(crate) async fn distributed_cluster() -> (Cluster, AsyncPgConnection) {
    let (cluster, mut conn) = migrated_cluster().await;
    assert_eq!(
        migrate::distribute(&mut conn).await.expect("distribute"),
        Distributed::Now
    );
    (cluster, conn)
}

fn log_job(group: &str, seq: i64) -> LogJob {
    LogJob {
        group: group.to_owned(),
        seq,
        fail_first: false,
        hold_ms: 0,
    }
}

/// Rows of `table` whose part is not the one their queue and group give.
async fn misplaced(conn: &mut AsyncPgConnection, table: &str) -> i64 {
    scalar(
        conn,
        &format!(
            "SELECT count(*) FROM pgfifo.{table} WHERE part <> pgfifo.part_of(queue, group_id)"
        ),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn enqueue_puts_each_job_on_its_groups_part() {
    let (_cluster, mut conn) = distributed_cluster().await;

    // One job alone, then a batch of 200 groups × 2 and 20 ungrouped jobs.
    let first = log_job("solo", 0)
        .enqueue(&mut conn, "solo")
        .await
        .expect("enqueue one job");
    let mut jobs = Vec::new();
    for seq in 0..2 {
        for g in 0..200 {
            jobs.push(job(&format!("g{g:03}"), seq, false));
        }
    }
    for seq in 0..20 {
        jobs.push(NewJob::new(&log_job("", seq), EnqueueOptions::ungrouped()).expect("new job"));
    }
    let ids = pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .expect("enqueue a batch");
    assert_eq!(ids.len(), 420);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids in input order");
    assert!(ids[0] > first);

    assert_eq!(
        scalar(&mut conn, "SELECT count(*) FROM pgfifo.job").await,
        421
    );
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE part <> pgfifo.job_part(queue, group_id, id, unique_key)"
        )
        .await,
        0
    );
    // Every group is woken once it commits, on its own part.
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(DISTINCT (queue, group_id)) FROM pgfifo.group_wake"
        )
        .await,
        201
    );
    assert_eq!(misplaced(&mut conn, "group_wake").await, 0);

    // Within the application's transaction: gone with a rollback, there
    // after a commit.
    let rolled_back: Result<(), pgfifo::Error> = conn
        .transaction(async |conn| {
            log_job("tx", 1).enqueue(conn, "tx").await?;
            Err(pgfifo::Error::InvalidOption("roll back".into()))
        })
        .await;
    assert!(rolled_back.is_err());
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id = 'tx'"
        )
        .await,
        0
    );
    conn.transaction::<_, pgfifo::Error, _>(async |conn| {
        log_job("tx", 2).enqueue(conn, "tx").await?;
        diesel::sql_query("CREATE TABLE app_row AS SELECT 1 AS x")
            .execute(conn)
            .await?;
        Ok(())
    })
    .await
    .expect("commit");
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE group_id = 'tx'"
        )
        .await,
        1
    );

    // A delayed job keeps its time.
    let delayed = log_job("later", 0)
        .enqueue_with(
            &mut conn,
            EnqueueOptions::group("later").run_in(Duration::from_secs(3600)),
        )
        .await
        .expect("a delayed job");
    assert_eq!(
        scalar(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job
                 WHERE id = {delayed} AND run_after > now() + interval '59 minutes'"
            )
        )
        .await,
        1
    );

    // Unique keys: a second enqueue with the key gets the first job's id,
    // for a group's jobs and for ungrouped ones.
    for options in [
        || EnqueueOptions::group("keyed").unique_key("k1"),
        || EnqueueOptions::ungrouped().unique_key("k2"),
    ] {
        let a = log_job("keyed", 0)
            .enqueue_with(&mut conn, options())
            .await
            .expect("keyed");
        let b = log_job("keyed", 1)
            .enqueue_with(&mut conn, options())
            .await
            .expect("keyed again");
        assert_eq!(a, b, "the key's holder is returned");
    }
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job WHERE unique_key IS NOT NULL"
        )
        .await,
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn a_traced_enqueue_keeps_each_context_beside_its_job() {
    let (_cluster, mut conn) = distributed_cluster().await;
    let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    let ids: Vec<i64> = diesel::sql_query(
        "SELECT unnest(pgfifo.enqueue($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)) AS id",
    )
    .bind::<Array<Text>, _>(vec!["citus"; 3])
    .bind::<Array<Nullable<Text>>, _>(vec![Some("a"), Some("b"), None])
    .bind::<Array<Text>, _>(vec![LogJob::KIND; 3])
    .bind::<Array<Jsonb>, _>(vec![serde_json::json!({}); 3])
    .bind::<Array<SmallInt>, _>(vec![0i16; 3])
    .bind::<Array<Integer>, _>(vec![3; 3])
    .bind::<Array<Nullable<Text>>, _>(vec![None::<&str>, None, Some("trace-key")])
    .bind::<Array<Nullable<BigInt>>, _>(vec![None::<i64>; 3])
    .bind::<Array<Nullable<BigInt>>, _>(vec![None::<i64>; 3])
    .bind::<Array<Nullable<Text>>, _>(vec![Some(tp); 3])
    .bind::<Array<Nullable<Text>>, _>(vec![None::<&str>; 3])
    .load::<Id>(&mut conn)
    .await
    .expect("a traced enqueue")
    .into_iter()
    .map(|r| r.id)
    .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM pgfifo.job_trace AS t JOIN pgfifo.job AS j
               ON j.part = t.part AND j.id = t.job_id"
        )
        .await,
        3,
        "each context on its job's part"
    );
}

#[derive(diesel::QueryableByName)]
struct Id {
    #[diesel(sql_type = BigInt)]
    id: i64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn a_single_enqueue_runs_each_statement_on_its_groups_shard() {
    let (cluster, mut conn) = distributed_cluster().await;
    // Warm up (the first call plans and caches), then log what the
    // coordinator sends to the workers for one enqueue into a new group.
    log_job("warm", 0)
        .enqueue(&mut conn, "warm")
        .await
        .expect("warm up");
    conn.batch_execute("SET citus.log_remote_commands = on; SET log_min_messages = notice")
        .await
        .expect("log remote commands");
    for g in ["shape-a", "shape-b", "shape-c"] {
        conn.batch_execute(&format!("SET application_name = '{g}'"))
            .await
            .expect("name the session");
        for seq in 0..3 {
            log_job(g, seq)
                .enqueue(&mut conn, g)
                .await
                .expect("enqueue");
        }
    }
    conn.batch_execute("RESET citus.log_remote_commands; RESET log_min_messages")
        .await
        .expect("reset");
    let log = cluster.coordinator.log_text();
    for g in ["shape-a", "shape-b", "shape-c"] {
        let commands = remote_commands(&log, g);
        // Three enqueues: a job's insert each, the group's row read and
        // its wake row; a multi-shard statement would send one command
        // per shard (32).
        assert!(
            (3..=12).contains(&commands.len()),
            "{g}: {} remote commands for three enqueues: {commands:?}",
            commands.len()
        );
        let ranges = shard_ranges(&mut conn, &commands).await;
        assert!(
            !ranges.is_empty() && !ranges.contains(','),
            "{g}'s enqueues touched several shards ({ranges}): {commands:?}"
        );
        let holds = scalar(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pg_dist_shard
                 WHERE logicalrelid = 'pgfifo.job'::regclass AND shardminvalue = '{ranges}'
                   AND shardid = get_shard_id_for_distribution_column(
                       'pgfifo.job', pgfifo.part_of('citus', '{g}'))"
            ),
        )
        .await;
        assert_eq!(holds, 1, "{g}'s shard is not that of its part");
    }
}

/// The hash ranges (their lower ends, joined with ",") of the shards that
/// `commands` (from [`remote_commands`]) name.
pub(crate) async fn shard_ranges(
    conn: &mut AsyncPgConnection,
    commands: &[(String, Vec<i64>)],
) -> String {
    let ids: Vec<String> = commands
        .iter()
        .flat_map(|(_, ids)| ids.iter().map(i64::to_string))
        .collect();
    text(
        conn,
        &format!(
            "SELECT string_agg(DISTINCT shardminvalue, ',') FROM pg_dist_shard
             WHERE shardid IN ({}) AND shardminvalue IS NOT NULL",
            ids.join(",")
        ),
    )
    .await
    .unwrap_or_default()
}

/// The remote commands that sessions named `app` logged: each command's
/// text and the shard ids it names (`pgfifo.<table>_<shard id>`).
pub(crate) fn remote_commands(log: &str, app: &str) -> Vec<(String, Vec<i64>)> {
    let mut found = Vec::new();
    for line in log.lines() {
        if !line.contains(&format!(" {app} ")) || !line.contains("issuing ") {
            continue;
        }
        let command = line[line.find("issuing ").unwrap_or(0)..].to_owned();
        let mut ids = Vec::new();
        for piece in command.split("pgfifo.").skip(1) {
            let name: String = piece
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if let Some((_, id)) = name.rsplit_once('_') {
                if let Ok(id) = id.parse::<i64>() {
                    ids.push(id);
                }
            }
        }
        if !ids.is_empty() {
            found.push((command, ids));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs Citus (scripts/citus-build.sh); .ci/run runs it"]
async fn the_sql_enqueue_api_puts_each_job_on_its_part() {
    let (_cluster, mut conn) = distributed_cluster().await;
    let one = scalar(
        &mut conn,
        "SELECT pgfifo.add_job(kind => 'citus.log', queue => 'citus',
                               payload => '{\"group\": \"sql-a\", \"seq\": 0, \"fail_first\": false, \"hold_ms\": 0}',
                               group_id => 'sql-a')",
    )
    .await;
    assert_eq!(
        scalar(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job
                 WHERE id = {one} AND part = pgfifo.part_of('citus', 'sql-a')"
            )
        )
        .await,
        1,
        "add_job's job on its group's part"
    );
    let ids = text(
        &mut conn,
        "SELECT pgfifo.add_jobs('[
             {\"kind\": \"citus.log\", \"queue\": \"citus\", \"group_id\": \"sql-b\", \"payload\": {}},
             {\"kind\": \"citus.log\", \"queue\": \"citus\", \"payload\": {}, \"unique_key\": \"k-1\"},
             {\"kind\": \"citus.log\", \"queue\": \"citus\", \"group_id\": \"sql-b\", \"payload\": {},
              \"traceparent\": \"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01\"}
         ]'::jsonb)::text",
    )
    .await
    .expect("add_jobs");
    let ids: Vec<i64> = ids
        .trim_matches(['{', '}'])
        .split(',')
        .map(|id| id.parse().expect("an id"))
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "in input order: {ids:?}"
    );
    assert_eq!(
        scalar(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job AS j
                 WHERE j.id = ANY ('{{{}}}') AND j.part = pgfifo.job_part(j.queue, j.group_id, j.id, j.unique_key)",
                ids.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
            )
        )
        .await,
        3,
        "each job on its part"
    );
    assert_eq!(
        scalar(
            &mut conn,
            &format!(
                "SELECT count(*) FROM pgfifo.job_trace AS t JOIN pgfifo.job AS j
                   ON j.part = t.part AND j.id = t.job_id WHERE j.id = {}",
                ids[2]
            )
        )
        .await,
        1,
        "the traced job's context beside it"
    );
    // (Windows and the outcomes: `distributed_windows`.)
}
