// A job type must be concrete: no type parameters, no lifetimes.

use pgfifo::Job;
use serde::{Deserialize, Serialize};

#[derive(Job, Serialize, Deserialize)]
struct Wrapper<T> {
    inner: T,
}

#[derive(Job, Serialize, Deserialize)]
struct Borrowed<'a> {
    text: &'a str,
}

fn main() {}
