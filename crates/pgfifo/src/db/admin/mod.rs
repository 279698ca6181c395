//! The statements of [`crate::admin`]: listings, status, and the operations
//! that change jobs and groups.

pub(crate) mod controls;
pub(crate) mod dependency;
pub(crate) mod group_list;
pub(crate) mod inspect;
pub(crate) mod ops;
pub(crate) mod queue_limits;
pub(crate) mod status;
pub(crate) mod window;
