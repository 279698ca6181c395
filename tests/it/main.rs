//! pgfifo's integration tests: one binary, a module per topic, a database per
//! test (see `pgfifo_tests::TestDb`).
//!
//! Job type names must be unique across this binary (a duplicate makes every
//! registration lookup fail), so each module names its types after itself.

mod gate;
mod group_probe;
mod jobs;
mod smoke;

// Enqueue side.
mod bad_input;
mod batches;
mod batches_counting;
mod batches_retention;
mod batches_sql;
mod dedup_windows;
mod dedup_windows_races;
mod dedup_windows_sql;
mod dedup_windows_wide;
mod dependencies_sql;
mod enqueue_activation;
mod enqueue_api;
mod enqueue_interleavings;
mod enqueue_no_wait;
mod enqueue_options;
mod migrations;
mod schema_check;
mod sql_api;
mod sql_api_bad_input;
mod sql_api_runs;
mod ungrouped;
mod upgrade;

// Runner side.
mod atomicity;
mod batch_functions;
mod batching;
mod burst;
mod contention;
mod crashes;
mod dependencies;
mod dependencies_races;
mod exclusivity_fifo;
mod group_concurrency;
mod group_controls;
mod group_limits_change;
mod group_slots_sql;
mod group_weights;
mod handler_misuse;
mod hot_groups;
mod hot_groups_cut;
mod hot_groups_sql;
mod long_mode;
mod queue_limits;
mod queue_limits_long;
mod queue_limits_reasons;
mod queue_limits_sql;
mod retries;
mod schedules;
mod stored_bad_input;
mod timeouts_shutdown;
mod trace_context_sql;
mod tracing_otel;
mod wakeups;

// Several OS processes on one database.
mod multiprocess;
mod pooler;
mod schedules_multi;

// Operating pgfifo.
mod admin_ops;
mod admin_pause;
mod admin_policy;
mod admin_races;
mod admin_retry;
mod admin_status;
mod admin_support;
mod admin_wake;

// Runner maintenance: heartbeat, retention, metrics.
mod runner_ops_heartbeat;
mod runner_ops_metrics;
mod runner_ops_retention;
mod runner_ops_support;

// The testing helpers users get (`pgfifo::testing`).
mod testing_helpers;

// The web dashboard.
mod dashboard;
mod dashboard_batches;
mod dashboard_browser;
mod dashboard_security;
mod dashboard_support;
mod dependencies_views;

// A real browser (headless Chromium) against a page the test serves.
mod browser_smoke;
