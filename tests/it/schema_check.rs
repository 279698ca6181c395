//! A runner checks the schema before it starts: it refuses a database that
//! is not migrated, migrated to an older or a newer version, migrated from
//! different SQL, or holding another build's functions, with a message that
//! names the versions and the command to run, and it never migrates on its
//! own.

use diesel_async::SimpleAsyncConnection;
use pgfifo::migrate::{self, FunctionsStatus, Migrated};
use pgfifo::Error;
use pgfifo_tests::query::scalar;
use pgfifo_tests::{test_config, FreshDb, TestDb};

use super::migrations::latest;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_refuses_an_unmigrated_database() {
    let db = FreshDb::new("mig").await;
    let pool = pgfifo::connect(&db.url, 4).await.unwrap();
    let err = pgfifo::runner::start(pool.clone(), test_config())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::SchemaOutdated { found: None, needed } if needed == latest()),
        "expected SchemaOutdated, got {err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("missing")
            && message.contains(&format!("needs version {}", latest()))
            && message.contains("pgfifo migrate up"),
        "{message}"
    );
    let mut conn = db.connect().await;
    assert_eq!(
        scalar(
            &mut conn,
            "(SELECT count(*) FROM pg_namespace WHERE nspname = 'pgfifo')"
        )
        .await,
        0,
        "starting a runner does not migrate silently"
    );

    // Migrated then rolled back to 0.1.0's version: outdated, and the
    // message names both versions and the command.
    migrate::migrate(&pool).await.unwrap();
    migrate::rollback(&mut conn, migrate::MIGRATIONS.len() - 2)
        .await
        .unwrap();
    let err = pgfifo::runner::start(pool.clone(), test_config())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::SchemaOutdated { found: Some(2), needed } if needed == latest()),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("at version 2 (pgfifo 0.1.0)")
            && message.contains(&format!("pgfifo {}", migrate::RELEASE))
            && message.contains("pgfifo migrate up"),
        "{message}"
    );

    // A schema newer than this library: refused by the runner and by migrate.
    migrate::migrate(&pool).await.unwrap();
    let future = latest() + 1;
    conn.batch_execute(&format!(
        "INSERT INTO pgfifo.schema_migrations (version, name, checksum) VALUES ({future}, 'from_the_future', '')"
    ))
    .await
    .unwrap();
    let err = pgfifo::runner::start(pool.clone(), test_config())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew(v) if v == future),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains(&format!("at version {future}"))
            && message.contains(&format!("schema version {}", latest()))
            && message.contains("migrate status"),
        "{message}"
    );
    let err = migrate::migrate_conn(&mut conn).await.unwrap_err();
    assert!(
        matches!(err, Error::SchemaTooNew(v) if v == future),
        "{err:?}"
    );
    let status = migrate::status(&mut conn).await.unwrap();
    assert_eq!(
        status.migrations.len(),
        migrate::MIGRATIONS.len() + 1,
        "{status:?}"
    );
    assert!(status.migrations.iter().all(|s| s.applied), "{status:?}");
    assert_eq!(
        status.migrations.last().unwrap().release,
        None,
        "unknown here"
    );
    drop(pool);
}

/// A database whose migration 1 was applied from different SQL (another
/// pgfifo build) is refused at start, before any job runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_refuses_a_schema_migrated_from_different_sql() {
    let db = TestDb::new().await;
    db.exec(
        "UPDATE pgfifo.schema_migrations SET checksum = md5('something else') WHERE version = 1",
    )
    .await;
    let err = pgfifo::runner::start(db.pool.clone(), test_config())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::SchemaMismatch(1)), "{err:?}");
    assert!(err.to_string().contains("differs"), "{err}");
}

/// Functions installed by another build (or release) are refused at start
/// with the command to run, and `migrate` reinstalls this release's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runner_refuses_functions_another_build_installed() {
    let db = TestDb::new().await;
    db.exec("UPDATE pgfifo.schema_functions SET checksum = md5('older'), release = '0.1.9'")
        .await;
    let err = pgfifo::runner::start(db.pool.clone(), test_config())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::FunctionsDiffer { installed_by } if installed_by == "0.1.9"),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.contains("installed by pgfifo 0.1.9") && message.contains("pgfifo migrate up"),
        "{message}"
    );
    let mut conn = db.conn().await;
    assert_eq!(
        migrate::status(&mut conn).await.unwrap().functions,
        FunctionsStatus::Different {
            installed_by: "0.1.9".into()
        }
    );
    assert_eq!(
        migrate::migrate_conn(&mut conn).await.unwrap(),
        Migrated {
            applied: vec![],
            functions_installed: true
        }
    );
    migrate::check_current(&mut conn).await.unwrap();
}
