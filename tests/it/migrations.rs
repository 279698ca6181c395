//! Schema migrations on databases created here without the migrated
//! template: apply, idempotence, status, rollback, re-apply, concurrent
//! migrations, the function set, and the bookkeeping tables living apart
//! from the host application's. (The runner's schema check:
//! `schema_check.rs`; upgrades from a released schema: `upgrade.rs`.)

use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use pgfifo::migrate::{self, FunctionsStatus, Migrated, MigrationStatus, SchemaStatus};
use pgfifo::runner::JobOutcome;
use pgfifo::{async_trait, Error, Handler, Job, JobContext, JobError};
use pgfifo_tests::query::{scalar, text};
use pgfifo_tests::{test_config, FreshDb};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "migrations", max_attempts = 2, timeout = "30s")]
pub struct MigrationsJob {
    n: i64,
}

#[async_trait]
impl Handler for MigrationsJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        ctx.set_result(&self.n)?;
        Ok(())
    }
}

/// How many of pgfifo's tables, sequences and functions of version 1 exist.
async fn schema_objects(conn: &mut AsyncPgConnection) -> i64 {
    scalar(
        conn,
        "SELECT (to_regclass('pgfifo.job') IS NOT NULL)::int
              + (to_regclass('pgfifo.queue_group') IS NOT NULL)::int
              + (to_regclass('pgfifo.job_attempt') IS NOT NULL)::int
              + (to_regclass('pgfifo.job_id_seq') IS NOT NULL)::int
              + (SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
                 WHERE n.nspname = 'pgfifo')",
    )
    .await
}

/// Every version this library ships, oldest first.
fn all_versions() -> Vec<i64> {
    migrate::MIGRATIONS.iter().map(|m| m.version).collect()
}

/// Every version, newest first: what a full rollback reverts.
fn all_versions_reversed() -> Vec<i64> {
    all_versions().into_iter().rev().collect()
}

/// How many migrations there are (versions need not be contiguous: a
/// number can be reserved for a migration of another branch).
pub(crate) fn count() -> i64 {
    migrate::MIGRATIONS.len() as i64
}

/// The newest schema version.
pub(crate) fn latest() -> i64 {
    migrate::latest_version()
}

/// The status of every migration: the first `applied` of them applied,
/// with `functions`.
fn status_first(applied: usize, functions: FunctionsStatus) -> SchemaStatus {
    SchemaStatus {
        migrations: migrate::MIGRATIONS
            .iter()
            .enumerate()
            .map(|(i, m)| MigrationStatus {
                version: m.version,
                name: m.name.into(),
                release: Some(m.release.into()),
                applied: i < applied,
            })
            .collect(),
        functions,
        layout: migrate::Layout::Plain,
    }
}

/// Everything applied and current, or nothing at all.
fn status_all(applied: bool) -> SchemaStatus {
    if applied {
        status_first(migrate::MIGRATIONS.len(), FunctionsStatus::Current)
    } else {
        status_first(0, FunctionsStatus::Unrecorded)
    }
}

