//! Where the runner opens connections that carry session state: the LISTEN
//! connection and retention's session lock.
//!
//! Such a connection must reach one PostgreSQL session for its whole life.
//! Straight to the server, or through a pooler in session mode, a connection
//! opened like the pool's does (outside the pool, so that it is never handed
//! to anyone else). Through a transaction-mode pooler it does not: those
//! connections go to [`RunnerConfig::direct_url`](super::RunnerConfig::direct_url)
//! when it is set, and otherwise the runner does without them (see
//! `docs/deploying.md`).

use diesel_async::AsyncPgConnection;

use crate::db::{self, Pool};
use crate::{Error, Result};

/// Where session connections come from.
#[derive(Clone)]
pub(crate) enum Sessions {
    /// Like the pool's connections, outside the pool.
    Pool(Pool),
    /// Straight to PostgreSQL at this URL (the pool goes through a
    /// transaction-mode pooler).
    Direct(String),
    /// Nowhere: the pool goes through a transaction-mode pooler and no
    /// direct URL was given.
    Unavailable,
}

impl Sessions {
    /// Decides from whether the pool's connections are transaction-pooled
    /// and the configured direct URL.
    pub(crate) fn new(pool: &Pool, pooled: bool, direct_url: Option<&str>) -> Sessions {
        match (pooled, direct_url) {
            (false, _) => Sessions::Pool(pool.clone()),
            (true, Some(url)) => Sessions::Direct(url.to_owned()),
            (true, None) => Sessions::Unavailable,
        }
    }

    /// Opens a session connection; `Ok(None)` when there is nowhere to open
    /// one.
    pub(crate) async fn open(&self) -> Result<Option<AsyncPgConnection>> {
        match self {
            Sessions::Pool(pool) => pool
                .dedicated_connection()
                .await
                .map(Some)
                .map_err(|err| Error::Pool(bb8::RunError::User(err))),
            Sessions::Direct(url) => db::open_direct(url)
                .await
                .map(Some)
                .map_err(Error::Connection),
            Sessions::Unavailable => Ok(None),
        }
    }
}
