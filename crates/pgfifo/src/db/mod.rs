//! Connections and every SQL statement pgfifo runs.
//!
//! The statements live in [`sql`]; the schema they run against, including the
//! functions that implement enqueue, pick and completion, is in
//! `migrations/`. Values always reach SQL as bound parameters.

pub(crate) mod sql;

use diesel_async::pooled_connection::AsyncDieselConnectionManager;
use diesel_async::{AsyncConnection, AsyncPgConnection};

use crate::Result;

/// The connection pool pgfifo works with: bb8 over diesel-async's PostgreSQL
/// connection. Build it yourself (any settings) or with [`connect`].
pub type Pool = bb8::Pool<AsyncDieselConnectionManager<AsyncPgConnection>>;

/// A connection checked out of a [`Pool`] for as long as the holder needs it.
pub type PooledConnection =
    bb8::PooledConnection<'static, AsyncDieselConnectionManager<AsyncPgConnection>>;

/// Builds a pool of at most `max_size` connections to `database_url`.
///
/// A runner holds one connection per lane (`concurrency + prefetch`, see
/// [`RunnerConfig::prefetch`](crate::RunnerConfig::prefetch)) plus two of its
/// own (the LISTEN connection and the attempt bookkeeper), so size the pool at
/// least `concurrency + prefetch + 2` plus what the application uses.
///
/// Fails at once with a clear error when the database cannot be reached.
pub async fn connect(database_url: &str, max_size: u32) -> Result<Pool> {
    // bb8 connects lazily and retries until its timeout; connect once directly
    // so a bad URL or a down server is reported now, with the server's reason.
    drop(AsyncPgConnection::establish(database_url).await?);
    let manager = AsyncDieselConnectionManager::<AsyncPgConnection>::new(database_url);
    let pool = bb8::Pool::builder()
        .max_size(max_size)
        .build(manager)
        .await
        .map_err(|err| crate::Error::Pool(err.to_string()))?;
    Ok(pool)
}
