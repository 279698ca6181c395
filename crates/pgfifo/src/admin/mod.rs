//! Seeing and steering pgfifo at run time: the library side of the `pgfifo`
//! command-line tool.
//!
//! Every function takes a plain connection and runs in its own short
//! transaction (or the caller's, if one is open: it must be READ COMMITTED,
//! PostgreSQL's default, as the operations that change a group look at its
//! jobs again after taking its locks). None waits for a running
//! job: an operation that would have to (cancelling a running job, skipping
//! a running head) fails with [`Error::JobRunning`](crate::Error::JobRunning)
//! or [`Error::GroupBusy`](crate::Error::GroupBusy) and changes nothing.
//!
//! | need | function |
//! |---|---|
//! | counts per queue, oldest job, blocked groups, largest backlogs | [`status`], [`queue_status`] |
//! | groups of a queue and why one is blocked | [`groups`], [`group`] |
//! | the runners alive now, jobs finished per minute | [`runners`], [`throughput`] |
//! | list and inspect jobs, a group's recent history | [`jobs`], [`job`], [`group_history`] |
//! | why jobs wait for their dependencies | [`dependency_waits`] |
//! | put failed jobs back, in order | [`retry_jobs`], [`retry_failed`] |
//! | cancel a job, skip a group's head | [`cancel_job`], [`skip_head`] |
//! | pause and resume a queue or one group | [`pause_queue`], [`pause_group`], … |
//! | failure policy of a queue | [`set_failure_policy`] |
//! | a whole queue's limits, and what they hold back now | [`set_queue_limits`], [`change_queue_limits`], [`queue_limits`], [`queue_usage`] |
//! | rate limits per group, and a queue's defaults | [`set_group_limits`], [`set_default_group_limits`], [`reset_group_limits`], [`limits`] |
//! | delete old finished jobs, idle groups, ended windows | [`purge`], [`clean_groups`], [`clean_windows`] |
//! | batches' progress, one batch's jobs and callbacks; delete emptied ones | [`batches`], [`batch`], [`clean_batches`] |
//! | recurring jobs: list, recent ticks, pause, resume, delete | [`schedules`], [`schedule_ticks`], [`pause_schedule`], [`resume_schedule`], [`delete_schedule`] |
//!
//! ```no_run
//! # async fn run(conn: &mut pgfifo::diesel_async::AsyncPgConnection) -> pgfifo::Result<()> {
//! use pgfifo::admin;
//!
//! // Stop one tenant's jobs while its account is migrated; its jobs stay queued.
//! admin::pause_group(conn, "billing", "tenant-42").await?;
//! // ...
//! admin::resume_group(conn, "billing", "tenant-42").await?;
//!
//! // Put the tenant's failed jobs back, in their original order.
//! admin::retry_failed(conn, "billing", Some("tenant-42")).await?;
//! # Ok(())
//! # }
//! ```

mod batches;
mod controls;
mod dependencies;
mod groups;
mod jobs;
mod ops;
mod queue_limits;
mod queue_usage;
mod runners;
mod schedules;
mod status;

pub use crate::batch::{BatchCallback, BatchMember, BatchProgress, BatchState, BatchSummary};
pub use crate::time::{human, rfc3339};
pub use batches::{batch, batches, clean_batches};
pub use controls::{
    change_group_limits, limits, limits_of, reset_default_group_limits, reset_group_limits,
    set_default_group_limits, set_group_limits, SetLimits,
};
pub use dependencies::{dependency_waits, DependencyWait};
pub use groups::{group, groups, GroupInfo, GroupOrder, GroupQuery, GroupState};
pub use jobs::{
    group_history, job, jobs, AttemptInfo, JobDetail, JobQuery, JobStateFilter, JobStatus,
    JobSummary, JobWindow, HISTORY_WINDOW,
};
pub use ops::{
    cancel_job, clean_groups, clean_windows, pause_group, pause_queue, purge, purge_batch,
    resume_group, resume_queue, retry_failed, retry_jobs, set_failure_policy, skip_head,
    FailurePolicy, FinishedState, PurgeBatch, Retried, RetryResult, PURGE_BATCH,
};
pub use queue_limits::{change_queue_limits, queue_limits, reset_queue_limits, set_queue_limits};
pub use queue_usage::{queue_usage, QueueUsage, QueueWait};
pub use runners::{runners, throughput, MinuteCount, RunnerInfo};
pub use schedules::{
    delete_schedule, pause_schedule, resume_schedule, schedule, schedule_ticks, schedules,
    ScheduleInfo, TickInfo,
};
pub use status::{
    gauges, queue_status, queues, status, BlockedGroups, Count, GroupBacklog, QueueGauges,
    QueueStatus, COUNT_CAP, RUNNER_ALIVE,
};
