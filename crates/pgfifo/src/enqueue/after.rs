//! Enqueueing jobs that depend on other jobs or batches
//! (`pgfifo.enqueue_after`): the path [`enqueue_batch`](crate::enqueue_batch)
//! takes when a job of the call has dependencies.

use diesel_async::AsyncPgConnection;

use super::NewJob;
use crate::db::dependency::{enqueue_after, Edges};
use crate::db::enqueue::EnqueueArrays;
use crate::{Dependency, Error, JobId, Result};

/// Whether some job of `jobs` has dependencies.
pub(super) fn any_dependency(jobs: &[NewJob]) -> bool {
    jobs.iter().any(|job| !job.dependencies.is_empty())
}

/// Enqueues `jobs`, some with dependencies, in one round trip. The other
/// jobs of the call may have no unique key nor window either: the function
/// takes none (enqueue them in a call of their own). A row cannot depend on
/// another row of the same call (its id is not known yet): enqueue the
/// dependency first. The jobs carry no trace context.
pub(super) async fn run(conn: &mut AsyncPgConnection, jobs: Vec<NewJob>) -> Result<Vec<JobId>> {
    if let Some(job) = jobs
        .iter()
        .find(|job| job.unique_key.is_some() || job.window.is_some())
    {
        return Err(Error::InvalidOption(format!(
            "a job with a unique key or a de-duplication window ({}) cannot be enqueued in one call \
             with jobs that have dependencies: enqueue it in a call of its own",
            job.kind
        )));
    }
    let mut arrays = EnqueueArrays::default();
    let mut on_failure = Vec::with_capacity(jobs.len());
    let mut edges = Edges::default();
    for (i, mut job) in jobs.into_iter().enumerate() {
        let row = i32::try_from(i + 1)
            .map_err(|_| Error::InvalidOption("too many jobs in one call".into()))?;
        on_failure.push(job.on_dependency_failure.as_str());
        for dependency in std::mem::take(&mut job.dependencies) {
            edges.row.push(row);
            match dependency {
                Dependency::Job(id) => {
                    edges.job.push(Some(id));
                    edges.batch.push(None);
                }
                Dependency::Batch(id) => {
                    edges.job.push(None);
                    edges.batch.push(Some(id));
                }
            }
        }
        job.push_into(&mut arrays);
    }
    Ok(enqueue_after(conn, arrays, on_failure, edges).await?)
}
