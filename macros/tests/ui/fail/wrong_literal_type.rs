// A value of the wrong type is rejected on the value, with an example of the
// expected form.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(max_attempts = "five", queue = billing, timeout = 30, priority = 1.5)]
struct ChargeInvoice {
    invoice_id: i64,
}

fn main() {}
