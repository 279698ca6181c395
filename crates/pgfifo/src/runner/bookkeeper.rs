//! Writes that must not be part of a job's transaction, on the runner's own
//! connection.
//!
//! The main one is the start of an attempt: it must be durable before the
//! handler runs, or a job that kills its process would never use up its
//! attempts. It cannot wait on the job's row lock either, so it goes to
//! `pgfifo.job_attempt` in autocommit. Requests from all workers are batched:
//! under load, one statement records the attempts of every job that started
//! since the previous one.
//!
//! The connection is taken from the pool once and kept; when it breaks
//! (database restart, killed backend), its server does not answer a batch
//! within the round-trip deadline, or it takes no writes (a demoted
//! primary), the pool is told to close it and the next request takes a new
//! one.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::hung::HungSignal;
use super::jitter::reconnect_backoff;
use crate::db::error::{must_replace, timed_out};
use crate::db::runner as sql;
use crate::db::{Pool, PooledConnection};

/// The most requests one batch carries.
const MAX_BATCH: usize = 512;

/// The attempt numbers of a pick's jobs, in its order (`None`: attempts used
/// up; `Some(0)`: not started, its group's rate limit had no token left).
type Attempts = Result<Vec<Option<i32>>, String>;

/// The starts a pick asked for: `(job id, max attempts)` of each of its
/// jobs, and where to answer.
type PickStarts = (Vec<(i64, i32)>, oneshot::Sender<Attempts>);

enum Request {
    Start {
        /// `(job id, max attempts)` of each job of one pick.
        jobs: Vec<(i64, i32)>,
        /// The parts of the pick's shard, on the distributed layout.
        parts: Option<Arc<str>>,
        reply: oneshot::Sender<Attempts>,
    },
    Forget {
        /// `(job id, attempt)` of each attempt to forget.
        attempts: Vec<(i64, i32)>,
        /// The handlers never ran: their groups get their tokens back.
        unstarted: bool,
        reply: oneshot::Sender<()>,
    },
    NextToken {
        queue: String,
        group: String,
        reply: oneshot::Sender<Option<std::time::Duration>>,
    },
    NoteError {
        id: i64,
        attempt: i32,
        error: String,
    },
    CancelBackend {
        pid: i32,
        reply: oneshot::Sender<()>,
    },
}

/// A handle to the bookkeeper task.
pub(crate) struct Bookkeeper {
    tx: mpsc::UnboundedSender<Request>,
}

impl Bookkeeper {
    /// Spawns the task on `conn`, taken from `pool` before the runner's
    /// workers start (so they cannot starve it of a connection); the pool
    /// gives a replacement when it breaks. `runner` is the runner's name,
    /// its round-trip deadline and where its lanes say that a server hung
    /// (a connection taken before is replaced). It ends when `service` is
    /// cancelled.
    pub(crate) fn spawn(
        pool: Pool,
        conn: PooledConnection,
        runner: (String, std::time::Duration, HungSignal),
        service: CancellationToken,
        tracker: &TaskTracker,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tracker.spawn(run(pool, conn, runner, service, rx));
        Self { tx }
    }

