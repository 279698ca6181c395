//! Parsing of the duration strings of `timeout` and `backoff`.

use std::fmt;

/// The units a duration string may end with, and how many milliseconds each
/// is worth. `ms` comes before `m` and `s` so that the longest unit matches.
const UNITS: &[(&str, u64)] = &[("ms", 1), ("s", 1_000), ("m", 60_000), ("h", 3_600_000)];

/// A duration in whole milliseconds, as the generated code passes it to
/// `Duration::from_millis`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Millis(pub(crate) u64);

impl Millis {
    /// Whether this is the zero duration.
    pub(crate) fn is_zero(self) -> bool {
        self.0 == 0
    }
}

/// Why a duration string was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DurationError {
    /// Not an integer immediately followed by a known unit.
    Syntax,
    /// A valid duration that does not fit in `u64` milliseconds.
    TooLarge,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Syntax => f.write_str(
                "expected an integer followed by a unit among `ms`, `s`, `m` and `h`, \
                 such as \"500ms\", \"30s\", \"5m\" or \"1h\"",
            ),
            DurationError::TooLarge => {
                f.write_str("the duration is too large: it must fit in u64 milliseconds")
            }
        }
    }
}

/// Parses `"<integer><unit>"`, with `unit` among `ms`, `s`, `m` and `h`.
///
/// Nothing else is accepted: no sign, no fraction, no spaces, no compound
/// forms such as `"1m30s"`. Zero parses (as `Millis(0)`); whether it is
/// allowed is for the caller to decide.
pub(crate) fn parse(text: &str) -> Result<Millis, DurationError> {
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(DurationError::Syntax);
    }
    let (_, per_unit) = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .ok_or(DurationError::Syntax)?;
    // Only ASCII digits remain, so the only possible failure is overflow.
    let count: u64 = digits.parse().map_err(|_| DurationError::TooLarge)?;
    count
        .checked_mul(*per_unit)
        .map(Millis)
        .ok_or(DurationError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse("250ms"), Ok(Millis(250)));
        assert_eq!(parse("30s"), Ok(Millis(30_000)));
        assert_eq!(parse("5m"), Ok(Millis(300_000)));
        assert_eq!(parse("1h"), Ok(Millis(3_600_000)));
    }

    #[test]
    fn parses_zero_and_leading_zeros() {
        assert_eq!(parse("0s"), Ok(Millis(0)));
        assert!(parse("0ms").unwrap().is_zero());
        assert_eq!(parse("007s"), Ok(Millis(7_000)));
    }

    #[test]
    fn rejects_malformed_strings() {
        for text in [
            "",
            "s",
            "ms",
            "30",
            "30 s",
            " 30s",
            "30s ",
            "30S",
            "30sec",
            "10 parsecs",
            "1m30s",
            "-5s",
            "+5s",
            "1.5s",
            "1_000ms",
            "30d",
            "h1",
            "٣s",
        ] {
            assert_eq!(parse(text), Err(DurationError::Syntax), "{text:?}");
        }
    }

    #[test]
    fn rejects_overflow() {
        assert_eq!(parse("18446744073709551615ms"), Ok(Millis(u64::MAX)));
        assert_eq!(
            parse("18446744073709551616ms"),
            Err(DurationError::TooLarge)
        );
        assert_eq!(
            parse("99999999999999999999999h"),
            Err(DurationError::TooLarge)
        );
        assert_eq!(parse("18446744073709552s"), Err(DurationError::TooLarge));
    }

    #[test]
    fn error_messages_name_the_units() {
        let message = DurationError::Syntax.to_string();
        for unit in ["`ms`", "`s`", "`m`", "`h`"] {
            assert!(message.contains(unit), "{message}");
        }
    }
}
