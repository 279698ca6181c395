//! Examples live in this package's `[[example]]` targets; this library holds
//! what they share.

use std::time::Duration;

use pgfifo::diesel_async::SimpleAsyncConnection;

pub mod polyglot;
pub mod throwaway_pg;

use throwaway_pg::ThrowawayPg;

/// How long the first connection to `DATABASE_URL` may take before the
/// server counts as unreachable: past what pgfifo gives each host of the
/// URL (5 s), so that the second host of a multi-host URL is tried when
/// the first hangs.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Logs to stderr, filtered by `RUST_LOG` (default: warnings).
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
}

/// The PostgreSQL server the examples use: `DATABASE_URL`, by default
/// `postgres://postgres@127.0.0.1:5432/postgres`.
pub fn server_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

/// A PostgreSQL server to run on: `DATABASE_URL`'s when it answers, else a
/// throwaway one started for this run (kept alive by the returned guard).
pub struct Server {
    /// The server's URL (its `postgres` database for a throwaway one).
    pub url: String,
    /// The throwaway server, stopped and deleted when dropped.
    pub throwaway: Option<ThrowawayPg>,
}

/// Finds a server for the demo: [`server_url`] if a connection succeeds
/// within a few seconds; otherwise, with the server binaries on the machine
/// and `PGFIFO_DEMO_THROWAWAY` not `off`, a throwaway server, announced in
/// one line on stderr. Fails with one line saying what to do when neither
/// works.
pub async fn demo_server() -> Result<Server, String> {
    let url = server_url();
    let problem = match tokio::time::timeout(PROBE_TIMEOUT, pgfifo::db::establish(&url)).await {
        Ok(Ok(_)) => {
            return Ok(Server {
                url,
                throwaway: None,
            })
        }
        Ok(Err(err)) => one_line(&err.to_string()),
        Err(_) => format!("no answer within {PROBE_TIMEOUT:?}"),
    };
    let shown = without_password(&url);
    let allowed = std::env::var("PGFIFO_DEMO_THROWAWAY").map_or(true, |v| v != "off");
    let Some(bin) = allowed.then(throwaway_pg::find_server_binaries).flatten() else {
        return Err(format!(
            "cannot reach PostgreSQL at {shown} ({problem}): start it (for example \
             `pg_ctlcluster 15 main start`) or set DATABASE_URL to a server you can reach"
        ));
    };
    let pg = ThrowawayPg::start(bin).map_err(|err| {
        format!(
            "cannot reach PostgreSQL at {shown} ({problem}), and a throwaway server would not \
             start: {}",
            one_line(&err)
        )
    })?;
    eprintln!(
        "pgfifo demo: no PostgreSQL at {shown} ({problem}); running on a throwaway server \
         at {} instead (files in {}, removed on exit)",
        pg.url(),
        pg.dir().display()
    );
    Ok(Server {
        url: pg.url(),
        throwaway: Some(pg),
    })
}

/// `text` on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `url` without the password it may carry, for messages.
fn without_password(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_owned();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or("");
            format!("{}{user}@{}", &url[..scheme_end], &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

/// What an example starts from: a [`Server`] (see [`demo_server`]), a fresh
/// database `name` on it, migrated, and a pool of `size` connections to it.
/// When no server can be had, prints one line naming `example` and exits
/// with status 2. Keep the returned server alive while the pool is used.
pub async fn example_database(
    example: &str,
    name: &str,
    size: u32,
) -> Result<(Server, pgfifo::Pool), Box<dyn std::error::Error>> {
    let server = match demo_server().await {
        Ok(server) => server,
        Err(problem) => {
            eprintln!("pgfifo {example}: {problem}");
            std::process::exit(2);
        }
    };
    let url = fresh_database(&server.url, name).await?;
    let pool = pgfifo::connect(&url, size).await?;
    pgfifo::migrate(&pool).await?;
    Ok((server, pool))
}

/// Creates a fresh database `name` on `server` (dropping the one a previous
/// run left), so every run starts from scratch. Returns its URL. `name` must
/// be a plain lowercase identifier: it is part of the statements (a database
/// name cannot be a bound parameter).
pub async fn fresh_database(
    server: &str,
    name: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let plain = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_';
    if name.is_empty() || !name.chars().all(plain) {
        return Err(format!("not a plain database name: {name:?}").into());
    }
    // (pgfifo's opener: a multi-host URL, `target_session_attrs` and the
    // `pgbouncer` flag work as for the pool.)
    let mut admin = pgfifo::db::establish(server).await?;
    admin
        .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .await?;
    admin
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    Ok(database_url(server, name))
}

/// `server`'s URL with its database replaced by `name`.
fn database_url(server: &str, name: &str) -> String {
    let (base, query) = match server.split_once('?') {
        Some((base, query)) => (base, format!("?{query}")),
        None => (server, String::new()),
    };
    let after_scheme = base.find("://").map_or(0, |i| i + 3);
    let root = match base[after_scheme..].find('/') {
        Some(slash) => &base[..after_scheme + slash],
        None => base,
    };
    format!("{root}/{name}{query}")
}

#[cfg(test)]
mod tests {
    use super::{database_url, without_password};

    #[test]
    fn passwords_stay_out_of_messages() {
        assert_eq!(
            without_password("postgres://app:s3cret@db:5432/x?sslmode=require"),
            "postgres://app@db:5432/x?sslmode=require"
        );
        assert_eq!(
            without_password("postgres://postgres@127.0.0.1/postgres"),
            "postgres://postgres@127.0.0.1/postgres"
        );
        assert_eq!(without_password("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn the_database_of_a_url_is_replaced() {
        assert_eq!(
            database_url("postgres://u@h:5432/postgres", "x"),
            "postgres://u@h:5432/x"
        );
        assert_eq!(database_url("postgres://h", "x"), "postgres://h/x");
        assert_eq!(
            database_url("postgres://h/db?sslmode=disable", "x"),
            "postgres://h/x?sslmode=disable"
        );
        assert_eq!(
            database_url(
                "postgres://u@a:5432,b:5432/postgres?target_session_attrs=read-write",
                "x"
            ),
            "postgres://u@a:5432,b:5432/x?target_session_attrs=read-write"
        );
    }
}
