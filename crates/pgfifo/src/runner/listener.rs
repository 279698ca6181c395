//! Wakes idle workers when `pgfifo.enqueue` notifies that a queue this runner
//! serves has new work, after making woken groups active (`pgfifo.promote`).
//!
//! Notifications are an optimisation: workers also poll (and promote) on their
//! own, so a lost notification (the LISTEN connection dropped, the server
//! restarted) only delays a job until the next poll. The connection is
//! checked every poll interval and replaced when it fails.

use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection, TransactionManager};
use futures_util::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use super::bookkeeper::backoff;
use super::Shared;
use crate::db::sql;

type Tm = <AsyncPgConnection as AsyncConnection>::TransactionManager;

/// Wake rows promoted per statement.
pub(super) const PROMOTE_BATCH: i32 = 1_000;

pub(super) async fn run(shared: Arc<Shared>, service: CancellationToken) {
    let mut failures = 0u32;
    while !service.is_cancelled() {
        match listen(&shared, &service).await {
            Ok(()) => return,
            Err(err) => {
                failures += 1;
                tracing::warn!(error = %err, "pgfifo: LISTEN connection failed; polling until it is back");
                // Wake everyone: whatever was notified meanwhile is picked up.
                shared.wake_all();
                tokio::select! {
                    () = tokio::time::sleep(backoff(failures)) => {}
                    () = service.cancelled() => return,
                }
            }
        }
    }
}

/// Why the inner loop stopped listening for a moment.
enum Interrupt {
    /// Notifications for this runner's queues: `work` if any said that work
    /// may be ready without a group to promote (see `sql::CHANNEL`).
    Notified {
        work: bool,
    },
    Tick,
    Stop,
}

/// Whether a notification concerns this runner: `Some(true)` on the channel
/// that always wakes a lane, `Some(false)` on the woken-groups one. Its own
/// (`own_pid`, see `promote_and_wake`) do not.
fn relevant(shared: &Shared, note: &diesel::pg::PgNotification, own_pid: i32) -> Option<bool> {
    if note.process_id == own_pid || !shared.queues.contains(&note.payload) {
        return None;
    }
    match note.channel.as_str() {
        sql::CHANNEL => Some(true),
        sql::GROUPS_CHANNEL => Some(false),
        _ => None,
    }
}

/// Listens until `service` is cancelled (`Ok`) or the connection fails.
async fn listen(shared: &Shared, service: &CancellationToken) -> Result<(), String> {
    let mut conn = shared.pool.get_owned().await.map_err(|e| e.to_string())?;
    let result = listen_on(shared, service, &mut conn).await;
    if result.is_err() {
        // Never hand a LISTENing connection back to the application's pool:
        // marked broken, the pool closes it.
        Tm::transaction_manager_status_mut(&mut *conn).set_in_error();
    }
    result
}

async fn listen_on(
    shared: &Shared,
    service: &CancellationToken,
    conn: &mut AsyncPgConnection,
) -> Result<(), String> {
    conn.batch_execute(sql::LISTEN)
        .await
        .map_err(|e| e.to_string())?;
    let own_pid = sql::backend_pid(conn).await.map_err(|e| e.to_string())?;
    tracing::debug!("pgfifo: listening for new jobs");
    // Work enqueued while no runner listened. Workers that looked for work
    // meanwhile may have found the wake rows taken by this promote (they are
    // taken SKIP LOCKED) and gone to sleep: wake them.
    promote_all(shared, conn).await?;
    shared.wake_all();
    loop {
        let interrupt = {
            let mut stream = pin!(conn.notifications_stream());
            let mut tick = pin!(tokio::time::sleep(shared.config.poll_interval));
            loop {
                tokio::select! {
                    item = stream.next() => match item {
                        Some(Ok(note)) => {
                            if let Some(mut work) = relevant(shared, &note, own_pid) {
                                // One promote for every notification that
                                // has arrived already: they are of commits
                                // it will see.
                                while let Some(item) = stream.next().now_or_never() {
                                    match item {
                                        Some(Ok(note)) => {
                                            work |= relevant(shared, &note, own_pid) == Some(true);
                                        }
                                        Some(Err(err)) => return Err(err.to_string()),
                                        None => return Err("notification stream ended".into()),
                                    }
                                }
                                break Interrupt::Notified { work };
                            }
                        }
                        Some(Err(err)) => return Err(err.to_string()),
                        None => return Err("notification stream ended".into()),
                    },
                    () = &mut tick => break Interrupt::Tick,
                    () = service.cancelled() => break Interrupt::Stop,
                }
            }
        };
        match interrupt {
            // The connection goes back to the pool: stop receiving notifications.
            Interrupt::Stop => {
                return conn
                    .batch_execute("UNLISTEN *")
                    .await
                    .map_err(|e| e.to_string());
            }
            Interrupt::Notified { work } => promote_and_wake(shared, conn, work).await?,
            // The poll: also proves the connection is alive.
            Interrupt::Tick => promote_and_wake(shared, conn, false).await?,
        }
    }
}

/// New groups first, then the workers, one lane per group promoted. Woken
/// groups that this promote found nothing to do for were promoted by someone
/// else (who woke lanes for them) or are running (their lane finds the new
/// job when it advances the group): waking a lane for them only sent it to
/// find nothing. `work` (an ungrouped job, an operator's release) wakes one
/// lane at least.
///
/// A runner that promoted more groups than it had idle lanes for tells the
/// other runners, after waking its own lanes: they were woken too, but found
/// the groups promoted and woke nobody, and their idle lanes would otherwise
/// wait for the poll. (Its own listener ignores what it sends.)
async fn promote_and_wake(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
    work: bool,
) -> Result<(), String> {
    let promoted = promote_all(shared, conn).await?;
    let short = promoted > 0 && shared.idle_lanes.load(Ordering::SeqCst) < promoted as usize;
    if promoted > 0 || work {
        shared.wake_lanes(promoted as usize);
    }
    if short {
        sql::announce(conn, &shared.queues)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Promotes woken groups until no wake rows are left; returns how many wake
/// rows it consumed. The delayed heads it set are noted for the timer.
pub(super) async fn promote_all(
    shared: &Shared,
    conn: &mut AsyncPgConnection,
) -> Result<i32, String> {
    let mut total = 0;
    loop {
        let promoted = sql::promote(conn, &shared.queues, PROMOTE_BATCH)
            .await
            .map_err(|e| e.to_string())?;
        for &later in &promoted.later {
            shared.due.add(later);
        }
        let n = promoted.groups;
        total += n;
        if n < PROMOTE_BATCH {
            shared.promoted_now();
            return Ok(total);
        }
    }
}
