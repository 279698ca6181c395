//! The PostgreSQL server the tests share: its URL, the migrated template
//! that test databases are cloned from, creating and dropping test
//! databases, and sweeping what failed runs left behind.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use diesel::sql_types::{BigInt, Text};
use diesel::QueryableByName;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};

/// The server tests run against.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// `url` with its database name replaced by `db`.
pub fn url_for(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((base, query)) => (base, Some(query)),
        None => (url, None),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let base = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    match query {
        Some(query) => format!("{base}/{db}?{query}"),
        None => format!("{base}/{db}"),
    }
}

/// Drops database `name` at the end of a test that passed; keeps it (and
/// says so) when the test failed. From a thread of its own: Drop cannot
/// await, and the test's runtime may be shutting down.
pub(crate) fn drop_unless_failed(name: &str) {
    if std::thread::panicking() {
        eprintln!("test failed: database {name} kept for inspection");
        return;
    }
    let name = name.to_owned();
    let _ = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            if let Ok(mut admin) = AsyncPgConnection::establish(&server_url()).await {
                let _ = admin
                    .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await;
            }
        });
    })
    .join();
}

/// A connection to the server's default database, for creating and
/// dropping databases.
async fn admin() -> AsyncPgConnection {
    AsyncPgConnection::establish(&server_url())
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e} (is PostgreSQL running?)", server_url()))
}

/// A new test database name: `pgfifo_test_<secs>_<pid>_<tag><n>`. The
/// creation time in it lets [`sweep_stale`] drop what failed runs left.
pub(crate) fn unique_name(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "pgfifo_test_{}_{}_{tag}{}",
        epoch_secs(),
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates database `name`, from `template` or else PostgreSQL's default.
pub(crate) async fn create_database(name: &str, template: Option<&str>) {
    let create = match template {
        Some(template) => format!("CREATE DATABASE \"{name}\" TEMPLATE \"{template}\""),
        None => format!("CREATE DATABASE \"{name}\""),
    };
    admin()
        .await
        .batch_execute(&create)
        .await
        .unwrap_or_else(|e| panic!("create test database {name}: {e}"));
}

/// The template database for the current migrations, created on first use
/// under an advisory lock (parallel test processes create it once).
pub(crate) async fn ensure_template() -> String {
    // The same template `pgfifo::testing::TestDatabase` clones: one per
    // schema (migrations, functions, release).
    let template = pgfifo::testing::template_name();

    #[derive(QueryableByName)]
    struct Count {
        #[diesel(sql_type = BigInt)]
        n: i64,
    }
    let mut admin = admin().await;
    admin
        .batch_execute("SELECT pg_advisory_lock(8099555043121823745)")
        .await
        .expect("template lock");
    let existing: Count =
        diesel::sql_query("SELECT count(*) AS n FROM pg_database WHERE datname = $1")
            .bind::<Text, _>(&template)
            .get_result(&mut admin)
            .await
            .expect("look for the template");
    if existing.n == 0 {
        sweep_stale(&mut admin).await;
        let building = format!("{template}_building");
        for sql in [
            format!("DROP DATABASE IF EXISTS \"{building}\" WITH (FORCE)"),
            format!("CREATE DATABASE \"{building}\""),
        ] {
            admin
                .batch_execute(&sql)
                .await
                .expect("create the template database");
        }
        {
            let mut conn = AsyncPgConnection::establish(&url_for(&server_url(), &building))
                .await
                .expect("connect to the template");
            pgfifo::migrate::migrate_conn(&mut conn)
                .await
                .expect("migrate the template");
        }
        admin
            .batch_execute(&format!(
                "ALTER DATABASE \"{building}\" RENAME TO \"{template}\"; \
                 ALTER DATABASE \"{template}\" WITH IS_TEMPLATE true; \
                 COMMENT ON DATABASE \"{template}\" IS 'pgfifo test template created {}'",
                epoch_secs()
            ))
            .await
            .expect("publish the template");
    }
    admin
        .batch_execute("SELECT pg_advisory_unlock(8099555043121823745)")
        .await
        .expect("template unlock");
    template
}

fn epoch_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

/// Drops test databases left by failed runs more than a day ago, and
/// templates of other schema versions made more than an hour ago (a test
/// run of another checkout may still be cloning a younger one).
async fn sweep_stale(admin: &mut AsyncPgConnection) {
    #[derive(QueryableByName)]
    struct Name {
        #[diesel(sql_type = Text)]
        datname: String,
        #[diesel(sql_type = diesel::sql_types::Nullable<Text>)]
        comment: Option<String>,
    }
    let names: Vec<Name> = diesel::sql_query(
        "SELECT datname::text AS datname, shobj_description(oid, 'pg_database') AS comment
         FROM pg_database WHERE datname LIKE 'pgfifo\\_te%'",
    )
    .load(admin)
    .await
    .unwrap_or_default();
    let now = epoch_secs();
    let older_than = |created: Option<u64>, secs: u64| {
        created.is_none_or(|created| now.saturating_sub(created) > secs)
    };
    for Name { datname, comment } in names {
        let stale = if let Some(rest) = datname.strip_prefix("pgfifo_test_") {
            let created = rest.split('_').next().and_then(|s| s.parse::<u64>().ok());
            created.is_some() && older_than(created, 86_400)
        } else if datname.starts_with("pgfifo_template_") {
            let created = comment
                .as_deref()
                .and_then(|c| c.rsplit(' ').next())
                .and_then(|s| s.parse::<u64>().ok());
            older_than(created, 3_600)
        } else {
            false
        };
        if stale {
            let _ = admin
                .batch_execute(&format!(
                    "ALTER DATABASE \"{datname}\" WITH IS_TEMPLATE false"
                ))
                .await;
            let _ = admin
                .batch_execute(&format!(
                    "DROP DATABASE IF EXISTS \"{datname}\" WITH (FORCE)"
                ))
                .await;
        }
    }
}

/// An empty database (from PostgreSQL's default template, not pgfifo's
/// migrated one), dropped when the test passes and kept when it fails.
pub struct FreshDb {
    name: String,
    /// Its URL.
    pub url: String,
}

impl FreshDb {
    /// Creates it; `tag` goes into its name (which follows the harness's
    /// naming scheme, so databases of failed runs are swept).
    pub async fn new(tag: &str) -> FreshDb {
        let name = unique_name(tag);
        create_database(&name, None).await;
        let url = url_for(&server_url(), &name);
        FreshDb { name, url }
    }

    /// A direct connection to it.
    pub async fn connect(&self) -> AsyncPgConnection {
        AsyncPgConnection::establish(&self.url)
            .await
            .expect("connect to the fresh database")
    }
}

impl Drop for FreshDb {
    fn drop(&mut self) {
        drop_unless_failed(&self.name);
    }
}

#[cfg(test)]
mod tests {
    use super::url_for;

    #[test]
    fn replaces_the_database_name() {
        assert_eq!(
            url_for("postgres://u@h:5432/postgres", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(url_for("postgres://u@h:5432", "x"), "postgres://u@h:5432/x");
        assert_eq!(
            url_for("postgres://u@h/db?sslmode=disable", "x"),
            "postgres://u@h/x?sslmode=disable"
        );
    }
}
