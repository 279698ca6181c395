//! How many jobs a lane's next pick takes: as many as fit in the batch
//! window by recent handlers' run times, no more than the last picks found;
//! one while handlers take the connection, and one while another lane of
//! the runner looks for work with a slot free for it (recent run times say
//! nothing of the next job's: a job that turns out slow would hold the jobs
//! picked with it while that lane stands idle). See `batch.rs` for what a
//! batch is, and `lane.rs` for the picks that are handed back when they
//! took every ready job.
//!
//! A pick may also take the next jobs of the groups it took (followers, see
//! `pgfifo.pick`), up to [`Batching::batch`] jobs in all: they fill the
//! window of a lane whose groups have a backlog of quick jobs, and could
//! not run in another lane anyway.

use std::time::Duration;

/// How a lane sizes its picks (see the module documentation).
#[derive(Debug)]
pub(super) struct Batching {
    /// The most jobs one pick takes (`RunnerConfig::max_batch`).
    max: usize,
    /// No handler of a batch starts later than this after its first one.
    window: Duration,
    /// How many jobs the last picks found: a pick that asks for more jobs
    /// than there are free groups walks every busy one, and every lane
    /// asking for many keeps more groups locked than there are.
    found: usize,
    /// A moving average of recent handlers' run times, in seconds; `None`
    /// when handlers take the connection (they never share a transaction).
    average: Option<f64>,
}

impl Batching {
    pub(super) fn new(max: usize, window: Duration) -> Self {
        let max = max.max(1);
        Self {
            max,
            window,
            found: max,
            average: None,
        }
    }

    /// No handler of a batch starts later than this after its first one.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// How many jobs the next pick takes. `spread`: another lane of the
    /// runner looks for work and a slot is free (`Board::others_seek`):
    /// one job, the other lanes take the rest.
    pub(super) fn limit(&self, spread: bool) -> i32 {
        let Some(average) = self.average else {
            return 1;
        };
        if spread {
            return 1;
        }
        let fit = if average > 0.0 {
            self.window.as_secs_f64() / average
        } else {
            f64::INFINITY
        };
        (fit.clamp(1.0, self.max as f64) as usize)
            .min(self.found)
            .max(1) as i32
    }

    /// How many jobs the next pick takes in all, its groups' next jobs
    /// (followers) included: as many as fit in the window, whatever the
    /// other lanes do (a follower could not run elsewhere: its group is
    /// held by this lane) and whatever the last picks found (that counts
    /// free groups). One while handlers take the connection.
    pub(super) fn batch(&self) -> i32 {
        let Some(average) = self.average else {
            return 1;
        };
        let fit = if average > 0.0 {
            self.window.as_secs_f64() / average
        } else {
            f64::INFINITY
        };
        fit.clamp(1.0, self.max as f64) as i32
    }

    /// A pick asked for `asked` jobs of different groups and found `got`
    /// (0: nothing to do).
    pub(super) fn picked(&mut self, asked: i32, got: usize) {
        if got == 0 {
            return;
        }
        self.found = if got < asked as usize {
            // Halve rather than drop to `got`: the walk for free groups is
            // bounded in pick, and lanes that all ask for one job at a time
            // lose what batching gains.
            got.max(self.found / 2)
        } else {
            (self.found * 2).min(self.max)
        };
    }

    /// A handler that never took the connection ran for `took`.
    pub(super) fn ran(&mut self, took: Duration) {
        let took = took.as_secs_f64();
        self.average = Some(match self.average {
            Some(average) => 0.8 * average + 0.2 * took,
            None => took,
        });
    }

    /// The lane found nothing to do: what the last picks found says nothing
    /// of the next work to come (a burst is sized by what its first pick
    /// finds, so that a pick that takes every ready job shows it).
    pub(super) fn found_nothing(&mut self) {
        self.found = self.max;
    }

    /// A handler took the connection, or the transaction failed: one job at
    /// a time until handlers show otherwise.
    pub(super) fn single(&mut self) {
        self.average = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn picks_fit_the_window_the_slots_and_what_was_found() {
        let mut b = Batching::new(16, 5 * MS);
        // Nothing known yet: one job.
        assert_eq!(b.limit(false), 1);
        assert_eq!(b.batch(), 1);
        // Handlers of 0.5 ms: ten fit in 5 ms; one while other lanes seek,
        // but ten in all with their groups' next jobs.
        b.ran(MS / 2);
        assert_eq!(b.limit(false), 10);
        assert_eq!(b.limit(true), 1);
        assert_eq!(b.batch(), 10);
        // A pick that found fewer than it asked for caps the next ones (not
        // the followers: they are not free groups).
        b.picked(10, 3);
        assert_eq!(b.limit(false), 8);
        assert_eq!(b.batch(), 10);
        b.picked(8, 2);
        assert_eq!(b.limit(false), 4);
        b.picked(4, 4);
        assert_eq!(b.limit(false), 8);
        // Handlers that take the connection run one per transaction.
        b.single();
        assert_eq!(b.limit(false), 1);
        assert_eq!(b.batch(), 1);
        // Instant handlers: up to max_batch.
        b.ran(Duration::ZERO);
        b.picked(1, 1);
        b.picked(1, 1);
        b.picked(1, 1);
        assert_eq!(b.limit(false), 16);
        assert_eq!(b.limit(true), 1);
        // After nothing was found, the next pick may take up to max_batch.
        b.picked(16, 2);
        b.picked(8, 2);
        assert_eq!(b.limit(false), 4);
        b.found_nothing();
        assert_eq!(b.limit(false), 16);
        // Handlers as long as the window: one at a time.
        let mut slow = Batching::new(16, 5 * MS);
        slow.ran(5 * MS);
        assert_eq!(slow.limit(false), 1);
        assert_eq!(slow.batch(), 1);
    }
}
