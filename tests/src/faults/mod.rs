//! Support for the fault-injection suite (`tests/faults/`): a private
//! PostgreSQL server it may restart ([`private_pg`]), the run records of
//! its `fault-worker` processes with the checks made on them ([`runs`]),
//! and the start checks of groups that run several jobs at once
//! ([`starts`]).

pub mod private_pg;
pub mod rng;
pub mod runs;
pub mod starts;
