// Every key of `#[job(...)]` in one attribute, including a negative priority
// and the `long` flag.

use std::time::Duration;

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(
    queue = "billing",
    kind = "charge",
    max_attempts = 7,
    timeout = "30s",
    backoff = "500ms",
    priority = -2,
    long
)]
struct ChargeInvoice {
    invoice_id: i64,
}

#[async_trait]
impl Handler for ChargeInvoice {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

// The bounds of each integer setting, and the other duration units.
#[derive(Job, Serialize, Deserialize)]
#[job(max_attempts = 4294967295, priority = -32768, timeout = "1h", backoff = "5m")]
struct Extremes;

#[async_trait]
impl Handler for Extremes {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn main() {
    assert_eq!(<ChargeInvoice as Job>::KIND, "charge");
    assert_eq!(<ChargeInvoice as Job>::QUEUE, "billing");
    assert_eq!(<ChargeInvoice as Job>::MAX_ATTEMPTS, 7);
    assert_eq!(<ChargeInvoice as Job>::TIMEOUT, Some(Duration::from_secs(30)));
    assert_eq!(<ChargeInvoice as Job>::BACKOFF, Duration::from_millis(500));
    assert_eq!(<ChargeInvoice as Job>::PRIORITY, -2);
    assert!(<ChargeInvoice as Job>::LONG);
    assert!(!<Extremes as Job>::LONG);
    let _ = ChargeInvoice { invoice_id: 1 }.invoice_id;

    assert_eq!(<Extremes as Job>::MAX_ATTEMPTS, u32::MAX);
    assert_eq!(<Extremes as Job>::PRIORITY, i16::MIN);
    assert_eq!(<Extremes as Job>::TIMEOUT, Some(Duration::from_secs(3600)));
    assert_eq!(<Extremes as Job>::BACKOFF, Duration::from_secs(300));
}
