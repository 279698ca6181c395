// A key without a value, and `#[job]` without parentheses.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue, priority = 1)]
struct ChargeInvoice {
    invoice_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job]
struct RefundInvoice {
    invoice_id: i64,
}

fn main() {}
