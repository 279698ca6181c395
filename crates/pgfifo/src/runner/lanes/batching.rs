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
//!
//! # Under a queue's slot
//!
//! A pick that takes a slot of a queue with a concurrency limit holds it
//! until its transaction ends, and the queue's throughput is what its slots
//! carry. Between two batches a slot stands idle for the lane's turnaround:
//! the outcomes' write, the COMMIT with the next pick, and the next
//! attempts' record (three round trips, each with a WAL flush: 3–6 ms
//! under load, measured). With the batch window alone (a few 5 ms handlers
//! per batch), that idle time was 15–20 % of the slot's. So such a pick
//! takes [`Batching::slot_batch`] jobs, as many as fit in
//! [`Batching::slot_window`]: [`SLOT_TURNS`] times the lane's measured
//! turnaround, at least the batch window and at most [`SLOT_WINDOW_MAX`].
//! The lanes that look for work lose nothing by it: they could not start
//! a job of that queue without a slot either.

use std::time::{Duration, Instant};

/// A slot's batch lasts this many times the lane's turnaround, so that the
/// slot spends at least SLOT_TURNS / (SLOT_TURNS + 1) (94 %) of its time in
/// handlers, when handlers are short enough and `max_batch` allows. (20
/// did no better than 15 in alternate runs: the batch is then capped by
/// `max_batch` most of the time.)
pub(super) const SLOT_TURNS: u32 = 15;

/// The longest a slot's batch runs (unless the batch window is longer):
/// the groups of its jobs wait that long at most for their next job.
pub(super) const SLOT_WINDOW_MAX: Duration = Duration::from_millis(250);

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
    /// A moving average of the lane's turnaround, in seconds: from the end
    /// of a batch's last handler to the start of the next batch's first,
    /// when the lane picked again at once.
    turnaround: Option<f64>,
    /// When the last batch's handlers ended, while the lane picks again at
    /// once (cleared when it finds nothing and waits).
    handlers_ended: Option<Instant>,
}

impl Batching {
    pub(super) fn new(max: usize, window: Duration) -> Self {
        let max = max.max(1);
        Self {
            max,
            window,
            found: max,
            average: None,
            turnaround: None,
            handlers_ended: None,
        }
    }

    /// How many jobs the next pick takes. `spread`: another lane of the
    /// runner looks for work and a slot is free (`Board::others_seek`):
    /// one job, the other lanes take the rest.
    pub(super) fn limit(&self, spread: bool) -> i32 {
        match self.fit(self.window) {
            Some(fit) if !spread => fit.min(self.found).max(1) as i32,
            _ => 1,
        }
    }

    /// How many handlers of recent run times fit in `window`, from 1 to
    /// `max_batch`; `None` while handlers take the connection.
    fn fit(&self, window: Duration) -> Option<usize> {
        let average = self.average?;
        let fit = if average > 0.0 {
            window.as_secs_f64() / average
        } else {
            f64::INFINITY
        };
        Some(fit.clamp(1.0, self.max as f64) as usize)
    }

    /// No handler of a batch picked under a queue's slot starts later than
    /// this after its first one (see "Under a queue's slot" above).
    pub(super) fn slot_window(&self) -> Duration {
        let Some(turnaround) = self.turnaround else {
            return self.window;
        };
        Duration::from_secs_f64(turnaround * f64::from(SLOT_TURNS))
            .min(SLOT_WINDOW_MAX)
            .max(self.window)
    }

    /// No handler of a batch starts later than this after its first one:
    /// the batch window, or the slot's for a job picked under a queue's
    /// slot.
    pub(super) fn window_for(&self, under_queue_slot: bool) -> Duration {
        if under_queue_slot {
            self.slot_window()
        } else {
            self.window
        }
    }

    /// How many jobs the next pick takes in all if it takes a queue's slot:
    /// as many as fit in [`Batching::slot_window`], at most `max_batch`.
    /// One while handlers take the connection.
    pub(super) fn slot_batch(&self) -> i32 {
        self.fit(self.slot_window()).unwrap_or(1) as i32
    }

    /// A batch's first handler starts: the time since the last batch's
    /// handlers ended, if the lane picked again at once, is its turnaround.
    pub(super) fn first_handler_starts(&mut self) {
        if let Some(ended) = self.handlers_ended.take() {
            let took = ended.elapsed().as_secs_f64();
            self.turnaround = Some(match self.turnaround {
                Some(turnaround) => 0.8 * turnaround + 0.2 * took,
                None => took,
            });
        }
    }

    /// A batch's handlers are done (its outcomes are written next).
    pub(super) fn handlers_end(&mut self) {
        self.handlers_ended = Some(Instant::now());
    }

    /// How many jobs the next pick takes in all, its groups' next jobs
    /// (followers) included: as many as fit in the window, whatever the
    /// other lanes do (a follower could not run elsewhere: its group is
    /// held by this lane) and whatever the last picks found (that counts
    /// free groups). One while handlers take the connection.
    pub(super) fn batch(&self) -> i32 {
        self.fit(self.window).unwrap_or(1) as i32
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
        // The wait that follows is no turnaround.
        self.handlers_ended = None;
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

    #[test]
    fn a_queue_slot_carries_turnarounds_worth_of_handlers() {
        let mut b = Batching::new(16, 25 * MS);
        // Nothing known: one job, and the batch window.
        assert_eq!(b.slot_batch(), 1);
        assert_eq!(b.slot_window(), 25 * MS);
        b.ran(5 * MS);
        // No turnaround measured yet: what fits in the batch window.
        assert_eq!(b.slot_batch(), 5);
        assert_eq!(b.window_for(true), 25 * MS);
        // A turnaround of about 4 ms: 15 of them, 60 ms, 12 handlers of 5 ms.
        b.handlers_ended = Some(Instant::now() - 4 * MS);
        b.first_handler_starts();
        let window = b.slot_window();
        assert!(window >= 60 * MS && window < 75 * MS, "{window:?}");
        assert_eq!(b.window_for(true), window);
        assert_eq!(b.window_for(false), 25 * MS);
        assert!((12..=14).contains(&b.slot_batch()), "{}", b.slot_batch());
        // The batch outside a slot is unchanged.
        assert_eq!(b.batch(), 5);
        // Measured once per batch: a second start without an end in
        // between changes nothing.
        b.first_handler_starts();
        assert_eq!(b.slot_window(), window);
        // A long turnaround is capped, and so is the batch by max_batch.
        b.turnaround = Some(1.0);
        assert_eq!(b.slot_window(), SLOT_WINDOW_MAX);
        assert_eq!(b.slot_batch(), 16);
        // A wait after finding nothing is no turnaround.
        b.handlers_end();
        b.found_nothing();
        b.first_handler_starts();
        assert_eq!(b.slot_window(), SLOT_WINDOW_MAX);
        // A batch window longer than the cap stays the floor.
        let mut long = Batching::new(16, 400 * MS);
        long.turnaround = Some(0.001);
        assert_eq!(long.slot_window(), 400 * MS);
    }
}
