//! Examples live in this package's `[[example]]` targets; this library holds
//! what they share.

use pgfifo::diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

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
    let mut admin = AsyncPgConnection::establish(server).await?;
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
    use super::database_url;

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
    }
}
