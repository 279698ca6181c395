// A job with no `#[job]` attribute gets every default.

use std::time::Duration;

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
struct SendWelcomeEmail {
    user_id: i64,
}

#[async_trait]
impl Handler for SendWelcomeEmail {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn main() {
    assert_eq!(<SendWelcomeEmail as Job>::KIND, "SendWelcomeEmail");
    assert_eq!(<SendWelcomeEmail as Job>::QUEUE, "default");
    assert_eq!(<SendWelcomeEmail as Job>::MAX_ATTEMPTS, 5);
    assert_eq!(<SendWelcomeEmail as Job>::TIMEOUT, None);
    assert_eq!(<SendWelcomeEmail as Job>::BACKOFF, Duration::from_secs(1));
    assert_eq!(<SendWelcomeEmail as Job>::PRIORITY, 0);
    let _ = SendWelcomeEmail { user_id: 1 }.user_id;
}
