// A duration string that does not parse is rejected on the string.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(timeout = "10 parsecs", backoff = "1.5s")]
struct ChargeInvoice {
    invoice_id: i64,
}

fn main() {}
