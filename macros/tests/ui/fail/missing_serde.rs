// `Job` requires `Serialize` and `Deserialize`: a type missing either derive
// gets an error on its name.

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Deserialize)]
struct NotSerialize {
    invoice_id: i64,
}

#[async_trait]
impl Handler for NotSerialize {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

#[derive(Job, Serialize)]
struct NotDeserialize {
    invoice_id: i64,
}

#[async_trait]
impl Handler for NotDeserialize {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        let _ = self.invoice_id;
        Ok(())
    }
}

fn main() {}
