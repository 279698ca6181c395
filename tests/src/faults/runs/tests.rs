//! Unit tests of the records and the interval checks.

use super::*;

fn key(job: i64, attempt: u32) -> RunKey {
    RunKey { job, attempt }
}

/// Runs are numbered by their job in these tests (one run per job and
/// process unless a test says otherwise).
fn start(job: i64, attempt: u32, grp: u32, seq: u32, pid: u32, ns: i64) -> Line {
    Line::Start {
        run: key(job, attempt),
        n: job as u64,
        grp,
        seq,
        pid,
        ns,
    }
}

fn fault(begin: i64, end: i64) -> DbFault {
    DbFault { begin, end }
}

/// Each run's end and why it ended there.
fn ends(lines: &[Line], ctx: &Context) -> Vec<(i64, Cut)> {
    intervals(lines, ctx)
        .iter()
        .map(|i| (i.end, i.cut))
        .collect()
}

fn end_of(job: i64, attempt: u32, pid: u32, ns: i64) -> Line {
    Line::End {
        run: key(job, attempt),
        pid,
        n: job as u64,
        ns,
        outcome: "ok".into(),
    }
}

#[test]
fn lines_round_trip() {
    for line in [
        start(7, 2, 3, 4, 99, 1_700_000_000_000_000_000),
        Line::End {
            run: key(7, 2),
            pid: 99,
            n: 7,
            ns: 5,
            outcome: "dberr:connection closed".into(),
        },
        Line::Abort {
            run: key(8, 1),
            pid: 42,
            n: 3,
            ns: 6,
        },
    ] {
        assert_eq!(Line::parse(&line.to_line()), Ok(line));
    }
    assert!(Line::parse("S\t1\t2").is_err());
    let (lines, bad) = parse_all("S\t1\t1\t0\t0\t9\t10\t1\nE\t1\t1\t9\t1\t20\tok\nS\t2\t1\t0");
    assert_eq!((lines.len(), bad.len()), (2, 1));
    assert_eq!(in_flight(&lines), 0);
}

#[test]
fn cut_off_runs_end_at_death_fault_or_timeout() {
    let lines = [
        start(1, 1, 0, 0, 10, 100), // killed at 150
        start(2, 1, 1, 0, 11, 100), // database fault at 130
        start(3, 1, 2, 0, 12, 100), // timed out (timeout 40)
        start(4, 1, 3, 0, 12, 100),
        end_of(4, 1, 12, 120), // ended normally before the fault
    ];
    let ctx = Context {
        deaths: HashMap::from([(10, 150)]),
        db_faults: vec![fault(130, 135), fault(50, 55)],
        timeout_ns: HashMap::from([(3, 40)]),
    };
    let got = ends(&lines, &ctx);
    assert_eq!(
        got,
        vec![
            (130, Cut::DatabaseFault),
            (130, Cut::DatabaseFault),
            (130, Cut::DatabaseFault),
            (120, Cut::Ended)
        ]
    );
    let ctx = Context {
        deaths: HashMap::from([(10, 150)]),
        db_faults: vec![],
        timeout_ns: HashMap::from([(3, 40)]),
    };
    let got = ends(&lines[..3], &ctx);
    assert_eq!(
        got,
        vec![(150, Cut::Died), (100, Cut::TimedOut), (140, Cut::TimedOut)]
    );
}

#[test]
fn a_run_begun_during_a_fault_whose_write_failed_ends_at_its_start() {
    let dberr = |job: i64, pid: u32, ns: i64| Line::End {
        run: key(job, 1),
        pid,
        n: job as u64,
        ns,
        outcome: "dberr:connection closed".into(),
    };
    let lines = [
        start(1, 1, 0, 0, 10, 102), // began mid-fault, its write failed
        dberr(1, 10, 300),
        start(2, 1, 1, 0, 11, 104), // began mid-fault, its write went through
        end_of(2, 1, 11, 300),
        start(3, 1, 2, 0, 12, 200), // began after the fault, its write failed
        dberr(3, 12, 300),
        start(4, 1, 3, 0, 13, 140), // began mid-fault, its write failed after another fault
        dberr(4, 13, 900),
    ];
    let ctx = Context {
        db_faults: vec![fault(100, 150), fault(800, 850)],
        ..Context::default()
    };
    let got = ends(&lines, &ctx);
    assert_eq!(
        got,
        vec![
            (102, Cut::DatabaseFault),
            (300, Cut::Ended),
            (300, Cut::Ended),
            (800, Cut::DatabaseFault)
        ]
    );
}

