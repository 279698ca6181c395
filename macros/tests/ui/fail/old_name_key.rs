// pgfifo 0.1.0's `name` key is now `kind`: the error says so.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "billing", name = "charge")]
struct ChargeInvoice {
    invoice_id: i64,
}

fn main() {}