/// What a migrate of an empty database does.
fn everything() -> Migrated {
    Migrated {
        applied: all_versions(),
        functions_installed: true,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_is_idempotent_reversible_and_repeatable() {
    let db = FreshDb::new("mig").await;
    let mut conn = db.connect().await;
    assert_eq!(
        migrate::release_of(latest()),
        Some(migrate::RELEASE),
        "the newest migration is this release's"
    );
    assert_eq!(
        scalar(&mut conn, "(to_regclass('pgfifo.job') IS NULL)::int").await,
        1
    );
    assert_eq!(migrate::status(&mut conn).await.unwrap(), status_all(false));
    assert!(
        matches!(
            migrate::check_current(&mut conn).await,
            Err(Error::SchemaOutdated { found: None, needed }) if needed == latest()
        ),
        "an unmigrated database is outdated"
    );

    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        everything()
    );
    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        Migrated::default(),
        "idempotent"
    );
    assert_eq!(migrate::status(&mut conn).await.unwrap(), status_all(true));
    migrate::check_current(&mut conn).await.unwrap();
    assert_eq!(
        scalar(&mut conn, "SELECT count(*) FROM pgfifo.schema_migrations").await,
        count()
    );
    let objects = schema_objects(&mut conn).await;
    assert!(
        objects >= 4 + 7,
        "tables, sequence and functions exist: {objects}"
    );

    // Down to 0.1.0's schema (version 2) and up again: the migrations after
    // it are reverted and re-applied. The functions stay (they accept
    // 0.1.0's calls) but are no longer recorded; migrate records them again.
    let newest = count() as usize;
    let since_0_1_0: Vec<i64> = all_versions().into_iter().filter(|&v| v >= 3).collect();
    assert_eq!(
        migrate::rollback(&mut conn, newest - 2).await.unwrap(),
        since_0_1_0.iter().rev().copied().collect::<Vec<_>>()
    );
    assert_eq!(
        migrate::status(&mut conn).await.unwrap(),
        status_first(2, FunctionsStatus::Unrecorded)
    );
    let err = migrate::check_current(&mut conn).await.unwrap_err();
    assert!(
        matches!(err, Error::SchemaOutdated { found: Some(2), needed } if needed == latest()),
        "a database at 0.1.0's version is outdated: {err:?}"
    );
    assert_eq!(
        scalar(
            &mut conn,
            "(to_regprocedure('pgfifo.retry_jobs(bigint[])') IS NOT NULL)::int"
        )
        .await,
        1,
        "the functions stay when the newer migrations are reverted"
    );
    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        Migrated {
            applied: since_0_1_0,
            functions_installed: true
        }
    );
    assert_eq!(schema_objects(&mut conn).await, objects);

    // Down: the tables and functions go, the bookkeeping table stays, empty.
    assert_eq!(
        migrate::rollback(&mut conn, newest).await.unwrap(),
        all_versions_reversed()
    );
    assert_eq!(
        scalar(&mut conn, "(to_regclass('pgfifo.job') IS NULL)::int").await,
        1
    );
    assert_eq!(
        schema_objects(&mut conn).await,
        0,
        "everything of version 1 is gone"
    );
    assert_eq!(migrate::status(&mut conn).await.unwrap(), status_all(false));
    assert_eq!(
        scalar(&mut conn, "SELECT count(*) FROM pgfifo.schema_migrations").await,
        0
    );
    assert_eq!(
        migrate::rollback(&mut conn, 1).await.unwrap(),
        Vec::<i64>::new(),
        "nothing left to revert"
    );
    assert!(matches!(
        migrate::check_current(&mut conn).await,
        Err(Error::SchemaOutdated { found: None, needed }) if needed == latest()
    ));

    // Up, down, up again.
    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        everything()
    );
    assert_eq!(
        migrate::rollback(&mut conn, count() as usize)
            .await
            .unwrap(),
        all_versions_reversed()
    );
    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        everything()
    );
    assert_eq!(
        schema_objects(&mut conn).await,
        objects,
        "the same schema as the first time"
    );
    assert_eq!(migrate::status(&mut conn).await.unwrap(), status_all(true));

    // And it works: a job is enqueued and run.
    let pool = pgfifo::connect(&db.url, 6).await.unwrap();
    let id = MigrationsJob { n: 42 }
        .enqueue(&mut conn, "g")
        .await
        .unwrap();
    let runner = pgfifo::runner::start(pool.clone(), test_config().concurrency(2))
        .await
        .unwrap();
    let mut events = runner.subscribe();
    let event = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let event = events.recv().await.expect("runner events");
            if event.id == id {
                return event;
            }
        }
    })
    .await
    .expect("the job ran");
    assert_eq!(event.outcome, JobOutcome::Succeeded);
    runner.shutdown().await.unwrap();
    assert_eq!(
        text(
            &mut conn,
            &format!("SELECT state || ':' || result::text FROM pgfifo.job WHERE id = {id}")
        )
        .await
        .as_deref(),
        Some("succeeded:42")
    );
    drop(pool);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrations_apply_once() {
    let db = FreshDb::new("mig").await;
    let mut conns = Vec::new();
    for _ in 0..4 {
        conns.push(db.connect().await);
    }
    // Round 0 on a database without even the pgfifo schema; later rounds after
    // a rollback.
    for round in 0..3 {
        let results =
            futures_util::future::join_all(conns.iter_mut().map(migrate::migrate_conn)).await;
        let applied: Vec<Migrated> = results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|e| panic!("round {round}: a concurrent migrate failed: {e}"))
            })
            .collect();
        assert_eq!(
            applied.iter().filter(|a| **a == everything()).count(),
            1,
            "round {round}: exactly one call applied the migrations: {applied:?}"
        );
        assert!(
            applied
                .iter()
                .all(|a| a.nothing_to_do() || *a == everything()),
            "{applied:?}"
        );
        let conn = &mut conns[0];
        assert_eq!(
            scalar(conn, "SELECT count(*) FROM pgfifo.schema_migrations").await,
            count()
        );
        assert_eq!(
            scalar(
                conn,
                "SELECT count(*) FROM pgfifo.schema_migrations WHERE version = 1"
            )
            .await,
            1
        );
        assert_eq!(migrate::status(conn).await.unwrap(), status_all(true));
        if round < 2 {
            assert_eq!(
                migrate::rollback(conn, count() as usize).await.unwrap(),
                all_versions_reversed()
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bookkeeping_stays_apart_from_the_host_migrations() {
    let db = FreshDb::new("mig").await;
    let mut conn = db.connect().await;
    // The table diesel_migrations keeps for the host application.
    conn.batch_execute(
        "CREATE TABLE public.__diesel_schema_migrations (
             version VARCHAR(50) PRIMARY KEY NOT NULL,
             run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP);
         INSERT INTO public.__diesel_schema_migrations (version, run_on) VALUES
             ('00000000000000', '2024-01-01 00:00:00'),
             ('20240315120000', '2024-03-15 12:00:00'),
             ('20240401080000', '2024-04-01 08:00:00');",
    )
    .await
    .unwrap();
    let host_rows = "SELECT string_agg(version || '@' || run_on::text, ',' ORDER BY version) \
                     FROM public.__diesel_schema_migrations";
    let host_columns = "SELECT string_agg(column_name || ':' || data_type, ',' ORDER BY ordinal_position) \
                        FROM information_schema.columns \
                        WHERE table_schema = 'public' AND table_name = '__diesel_schema_migrations'";
    let public_tables = "SELECT string_agg(tablename, ',' ORDER BY tablename) FROM pg_tables WHERE schemaname = 'public'";
    let rows_before = text(&mut conn, host_rows).await;
    let columns_before = text(&mut conn, host_columns).await;
    assert_eq!(
        text(&mut conn, public_tables).await.as_deref(),
        Some("__diesel_schema_migrations")
    );

    let check_host = async |conn: &mut AsyncPgConnection| {
        assert_eq!(
            text(conn, host_rows).await,
            rows_before,
            "host migration rows untouched"
        );
        assert_eq!(
            text(conn, host_columns).await,
            columns_before,
            "host migration table unchanged"
        );
        assert_eq!(
            text(conn, public_tables).await.as_deref(),
            Some("__diesel_schema_migrations"),
            "pgfifo creates nothing in public"
        );
    };

    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        everything()
    );
    check_host(&mut conn).await;
    assert_eq!(
        text(
            &mut conn,
            "SELECT string_agg(version || ':' || name, ',' ORDER BY version) FROM pgfifo.schema_migrations"
        )
        .await
        .as_deref(),
        Some(
            migrate::MIGRATIONS
                .iter()
                .map(|m| format!("{}:{}", m.version, m.name))
                .collect::<Vec<_>>()
                .join(",")
                .as_str()
        ),
        "pgfifo records its migrations in pgfifo.schema_migrations"
    );
    assert_eq!(
        scalar(
            &mut conn,
            "SELECT count(*) FROM information_schema.tables WHERE table_name LIKE '%schema_migrations'"
        )
        .await,
        2,
        "exactly the host's table and pgfifo's"
    );
    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        Migrated::default()
    );
    assert_eq!(
        migrate::rollback(&mut conn, count() as usize)
            .await
            .unwrap(),
        all_versions_reversed()
    );
    check_host(&mut conn).await;
    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        everything()
    );
    check_host(&mut conn).await;
}

