//! Ages on the command line (`--older-than 7d`): a positive whole number
//! and one unit.

use std::time::Duration;

/// The units an age may be given in, with their length in seconds.
const UNITS: [(&str, u64); 5] = [
    ("s", 1),
    ("m", 60),
    ("h", 3_600),
    ("d", 86_400),
    ("w", 604_800),
];

/// What every rejection says about the expected form.
const EXPECTED: &str =
    "expected a positive whole number and a unit s, m, h, d or w (e.g. 90s, 30m, 12h, 7d, 2w)";

/// Parses an age such as `90s`, `30m`, `12h`, `7d` or `2w`. Rejects zero,
/// negative numbers, fractions, missing or unknown units, and ages too large
/// to mean anything (over about 10,000 years); the message says why.
pub fn parse_age(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative: {EXPECTED}"));
    }
    if number.is_empty() {
        return Err(format!("{text:?} does not start with a number: {EXPECTED}"));
    }
    let Some(&(_, unit_secs)) = UNITS.iter().find(|(name, _)| *name == unit) else {
        return Err(if unit.is_empty() {
            format!("{text:?} has no unit: {EXPECTED}")
        } else {
            format!("{text:?} has an unknown unit {unit:?}: {EXPECTED}")
        });
    };
    let value: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is too large: {EXPECTED}"))?;
    if value == 0 {
        return Err(format!("{text:?} is zero: {EXPECTED}"));
    }
    // About 10,000 years: far beyond any retention, well within PostgreSQL's
    // interval and timestamp ranges.
    const MAX_SECS: u64 = 10_000 * 366 * 86_400;
    match value.checked_mul(unit_secs) {
        Some(secs) if secs <= MAX_SECS => Ok(Duration::from_secs(secs)),
        _ => Err(format!("{text:?} is too large: at most about 10,000 years")),
    }
}

/// Writes an age in the largest unit that divides it exactly (`2w`, `36h`,
/// `90s`): the form [`parse_age`] reads.
pub fn format_age(age: Duration) -> String {
    let secs = age.as_secs();
    let (name, unit_secs) = UNITS
        .iter()
        .rev()
        .find(|(_, unit_secs)| secs % unit_secs == 0)
        .copied()
        .unwrap_or(("s", 1));
    format!("{}{name}", secs / unit_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse_age("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("30m"), Ok(Duration::from_secs(30 * 60)));
        assert_eq!(parse_age("12h"), Ok(Duration::from_secs(12 * 3_600)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("2w"), Ok(Duration::from_secs(14 * 86_400)));
        assert_eq!(parse_age(" 1d "), Ok(Duration::from_secs(86_400)));
    }

    #[test]
    fn formats_in_the_largest_exact_unit() {
        for text in ["90s", "30m", "12h", "2w", "36h", "10d"] {
            assert_eq!(format_age(parse_age(text).unwrap()), text);
        }
        assert_eq!(format_age(Duration::from_secs(7 * 86_400)), "1w");
    }

    #[test]
    fn rejects_zero_and_negative() {
        assert!(parse_age("0d").unwrap_err().contains("is zero"));
        assert!(parse_age("000s").unwrap_err().contains("is zero"));
        assert!(parse_age("-3d").unwrap_err().contains("is negative"));
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "", "d", "7", "7x", "7 d", "7D", "1.5h", "7dd", "abc", "1h30m",
        ] {
            let err = parse_age(bad).unwrap_err();
            assert!(
                err.contains("expected a positive whole number"),
                "{bad:?}: {err}"
            );
        }
        assert!(parse_age("7").unwrap_err().contains("has no unit"));
        assert!(parse_age("7x").unwrap_err().contains("unknown unit \"x\""));
    }

    #[test]
    fn rejects_absurdly_large() {
        assert!(parse_age("99999999999999999999999s")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_age("18446744073709551615w")
            .unwrap_err()
            .contains("too large"));
        assert!(parse_age("600000w").unwrap_err().contains("too large"));
        assert!(parse_age("500000w").is_ok());
    }
}