    /// Records the start of an attempt of each job `(id, max attempts)` of
    /// one pick (whose shard's `parts` the distributed layout gives, see
    /// `PickedJob::shard_parts`). For each, in order: `Some(n)`, this is
    /// attempt `n`; `None`, the job has used all its attempts.
    pub(crate) async fn start_attempts(
        &self,
        jobs: Vec<(i64, i32)>,
        parts: Option<Arc<str>>,
    ) -> Attempts {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request::Start { jobs, parts, reply })
            .map_err(|_| "the runner is stopping".to_owned())?;
        rx.await.map_err(|_| "the runner is stopping".to_owned())?
    }

    /// Deletes the records of attempts `(job id, attempt)` whose runs do
    /// not count (best effort): with `unstarted`, their handlers never ran,
    /// and rate-limited groups get the tokens back; without, they ran and
    /// were aborted by shutdown.
    pub(crate) async fn forget_attempts(&self, attempts: Vec<(i64, i32)>, unstarted: bool) {
        if attempts.is_empty() {
            return;
        }
        let (reply, rx) = oneshot::channel();
        let request = Request::Forget {
            attempts,
            unstarted,
            reply,
        };
        if self.tx.send(request).is_ok() {
            let _ = rx.await;
        }
    }

    /// How soon the group's rate limit has a token again (best effort:
    /// `None` when that could not be read).
    pub(crate) async fn next_token_in(
        &self,
        queue: String,
        group: String,
    ) -> Option<std::time::Duration> {
        let (reply, rx) = oneshot::channel();
        let request = Request::NextToken {
            queue,
            group,
            reply,
        };
        self.tx.send(request).ok()?;
        rx.await.ok().flatten()
    }

    /// Notes an error on an attempt whose own transaction could not (best effort).
    pub(crate) fn note_error(&self, id: i64, attempt: i32, error: String) {
        let _ = self.tx.send(Request::NoteError { id, attempt, error });
    }

    /// Cancels the statement running on backend `pid` (best effort).
    pub(crate) async fn cancel_backend(&self, pid: i32) {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Request::CancelBackend { pid, reply }).is_ok() {
            let _ = rx.await;
        }
    }
}

async fn run(
    pool: Pool,
    conn: PooledConnection,
    (runner, deadline, hung): (String, std::time::Duration, HungSignal),
    service: CancellationToken,
    mut rx: mpsc::UnboundedReceiver<Request>,
) {
    let mut conn: Option<PooledConnection> = Some(conn);
    // The hung count when `conn` was taken.
    let mut taken_at = hung.seen();
    let mut failures = 0u32;
    loop {
        let first = tokio::select! {
            request = rx.recv() => match request {
                Some(request) => request,
                None => return,
            },
            () = service.cancelled() => return,
        };
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(request) => batch.push(request),
                Err(_) => break,
            }
        }
        if let Some(c) = conn.as_mut().filter(|_| hung.seen() != taken_at) {
            // A lane found a server hung since this connection was taken:
            // it may be on that server too.
            tracing::debug!("pgfifo: replacing the bookkeeping connection after a hung server");
            crate::db::discard(c);
            conn = None;
        }
        if conn.is_none() {
            taken_at = hung.seen();
            match pool.get_owned().await {
                Ok(c) => conn = Some(c),
                Err(err) => {
                    let message = format!("no connection for attempt bookkeeping: {err}");
                    tracing::warn!("pgfifo: {message}");
                    fail_all(batch, &message);
                    failures += 1;
                    tokio::time::sleep(reconnect_backoff(failures)).await;
                    continue;
                }
            }
        }
        let c = conn.as_mut().expect("connection taken above");
        // (Requests of a batch cut off by the deadline get no answer: their
        // senders see the bookkeeper gone and count them as failed.)
        let processed = match tokio::time::timeout(deadline, process(c, &runner, batch)).await {
            Ok(processed) => processed,
            Err(_) => {
                // Only a round trip that got no answer says the server hung
                // (a closed connection may be one backend terminated).
                hung.note(crate::db::pooler::host_of(c));
                Err(timed_out(deadline))
            }
        };
        match processed {
            Ok(()) => failures = 0,
            Err(err) => {
                tracing::warn!(error = %err, "pgfifo: attempt bookkeeping failed; reconnecting");
                // A broken connection is discarded by the pool when dropped;
                // one to a hung or read-only server must be told so.
                if must_replace(&err) {
                    crate::db::discard(c);
                }
                conn = None;
                failures += 1;
            }
        }
    }
}