/// Reverting 0008 and the migrations after it, and applying them again with
/// the same release, installs the functions their `down.sql` dropped (they
/// forget the recorded function set, so `up` does not take them for
/// installed): those of 0011 (queue limits), 0009 (trace contexts) and
/// 0008 (shares).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn down_one_and_up_again_reinstalls_the_functions_it_dropped() {
    let db = FreshDb::new("mig").await;
    let mut conn = db.connect().await;
    migrate::migrate_conn(&mut conn).await.unwrap();
    let installed = "(to_regprocedure('pgfifo.share_candidates(text, smallint, integer, timestamptz)') IS NOT NULL)::int
         + (to_regprocedure('pgfifo.purge_job_traces(bigint, bigint)') IS NOT NULL)::int
         + (to_regprocedure('pgfifo.enqueue(text[], text[], text[], jsonb[], smallint[], integer[],
                                            text[], bigint[], bigint[], text[], text[])') IS NOT NULL)::int
         + (to_regprocedure('pgfifo.change_queue_control(text, text[], integer, integer, bigint, integer)') IS NOT NULL)::int";
    assert_eq!(scalar(&mut conn, installed).await, 4);
    let since_0008: Vec<i64> = migrate::MIGRATIONS
        .iter()
        .map(|m| m.version)
        .filter(|v| *v >= 8)
        .collect();
    // Down to 0008: everything after it goes, the functions of 0009 (trace
    // contexts) and 0011 (queue limits) with it.
    assert_eq!(
        migrate::rollback(&mut conn, since_0008.len() - 1)
            .await
            .unwrap(),
        since_0008[1..].iter().rev().copied().collect::<Vec<_>>()
    );
    assert_eq!(
        scalar(&mut conn, installed).await,
        1,
        "0009's and 0011's functions went"
    );
    assert_eq!(migrate::rollback(&mut conn, 1).await.unwrap(), vec![8]);
    assert_eq!(
        scalar(&mut conn, installed).await,
        0,
        "0008's functions went"
    );
    let migrated = migrate::migrate_conn(&mut conn).await.unwrap();
    assert_eq!(migrated.applied, since_0008);
    assert!(migrated.functions_installed);
    assert_eq!(scalar(&mut conn, installed).await, 4);
    migrate::check_current(&mut conn).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn distribute_refuses_a_database_without_citus_and_changes_nothing() {
    let db = FreshDb::new("mig").await;
    let mut conn = db.connect().await;
    // Before any migration: no citus, so that is the error (not the schema).
    let refused = migrate::distribute(&mut conn)
        .await
        .expect_err("distributed without citus");
    assert!(matches!(refused, pgfifo::Error::CitusMissing), "{refused}");
    migrate::migrate_conn(&mut conn).await.unwrap();
    let before = schema_objects(&mut conn).await;
    let refused = migrate::distribute(&mut conn)
        .await
        .expect_err("distributed without citus");
    assert!(matches!(refused, pgfifo::Error::CitusMissing), "{refused}");
    assert!(
        refused.to_string().contains("CREATE EXTENSION citus"),
        "the error says what to do: {refused}"
    );
    assert_eq!(schema_objects(&mut conn).await, before);
    let status = migrate::status(&mut conn).await.unwrap();
    assert_eq!(status.layout, migrate::Layout::Plain);
    migrate::check_current(&mut conn).await.unwrap();
}
