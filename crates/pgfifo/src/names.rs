//! Queue and group names: what pgfifo accepts, checked before anything is
//! written.

use crate::{Error, Result};

/// The longest queue name, in bytes.
pub const MAX_QUEUE_LEN: usize = 128;
/// The longest group name (and unique key), in bytes.
pub const MAX_GROUP_LEN: usize = 256;
/// The longest job kind ([`Job::KIND`](crate::Job::KIND)), in bytes.
pub const MAX_KIND_LEN: usize = 256;

pub(crate) fn validate_queue(queue: &str) -> Result<()> {
    match name_problem(queue, MAX_QUEUE_LEN) {
        Some(reason) => Err(Error::InvalidQueue {
            name: truncated(queue),
            reason,
        }),
        None => Ok(()),
    }
}

pub(crate) fn validate_group(group: &str) -> Result<()> {
    match name_problem(group, MAX_GROUP_LEN) {
        Some(reason) => Err(Error::InvalidGroup {
            name: truncated(group),
            reason,
        }),
        None => Ok(()),
    }
}

fn name_problem(name: &str, max: usize) -> Option<String> {
    if name.is_empty() {
        Some("it is empty".to_owned())
    } else if name.len() > max {
        Some(format!("it is longer than {max} bytes"))
    } else if name.contains('\0') {
        Some("it contains a NUL character".to_owned())
    } else {
        None
    }
}

/// Keeps error messages short when someone passes a megabyte as a name.
fn truncated(name: &str) -> String {
    match name.char_indices().nth(64) {
        Some((cut, _)) => format!("{}…", &name[..cut]),
        None => name.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(validate_queue("billing").is_ok());
        assert!(matches!(
            validate_queue(""),
            Err(Error::InvalidQueue { .. })
        ));
        assert!(matches!(
            validate_queue(&"q".repeat(129)),
            Err(Error::InvalidQueue { .. })
        ));
        assert!(validate_queue(&"q".repeat(128)).is_ok());
        assert!(matches!(
            validate_group(""),
            Err(Error::InvalidGroup { .. })
        ));
        assert!(matches!(
            validate_group("a\0b"),
            Err(Error::InvalidGroup { .. })
        ));
        let err = validate_group(&"g".repeat(1000)).unwrap_err().to_string();
        assert!(err.contains("longer than 256 bytes"), "{err}");
        assert!(
            err.len() < 200,
            "long names are truncated in messages: {err}"
        );
    }
}
