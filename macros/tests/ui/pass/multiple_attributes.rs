// Settings may be split over several `#[job(...)]` attributes, mixed with
// others; a raw identifier's name has no `r#`.

use std::time::Duration;

use pgfifo::{async_trait, Handler, Job, JobContext, JobError};
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(queue = "reports")]
/// Builds the monthly report.
#[job(max_attempts = 1)]
#[derive(Debug)]
#[job(timeout = "5m", backoff = "250ms")]
struct r#MonthlyReport {
    month: u8,
}

#[async_trait]
impl Handler for MonthlyReport {
    async fn handle(&self, _ctx: &mut JobContext<'_>) -> Result<(), JobError> {
        Ok(())
    }
}

fn main() {
    assert_eq!(<MonthlyReport as Job>::KIND, "MonthlyReport");
    assert_eq!(<MonthlyReport as Job>::QUEUE, "reports");
    assert_eq!(<MonthlyReport as Job>::MAX_ATTEMPTS, 1);
    assert_eq!(<MonthlyReport as Job>::TIMEOUT, Some(Duration::from_secs(300)));
    assert_eq!(<MonthlyReport as Job>::BACKOFF, Duration::from_millis(250));
    assert_eq!(<MonthlyReport as Job>::PRIORITY, 0);
    let _ = MonthlyReport { month: 1 }.month;
}
