// A key `#[job(...)]` does not know is rejected on the key, with the list of
// accepted keys.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "billing", retries = 3)]
struct ChargeInvoice {
    invoice_id: i64,
}

fn main() {}
