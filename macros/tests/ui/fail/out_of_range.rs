// Numbers outside what a setting accepts are rejected on the number.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(max_attempts = 0, priority = 40000)]
struct ChargeInvoice {
    invoice_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(max_attempts = -1, priority = -32769)]
struct RefundInvoice {
    invoice_id: i64,
}

fn main() {}