#[test]
fn finds_overlaps_and_order_violations_within_groups() {
    let lines = [
        start(1, 1, 0, 0, 1, 0),
        end_of(1, 1, 1, 10),
        start(2, 1, 0, 1, 2, 11),
        end_of(2, 1, 2, 20),
        // Group 1: the second run starts while the first still runs.
        start(3, 1, 1, 0, 1, 0),
        end_of(3, 1, 1, 10),
        start(4, 1, 1, 1, 2, 5),
        end_of(4, 1, 2, 20),
        // Group 2: seq 1 before seq 0.
        start(5, 1, 2, 1, 1, 0),
        end_of(5, 1, 1, 1),
        start(6, 1, 2, 0, 1, 2),
        end_of(6, 1, 1, 3),
    ];
    let iv = intervals(&lines, &Context::default());
    let o = overlaps(&iv);
    assert_eq!(o.len(), 1);
    assert_eq!((o[0].0.run.job, o[0].1.run.job), (3, 4));
    let v = order_violations(&iv);
    assert_eq!(v.len(), 1);
    assert_eq!((v[0].0.run.job, v[0].1.run.job), (5, 6));
}

#[test]
fn runs_are_told_apart_by_process_not_attempt() {
    // A server crash lost attempt 1's record: two runs of job 9 carry
    // attempt 1. Each keeps its own end.
    let lines = [
        start(9, 1, 0, 0, 1, 0),
        end_of(9, 1, 1, 10),
        start(9, 1, 0, 0, 2, 20),
        end_of(9, 1, 2, 30),
    ];
    let iv = intervals(&lines, &Context::default());
    assert_eq!(
        iv.iter().map(|i| (i.start, i.end)).collect::<Vec<_>>(),
        vec![(0, 10), (20, 30)]
    );
    assert!(overlaps(&iv).is_empty());
}

#[test]
fn counts_runs_at_once_against_each_groups_limit() {
    let lines = [
        // Group 0 (limit 2): two at once, then a third while both run.
        start(1, 1, 0, 0, 1, 0),
        end_of(1, 1, 1, 10),
        start(2, 1, 0, 1, 2, 2),
        end_of(2, 1, 2, 20),
        start(3, 1, 0, 2, 3, 5),
        end_of(3, 1, 3, 15),
        // After job 1 ended: two at once again, within the limit.
        start(4, 1, 0, 3, 1, 16),
        end_of(4, 1, 1, 30),
        // Group 1 (limit 1): one after another.
        start(5, 1, 1, 0, 1, 0),
        end_of(5, 1, 1, 10),
        start(6, 1, 1, 1, 2, 11),
        end_of(6, 1, 2, 20),
    ];
    let iv = intervals(&lines, &Context::default());
    let found = at_once(&iv, |grp| if grp == 0 { 2 } else { 1 });
    assert_eq!(found.over.len(), 1);
    let (going, run) = &found.over[0];
    assert_eq!(run.run.job, 3);
    assert_eq!(
        going.iter().map(|g| g.run.job).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(found.peaks, BTreeMap::from([(0, 3), (1, 1)]));
    // With a limit of 3 the same runs are fine; with 1, every overlap counts.
    assert!(at_once(&iv, |grp| if grp == 0 { 3 } else { 1 })
        .over
        .is_empty());
    assert_eq!(overlaps(&iv).len(), 3);
}
