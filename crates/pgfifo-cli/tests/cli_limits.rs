//! `pgfifo group set|reset|limits` and the limits `pgfifo groups` shows,
//! run as an operator would, against a database of its own per test.

// Each test binary uses part of the shared support.
#[allow(dead_code, unused_imports)]
mod support;

use pgfifo_tests::TestDb;
use serde_json::{json, Value};

use support::{enqueue, pgfifo, QUEUE};

/// `pgfifo group limits cli --json`: every row set in the queue.
fn limits(url: &str) -> Value {
    pgfifo(Some(url), &["group", "limits", QUEUE, "--json"])
        .expect(0)
        .json()
}

#[tokio::test]
async fn set_changes_only_the_settings_given_and_reset_removes_them() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    enqueue(&db, QUEUE, &["a"]).await;
    let set = |args: &[&str]| pgfifo(Some(url), &[&["group", "set", QUEUE], args].concat());

    let first = set(&["a", "--rate", "10/s", "--burst", "20"])
        .expect(0)
        .stdout;
    assert_eq!(
        first,
        "group a of queue cli:\n\
         rate:         10/s\n\
         burst:        20\n\
         concurrency:  - (the queue's default, else 1)\n\
         weight:       - (the queue's default, else 1)\n"
    );
    // Only the settings given change; `none` clears one.
    set(&["a", "--concurrency", "4"]).expect(0);
    let cleared = set(&["a", "--burst", "none", "--json"]).expect(0).json();
    assert_eq!(
        cleared,
        json!({"queue": "cli", "group": "a", "rate": "10/s", "burst": null,
               "concurrency": 4, "weight": null})
    );

    let defaults = set(&["--defaults", "--weight", "2", "--rate", "1/250ms"]).expect(0);
    assert!(
        defaults.stdout.starts_with("defaults of queue cli:\n")
            && defaults.stdout.contains("rate:         1/250ms\n")
            && defaults
                .stdout
                .contains("burst:        - (the rate's count)\n")
            && defaults.stdout.contains("weight:       2\n"),
        "{}",
        defaults.stdout
    );
    set(&["--defaults", "--rate", "none"]).expect(0);
    assert_eq!(
        limits(url),
        json!([
            {"group": null, "rate": null, "burst": null, "concurrency": null, "weight": 2},
            {"group": "a", "rate": "10/s", "burst": null, "concurrency": 4, "weight": null},
        ])
    );
    let table = pgfifo(Some(url), &["group", "limits", QUEUE])
        .expect(0)
        .stdout;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3, "{table}");
    assert!(lines[0].starts_with("GROUP") && lines[0].ends_with("WEIGHT"));
    assert!(lines[1].starts_with("(defaults)") && lines[1].ends_with(" 2"));
    assert!(lines[2].starts_with("a ") && lines[2].contains("10/s"));
    let page = pgfifo(Some(url), &["group", "limits", QUEUE, "--limit", "1"]).expect(0);
    assert!(
        page.stdout.ends_with("more may follow: --after \"\"\n"),
        "{}",
        page.stdout
    );
    let rest = pgfifo(
        Some(url),
        &["group", "limits", QUEUE, "--after", "", "--json"],
    );
    assert_eq!(rest.expect(0).json()[0]["group"], "a");

    // `groups`: running of concurrency, the rate with the burst it takes
    // (the rate's count), the queue's default weight, and (own).
    let groups = pgfifo(Some(url), &["groups", "--queue", QUEUE])
        .expect(0)
        .stdout;
    let a = groups.lines().nth(1).unwrap_or("");
    assert!(
        groups.lines().next().unwrap().contains(" RUNNING ")
            && a.contains(" 0/4 ")
            && a.contains(" 10/s burst 10, weight 2 (own) "),
        "{groups}"
    );

    let reset = pgfifo(Some(url), &["group", "reset", QUEUE, "a"]).expect(0);
    assert_eq!(
        reset.stdout,
        "removed the limits of group a of queue cli: it follows the queue's defaults\n"
    );
    let again = pgfifo(Some(url), &["group", "reset", QUEUE, "a", "--json"])
        .expect(0)
        .json();
    assert_eq!(
        again,
        json!({"queue": "cli", "group": "a", "changed": false})
    );
    let groups = pgfifo(Some(url), &["groups", "--queue", QUEUE, "--json"])
        .expect(0)
        .json();
    assert_eq!(
        (&groups[0]["own_limits"], &groups[0]["weight"]),
        (&json!(false), &json!(2))
    );

    // Clearing the last setting of a row removes it.
    set(&["b", "--concurrency", "2"]).expect(0);
    set(&["b", "--concurrency", "none"]).expect(0);
    assert_eq!(limits(url).as_array().map(Vec::len), Some(1));

    let defaults = pgfifo(Some(url), &["group", "reset", QUEUE, "--defaults"]).expect(0);
    assert!(
        defaults
            .stdout
            .starts_with("removed the defaults of queue cli"),
        "{}",
        defaults.stdout
    );
    let none = pgfifo(Some(url), &["group", "reset", QUEUE, "--defaults"]).expect(0);
    assert_eq!(none.stdout, "queue cli had no defaults: nothing changed\n");
    let empty = pgfifo(Some(url), &["group", "limits", QUEUE]).expect(0);
    assert_eq!(empty.stdout, "no limits set in queue cli\n");
}

