// A zero timeout or backoff is rejected on the string.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(timeout = "0s", backoff = "0ms")]
struct ChargeInvoice {
    invoice_id: i64,
}

fn main() {}
