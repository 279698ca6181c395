//! Group controls: what limits how fast a group's jobs start.
//!
//! A [`Rate`] with a burst makes a token bucket per group: the bucket holds
//! at most `burst` tokens, refills at the rate, and every start of a job of
//! the group takes a token. A group with no token left waits for the next
//! one without using any attempt, and no pick looks at it before then. Over
//! any window of length `t`, a group starts at most `burst + rate × t` jobs,
//! across all runners.
//!
//! Limits are set per queue (defaults for its groups) and per group
//! (overrides), at run time, through [`admin::set_group_limits`](crate::admin::set_group_limits),
//! `pgfifo group set`, the SQL function `pgfifo.set_group_control`, or
//! [`RunnerConfig::group_limits`](crate::RunnerConfig::group_limits) at a
//! runner's start. See `docs/group-controls.md`.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::{Error, Result};

/// The most starts a rate may allow per period, and the largest burst.
pub const MAX_RATE_COUNT: u32 = 1_000_000;
/// The largest concurrency of a group, and the largest weight.
pub const MAX_GROUP_CONCURRENCY: u32 = 1_000;
/// The longest period of a rate (a year, 366 days).
pub const MAX_RATE_PERIOD: Duration = Duration::from_secs(366 * 24 * 3600);

/// At most `count` job starts per `period`, on average.
///
/// ```
/// use std::time::Duration;
/// use pgfifo::Rate;
///
/// let rate: Rate = "10/s".parse()?;
/// assert_eq!(rate, Rate::new(10, Duration::from_secs(1))?);
/// assert_eq!("600/5m".parse::<Rate>()?, Rate::new(600, Duration::from_secs(300))?);
/// assert!("0/s".parse::<Rate>().is_err()); // to stop a group, pause it
/// # Ok::<(), pgfifo::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    count: u32,
    period: Duration,
}

impl Rate {
    /// `count` starts per `period`: 1 to 1,000,000 per 1 ms to 366 days,
    /// whole milliseconds. Anything else is an [`Error::InvalidArgument`]
    /// naming the setting (a rate of 0 is refused: pause the group instead).
    pub fn new(count: u32, period: Duration) -> Result<Self> {
        if count == 0 {
            return Err(invalid(
                "rate: 0 starts per period would stop the group for good; to stop a group, pause it",
            ));
        }
        if count > MAX_RATE_COUNT {
            return Err(invalid(format!(
                "rate: {count} starts per period is more than {MAX_RATE_COUNT}"
            )));
        }
        if period < Duration::from_millis(1) || period > MAX_RATE_PERIOD {
            return Err(invalid(format!(
                "rate: the period {period:?} is outside 1 ms to 366 days"
            )));
        }
        if period.subsec_nanos() % 1_000_000 != 0 {
            return Err(invalid(format!(
                "rate: the period {period:?} is not a whole number of milliseconds"
            )));
        }
        Ok(Self { count, period })
    }

    /// `count` starts per second.
    pub fn per_second(count: u32) -> Result<Self> {
        Self::new(count, Duration::from_secs(1))
    }

    /// `count` starts per minute.
    pub fn per_minute(count: u32) -> Result<Self> {
        Self::new(count, Duration::from_secs(60))
    }

    /// Starts allowed per period.
    pub fn count(self) -> u32 {
        self.count
    }

    /// The period.
    pub fn period(self) -> Duration {
        self.period
    }

    /// The period in milliseconds, as stored.
    pub(crate) fn period_ms(self) -> i64 {
        self.period.as_millis() as i64
    }
}

/// `COUNT/PERIOD`, the period a unit (`ms`, `s`, `m`, `h`, `d`) with an
/// optional whole number before it: `10/s`, `600/5m`, `1/250ms`.
impl FromStr for Rate {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            invalid(format!(
                "rate: {text:?} is not COUNT/PERIOD (for example 10/s, 600/5m, 1/250ms)"
            ))
        };
        let (count, period) = text.trim().split_once('/').ok_or_else(bad)?;
        let count: u32 = count.trim().parse().map_err(|_| bad())?;
        let period = period.trim();
        let digits = period.find(|c: char| !c.is_ascii_digit()).ok_or_else(bad)?;
        let (number, unit) = period.split_at(digits);
        let number: u64 = if number.is_empty() {
            1
        } else {
            number.parse().map_err(|_| bad())?
        };
        let unit_ms: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        let period_ms = number.checked_mul(unit_ms).ok_or_else(bad)?;
        Self::new(count, Duration::from_millis(period_ms))
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.period.as_millis();
        let (number, unit) = [
            (86_400_000, "d"),
            (3_600_000, "h"),
            (60_000, "m"),
            (1_000, "s"),
        ]
        .into_iter()
        .find(|(unit, _)| ms % unit == 0)
        .map_or((ms, "ms"), |(unit, name)| (ms / unit, name));
        if number == 1 {
            write!(f, "{}/{unit}", self.count)
        } else {
            write!(f, "{}/{number}{unit}", self.count)
        }
    }
}

/// The limits set for a group, or for all groups of a queue (its defaults).
/// A field left `None` in a group's limits takes the queue's default; in a
/// queue's defaults it means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupLimits {
    /// At most this many starts per period, on average.
    pub rate: Option<Rate>,
    /// How many starts may happen at once after a quiet spell (the bucket's
    /// size, 1 to 1,000,000). Default: the rate's count.
    pub burst: Option<u32>,
    /// How many jobs of the group may run at once (1 to 1,000; default 1).
    /// They start in FIFO order; see `docs/group-controls.md` for what a
    /// failing job does to the jobs behind it.
    pub concurrency: Option<u32>,
    /// The group's share of starts among groups with backlog when there
    /// are fewer free slots than they could use (1 to 1,000; default 1):
    /// start-time fair queueing, see `docs/group-controls.md`.
    pub weight: Option<u32>,
}

