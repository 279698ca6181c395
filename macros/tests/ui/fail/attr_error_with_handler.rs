// With an attribute error, the derive emits only the error: no `Job` impl and
// no registration. The type's own `Handler` impl then also reports the
// missing `Job` impl, until the attribute is fixed.

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "")]
struct ChargeInvoice {
    invoice_id: i64,
}

#[async_trait]
impl Handler for ChargeInvoice {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn main() {}
