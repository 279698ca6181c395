//! The overview's chart: jobs finished per minute over the last hour, as an
//! inline SVG drawn on the server (no script, no library).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use maud::{html, Markup};

use crate::admin::MinuteCount;

const MINUTES: u64 = 60;
const WIDTH: u64 = 720;
const HEIGHT: u64 = 120;
const BAR: u64 = WIDTH / MINUTES;

/// Minutes since the epoch.
fn minute_of(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .unwrap_or(Duration::ZERO)
        .as_secs()
        / 60
}

/// Succeeded and failed per minute of the last hour, oldest first, summed
/// over queues.
pub(crate) fn per_minute(counts: &[MinuteCount], now: SystemTime) -> Vec<(i64, i64)> {
    let last = minute_of(now);
    let first = last + 1 - MINUTES;
    let mut sums: BTreeMap<u64, (i64, i64)> = BTreeMap::new();
    for c in counts {
        let m = minute_of(c.minute);
        if (first..=last).contains(&m) {
            let e = sums.entry(m).or_default();
            e.0 += c.succeeded;
            e.1 += c.failed;
        }
    }
    (first..=last)
        .map(|m| sums.get(&m).copied().unwrap_or_default())
        .collect()
}

/// The chart of `minutes` (oldest first).
pub(crate) fn chart(minutes: &[(i64, i64)]) -> Markup {
    let peak = minutes.iter().map(|(s, f)| s + f).max().unwrap_or(0).max(1);
    let total_ok: i64 = minutes.iter().map(|m| m.0).sum();
    let total_failed: i64 = minutes.iter().map(|m| m.1).sum();
    let scale = |n: i64| (n as u64 * (HEIGHT - 10)) / peak as u64;
    html! {
        figure.chart {
            svg #throughput width=(WIDTH) height=(HEIGHT + 18) viewBox={ "0 0 " (WIDTH) " " (HEIGHT + 18) }
                role="img" aria-label="jobs finished per minute, last hour" {
                line x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) stroke="#c8ced8" {}
                @for (i, (ok, failed)) in minutes.iter().enumerate() {
                    @let x = i as u64 * BAR;
                    @let h_ok = scale(*ok);
                    @let h_failed = scale(*failed);
                    @if h_ok > 0 {
                        rect x=(x) y=(HEIGHT - h_ok) width=(BAR - 2) height=(h_ok) fill="#3f9d5d" {
                            title { (ok) " succeeded, " (failed) " failed" }
                        }
                    }
                    @if h_failed > 0 {
                        rect x=(x) y=(HEIGHT - h_ok - h_failed) width=(BAR - 2) height=(h_failed) fill="#c7463d" {
                            title { (ok) " succeeded, " (failed) " failed" }
                        }
                    }
                }
                text x="0" y=(HEIGHT + 14) font-size="11" fill="#5f6b7a" { "60 min ago" }
                text x=(WIDTH) y=(HEIGHT + 14) font-size="11" fill="#5f6b7a" text-anchor="end" { "now" }
                text x=(WIDTH) y="10" font-size="11" fill="#5f6b7a" text-anchor="end" { "peak " (peak) "/min" }
            }
            figcaption.muted {
                (total_ok) " succeeded and " (total_failed) " failed in the last hour"
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minutes_are_summed_over_queues_and_placed_by_age() {
        let now = UNIX_EPOCH + Duration::from_secs(1_000 * 60 + 30);
        let at = |ago: u64| UNIX_EPOCH + Duration::from_secs((1_000 - ago) * 60);
        let count = |queue: &str, ago, succeeded, failed| MinuteCount {
            queue: queue.into(),
            minute: at(ago),
            succeeded,
            failed,
        };
        let minutes = per_minute(
            &[
                count("a", 0, 5, 1),
                count("b", 0, 2, 0),
                count("a", 59, 7, 0),
                count("a", 60, 100, 0),
            ],
            now,
        );
        assert_eq!(minutes.len(), 60);
        assert_eq!(minutes[59], (7, 1), "this minute, both queues");
        assert_eq!(minutes[0], (7, 0), "59 minutes ago");
        assert_eq!(
            minutes.iter().map(|m| m.0).sum::<i64>(),
            14,
            "an hour ago is out"
        );
    }
}
