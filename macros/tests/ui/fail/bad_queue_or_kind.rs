// Queue names must be 1 to 128 bytes and job kinds 1 to 256 bytes.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "", kind = "")]
struct ChargeInvoice {
    invoice_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqq")]
struct RefundInvoice {
    invoice_id: i64,
}

fn main() {}
