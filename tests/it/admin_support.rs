//! What the `admin_*` modules share: one job type whose runs are logged in
//! the job's transaction, that can be held at the test's gate, made to fail
//! (its `seq` listed in `admin_broken`) or to ask for a late retry; and a
//! fixture around [`TestDb`] with the waits and checks those tests repeat.

use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use diesel::sql_types::{BigInt, Integer, Text};
use diesel::QueryableByName;
use diesel_async::RunQueryDsl;
use pgfifo::{
    async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, JobId, NewJob, RunnerHandle,
};
use pgfifo_tests::{id_list, test_config, TestDb};
use serde::{Deserialize, Serialize};

use crate::gate::{gate, Gate};

/// The queue of every `admin_*` test.
pub(crate) const QUEUE: &str = "admin";

/// How long a test waits for something that should happen.
pub(crate) const LIMIT: Duration = Duration::from_secs(20);

/// How long a test watches for something that must not happen: several pick
/// cycles of [`test_config`] (100 ms poll interval).
pub(crate) const QUIET: Duration = Duration::from_millis(800);

/// The test's own tables: the log of committed runs, and the `seq`s whose
/// runs fail.
const TABLES: &str = "
    CREATE TABLE admin_log (
        n bigserial PRIMARY KEY, grp text, seq bigint NOT NULL, job_id bigint NOT NULL,
        attempt int NOT NULL);
    CREATE TABLE admin_broken (seq bigint PRIMARY KEY);";

/// What a run of [`AdminJob`] does besides logging itself.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Nothing more.
    Ok,
    /// Waits at the test's gate until released.
    Hold,
    /// Its first attempt asks to be retried in a minute.
    RetryLater,
}

/// One job of the `admin_*` tests. A run fails (retryably; with the default
/// one attempt, for good) while `admin_broken` lists its `seq`; otherwise it
/// appends a row to `admin_log`, which commits with its success.
#[derive(Job, Serialize, Deserialize, Debug, Clone)]
#[job(queue = "admin", max_attempts = 1, backoff = "10ms")]
pub(crate) struct AdminJob {
    pub(crate) tag: String,
    pub(crate) seq: i64,
    pub(crate) mode: Mode,
}

#[derive(QueryableByName)]
struct CountRow {
    #[diesel(sql_type = BigInt)]
    n: i64,
}

#[async_trait]
impl Handler for AdminJob {
    async fn handle(&self, ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        if self.mode == Mode::Hold {
            gate(&self.tag).hold().await?;
        }
        if self.mode == Mode::RetryLater && ctx.attempt() == 1 {
            return Err(JobError::retry_after(
                Duration::from_secs(60),
                "come back in a minute",
            ));
        }
        let broken: CountRow =
            diesel::sql_query("SELECT count(*) AS n FROM admin_broken WHERE seq = $1")
                .bind::<BigInt, _>(self.seq)
                .get_result(ctx.conn())
                .await?;
        if broken.n > 0 {
            return Err(JobError::retry(format!("seq {} is broken", self.seq)));
        }
        let (group, id, attempt) = (
            ctx.group().map(str::to_owned),
            ctx.id(),
            ctx.attempt() as i32,
        );
        diesel::sql_query(
            "INSERT INTO admin_log (grp, seq, job_id, attempt) VALUES ($1, $2, $3, $4)",
        )
        .bind::<diesel::sql_types::Nullable<Text>, _>(group)
        .bind::<BigInt, _>(self.seq)
        .bind::<BigInt, _>(id)
        .bind::<Integer, _>(attempt)
        .execute(ctx.conn())
        .await?;
        Ok(())
    }
}

