//! Word between the runner's tasks that a server stopped answering.
//!
//! Each task that talks to the database bounds its own round trips, but
//! one that is idle, or whose handler is in a statement of its own, finds
//! out late or never: after a failover the bookkeeper, idle while the
//! lanes waited on the hung server, would hold up the first jobs on the new
//! primary for another deadline, and a handler stuck in its own statement
//! on the hung server would hold its permit until its job's timeout
//! (minutes). So a lane that gives up on a hung server notes it here, with
//! the host its connection went to, and
//!
//! * the bookkeeper replaces a connection it took before that;
//! * a handler that started before it, on a connection to the same host,
//!   is cut off: its server did not answer another connection's round trip
//!   in time, so its transaction is as good as lost (and after a failover,
//!   its job runs again on the new primary). A handler's long statement on
//!   a server that answers the runner's other round trips is left alone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

/// How long a hung host is remembered for the handlers that started before.
const REMEMBER: Duration = Duration::from_secs(600);

/// A host (`host:port`, `None` for a connection pgfifo did not open).
pub(crate) type Host = Option<Arc<str>>;

#[derive(Default, Debug)]
struct Inner {
    count: AtomicU64,
    /// When each host was last found hung.
    hosts: Mutex<Vec<(Host, Instant)>>,
    notify: Notify,
}

/// Where the runner's tasks say that a server did not answer in time.
#[derive(Clone, Default, Debug)]
pub(crate) struct HungSignal(Arc<Inner>);

impl HungSignal {
    /// A round trip to `host` got no answer in time.
    pub(crate) fn note(&self, host: Host) {
        {
            let mut hosts = self.0.hosts.lock().unwrap_or_else(|e| e.into_inner());
            hosts.retain(|(known, at)| *known != host && at.elapsed() < REMEMBER);
            hosts.push((host, Instant::now()));
        }
        self.0.count.fetch_add(1, Ordering::SeqCst);
        self.0.notify.notify_waiters();
    }

    /// The count so far: a connection taken at one count is suspect once
    /// it moved.
    pub(crate) fn seen(&self) -> u64 {
        self.0.count.load(Ordering::SeqCst)
    }

    /// Whether `host` was found hung after `since`.
    fn hung_since(&self, host: &Host, since: Instant) -> bool {
        let hosts = self.0.hosts.lock().unwrap_or_else(|e| e.into_inner());
        hosts.iter().any(|(known, at)| known == host && *at > since)
    }

    /// Returns once `host` is found hung after `since` (a handler that
    /// started then on a connection to it).
    pub(crate) async fn wait_for(&self, host: &Host, since: Instant) {
        loop {
            let notified = self.0.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.hung_since(host, since) {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_handler_is_told_only_of_its_own_host_hung_after_it_started() {
        let signal = HungSignal::default();
        let a: Host = Some("a:5432".into());
        let b: Host = Some("b:5432".into());
        let before = Instant::now();
        signal.note(b.clone());
        let waiting = signal.wait_for(&a, before);
        tokio::pin!(waiting);
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        signal.note(a.clone());
        waiting.await;
        assert_eq!(signal.seen(), 2);
        // A handler that started after the note is not told.
        let after = Instant::now();
        assert!(!signal.hung_since(&a, after));
    }
}
