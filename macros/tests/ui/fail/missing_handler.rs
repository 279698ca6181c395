// A job without a `Handler` impl: the error points at the type's name.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
struct ChargeInvoice {
    invoice_id: i64,
}

fn main() {}
