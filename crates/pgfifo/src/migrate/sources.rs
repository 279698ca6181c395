//! The SQL this library ships: the numbered migrations and the function
//! files, embedded in installation order.

/// One embedded migration.
#[derive(Debug, Clone, Copy)]
pub struct Migration {
    /// Its version, increasing from 1.
    pub version: i64,
    /// Its short name (the directory name without the version).
    pub name: &'static str,
    /// The pgfifo release that introduced it.
    pub release: &'static str,
    /// The SQL that applies it.
    pub up: &'static str,
    /// The SQL that reverts it.
    pub down: &'static str,
}

/// Every migration this library ships, oldest first.
pub const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        release: "0.1.0",
        up: include_str!("../../migrations/0001_init/up.sql"),
        down: include_str!("../../migrations/0001_init/down.sql"),
    },
    Migration {
        version: 2,
        name: "operate",
        release: "0.1.0",
        up: include_str!("../../migrations/0002_operate/up.sql"),
        down: include_str!("../../migrations/0002_operate/down.sql"),
    },
    Migration {
        version: 3,
        name: "functions",
        release: "0.2.0",
        up: include_str!("../../migrations/0003_functions/up.sql"),
        down: include_str!("../../migrations/0003_functions/down.sql"),
    },
    Migration {
        version: 4,
        name: "schedules",
        release: "0.2.0",
        up: include_str!("../../migrations/0004_schedules/up.sql"),
        down: include_str!("../../migrations/0004_schedules/down.sql"),
    },
    Migration {
        version: 5,
        name: "throughput",
        release: "0.2.0",
        up: include_str!("../../migrations/0005_throughput/up.sql"),
        down: include_str!("../../migrations/0005_throughput/down.sql"),
    },
    Migration {
        version: 6,
        name: "group_controls",
        release: "0.2.0",
        up: include_str!("../../migrations/0006_group_controls/up.sql"),
        down: include_str!("../../migrations/0006_group_controls/down.sql"),
    },
    Migration {
        version: 7,
        name: "long_runs",
        release: "0.2.0",
        up: include_str!("../../migrations/0007_long_runs/up.sql"),
        down: include_str!("../../migrations/0007_long_runs/down.sql"),
    },
    Migration {
        version: 8,
        name: "fair_shares",
        release: "0.3.0",
        up: include_str!("../../migrations/0008_fair_shares/up.sql"),
        down: include_str!("../../migrations/0008_fair_shares/down.sql"),
    },
    Migration {
        version: 9,
        name: "trace_context",
        release: "0.3.0",
        up: include_str!("../../migrations/0009_trace_context/up.sql"),
        down: include_str!("../../migrations/0009_trace_context/down.sql"),
    },
    Migration {
        version: 10,
        name: "dedup_windows",
        release: "0.3.0",
        up: include_str!("../../migrations/0010_dedup_windows/up.sql"),
        down: include_str!("../../migrations/0010_dedup_windows/down.sql"),
    },
    Migration {
        version: 11,
        name: "queue_limits",
        release: "0.3.0",
        up: include_str!("../../migrations/0011_queue_limits/up.sql"),
        down: include_str!("../../migrations/0011_queue_limits/down.sql"),
    },
    Migration {
        version: 12,
        name: "batches",
        release: "0.3.0",
        up: include_str!("../../migrations/0012_batches/up.sql"),
        down: include_str!("../../migrations/0012_batches/down.sql"),
    },
    Migration {
        version: 13,
        name: "dependencies",
        release: "0.3.0",
        up: include_str!("../../migrations/0013_dependencies/up.sql"),
        down: include_str!("../../migrations/0013_dependencies/down.sql"),
    },
];

/// One source file of the schema's functions.
#[derive(Debug, Clone, Copy)]
pub struct FunctionSource {
    /// The file's name in `src/db/functions/`.
    pub file: &'static str,
    /// Its SQL: `CREATE OR REPLACE FUNCTION` statements.
    pub sql: &'static str,
}

macro_rules! function_sources {
    ($($file:literal),+ $(,)?) => {
        &[$(FunctionSource { file: $file, sql: include_str!(concat!("../db/functions/", $file)) }),+]
    };
}

/// The schema's functions, in installation order.
pub const FUNCTIONS: &[FunctionSource] = function_sources![
    "00_helpers.sql",
    "10_enqueue.sql",
    "11_enqueue_window.sql",
    "12_add_job.sql",
    "15_controls.sql",
    "16_queue_limits.sql",
    "17_batches.sql",
    "17_batches_take.sql",
    "18_dependencies.sql",
    "19_dependencies_api.sql",
    "20_promote.sql",
    "30_advance_head.sql",
    "40_pick.sql",
    "45_long_run.sql",
    "50_start_attempts.sql",
    "60_complete.sql",
    "70_lock_group.sql",
    "71_retry.sql",
    "72_cancel.sql",
    "73_skip_head.sql",
    "74_pause.sql",
    "75_failure_policy.sql",
    "80_retention.sql",
    "85_group_row.sql",
    "90_estimate.sql",
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::layout::passages;

    #[test]
    fn passages_are_well_formed_in_every_source() {
        for f in FUNCTIONS {
            passages(f.sql).unwrap_or_else(|e| panic!("{}: {e}", f.file));
        }
        for m in MIGRATIONS {
            passages(m.up).unwrap_or_else(|e| panic!("migration {}: {e}", m.version));
        }
        assert!(passages("/*@dist a").is_err());
        assert!(passages("/*@dist a /* b */ c */").is_err());
    }
}
