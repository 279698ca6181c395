//! Wakes idle workers when `pgfifo.enqueue` notifies that a queue this runner
//! serves has new work, after making woken groups active (`pgfifo.promote`).
//!
//! Notifications are an optimisation: lanes also poll (and promote) on their
//! own, so a lost notification (the LISTEN connection dropped, the server
//! restarted) only delays a job until the next poll. The connection is
//! checked every poll interval and replaced when it fails. It is a
//! connection of its own, not one of the pool's: a LISTENing session is never
//! handed to the application, and it closes when the listener stops.
//!
//! Where the pool goes through a transaction-mode pooler and no direct URL
//! was given ([`Sessions::Unavailable`]), nothing can LISTEN: the listener
//! then only polls, promoting and waking every poll interval on a pooled
//! connection.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use diesel_async::{AsyncPgConnection, SimpleAsyncConnection};
use futures_util::{FutureExt, StreamExt};
use tokio_util::sync::CancellationToken;

use super::hung::{Host, HungSignal};
use super::jitter::reconnect_backoff;
use super::lanes::{promote_all, Board};
use super::maintenance::pooled;
use super::sessions::Sessions;
use super::timer::Timer;
use crate::db::runner as sql;
use crate::db::Pool;

/// What the listener works with.
pub(crate) struct Listener {
    pub pool: Pool,
    /// Where its LISTEN connection comes from.
    pub sessions: Sessions,
    pub queues: Vec<String>,
    pub poll_interval: Duration,
    pub board: Arc<Board>,
    pub timer: Timer,
    /// Told of every notification it handled: the queue-token watch
    /// (`queue_tokens.rs`) looks again when work may have come.
    pub look: Arc<tokio::sync::Notify>,
    /// How long the server gets to answer each round trip.
    pub round_trip: Duration,
    /// Where the listener says that its server did not answer in time: its
    /// poll every `poll_interval` is the runner's steady probe of the
    /// server, which tells the lanes to cut off handlers waiting on a hung
    /// one (see `hung.rs`).
    pub hung: HungSignal,
}

/// `work` within `deadline`, its error as text.
async fn bounded<T, E: std::fmt::Display>(
    deadline: Duration,
    work: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    bounded_noting(deadline, work, |_| {}).await
}

/// [`bounded`], telling `note` whether the deadline passed.
async fn bounded_noting<T, E: std::fmt::Display>(
    deadline: Duration,
    work: impl std::future::Future<Output = Result<T, E>>,
    note: impl FnOnce(bool),
) -> Result<T, String> {
    match tokio::time::timeout(deadline, work).await {
        Ok(result) => {
            note(false);
            result.map_err(|e| e.to_string())
        }
        Err(_) => {
            note(true);
            Err(crate::db::error::timed_out(deadline).to_string())
        }
    }
}

/// Listens, promotes and wakes lanes until `service` is cancelled.
pub(crate) async fn run(listener: Listener, service: CancellationToken) {
    if matches!(listener.sessions, Sessions::Unavailable) {
        return poll(&listener, &service).await;
    }
    let mut failures = 0u32;
    while !service.is_cancelled() {
        match listen(&listener, &service).await {
            Ok(()) => return,
            Err(err) => {
                failures += 1;
                tracing::warn!(error = %err, "pgfifo: LISTEN connection failed; polling until it is back");
                // Wake everyone: whatever was notified meanwhile is picked up.
                listener.board.wake_all();
                tokio::select! {
                    () = tokio::time::sleep(reconnect_backoff(failures)) => {}
                    () = service.cancelled() => return,
                }
            }
        }
    }
}

/// Why the inner loop stopped listening for a moment.
enum Interrupt {
    /// Notifications for this runner's queues: `work` if any said that work
    /// may be ready without a group to promote (see `sql::CHANNEL`),
    /// `groups` if any said that enqueuers woke groups (see
    /// `sql::GROUPS_CHANNEL`).
    Notified {
        work: bool,
        groups: bool,
    },
    Tick,
    Stop,
}

/// Whether a notification concerns this runner: `Some(true)` on the channel
/// that always wakes a lane, `Some(false)` on the woken-groups one. Its own
/// (`own_pid`, see `promote_and_wake`) do not.
fn relevant(listener: &Listener, note: &diesel::pg::PgNotification, own_pid: i32) -> Option<bool> {
    if note.process_id == own_pid || !listener.queues.contains(&note.payload) {
        return None;
    }
    match note.channel.as_str() {
        sql::CHANNEL => Some(true),
        sql::GROUPS_CHANNEL => Some(false),
        _ => None,
    }
}

