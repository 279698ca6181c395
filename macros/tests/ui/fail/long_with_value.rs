// `long` is a flag: it takes no value, and is given once.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
#[job(long = true)]
struct Export {
    report_id: i64,
}

#[derive(Job, Serialize, Deserialize)]
#[job(long)]
#[job(long)]
struct Transcode {
    video_id: i64,
}

fn main() {}
