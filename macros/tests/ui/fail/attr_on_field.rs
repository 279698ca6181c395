// `#[job(...)]` belongs on the type, not on a field or a variant.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
struct ChargeInvoice {
    #[job(queue = "billing")]
    invoice_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
enum Notify {
    #[job(priority = 1)]
    Email,
}

fn main() {}
