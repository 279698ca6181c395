//! How soon groups were released and cut-off jobs ran again (printed, not
//! checked: the bounds are the frozen worker's, checked in `freeze.rs`).

use std::collections::HashMap;

use pgfifo_tests::faults::private_pg::PrivatePg;
use pgfifo_tests::faults::runs::{self, Cut};

use crate::monitor::log_line_ns;
use crate::processes::Cause;
use crate::suite::Suite;

/// How soon groups were released and cut-off jobs ran again, printed.
pub(crate) fn print_release_times(suite: &Suite, pg: &PrivatePg, intervals: &[runs::Interval]) {
    // How soon a cut-off job ran again: from its process's death (or the
    // database fault) to the start of its next attempt's handler. This bounds
    // how long the group stayed held (plus the time to pick and start).
    let mut next_start: HashMap<(i64, u32), i64> = HashMap::new();
    for i in intervals {
        next_start.insert((i.run.job, i.run.attempt), i.start);
    }
    let rerun_delays = |cut: Cut| -> Vec<f64> {
        let mut v: Vec<f64> = intervals
            .iter()
            .filter(|i| i.cut == cut)
            .filter_map(|i| {
                (i.run.attempt + 1..i.run.attempt + 4)
                    .find_map(|a| next_start.get(&(i.run.job, a)))
                    .map(|&next| (next - i.end) as f64 / 1e6)
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v
    };
    // When the server ended each killed process's transactions (its log
    // has a line per session, with the application name): the group release.
    let server_log = pg.log_text();
    let mut kill_release: Vec<f64> = suite
        .fleet
        .deaths
        .iter()
        .filter(|d| matches!(d.cause, Cause::Killed | Cause::Poison))
        .filter_map(|d| {
            server_log
                .lines()
                .filter(|l| {
                    l.contains(&format!(
                        "] {} LOG:  unexpected EOF on client connection",
                        d.app
                    ))
                })
                .filter_map(log_line_ns)
                .filter(|&t| t >= d.ns - 5_000_000 && t < d.ns + 10_000_000_000)
                .max()
                .map(|t| (t - d.ns) as f64 / 1e6)
        })
        .collect();
    kill_release.sort_by(f64::total_cmp);
    if !kill_release.is_empty() {
        println!(
            "faults: process killed or aborted -> the server ended its open transactions after: \
             median {:.0} ms, max {:.0} ms ({} processes, from the server log)",
            kill_release[kill_release.len() / 2],
            kill_release[kill_release.len() - 1],
            kill_release.len()
        );
    }
    for (cut, what) in [
        (Cut::Died, "process killed or aborted"),
        (Cut::DatabaseFault, "connections cut or database restarted"),
    ] {
        let v = rerun_delays(cut);
        if !v.is_empty() {
            println!(
                "faults: {what} -> the cut-off job's next run started after (includes waiting \
                 for a free lane under load): median {:.0} ms, p90 {:.0} ms, max {:.0} ms ({} runs)",
                v[v.len() / 2],
                v[v.len() * 9 / 10],
                v[v.len() - 1],
                v.len()
            );
        }
    }
}
