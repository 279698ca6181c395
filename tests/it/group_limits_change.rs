//! Changing some limits of a group and keeping the others
//! (`admin::change_group_limits`, what `pgfifo group set` does): one
//! statement, so two changes of different limits made at once both hold;
//! a change that leaves nothing set removes the group's own limits; a bad
//! value is refused by name and changes nothing.

use std::time::Duration;

use pgfifo::admin::{self, SetLimits};
use pgfifo::diesel_async::SimpleAsyncConnection;
use pgfifo::{Error, GroupLimits, GroupLimitsChange, LimitChange, Rate};
use pgfifo_tests::{eventually, TestDb};

const QUEUE: &str = "limits_change";

fn concurrency(n: u32) -> GroupLimitsChange {
    GroupLimitsChange {
        concurrency: LimitChange::Set(n),
        ..Default::default()
    }
}

fn weight(n: u32) -> GroupLimitsChange {
    GroupLimitsChange {
        weight: LimitChange::Set(n),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_of_different_limits_made_at_once_both_hold() {
    let db = TestDb::new().await;
    // The first change is made in a transaction that stays open, so the
    // second is certainly made while the first is not committed.
    let mut first = db.direct().await;
    first.batch_execute("BEGIN").await.unwrap();
    let set = admin::change_group_limits(&mut first, QUEUE, Some("g"), concurrency(4))
        .await
        .unwrap();
    assert_eq!(set.and_then(|s| s.concurrency), Some(4));
    let mut second = db.direct().await;
    let change = tokio::spawn(async move {
        admin::change_group_limits(&mut second, QUEUE, Some("g"), weight(3)).await
    });
    eventually("the second change to wait for the first", Duration::from_secs(10), || async {
        let waiting = db
            .scalar("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
            .await;
        if waiting == 1 {
            Ok(())
        } else {
            Err(format!("{waiting} sessions wait for a lock"))
        }
    })
    .await;
    first.batch_execute("COMMIT").await.unwrap();
    let now = change.await.unwrap().unwrap().expect("limits set");
    assert_eq!((now.concurrency, now.weight), (Some(4), Some(3)), "{now:?}");
    let mut conn = db.conn().await;
    let stored = admin::limits_of(&mut conn, QUEUE, Some("g")).await.unwrap();
    assert_eq!(stored, Some(now));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_keeps_what_it_does_not_name_and_clearing_the_last_removes_the_row() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    let rate = Rate::per_second(10).unwrap();
    admin::set_group_limits(
        &mut conn,
        QUEUE,
        "g",
        GroupLimits::new().rate(rate).burst(20),
    )
    .await
    .unwrap();
    let now = admin::change_group_limits(&mut conn, QUEUE, Some("g"), concurrency(2))
        .await
        .unwrap();
    let expected = SetLimits {
        group: Some("g".into()),
        rate: Some(rate),
        burst: Some(20),
        concurrency: Some(2),
        weight: None,
    };
    assert_eq!(now, Some(expected.clone()));
    let clear_rate = GroupLimitsChange {
        rate: LimitChange::Clear,
        ..Default::default()
    };
    let now = admin::change_group_limits(&mut conn, QUEUE, Some("g"), clear_rate)
        .await
        .unwrap();
    assert_eq!(
        now,
        Some(SetLimits {
            rate: None,
            ..expected
        })
    );
    let clear_rest = GroupLimitsChange {
        burst: LimitChange::Clear,
        concurrency: LimitChange::Clear,
        ..Default::default()
    };
    let now = admin::change_group_limits(&mut conn, QUEUE, Some("g"), clear_rest)
        .await
        .unwrap();
    assert_eq!(now, None);
    assert_eq!(
        admin::limits_of(&mut conn, QUEUE, Some("g")).await.unwrap(),
        None
    );
    // The queue's defaults change the same way.
    let now = admin::change_group_limits(&mut conn, QUEUE, None, weight(3))
        .await
        .unwrap();
    assert_eq!(now.as_ref().and_then(|s| s.weight), Some(3));
    assert_eq!(now.and_then(|s| s.group), None);
    assert_eq!(
        admin::limits_of(&mut conn, QUEUE, None)
            .await
            .unwrap()
            .and_then(|s| s.weight),
        Some(3)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_change_is_refused_by_name_and_changes_nothing() {
    let db = TestDb::new().await;
    let mut conn = db.conn().await;
    admin::change_group_limits(&mut conn, QUEUE, Some("g"), weight(2))
        .await
        .unwrap();
    let bad = GroupLimitsChange {
        weight: LimitChange::Set(5),
        concurrency: LimitChange::Set(0),
        ..Default::default()
    };
    match admin::change_group_limits(&mut conn, QUEUE, Some("g"), bad).await {
        Err(Error::InvalidArgument(message)) => {
            assert!(message.contains("concurrency"), "{message}");
        }
        other => panic!("expected a refusal naming concurrency, got {other:?}"),
    }
    let burst = GroupLimitsChange {
        burst: LimitChange::Set(0),
        ..Default::default()
    };
    match admin::change_group_limits(&mut conn, QUEUE, Some("g"), burst).await {
        Err(Error::InvalidArgument(message)) => assert!(message.contains("burst"), "{message}"),
        other => panic!("expected a refusal naming burst, got {other:?}"),
    }
    assert!(
        admin::change_group_limits(&mut conn, QUEUE, Some(""), weight(1))
            .await
            .is_err()
    );
    let stored = admin::limits_of(&mut conn, QUEUE, Some("g")).await.unwrap();
    assert_eq!(stored.and_then(|s| s.weight), Some(2));
    assert_eq!(
        admin::limits_of(&mut conn, QUEUE, Some(""))
            .await
            .ok()
            .flatten(),
        None
    );
}
