//! Checks of rate limits on what the database recorded: the starts of a
//! group (its attempts' records, written in the transaction that took the
//! token) and the token bucket's bound over every window of them.

use crate::TestDb;

/// The starts of `group`'s jobs (any queue), in seconds since the epoch on
/// the server's clock, oldest first.
pub async fn starts_of(db: &TestDb, group: &str) -> Vec<f64> {
    let group = group.replace('\'', "''");
    db.text(&format!(
        "SELECT string_agg((extract(epoch FROM a.started_at))::text, ',' ORDER BY a.started_at)
         FROM pgfifo.job_attempt AS a JOIN pgfifo.job AS j ON j.id = a.job_id
         WHERE j.group_id = '{group}'"
    ))
    .await
    .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
    .unwrap_or_default()
}

/// The starts of `queue`'s jobs (grouped or not), in seconds since the
/// epoch on the server's clock, oldest first.
pub async fn starts_in_queue(db: &TestDb, queue: &str) -> Vec<f64> {
    let queue = queue.replace('\'', "''");
    db.text(&format!(
        "SELECT string_agg((extract(epoch FROM a.started_at))::text, ',' ORDER BY a.started_at)
         FROM pgfifo.job_attempt AS a JOIN pgfifo.job AS j ON j.id = a.job_id
         WHERE j.queue = '{queue}'"
    ))
    .await
    .map(|s| s.split(',').map(|x| x.parse().unwrap()).collect())
    .unwrap_or_default()
}

/// The most starts any window held beyond `burst + rate_per_s × its
/// length`, over every window from one start to a later one: at most 0
/// (give or take a microsecond's rounding) when the bound held.
pub fn worst_excess(starts: &[f64], rate_per_s: f64, burst: f64) -> f64 {
    let mut worst = f64::MIN;
    for i in 0..starts.len() {
        for j in i..starts.len() {
            let bound = burst + rate_per_s * (starts[j] - starts[i]);
            worst = worst.max((j - i + 1) as f64 - bound);
        }
    }
    worst
}

#[cfg(test)]
mod tests {
    use super::worst_excess;

    #[test]
    fn the_excess_is_measured_on_the_fullest_window() {
        // Burst 2, 1/s: three starts within a second are one too many.
        assert!((worst_excess(&[0.0, 0.1, 0.2], 1.0, 2.0) - 0.8).abs() < 1e-9);
        assert!(worst_excess(&[0.0, 0.1, 1.2], 1.0, 2.0) <= 0.0);
        assert_eq!(worst_excess(&[], 1.0, 2.0), f64::MIN);
    }
}
