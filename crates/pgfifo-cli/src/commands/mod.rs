//! One module per family of commands. Each command takes the connection and
//! the [`Output`](crate::output::Output), calls the library, and prints.

pub mod batches;
pub mod dashboard;
pub mod inspect;
pub mod job_types;
pub mod limits;
pub mod migrate;
pub mod ops;
pub mod queue_limits;
pub mod schedules;
pub mod status;

use pgfifo::db::PooledConnection;

use crate::error::{CliError, CliResult};

/// Opens the one connection a command uses, with `pgfifo::connect`'s
/// connect timeout and keepalives (or, through a transaction-mode pooler,
/// prepared for it). A database that cannot be reached is an operational
/// failure (exit code 1); the message names the server and database (never
/// the password).
pub async fn connect(url: &str, transaction_pooler: bool) -> CliResult<PooledConnection> {
    let unreachable = |detail: String| {
        let target = server_of(url).map_or_else(String::new, |t| format!(" at {t}"));
        CliError::failure(format!("cannot connect to the database{target}: {detail}"))
    };
    let options = pgfifo::ConnectOptions::new(1).transaction_pooler(transaction_pooler);
    let pool = pgfifo::connect_with(url, options)
        .await
        .map_err(|err| match err {
            pgfifo::Error::Connection(inner) => unreachable(inner.to_string()),
            err @ (pgfifo::Error::ConnectTimeout(_) | pgfifo::Error::Pool(_)) => {
                unreachable(err.to_string())
            }
            other => other.into(),
        })?;
    pool.get_owned()
        .await
        .map_err(|err| unreachable(err.to_string()))
}

/// `host:port/database` of a `postgres://` URL, without user, password or
/// parameters; `None` for other forms.
fn server_of(url: &str) -> Option<&str> {
    let rest = url
        .strip_prefix("postgres://")
        .or_else(|| url.strip_prefix("postgresql://"))?;
    let rest = rest.split(['?', '#']).next().unwrap_or(rest);
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let start = rest[..authority_end].rfind('@').map_or(0, |at| at + 1);
    Some(&rest[start..]).filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests {
    use super::server_of;

    #[test]
    fn server_of_hides_credentials() {
        assert_eq!(
            server_of("postgres://u:secret@db.example:5432/app?sslmode=require"),
            Some("db.example:5432/app")
        );
        assert_eq!(server_of("postgresql://h/app"), Some("h/app"));
        assert_eq!(server_of("postgres://u:p@w@h"), Some("h"));
        assert_eq!(server_of("host=h dbname=app"), None);
    }
}
