//! An application's own `pgfifo` binary (`examples/app_cli.rs`) lists the
//! application's job types with `job-types`: kind, queue, settings and the
//! payload's JSON Schema, which a payload the producers send must match.

use std::process::Command;

fn job_types(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pgfifo-app"))
        .args(args)
        // No database is needed: make sure none is used.
        .env("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none")
        .output()
        .expect("run pgfifo-app");
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8(out.stdout).expect("utf-8"),
        String::from_utf8(out.stderr).expect("utf-8"),
    )
}

#[test]
fn job_types_lists_the_applications_types_with_their_payload_schemas() {
    let (stdout, stderr) = job_types(&["job-types", "--json"]);
    assert_eq!(stderr, "");
    let doc: serde_json::Value = serde_json::from_str(&stdout).expect("JSON");
    let types = doc["job_types"].as_array().expect("an array");
    assert_eq!(types.len(), 1, "{doc:#}");
    let step = &types[0];
    assert_eq!(step["kind"], "polyglot.step");
    assert_eq!(step["queue"], "polyglot");
    assert_eq!(step["rust_type"], "pgfifo_examples::polyglot::Step");
    assert_eq!(step["max_attempts"], 3);
    assert_eq!(step["priority"], 0);
    assert_eq!(step["backoff_ms"], 100);
    assert_eq!(step["timeout_ms"], serde_json::Value::Null);
    assert_eq!(step["long"], false);
    let schema = &step["payload_schema"];
    assert_eq!(schema["type"], "object");
    let mut required: Vec<&str> = schema["required"]
        .as_array()
        .expect("required fields")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    required.sort_unstable();
    assert_eq!(required, ["producer", "seq", "tenant"]);
    assert_eq!(schema["properties"]["seq"]["type"], "integer");
    assert_eq!(schema["properties"]["tenant"]["type"], "string");

    let (text, _) = job_types(&["job-types"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    assert!(
        lines[0].starts_with("KIND") && lines[0].contains("SCHEMA"),
        "{text}"
    );
    assert!(lines[1].starts_with("polyglot.step  polyglot  3"), "{text}");
}
