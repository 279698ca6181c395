//! The value types of the command line: job states, purge states, failure
//! policies, and the parsers of ids and limits.

use clap::ValueEnum;
use pgfifo::admin::{FailurePolicy, FinishedState, JobStateFilter};
use pgfifo::JobId;

/// A job state `pgfifo jobs --state` filters on.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum StateArg {
    /// Not finished: waiting, scheduled, running or retrying.
    Queued,
    /// Ran successfully.
    Succeeded,
    /// Failed for good.
    Failed,
    /// Cancelled.
    Cancelled,
}

impl From<StateArg> for JobStateFilter {
    fn from(state: StateArg) -> Self {
        match state {
            StateArg::Queued => JobStateFilter::Queued,
            StateArg::Succeeded => JobStateFilter::Succeeded,
            StateArg::Failed => JobStateFilter::Failed,
            StateArg::Cancelled => JobStateFilter::Cancelled,
        }
    }
}

/// A final state `pgfifo purge --state` deletes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PurgeState {
    /// Jobs that succeeded.
    Succeeded,
    /// Jobs that failed for good (a held group's failed head is kept).
    Failed,
    /// Jobs that were cancelled.
    Cancelled,
}

impl From<PurgeState> for FinishedState {
    fn from(state: PurgeState) -> Self {
        match state {
            PurgeState::Succeeded => FinishedState::Succeeded,
            PurgeState::Failed => FinishedState::Failed,
            PurgeState::Cancelled => FinishedState::Cancelled,
        }
    }
}

/// A failure policy on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum PolicyArg {
    /// The failed job is kept as failed and the group goes on.
    Continue,
    /// The group stops at the failed job until it is retried or skipped.
    Hold,
}

impl From<PolicyArg> for FailurePolicy {
    fn from(policy: PolicyArg) -> Self {
        match policy {
            PolicyArg::Continue => FailurePolicy::Continue,
            PolicyArg::Hold => FailurePolicy::Hold,
        }
    }
}

/// Job ids are positive.
pub fn job_id() -> clap::builder::RangedI64ValueParser<JobId> {
    clap::value_parser!(JobId).range(1..)
}

/// Listing limits are at least 1.
pub fn limit() -> clap::builder::RangedI64ValueParser<i64> {
    clap::value_parser!(i64).range(1..)
}
