// A job declared by a `macro_rules!` macro: values passed as `$value:expr`
// fragments reach the derive wrapped in invisible groups and still parse.

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

macro_rules! job {
    ($ty:ident, $queue:expr, $priority:expr) => {
        #[derive(Job, Serialize, Deserialize)]
        #[job(queue = $queue, priority = $priority)]
        struct $ty;

        #[async_trait]
        impl Handler for $ty {
            async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
                Ok(())
            }
        }
    };
}

job!(Cleanup, "maintenance", -7);

fn main() {
    assert_eq!(<Cleanup as Job>::KIND, "Cleanup");
    assert_eq!(<Cleanup as Job>::QUEUE, "maintenance");
    assert_eq!(<Cleanup as Job>::PRIORITY, -7);
}
