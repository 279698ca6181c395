//! `pgfifo job-types` in the stand-alone binary, which links no
//! application: an empty list, a note saying where job types are listed,
//! and no database needed. (An application's own binary lists its types:
//! `examples/tests/job_types.rs`.)

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use support::pgfifo;

#[test]
fn the_standalone_binary_lists_no_job_types_and_says_where_to_look() {
    let run = pgfifo(None, &["job-types", "--json"]).expect(0);
    assert_eq!(run.json(), serde_json::json!({"job_types": []}));
    assert!(
        run.stderr
            .contains("no job types are registered in this binary")
            && run.stderr.contains("pgfifo_cli::main()"),
        "{}",
        run.stderr
    );
    let text = pgfifo(None, &["job-types"]).expect(0);
    assert_eq!(text.stdout, "");
    assert!(
        text.stderr.contains("docs/enqueue-from-sql.md"),
        "{}",
        text.stderr
    );
}
