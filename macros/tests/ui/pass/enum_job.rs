// An enum is a job too; serde's own attributes sit beside `#[job]`.

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[job(queue = "notifications", priority = 3)]
enum Notify {
    Email { address: String },
    Sms { number: String },
    Push,
}

#[async_trait]
impl Handler for Notify {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        match self {
            Notify::Email { address } => drop(address.len()),
            Notify::Sms { number } => drop(number.len()),
            Notify::Push => {}
        }
        Ok(())
    }
}

fn main() {
    assert_eq!(<Notify as Job>::KIND, "Notify");
    assert_eq!(<Notify as Job>::QUEUE, "notifications");
    assert_eq!(<Notify as Job>::PRIORITY, 3);
    assert_eq!(<Notify as Job>::MAX_ATTEMPTS, 5);
}
