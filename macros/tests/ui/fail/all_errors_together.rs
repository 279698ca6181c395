// Every mistake of a type is reported in one compilation, each on its token.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "", colour = "red", timeout = "soon")]
#[job(queue = "billing", max_attempts = 0)]
struct ChargeInvoice<T> {
    #[job(priority = 1)]
    invoice_id: T,
}

fn main() {}
