//! Wakes idle workers when `pgfifo.enqueue` notifies that a group (or an
//! ungrouped job) became ready in a queue this runner serves.
//!
//! Notifications are an optimisation: workers also poll, so a lost
//! notification (the LISTEN connection dropped, the server restarted) only
//! delays a job until the next poll. The connection is checked every poll
//! interval and replaced when it fails.

use std::pin::pin;
use std::sync::Arc;

use diesel_async::SimpleAsyncConnection;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::bookkeeper::backoff;
use super::Shared;
use crate::db::sql;

pub(super) async fn run(shared: Arc<Shared>, service: CancellationToken) {
    let mut failures = 0u32;
    while !service.is_cancelled() {
        match listen(&shared, &service).await {
            Ok(()) => return,
            Err(err) => {
                failures += 1;
                tracing::warn!(error = %err, "pgfifo: LISTEN connection failed; polling until it is back");
                // Wake everyone: whatever was notified meanwhile is picked up.
                shared.wake.notify_waiters();
                tokio::select! {
                    () = tokio::time::sleep(backoff(failures)) => {}
                    () = service.cancelled() => return,
                }
            }
        }
    }
}

/// Listens until `service` is cancelled (`Ok`) or the connection fails.
async fn listen(shared: &Shared, service: &CancellationToken) -> Result<(), String> {
    let mut conn = shared.pool.get_owned().await.map_err(|e| e.to_string())?;
    conn.batch_execute(sql::LISTEN).await.map_err(|e| e.to_string())?;
    tracing::debug!("pgfifo: listening for new jobs");
    loop {
        let stopping = {
            let mut stream = pin!(conn.notifications_stream());
            let ping = tokio::time::sleep(shared.config.poll_interval);
            let mut ping = pin!(ping);
            loop {
                tokio::select! {
                    item = stream.next() => match item {
                        Some(Ok(note)) => {
                            if note.channel == sql::CHANNEL && shared.queues.contains(&note.payload) {
                                shared.wake.notify_waiters();
                            }
                        }
                        Some(Err(err)) => return Err(err.to_string()),
                        None => return Err("notification stream ended".into()),
                    },
                    () = &mut ping => break false,
                    () = service.cancelled() => break true,
                }
            }
        };
        if stopping {
            // The connection goes back to the pool: stop receiving notifications.
            let _ = conn.batch_execute("UNLISTEN *").await;
            return Ok(());
        }
        // Detect a dead connection even when no notification arrives.
        conn.batch_execute("SELECT 1").await.map_err(|e| e.to_string())?;
    }
}