/// A test database with the `admin_*` tables, and the test's gate.
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
        let db = TestDb::new().await;
        db.exec(TABLES).await;
        Fx { db }
    }

    /// The gate [`Mode::Hold`] runs of this test wait at.
    pub(crate) fn gate(&self) -> Arc<Gate> {
        gate(&self.db.name)
    }

    /// Lets `n` held runs go on.
    pub(crate) fn release(&self, n: usize) {
        self.gate().release.add_permits(n);
    }

    pub(crate) fn job(&self, seq: i64, mode: Mode) -> AdminJob {
        AdminJob {
            tag: self.db.name.clone(),
            seq,
            mode,
        }
    }

    /// Enqueues one job with `options`.
    pub(crate) async fn push_with(&self, seq: i64, mode: Mode, options: EnqueueOptions) -> JobId {
        let mut conn = self.conn().await;
        self.job(seq, mode)
            .enqueue_with(&mut conn, options)
            .await
            .expect("enqueue")
    }

    /// Enqueues one job into `group`.
    pub(crate) async fn push(&self, group: &str, seq: i64, mode: Mode) -> JobId {
        self.push_with(seq, mode, EnqueueOptions::group(group))
            .await
    }

    /// Enqueues plain jobs `seqs` into `group` (`None`: ungrouped) in one
    /// batch, in order.
    pub(crate) async fn push_many(
        &self,
        group: Option<&str>,
        seqs: std::ops::Range<i64>,
    ) -> Vec<JobId> {
        let jobs: Vec<NewJob> = seqs
            .map(|seq| {
                let options = match group {
                    Some(group) => EnqueueOptions::group(group),
                    None => EnqueueOptions::ungrouped(),
                };
                NewJob::new(&self.job(seq, Mode::Ok), options).expect("new job")
            })
            .collect();
        let mut conn = self.conn().await;
        pgfifo::enqueue_batch(&mut conn, jobs)
            .await
            .expect("enqueue batch")
    }

    /// Makes runs of these `seq`s fail.
    pub(crate) async fn break_seqs(&self, seqs: &[i64]) {
        self.exec(&format!(
            "INSERT INTO admin_broken (seq) SELECT unnest(ARRAY[{}]::bigint[])",
            id_list(seqs)
        ))
        .await;
    }

    /// Makes every run succeed from now on.
    pub(crate) async fn fix_all(&self) {
        self.exec("DELETE FROM admin_broken").await;
    }

    /// Sets the test queue's failure policy; returns how many held groups
    /// that released.
    pub(crate) async fn set_policy(&self, policy: pgfifo::admin::FailurePolicy) -> u64 {
        let mut conn = self.conn().await;
        pgfifo::admin::set_failure_policy(&mut conn, QUEUE, policy)
            .await
            .expect("set the failure policy")
    }

    /// A runner on the test queue.
    pub(crate) async fn runner(&self) -> RunnerHandle {
        self.start_runner(test_config().queues([QUEUE]).concurrency(4))
            .await
    }

    /// Waits until every job of `ids` is in `state`.
    pub(crate) async fn wait_state(&self, ids: &[JobId], state: &str) {
        self.wait_jobs_in(ids, state, LIMIT).await;
    }

    /// Watches for [`QUIET`] and asserts that none of `ids` started and all
    /// are still queued. Something that must not happen has no event to wait
    /// for: the watch is a window of time, several of the runner's polls and
    /// wakeups long.
    pub(crate) async fn assert_not_started(&self, ids: &[JobId], why: &str) {
        tokio::time::sleep(QUIET).await;
        assert_eq!(self.attempts_of(ids).await, 0, "{why}: a job started");
        assert_eq!(
            self.scalar(&format!(
                "SELECT count(*) FROM pgfifo.job WHERE id IN ({}) AND state = 'queued'",
                id_list(ids)
            ))
            .await,
            ids.len() as i64,
            "{why}: a job is no longer queued"
        );
    }

    /// The `seq:attempt` of the committed runs of `group`, in run order.
    pub(crate) async fn run_order(&self, group: &str) -> String {
        self.text(&format!(
            "SELECT coalesce(string_agg(seq || ':' || attempt, ',' ORDER BY n), '') \
             FROM admin_log WHERE grp = '{group}'"
        ))
        .await
        .unwrap_or_default()
    }

    /// How many committed runs the jobs `ids` have, all together.
    pub(crate) async fn runs_of(&self, ids: &[JobId]) -> i64 {
        self.scalar(&format!(
            "SELECT count(*) FROM admin_log WHERE job_id IN ({})",
            id_list(ids)
        ))
        .await
    }

    /// Waits until `group` of the test queue is held at a failed head.
    pub(crate) async fn wait_held(&self, group: &str) {
        self.wait_for(
            &format!(
                "SELECT count(*) FROM pgfifo.queue_group WHERE queue = '{QUEUE}' \
                 AND group_id = '{group}' AND head_id IS NOT NULL AND ready_at IS NULL"
            ),
            1,
            LIMIT,
        )
        .await;
    }

    /// Waits until job `id` is the head of its group.
    pub(crate) async fn wait_head(&self, id: JobId) {
        self.wait_for(
            &format!("SELECT count(*) FROM pgfifo.queue_group WHERE head_id = {id}"),
            1,
            LIMIT,
        )
        .await;
    }

    /// Waits until job `id` failed its first attempt and waits for a retry.
    pub(crate) async fn wait_retrying(&self, id: JobId) {
        self.wait_for(
            &format!(
                "SELECT count(*) FROM pgfifo.job WHERE id = {id} AND state = 'queued' AND attempts = 1"
            ),
            1,
            LIMIT,
        )
        .await;
    }

    /// The group `group` of the test queue as [`pgfifo::admin::groups`] lists it.
    pub(crate) async fn group_info(&self, group: &str) -> pgfifo::admin::GroupInfo {
        let mut conn = self.conn().await;
        let all = pgfifo::admin::groups(&mut conn, QUEUE, &Default::default())
            .await
            .expect("groups");
        all.into_iter()
            .find(|g| g.group == group)
            .unwrap_or_else(|| panic!("group {group} is not listed"))
    }
}