impl GroupLimits {
    /// No limits (or, for a group, its queue's).
    pub fn new() -> Self {
        Self::default()
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

    /// Sets the concurrency.
    pub fn concurrency(mut self, n: u32) -> Self {
        self.concurrency = Some(n);
        self
    }

    /// Sets the weight.
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = Some(weight);
        self
    }

    /// Checks the values: an [`Error::InvalidArgument`] naming the setting.
    pub(crate) fn validate(&self) -> Result<()> {
        for (name, value) in [("concurrency", self.concurrency), ("weight", self.weight)] {
            if let Some(n) = value {
                if n == 0 || n > MAX_GROUP_CONCURRENCY {
                    return Err(invalid(format!(
                        "{name}: {n} is outside 1 to {MAX_GROUP_CONCURRENCY}"
                    )));
                }
            }
        }
        if let Some(burst) = self.burst {
            if burst == 0 || burst > MAX_RATE_COUNT {
                return Err(invalid(format!(
                    "burst: {burst} is outside 1 to {MAX_RATE_COUNT}"
                )));
            }
        }
        Ok(())
    }
}

/// What a change of limits does to one setting (see
/// [`GroupLimitsChange`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LimitChange<T> {
    /// Keep what is set.
    #[default]
    Keep,
    /// Unset it: a group then takes its queue's default, a queue's default
    /// means no limit of that kind.
    Clear,
    /// Set it to this value.
    Set(T),
}

impl<T: Copy> LimitChange<T> {
    fn value(self) -> Option<T> {
        match self {
            LimitChange::Set(value) => Some(value),
            LimitChange::Keep | LimitChange::Clear => None,
        }
    }

    fn changes(self) -> bool {
        !matches!(self, LimitChange::Keep)
    }
}

/// A change of some of the limits of a group (or of a queue's defaults),
/// keeping the others: see
/// [`admin::change_group_limits`](crate::admin::change_group_limits).
///
/// ```
/// use pgfifo::{GroupLimitsChange, LimitChange};
///
/// // Four at once; the rate, burst and weight stay as they are.
/// let change = GroupLimitsChange { concurrency: LimitChange::Set(4), ..Default::default() };
/// assert_eq!(change.weight, LimitChange::Keep);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupLimitsChange {
    /// The rate (see [`GroupLimits::rate`]).
    pub rate: LimitChange<Rate>,
    /// The burst (see [`GroupLimits::burst`]).
    pub burst: LimitChange<u32>,
    /// The concurrency (see [`GroupLimits::concurrency`]).
    pub concurrency: LimitChange<u32>,
    /// The weight (see [`GroupLimits::weight`]).
    pub weight: LimitChange<u32>,
}

impl GroupLimitsChange {
    /// The names of the settings it changes, as `pgfifo.change_group_control`
    /// takes them.
    pub(crate) fn changed(&self) -> Vec<&'static str> {
        [
            ("rate", self.rate.changes()),
            ("burst", self.burst.changes()),
            ("concurrency", self.concurrency.changes()),
            ("weight", self.weight.changes()),
        ]
        .into_iter()
        .filter_map(|(name, changes)| changes.then_some(name))
        .collect()
    }

    /// The values it sets (`None` where it clears or keeps), checked as
    /// [`GroupLimits`] checks them.
    pub(crate) fn values(&self) -> Result<GroupLimits> {
        let limits = GroupLimits {
            rate: self.rate.value(),
            burst: self.burst.value(),
            concurrency: self.concurrency.value(),
            weight: self.weight.value(),
        };
        limits.validate()?;
        Ok(limits)
    }
}

pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_parse_and_print_back() {
        for (text, count, ms, shown) in [
            ("10/s", 10, 1_000, "10/s"),
            ("600/5m", 600, 300_000, "600/5m"),
            ("1/250ms", 1, 250, "1/250ms"),
            (" 3 / 2h ", 3, 7_200_000, "3/2h"),
            ("5/1000ms", 5, 1_000, "5/s"),
            ("7/d", 7, 86_400_000, "7/d"),
        ] {
            let rate: Rate = text.parse().unwrap();
            assert_eq!((rate.count(), rate.period_ms()), (count, ms), "{text}");
            assert_eq!(rate.to_string(), shown);
        }
    }

    #[test]
    fn bad_rates_name_the_setting() {
        for text in [
            "0/s",
            "10",
            "10/",
            "10/x",
            "-1/s",
            "10/0s",
            "2000000/s",
            "1/400d",
            "1/99999999999999999999d",
        ] {
            let err = text.parse::<Rate>().unwrap_err().to_string();
            assert!(err.contains("rate:"), "{text}: {err}");
        }
        assert!(Rate::new(1, Duration::from_micros(1500)).is_err());
        let burst = GroupLimits::new().burst(0).validate().unwrap_err();
        assert!(burst.to_string().contains("burst:"), "{burst}");
        for bad in [
            GroupLimits::new().concurrency(0),
            GroupLimits::new().concurrency(1001),
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(err.contains("concurrency:"), "{err}");
        }
        let err = GroupLimits::new()
            .weight(0)
            .validate()
            .unwrap_err()
            .to_string();
        assert!(err.contains("weight:"), "{err}");
    }
}
