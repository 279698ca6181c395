//! Queue limits: what caps a whole queue, across all its groups and
//! runners. A queue's concurrency is how many of its jobs run at once; its
//! rate is a token bucket that every start of one of its jobs draws from.
//! Both add to the groups' own limits ([`GroupLimits`](crate::GroupLimits)):
//! a start needs a slot and a token from both. See
//! `docs/queue-limits.md`.

use std::fmt;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use crate::controls::invalid;
use crate::{Rate, Result, MAX_RATE_COUNT};

/// The largest concurrency of a queue.
pub const MAX_QUEUE_CONCURRENCY: u32 = 10_000;

/// The limits of a whole queue; a field left `None` is no limit of that
/// kind.
///
/// ```
/// use pgfifo::{QueueLimits, Rate};
///
/// // One payment provider for every tenant: 20 calls at once, 100 a minute.
/// let limits = QueueLimits::new().concurrency(20).rate(Rate::per_minute(100)?).burst(10);
/// assert_eq!(limits.concurrency, Some(20));
/// # Ok::<(), pgfifo::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueueLimits {
    /// How many of the queue's jobs may run at once, across all runners
    /// (1 to 10,000).
    pub concurrency: Option<u32>,
    /// At most this many starts of the queue's jobs per period, on average.
    pub rate: Option<Rate>,
    /// How many starts may happen at once after a quiet spell (1 to
    /// 1,000,000; needs a rate). Default: the rate's count.
    pub burst: Option<u32>,
}

impl QueueLimits {
    /// No limits.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the concurrency.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// Sets the rate.
    pub fn rate(mut self, rate: Rate) -> Self {
        self.rate = Some(rate);
        self
    }

    /// Sets the burst.
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// Checks the values as a whole: [`validate_values`](Self::validate_values),
    /// and a burst only with a rate.
    pub(crate) fn validate(&self) -> Result<()> {
        self.validate_values()?;
        if self.burst.is_some() && self.rate.is_none() {
            return Err(invalid("queue burst: a burst needs a rate"));
        }
        Ok(())
    }

    /// Checks each value: an [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// naming the setting.
    pub(crate) fn validate_values(&self) -> Result<()> {
        if let Some(n) = self.concurrency {
            if n == 0 || n > MAX_QUEUE_CONCURRENCY {
                return Err(invalid(format!(
                    "queue concurrency: {n} is outside 1 to {MAX_QUEUE_CONCURRENCY} (to stop a queue, pause it)"
                )));
            }
        }
        if let Some(burst) = self.burst {
            if burst == 0 || burst > MAX_RATE_COUNT {
                return Err(invalid(format!(
                    "queue burst: {burst} is outside 1 to {MAX_RATE_COUNT}"
                )));
            }
        }
        Ok(())
    }
}

/// As `pgfifo status` shows them: `20 at once, 100/m, burst 10`.
impl fmt::Display for QueueLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(n) = self.concurrency {
            parts.push(format!("{n} at once"));
        }
        if let Some(rate) = self.rate {
            parts.push(rate.to_string());
        }
        if let Some(burst) = self.burst {
            parts.push(format!("burst {burst}"));
        }
        if parts.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// `{"concurrency": 20, "rate": "100/m", "burst": 10}` (absent limits as
/// null).
impl Serialize for QueueLimits {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut out = s.serialize_struct("QueueLimits", 3)?;
        out.serialize_field("concurrency", &self.concurrency)?;
        out.serialize_field("rate", &self.rate.map(|r| r.to_string()))?;
        out.serialize_field("burst", &self.burst)?;
        out.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_values_are_refused() {
        assert!(QueueLimits::new().concurrency(0).validate().is_err());
        assert!(QueueLimits::new().concurrency(10_001).validate().is_err());
        assert!(QueueLimits::new().burst(5).validate().is_err());
        let rate = Rate::per_second(5).unwrap();
        assert!(QueueLimits::new().rate(rate).burst(0).validate().is_err());
        assert!(QueueLimits::new()
            .rate(rate)
            .burst(5)
            .concurrency(3)
            .validate()
            .is_ok());
    }

    #[test]
    fn limits_read_as_text_and_json() {
        let limits = QueueLimits::new()
            .concurrency(20)
            .rate(Rate::per_minute(100).unwrap())
            .burst(10);
        assert_eq!(limits.to_string(), "20 at once, 100/m, burst 10");
        assert_eq!(QueueLimits::new().to_string(), "none");
        let json = serde_json::to_value(limits).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"concurrency": 20, "rate": "100/m", "burst": 10})
        );
    }
}
