//! The metrics a runner records, checked against a debugging recorder.

use std::collections::BTreeMap;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

use super::*;

/// Runs `f` with a fresh recorder; returns what it recorded, keyed as
/// `name{label=value,...}`, with histograms as their sample counts.
fn recorded(f: impl FnOnce()) -> BTreeMap<String, f64> {
    let recorder = DebuggingRecorder::new();
    let snapshotter: Snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, f);
    snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let key = key.key();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let value = match value {
                DebugValue::Counter(n) => n as f64,
                DebugValue::Gauge(g) => g.into_inner(),
                DebugValue::Histogram(samples) => samples.len() as f64,
            };
            (format!("{}{{{}}}", key.name(), labels.join(",")), value)
        })
        .collect()
}

fn event(outcome: JobOutcome) -> JobEvent {
    JobEvent {
        id: 1,
        kind: "charge".into(),
        queue: "billing".into(),
        group: Some("tenant".into()),
        attempt: 1,
        outcome,
    }
}

fn metrics() -> Metrics {
    Metrics::new(&["billing".to_owned(), "emails".to_owned()])
}

const QK: &str = "queue=billing,kind=charge";

#[test]
fn a_committed_run_counts_its_outcome_and_duration() {
    let values = recorded(|| {
        let m = metrics();
        let mut run = m.start("billing", "charge").expect("served queue");
        assert_eq!(m.running()["billing"], 1);
        assert_eq!(m.running()["emails"], 0);
        run.handler_finished();
        m.committed(&event(JobOutcome::Succeeded), Some(run));
        assert_eq!(m.running()["billing"], 0);
    });
    assert_eq!(values[&format!("{JOBS_STARTED}{{{QK}}}")], 1.0);
    assert_eq!(values[&format!("{JOBS_SUCCEEDED}{{{QK}}}")], 1.0);
    assert_eq!(values[&format!("{JOBS_ABORTED}{{{QK}}}")], 0.0);
    assert_eq!(
        values[&format!("{JOB_DURATION}{{{QK},outcome=succeeded}}")],
        1.0
    );
    assert_eq!(values[&format!("{JOBS_RUNNING}{{queue=billing}}")], 0.0);
}

#[test]
fn a_run_dropped_without_outcome_counts_as_aborted() {
    let values = recorded(|| {
        let m = metrics();
        let run = m.start("billing", "charge").expect("served queue");
        drop(run);
        assert_eq!(m.running()["billing"], 0);
    });
    assert_eq!(values[&format!("{JOBS_ABORTED}{{{QK}}}")], 1.0);
    assert_eq!(
        values[&format!("{JOB_DURATION}{{{QK},outcome=aborted}}")],
        1.0
    );
    assert_eq!(values[&format!("{JOBS_SUCCEEDED}{{{QK}}}")], 0.0);
}

#[test]
fn outcomes_without_a_run_count_but_have_no_duration() {
    let values = recorded(|| {
        let m = metrics();
        let failed = JobOutcome::Failed {
            error: "unknown job type".into(),
        };
        m.committed(&event(failed), None);
        let retry = JobOutcome::Retrying {
            error: "boom".into(),
            delay: Duration::from_secs(1),
        };
        m.committed(&event(retry), None);
    });
    assert_eq!(values[&format!("{JOBS_FAILED}{{{QK}}}")], 1.0);
    assert_eq!(values[&format!("{JOBS_RETRIED}{{{QK}}}")], 1.0);
    assert_eq!(values[&format!("{JOBS_STARTED}{{{QK}}}")], 0.0);
    assert_eq!(
        values[&format!("{JOB_DURATION}{{{QK},outcome=failed}}")],
        0.0
    );
}

#[test]
fn jobs_of_queues_not_served_are_not_counted() {
    let values = recorded(|| {
        let m = metrics();
        assert!(m.start("other", "charge").is_none());
    });
    assert!(values.keys().all(|k| !k.contains("queue=other")));
}

#[test]
fn sampled_gauges_are_set_per_queue() {
    let values = recorded(|| {
        let m = metrics();
        m.set_gauges(&[
            crate::admin::QueueGauges {
                queue: "billing".into(),
                depth: 42,
                oldest_head_age: Some(Duration::from_millis(1500)),
                blocked_groups: 3,
            },
            crate::admin::QueueGauges {
                queue: "emails".into(),
                depth: 0,
                oldest_head_age: None,
                blocked_groups: 0,
            },
        ]);
        m.retained(7, 2);
    });
    assert_eq!(values[&format!("{QUEUE_DEPTH}{{queue=billing}}")], 42.0);
    assert_eq!(values[&format!("{GROUP_LAG}{{queue=billing}}")], 1.5);
    assert_eq!(values[&format!("{BLOCKED_GROUPS}{{queue=billing}}")], 3.0);
    assert_eq!(values[&format!("{GROUP_LAG}{{queue=emails}}")], 0.0);
    assert_eq!(values[&format!("{JOBS_PURGED}{{}}")], 7.0);
    assert_eq!(values[&format!("{GROUPS_CLEANED}{{}}")], 2.0);
}

#[test]
fn every_outcome_has_its_own_label_and_counter() {
    let labels: Vec<_> = Outcome::ALL.iter().map(|o| o.label()).collect();
    assert_eq!(
        labels,
        [
            "succeeded",
            "retried",
            "failed",
            "cancelled",
            "snoozed",
            "aborted"
        ]
    );
    for (i, outcome) in Outcome::ALL.iter().enumerate() {
        assert_eq!(*outcome as usize, i, "ALL is in discriminant order");
        assert!(outcome.counter_name().ends_with("_total"));
    }
    let cancelled = JobOutcome::Cancelled {
        reason: "no".into(),
    };
    assert_eq!(Outcome::of(&cancelled), Outcome::Cancelled);
}