/// Promotes and wakes every poll interval, on a pooled connection each
/// time, until `service` is cancelled: for a runner that cannot LISTEN.
async fn poll(listener: &Listener, service: &CancellationToken) {
    let mut failing = false;
    loop {
        tokio::select! {
            () = tokio::time::sleep(listener.poll_interval) => {}
            () = service.cancelled() => return,
        }
        let mut conn = match pooled(&listener.pool, listener.poll_interval).await {
            Ok(conn) => conn,
            // Every connection is in use: the lanes are working, and they
            // promote on their own when they run out of work. Skip a beat.
            Err(crate::Error::Pool(bb8::RunError::TimedOut)) => {
                tracing::debug!("pgfifo: the pool is busy; skipping a poll");
                continue;
            }
            Err(err) => {
                if !std::mem::replace(&mut failing, true) {
                    tracing::warn!(error = %err, "pgfifo: polling for new work failed; retrying every poll");
                }
                continue;
            }
        };
        let round = bounded(
            listener.round_trip,
            promote_and_wake(listener, &mut conn, false),
        );
        match round.await {
            Ok(()) if std::mem::take(&mut failing) => {
                tracing::info!("pgfifo: polling for new work works again");
            }
            Ok(()) => {}
            Err(err) if failing => {
                tracing::debug!(error = %err, "pgfifo: polling for new work still fails");
            }
            Err(err) => {
                failing = true;
                tracing::warn!(error = %err, "pgfifo: polling for new work failed; retrying every poll");
            }
        }
    }
}

/// Listens until `service` is cancelled (`Ok`) or the connection fails.
async fn listen(listener: &Listener, service: &CancellationToken) -> Result<(), String> {
    let Some(mut conn) = listener.sessions.open().await.map_err(|e| e.to_string())? else {
        return Ok(());
    };
    listen_on(listener, service, &mut conn).await
}

async fn listen_on(
    listener: &Listener,
    service: &CancellationToken,
    conn: &mut AsyncPgConnection,
) -> Result<(), String> {
    // Each round trip has the deadline: on a hung server the listener says
    // so, gives the connection up (it is its own, and closes when dropped)
    // and opens another, which a multi-host URL sends to the writable
    // server.
    let host = crate::db::pooler::host_of(conn);
    let deadline = listener.round_trip;
    let noting = |host: &Host| {
        let host = host.clone();
        move |timed_out: bool| {
            if timed_out {
                listener.hung.note(host);
            }
        }
    };
    bounded_noting(deadline, conn.batch_execute(sql::LISTEN), noting(&host)).await?;
    let own_pid = bounded_noting(deadline, sql::backend_pid(conn), noting(&host)).await?;
    tracing::debug!("pgfifo: listening for new jobs");
    // Work enqueued while no runner listened. Lanes that looked for work
    // meanwhile may have found the wake rows taken by this promote (they are
    // taken SKIP LOCKED) and gone to sleep: wake them.
    promote_all(&listener.queues, &listener.timer, &listener.board, conn).await?;
    listener.board.wake_all();
    loop {
        let interrupt = {
            let mut stream = pin!(conn.notifications_stream());
            let mut tick = pin!(tokio::time::sleep(listener.poll_interval));
            loop {
                tokio::select! {
                    item = stream.next() => match item {
                        Some(Ok(note)) => {
                            if let Some(first) = relevant(listener, &note, own_pid) {
                                // One promote for every notification that
                                // has arrived already: they are of commits
                                // it will see.
                                let (mut work, mut groups) = (first, !first);
                                while let Some(item) = stream.next().now_or_never() {
                                    match item {
                                        Some(Ok(note)) => {
                                            let kind = relevant(listener, &note, own_pid);
                                            work |= kind == Some(true);
                                            groups |= kind == Some(false);
                                        }
                                        Some(Err(err)) => return Err(err.to_string()),
                                        None => return Err("notification stream ended".into()),
                                    }
                                }
                                break Interrupt::Notified { work, groups };
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
            // The connection closes when it is dropped.
            Interrupt::Stop => return Ok(()),
            Interrupt::Notified { work, groups: true } => {
                let round = promote_and_wake(listener, conn, work);
                bounded_noting(deadline, round, noting(&host)).await?;
                listener.look.notify_one();
            }
            // Work without a group to promote (an enqueuer made its group
            // active, an ungrouped job, an operator's release): a lane.
            Interrupt::Notified { groups: false, .. } => {
                listener.board.wake(1);
                listener.look.notify_one();
            }
            // The poll: also proves the connection is alive.
            Interrupt::Tick => {
                let round = promote_and_wake(listener, conn, false);
                bounded_noting(deadline, round, noting(&host)).await?
            }
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
    listener: &Listener,
    conn: &mut AsyncPgConnection,
    work: bool,
) -> Result<(), String> {
    let board = &listener.board;
    let promoted = promote_all(&listener.queues, &listener.timer, board, conn).await?;
    let short = promoted > 0 && board.idle_lanes() < promoted as usize;
    if promoted > 0 || work {
        board.wake(promoted as usize);
    }
    if short {
        sql::announce(conn, &listener.queues)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