async fn process(
    conn: &mut PooledConnection,
    runner: &str,
    batch: Vec<Request>,
) -> Result<(), diesel::result::Error> {
    // The starts by shard: one statement for a plain database, one per
    // shard of the picks on the distributed layout.
    let mut starts: HashMap<Option<Arc<str>>, Vec<PickStarts>> = HashMap::new();
    let mut others = Vec::new();
    for request in batch {
        match request {
            Request::Start { jobs, parts, reply } => {
                starts.entry(parts).or_default().push((jobs, reply));
            }
            other => others.push(other),
        }
    }
    // After a failure, the other shards' picks get the same error (their
    // lanes hand their jobs back), and the caller replaces the connection.
    let mut failed: Option<(diesel::result::Error, String)> = None;
    for (parts, starts) in starts {
        if let Some((_, message)) = &failed {
            for (_, reply) in starts {
                let _ = reply.send(Err(message.clone()));
            }
            continue;
        }
        if let Err(err) = record_starts(conn, runner, parts.as_deref(), starts).await {
            let message = format!("could not record the attempt: {err}");
            failed = Some((err, message));
        }
    }
    if let Some((err, _)) = failed {
        return Err(err);
    }
    for request in others {
        match request {
            Request::Forget {
                attempts,
                unstarted,
                reply,
            } => {
                let (ids, numbers): (Vec<i64>, Vec<i32>) = attempts.into_iter().unzip();
                let result = sql::forget_attempts(conn, &ids, &numbers, unstarted).await;
                let _ = reply.send(());
                result?;
            }
            Request::NextToken {
                queue,
                group,
                reply,
            } => {
                let result = sql::next_token_in(conn, &queue, &group).await;
                let _ = reply.send(result.as_ref().ok().copied());
                result?;
            }
            Request::NoteError { id, attempt, error } => {
                sql::note_attempt_error(conn, id, attempt, &error).await?;
            }
            Request::CancelBackend { pid, reply } => {
                let result = sql::cancel_backend(conn, pid).await;
                let _ = reply.send(());
                result?;
            }
            Request::Start { .. } => unreachable!("starts were taken out above"),
        }
    }
    Ok(())
}

/// Records the starts of some picks' jobs, all of one shard (`parts`) on
/// the distributed layout, and answers each pick.
async fn record_starts(
    conn: &mut PooledConnection,
    runner: &str,
    parts: Option<&str>,
    starts: Vec<PickStarts>,
) -> Result<(), diesel::result::Error> {
    // One row per job: a job asked twice (a worker retrying after a lost
    // reply) gets the same answer twice.
    let mut ids: Vec<i64> = Vec::new();
    let mut max: Vec<i32> = Vec::new();
    let mut seen = HashSet::new();
    for (jobs, _) in &starts {
        for (id, max_attempts) in jobs {
            if seen.insert(*id) {
                ids.push(*id);
                max.push(*max_attempts);
            }
        }
    }
    match sql::start_attempts(conn, parts, &ids, &max, runner).await {
        Ok(recorded) => {
            let recorded: HashMap<i64, i32> = recorded.into_iter().collect();
            for (jobs, reply) in starts {
                let attempts = jobs.iter().map(|(id, _)| recorded.get(id).copied());
                let _ = reply.send(Ok(attempts.collect()));
            }
            Ok(())
        }
        Err(err) => {
            let message = format!("could not record the attempt: {err}");
            for (_, reply) in starts {
                let _ = reply.send(Err(message.clone()));
            }
            Err(err)
        }
    }
}

fn fail_all(batch: Vec<Request>, message: &str) {
    for request in batch {
        match request {
            Request::Start { reply, .. } => {
                let _ = reply.send(Err(message.to_owned()));
            }
            Request::Forget { reply, .. } | Request::CancelBackend { reply, .. } => {
                let _ = reply.send(());
            }
            Request::NextToken { reply, .. } => {
                let _ = reply.send(None);
            }
            Request::NoteError { .. } => {}
        }
    }
}
