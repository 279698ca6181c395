//! Support for the fault-injection suite (`tests/faults/`): a private
//! PostgreSQL server it may restart ([`private_pg`]), and the run records of
//! its `fault-worker` processes with the checks made on them ([`runs`]).

pub mod private_pg;
pub mod rng;
pub mod runs;
