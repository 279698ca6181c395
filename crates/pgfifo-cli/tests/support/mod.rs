//! What the `pgfifo` binary's tests share: running it, a job type to
//! enqueue, jobs in known states, and (from the harness) an empty database
//! for migrations.

use std::process::Command;

use pgfifo::{async_trait, EnqueueOptions, Handler, Job, JobContext, JobError, JobId, NewJob};
pub use pgfifo_tests::FreshDb;
use pgfifo_tests::TestDb;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The queue the tests enqueue to.
pub const QUEUE: &str = "cli";

/// A job that is never run here: the tests only enqueue it.
#[derive(Job, Serialize, Deserialize, Debug)]
#[job(queue = "cli", max_attempts = 3, timeout = "30s")]
pub struct CliJob {
    pub n: i64,
}

#[async_trait]
impl Handler for CliJob {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

/// What one run of the binary did.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// Asserts exit code `code`, showing the output otherwise.
    pub fn expect(self, code: i32) -> Run {
        assert_eq!(
            self.code, code,
            "exit code\n--- stdout\n{}\n--- stderr\n{}",
            self.stdout, self.stderr
        );
        self
    }

    /// Stdout as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}):\n{}", self.stdout))
    }
}

/// Runs `pgfifo args...` with `DATABASE_URL` set to `url` (unset for `None`).
pub fn pgfifo(url: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgfifo"));
    cmd.args(args).env_remove("DATABASE_URL");
    if let Some(url) = url {
        cmd.env("DATABASE_URL", url);
    }
    let out = cmd.output().expect("run pgfifo");
    Run {
        code: out.status.code().expect("exit code"),
        stdout: String::from_utf8(out.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(out.stderr).expect("utf-8 stderr"),
    }
}

/// Enqueues one job per group name, in order, in queue `queue`; returns the
/// ids. Then makes the groups active as a runner would (`pgfifo.promote`).
pub async fn enqueue(db: &TestDb, queue: &str, groups: &[&str]) -> Vec<JobId> {
    let jobs = groups
        .iter()
        .enumerate()
        .map(|(n, g)| {
            NewJob::new(
                &CliJob { n: n as i64 },
                EnqueueOptions::group(*g).queue(queue),
            )
        })
        .collect::<pgfifo::Result<Vec<_>>>()
        .expect("new jobs");
    let mut conn = db.conn().await;
    let ids = pgfifo::enqueue_batch(&mut conn, jobs)
        .await
        .expect("enqueue");
    drop(conn);
    db.exec(&format!("SELECT pgfifo.promote(ARRAY['{queue}'], 1000)"))
        .await;
    ids
}

/// Marks jobs failed for good, as a runner would after their last attempt.
pub async fn fail(db: &TestDb, ids: &[JobId]) {
    let ids: Vec<String> = ids.iter().map(ToString::to_string).collect();
    db.exec(&format!(
        "UPDATE pgfifo.job SET state = 'failed', finished_at = now(), last_error = 'boom'
         WHERE id IN ({})",
        ids.join(", ")
    ))
    .await;
}
