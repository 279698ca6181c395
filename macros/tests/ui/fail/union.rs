// A union cannot be a job.

use pgfifo::Job;

#[derive(Job)]
union Bits {
    int: u32,
    float: f32,
}

fn main() {}
