//! Word between the runner's tasks that a server stopped answering.
//!
//! Each task that talks to the database (the lanes, the bookkeeper) bounds
//! its round trips, but one that is idle when the server hangs finds out
//! only at its next round trip, a whole deadline later: after a failover
//! the bookkeeper, idle while the lanes waited on the hung server, would
//! then hold up the first jobs on the new primary for another deadline.
//! So a lane that gives up on a hung server says so here, and the
//! bookkeeper replaces a connection it took before that.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How many times a task of this runner found its server hung.
#[derive(Clone, Default, Debug)]
pub(crate) struct HungSignal(Arc<AtomicU64>);

impl HungSignal {
    /// A round trip got no answer in time.
    pub(crate) fn note(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// The count so far: a connection taken at one count is suspect once
    /// it moved.
    pub(crate) fn seen(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}
