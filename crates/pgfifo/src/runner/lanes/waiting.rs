//! How a lane waits for work: its registration for wake-ups, the poll, and
//! the connection it keeps for a moment of its wait or takes from the pool
//! when it has none (see the module documentation of `lanes`).

use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::futures::Notified;

use super::conn::JobConn;
use super::Lanes;
use crate::runner::jitter::jittered;

/// How long a lane that waits for work keeps its connection: long enough
/// for the wake-ups of a steady few hundred jobs a second to find it, short
/// enough that the pool has it back soon when work stops.
const KEEP_WHILE_WAITING: Duration = Duration::from_millis(100);

/// A wait for a pooled connection longer than this is logged.
const SLOW_POOL: Duration = Duration::from_secs(1);

/// A lane's standing order for the next wake-up (`Board::wake`).
pub(super) type Waiter<'a> = Pin<Box<Notified<'a>>>;

/// Waits for a wake-up (`notified`), the poll or shutdown, and returns
/// whether a wake-up ended the wait, with the connection if the lane may
/// pick on it at once.
///
/// The connection stays with the lane for the first moments of its wait: a
/// wake-up then picks at once, without taking a connection from the pool
/// (whose check on checkout is a round trip of its own: at a few hundred
/// jobs a second, one per job). Past that moment it goes back, so that an
/// idle runner does not keep connections the application (or another runner
/// on the pool) may need.
pub(super) async fn wait_for_work(
    lanes: &Lanes,
    mut notified: Waiter<'_>,
    conn: JobConn,
) -> (bool, Option<JobConn>) {
    let board = &*lanes.board;
    let poll = tokio::time::sleep(jittered(lanes.settings.poll_interval));
    let mut poll = std::pin::pin!(poll);
    board.idle.fetch_add(1, Ordering::SeqCst);
    let mut conn = Some(conn);
    if !conn.as_ref().is_some_and(JobConn::reusable) {
        if let Some(conn) = conn.take() {
            conn.release().await;
        }
    }
    let woken = loop {
        let grace = async {
            match conn {
                Some(_) => tokio::time::sleep(KEEP_WHILE_WAITING).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = &mut notified => break true,
            () = &mut poll => break false,
            () = lanes.stop.cancelled() => break false,
            () = grace => {
                if let Some(conn) = conn.take() {
                    conn.release().await;
                }
            }
        }
    };
    board.idle.fetch_sub(1, Ordering::SeqCst);
    match conn {
        Some(conn) if woken && !lanes.stop.is_cancelled() => (true, Some(conn)),
        Some(conn) => {
            conn.release().await;
            (woken, None)
        }
        None => (woken, None),
    }
}

/// Registers for the next wake-up, or takes the one kept for whoever
/// registers next.
pub(super) fn register(lanes: &Lanes) -> Waiter<'_> {
    let mut notified = Box::pin(lanes.board.wake.notified());
    notified.as_mut().enable();
    notified
}

/// Takes a connection from the pool, or `None` when stopping or the pool
/// failed (logged; the caller loops).
pub(super) async fn connection(lanes: &Lanes) -> Option<crate::db::PooledConnection> {
    let started = Instant::now();
    let result = tokio::select! {
        result = lanes.pool.get_owned() => result,
        () = lanes.stop.cancelled() => return None,
    };
    let waited = started.elapsed();
    match result {
        Ok(conn) => {
            if waited > SLOW_POOL {
                tracing::warn!(
                    waited_ms = waited.as_millis() as u64,
                    "pgfifo lane waited for a pooled connection: the pool is exhausted \
                     (size it at least concurrency + prefetch + 4 plus the application's needs)"
                );
            }
            Some(conn)
        }
        Err(err) => {
            tracing::warn!(error = %err, waited_ms = waited.as_millis() as u64,
                "pgfifo lane: no pooled connection; jobs wait until one is free");
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(500)) => {}
                () = lanes.stop.cancelled() => {}
            }
            None
        }
    }
}
