//! What the `runner_ops_*` modules share: one job type that does what its
//! [`Act`] says (succeed, wait at the test's gate, fail, cancel, retry), and
//! a fixture around [`TestDb`] to enqueue batches, wait for them to settle,
//! make them look old, and count what is left.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, JobId, NewJob, RunnerConfig,
};
use pgfifo_tests::{id_list, test_config, TestDb};
use serde::{Deserialize, Serialize};

use crate::gate::{gate, Gate};

/// The queue of every `runner_ops_*` test.
pub(crate) const QUEUE: &str = "runner_ops";

/// How long a test waits for something that should happen.
pub(crate) const LIMIT: Duration = Duration::from_secs(20);

/// How long a test watches for something that must not happen: several
/// heartbeats, retention passes or gauge samples at the short intervals these
/// tests use (200 ms).
pub(crate) const QUIET: Duration = Duration::from_millis(1500);

/// The short interval of heartbeats, retention passes and gauge samples.
pub(crate) const TICK: Duration = Duration::from_millis(200);

/// What a run of [`RunnerOpsJob`] does.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Act {
    /// Succeeds.
    Ok,
    /// Waits at the test's gate until released, then succeeds.
    Hold,
    /// Fails (retryably) on its first attempt, then succeeds.
    RetryOnce,
    /// Fails retryably on every attempt: retried once, then failed for good.
    FailAlways,
    /// Fails for good at once.
    Permanent,
    /// Cancels itself.
    Cancel,
    /// Its first attempt asks to be retried in an hour.
    RetryLater,
}

/// The job of the `runner_ops_*` tests: two attempts, quick retries.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "runner_ops", max_attempts = 2, backoff = "10ms")]
pub(crate) struct RunnerOpsJob {
    pub(crate) tag: String,
    pub(crate) act: Act,
}

#[async_trait]
impl Handler for RunnerOpsJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let first = ctx.attempt() == 1;
        match self.act {
            Act::Ok => Ok(()),
            Act::Hold => gate(&self.tag).hold().await,
            Act::RetryOnce if first => Err(JobError::retry("fails once")),
            Act::RetryOnce => Ok(()),
            Act::FailAlways => Err(JobError::retry("always fails")),
            Act::Permanent => Err(JobError::permanent("fails for good")),
            Act::Cancel => Err(JobError::cancel("not wanted")),
            Act::RetryLater if first => Err(JobError::retry_after(
                Duration::from_secs(3600),
                "come back in an hour",
            )),
            Act::RetryLater => Ok(()),
        }
    }
}

/// A test database and the test's gate.
pub(crate) struct Fx {
    pub(crate) db: TestDb,
}

impl Deref for Fx {
    type Target = TestDb;

    fn deref(&self) -> &TestDb {
        &self.db
    }
}

impl Fx {
    pub(crate) async fn new() -> Fx {
        Fx {
            db: TestDb::new().await,
        }
    }

    /// A runner configuration on the test queue.
    pub(crate) fn config(&self) -> RunnerConfig {
        test_config().queues([QUEUE])
    }

    /// The gate [`Act::Hold`] runs of this test wait at.
    pub(crate) fn gate(&self) -> Arc<Gate> {
        gate(&self.db.name)
    }

    /// Lets `n` held runs go on.
    pub(crate) fn release(&self, n: usize) {
        self.gate().release.add_permits(n);
    }

    /// Enqueues one job per act into `group` (`None`: ungrouped), in one
    /// batch, in order, each with `options` applied.
    pub(crate) async fn push_with(
        &self,
        group: Option<&str>,
        acts: &[Act],
        options: impl Fn(EnqueueOptions) -> EnqueueOptions,
    ) -> Vec<JobId> {
        let jobs: Vec<NewJob> = acts
            .iter()
            .map(|&act| {
                let base = match group {
                    Some(group) => EnqueueOptions::group(group),
                    None => EnqueueOptions::ungrouped(),
                };
                let job = RunnerOpsJob {
                    tag: self.db.name.clone(),
                    act,
                };
                NewJob::new(&job, options(base)).expect("new job")
            })
            .collect();
        let mut conn = self.conn().await;
        pgfifo::enqueue_batch(&mut conn, jobs)
            .await
            .expect("enqueue batch")
    }

    /// Enqueues one job per act into `group`, to run now.
    pub(crate) async fn push(&self, group: Option<&str>, acts: &[Act]) -> Vec<JobId> {
        self.push_with(group, acts, |o| o).await
    }

    /// Enqueues one job per act into `group`, to run in an hour.
    pub(crate) async fn push_later(&self, group: Option<&str>, acts: &[Act]) -> Vec<JobId> {
        self.push_with(group, acts, |o| o.run_in(Duration::from_secs(3600)))
            .await
    }

    /// How many of `ids` match `condition` (SQL on `pgfifo.job`).
    pub(crate) async fn count_jobs(&self, ids: &[JobId], condition: &str) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM pgfifo.job WHERE id IN ({}) AND ({condition})",
            id_list(ids)
        ))
        .await
    }

    /// Waits until each of `ids` has settled: it finished, or it waits (for
    /// its first run or a retry) until at least a minute from now.
    pub(crate) async fn wait_settled(&self, ids: &[JobId]) {
        self.wait_for(
            &format!(
                "SELECT count(*) FROM pgfifo.job WHERE id IN ({}) \
                 AND (state <> 'queued' OR run_after > now() + interval '1 minute')",
                id_list(ids)
            ),
            ids.len() as i64,
            LIMIT,
        )
        .await;
    }

    /// Enqueues `acts` into `group`, waits until they settled, and returns
    /// their ids.
    pub(crate) async fn settled(&self, group: Option<&str>, acts: &[Act]) -> Vec<JobId> {
        let ids = self.push(group, acts).await;
        self.wait_settled(&ids).await;
        ids
    }

    /// Makes the jobs `ids` look as if they had been enqueued `age` plus an
    /// hour ago, and the finished ones as if they had finished `age` ago.
    /// (Enqueue older batches first: ids must grow with `created_at`, as they
    /// do in real life, for retention's walk to see them.)
    pub(crate) async fn age_jobs(&self, ids: &[JobId], age: &str) {
        self.exec(&format!(
            "UPDATE pgfifo.job SET created_at = now() - interval '{age}' - interval '1 hour', \
             finished_at = CASE WHEN state <> 'queued' THEN now() - interval '{age}' END \
             WHERE id IN ({})",
            id_list(ids)
        ))
        .await;
    }

    /// Makes the rows of `groups` look created three days ago and, those
    /// that are idle, idle for two days.
    pub(crate) async fn age_groups(&self, groups: &[&str]) {
        let list = groups
            .iter()
            .map(|g| format!("'{g}'"))
            .collect::<Vec<_>>()
            .join(",");
        self.exec(&format!(
            "UPDATE pgfifo.queue_group SET created_at = now() - interval '3 days', \
             idle_since = CASE WHEN head_id IS NULL THEN now() - interval '2 days' END \
             WHERE queue = '{QUEUE}' AND group_id IN ({list})"
        ))
        .await;
    }
}
