//! Randomness for spreading timers out: enough for jitter, not for secrets.

use std::time::Duration;

/// A random number in [0, 1) from the standard library's per-instance random
/// hash keys.
pub(crate) fn random_fraction() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// `interval` spread over ±25 %.
pub(crate) fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.75 + random_fraction() / 2.0)
}

/// Reconnect delay after `failures` consecutive failures: 100 ms doubling to
/// 1 s. The cap is low so that a runner is back within a second of its
/// server (or, after a failover, the new primary) answering again; each
/// attempt that fails costs a connection attempt (bounded per host), not a
/// busy loop.
pub(crate) fn reconnect_backoff(failures: u32) -> Duration {
    let ms = 100u64.saturating_mul(1 << failures.min(4));
    Duration::from_millis(ms.min(1_000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fractions_stay_in_range_and_vary() {
        let draws: Vec<f64> = (0..100).map(|_| random_fraction()).collect();
        assert!(draws.iter().all(|f| (0.0..1.0).contains(f)));
        assert!(draws.iter().any(|f| *f != draws[0]));
        let second = Duration::from_secs(1);
        assert!((0..100)
            .map(|_| jittered(second))
            .all(|d| d >= second.mul_f64(0.75) && d <= second.mul_f64(1.25)));
    }

    #[test]
    fn reconnect_backoff_doubles_to_a_cap() {
        assert_eq!(reconnect_backoff(0), Duration::from_millis(100));
        assert_eq!(reconnect_backoff(1), Duration::from_millis(200));
        assert_eq!(reconnect_backoff(3), Duration::from_millis(800));
        assert_eq!(reconnect_backoff(4), Duration::from_secs(1));
        assert_eq!(reconnect_backoff(20), Duration::from_secs(1));
    }
}
