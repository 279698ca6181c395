// A key set twice is rejected on its second occurrence, within one attribute
// or across several.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "billing", queue = "payments")]
struct ChargeInvoice {
    invoice_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(max_attempts = 3)]
#[job(max_attempts = 5)]
struct RefundInvoice {
    invoice_id: i64,
}

fn main() {}
