//! Why a job waits for its dependencies: the job view's and the group
//! view's "waiting for jobs 17 and 18", "waiting for batch 5", "held:
//! dependency job 17 failed".

use std::fmt;

use diesel_async::AsyncPgConnection;
use serde::Serialize;

use crate::db;
use crate::db::pooler::pinned;
use crate::{BatchId, Dependency, DependencyFailure, JobId, Result};

/// The run_after of a waiting dependent (`pgfifo.dependency_wait_at()`,
/// 9999-12-31), in microseconds since the epoch: a group whose head's time
/// is this waits for dependencies, not for a time.
pub(crate) const WAIT_AT_US: i64 = 253_402_214_400_000_000;

/// Why a job waits for its dependencies (see
/// [`EnqueueOptions::depends_on`](crate::EnqueueOptions::depends_on)). Its
/// [`Display`](fmt::Display) is the reason the views show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DependencyWait {
    /// The waiting job.
    pub job: JobId,
    /// What a failed dependency does to it.
    pub on_failure: DependencyFailure,
    /// The jobs it still waits for, ascending.
    pub jobs: Vec<JobId>,
    /// The batches it still waits for, ascending.
    pub batches: Vec<BatchId>,
    /// The failed dependency that holds it (policy
    /// [`Hold`](DependencyFailure::Hold)): retry that one, or cancel this job.
    pub held_by: Option<Dependency>,
}

impl fmt::Display for DependencyWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.held_by {
            Some(Dependency::Job(id)) => return write!(f, "held: dependency job {id} failed"),
            Some(Dependency::Batch(id)) => {
                return write!(f, "held: dependency batch {id} completed without success")
            }
            None => {}
        }
        let mut parts = Vec::new();
        for (one, many, ids) in [
            ("job", "jobs", &self.jobs),
            ("batch", "batches", &self.batches),
        ] {
            match ids.as_slice() {
                [] => {}
                [id] => parts.push(format!("{one} {id}")),
                [rest @ .., last] => {
                    let rest: Vec<String> = rest.iter().map(i64::to_string).collect();
                    parts.push(format!("{many} {} and {last}", rest.join(", ")));
                }
            }
        }
        if parts.is_empty() {
            // Every dependency is decided: it is released in a moment.
            return write!(f, "waiting for its release");
        }
        write!(f, "waiting for {}", parts.join(" and "))
    }
}

/// Why each of the jobs `ids` that waits for dependencies waits, in id
/// order (jobs that do not wait are left out).
pub async fn dependency_waits(
    conn: &mut AsyncPgConnection,
    ids: &[JobId],
) -> Result<Vec<DependencyWait>> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = pinned(conn, async |conn| {
        db::admin::dependency::waits(conn, ids).await
    })
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| DependencyWait {
            job: row.job_id,
            on_failure: match row.on_failure.as_str() {
                "hold" => DependencyFailure::Hold,
                "run" => DependencyFailure::Run,
                _ => DependencyFailure::Cancel,
            },
            jobs: row.jobs,
            batches: row.batches,
            held_by: row
                .held_by_job
                .map(Dependency::Job)
                .or(row.held_by_batch.map(Dependency::Batch)),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::DependencyWait;
    use crate::{Dependency, DependencyFailure};

    fn wait(jobs: Vec<i64>, batches: Vec<i64>, held_by: Option<Dependency>) -> String {
        DependencyWait {
            job: 1,
            on_failure: DependencyFailure::Hold,
            jobs,
            batches,
            held_by,
        }
        .to_string()
    }

    #[test]
    fn the_reasons_read_as_sentences() {
        assert_eq!(
            wait(vec![17, 18], vec![], None),
            "waiting for jobs 17 and 18"
        );
        assert_eq!(
            wait(vec![1, 2, 3], vec![], None),
            "waiting for jobs 1, 2 and 3"
        );
        assert_eq!(wait(vec![], vec![5], None), "waiting for batch 5");
        assert_eq!(
            wait(vec![17], vec![5], None),
            "waiting for job 17 and batch 5"
        );
        assert_eq!(
            wait(vec![17], vec![], Some(Dependency::Job(17))),
            "held: dependency job 17 failed"
        );
    }
}
