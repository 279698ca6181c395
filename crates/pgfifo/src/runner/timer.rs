//! Work that becomes ready by itself at a known time, and nobody is woken for:
//! a retry's delay, a group's delayed next job, a delayed job whose idle
//! group was promoted, a group left active for an enqueue in flight. Whoever
//! learns of such a time notes it on the [`Timer`]; when it comes, the
//! timer task calls its `wake` with how much work is due (the runner passes
//! the lanes' `Board::wake`: an idle lane picks, or a busy one picks again
//! after its batch).
//!
//! One timer for the whole runner: a lane that noted a retry may be busy with
//! other jobs when it is due, and the retry would wait for the poll. Work of
//! other runners, and delayed ungrouped jobs, are found by the poll.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// At most this many due times are kept; beyond, the latest are left to the
/// poll.
const KEPT: usize = 4_096;

/// How long the timer sleeps when nothing is due (it wakes earlier when a
/// time is noted).
const NOTHING_DUE: Duration = Duration::from_secs(3_600);

/// A handle to the runner's timer: notes when known work becomes ready.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timer(Arc<DueTimes>);

impl Timer {
    /// Notes that some work becomes ready in `soon`.
    pub(crate) fn add(&self, soon: Duration) {
        self.0.add(soon);
    }
}

/// The times at which known work becomes ready, each with how many pieces
/// of work are due then.
#[derive(Debug, Default)]
struct DueTimes {
    at: Mutex<BTreeMap<Instant, usize>>,
    /// An earlier time than the timer sleeps for was noted.
    earlier: Notify,
}

impl DueTimes {
    fn add(&self, soon: Duration) {
        let at = Instant::now() + soon;
        let mut times = self.at.lock().unwrap_or_else(|e| e.into_inner());
        let earliest = times.first_key_value().is_none_or(|(first, _)| at < *first);
        *times.entry(at).or_default() += 1;
        if times.len() > KEPT {
            times.pop_last();
        }
        drop(times);
        if earliest {
            // Stored if the timer is not waiting: it looks again first.
            self.earlier.notify_one();
        }
    }

    fn next(&self) -> Option<Instant> {
        self.at
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .first_key_value()
            .map(|(at, _)| *at)
    }

    /// Forgets the times that have come; returns how much work was due.
    fn take_due(&self, now: Instant) -> usize {
        let mut times = self.at.lock().unwrap_or_else(|e| e.into_inner());
        let later = times.split_off(&(now + Duration::from_nanos(1)));
        let due = times.values().sum();
        *times = later;
        due
    }
}

/// Calls `wake` with how much noted work became ready, whenever some does,
/// until `stop` (the lanes stop picking).
pub(crate) async fn run(timer: Timer, wake: impl Fn(usize), stop: CancellationToken) {
    let due = &*timer.0;
    loop {
        let wait = due.next().map_or(NOTHING_DUE, |at| {
            at.saturating_duration_since(Instant::now())
        });
        tokio::select! {
            () = tokio::time::sleep(wait) => {
                let ready = due.take_due(Instant::now());
                if ready > 0 {
                    wake(ready);
                }
            }
            () = due.earlier.notified() => {}
            () = stop.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_that_came_are_taken_once_and_later_ones_kept() {
        let due = DueTimes::default();
        due.add(Duration::ZERO);
        due.add(Duration::from_micros(1));
        due.add(Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(due.take_due(Instant::now()), 2);
        assert_eq!(due.take_due(Instant::now()), 0);
        // Two pieces of work due at the same instant wake two lanes.
        let at = Instant::now();
        *due.at.lock().unwrap().entry(at).or_default() += 2;
        assert_eq!(due.take_due(at), 2);
        assert_eq!(due.take_due(Instant::now()), 0);
        let next = due.next().expect("the later time is kept");
        assert!(next > Instant::now() + Duration::from_secs(59));
    }

    #[test]
    fn beyond_the_bound_the_latest_are_dropped() {
        let due = DueTimes::default();
        for i in 0..KEPT as u64 + 10 {
            due.add(Duration::from_secs(i + 1));
        }
        let times = due.at.lock().unwrap();
        assert_eq!(times.len(), KEPT);
        let (&last, _) = times.last_key_value().unwrap();
        assert!(last < Instant::now() + Duration::from_secs(KEPT as u64 + 1));
    }
}