#[tokio::test]
async fn bad_values_name_the_setting_and_change_nothing() {
    let db = TestDb::new().await;
    let url = db.url.as_str();
    pgfifo(
        Some(url),
        &["group", "set", QUEUE, "a", "--rate", "5/s", "--weight", "2"],
    )
    .expect(0);
    let before = limits(url);
    let long = "g".repeat(pgfifo::MAX_GROUP_LEN + 1);
    let cases: &[(&[&str], &str)] = &[
        (&["a", "--rate", "0/s"], "rate: 0 starts per period"),
        (
            &["a", "--rate", "fast"],
            "rate: \"fast\" is not COUNT/PERIOD",
        ),
        (
            &["a", "--rate", "10/x"],
            "rate: \"10/x\" is not COUNT/PERIOD",
        ),
        (&["a", "--burst", "0"], "burst: 0 is outside 1 to 1000000"),
        (&["a", "--burst", "-3"], "burst: -3 is outside"),
        (
            &["a", "--concurrency", "0"],
            "concurrency: 0 is outside 1 to 1000",
        ),
        (
            &["a", "--concurrency", "5000"],
            "concurrency: 5000 is outside 1 to 1000",
        ),
        (&["a", "--weight", "0"], "weight: 0 is outside 1 to 1000"),
        (
            &["a", "--weight", "lots"],
            "weight: \"lots\" is not a whole number or none",
        ),
        // One bad value among good ones: none of them is applied.
        (
            &["a", "--rate", "9/s", "--concurrency", "5000"],
            "concurrency: 5000",
        ),
        (
            &["", "--rate", "1/s"],
            "invalid group name \"\": it is empty",
        ),
        (&[&long, "--rate", "1/s"], "it is longer than 256 bytes"),
        (&["a"], "the following required arguments were not provided"),
        (&["--rate", "1/s"], "<GROUP|--defaults>"),
        (&["a", "--defaults", "--rate", "1/s"], "cannot be used with"),
    ];
    for (args, expected) in cases {
        let run = pgfifo(Some(url), &[&["group", "set", QUEUE], *args].concat()).expect(2);
        assert!(
            run.stderr.starts_with("error: ") && run.stderr.contains(expected),
            "{args:?}: {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{args:?}: {}", run.stdout);
    }
    let run = pgfifo(Some(url), &["group", "reset", QUEUE, ""]).expect(2);
    assert!(run.stderr.contains("invalid group name"), "{}", run.stderr);
    assert_eq!(limits(url), before, "nothing changed");
}

#[test]
fn group_commands_have_help_that_says_what_each_setting_does() {
    for command in [
        &["group"][..],
        &["group", "set"],
        &["group", "reset"],
        &["group", "limits"],
    ] {
        let run = pgfifo(None, &[command, &["--help"]].concat()).expect(0);
        assert!(
            run.stdout.contains("Usage: pgfifo group"),
            "{command:?}: {}",
            run.stdout
        );
    }
    let set = pgfifo(None, &["group", "set", "--help"]).expect(0).stdout;
    for what in [
        "At most this many job starts per period",
        "the size of the group's token bucket",
        "How many jobs of the group may run at once",
        "The group's share of turns",
        "`none` clears it",
    ] {
        assert!(set.contains(what), "{what}: {set}");
    }
}
