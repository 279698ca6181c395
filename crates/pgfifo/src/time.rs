//! Timestamps and ages in the admin views: read from SQL as microseconds since
//! the epoch, shown and serialized as RFC 3339 (UTC) and seconds.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serializer;

/// A timestamp read from SQL as microseconds since the Unix epoch.
pub(crate) fn from_micros(us: i64) -> SystemTime {
    let magnitude = Duration::from_micros(us.unsigned_abs());
    if us >= 0 {
        UNIX_EPOCH + magnitude
    } else {
        UNIX_EPOCH - magnitude
    }
}

/// An age read from SQL as microseconds (negative ages, from clock skew
/// between the server's statements, are zero).
pub(crate) fn age_from_micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// Formats a time as RFC 3339 in UTC with millisecond precision, for
/// example `2026-11-21T09:30:00.250Z`.
pub fn rfc3339(at: SystemTime) -> String {
    let (secs, millis) = match at.duration_since(UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_millis()),
        Err(before) => {
            let d = before.duration();
            let whole = d.as_secs() as i64 + i64::from(d.subsec_nanos() > 0);
            let millis = (1_000 - d.subsec_millis()) % 1_000;
            (-whole, millis)
        }
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

/// Formats a duration briefly for people: `850ms`, `42s`, `3m12s`, `5h03m`,
/// `2d04h`.
pub fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..=59 => format!("{secs}s"),
        60..=3_599 => format!("{}m{:02}s", secs / 60, secs % 60),
        3_600..=86_399 => format!("{}h{:02}m", secs / 3_600, secs % 3_600 / 60),
        _ => format!("{}d{:02}h", secs / 86_400, secs % 86_400 / 3_600),
    }
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `civil_from_days` algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

pub(crate) fn ser_time<S: Serializer>(at: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*at))
}

pub(crate) fn ser_opt_time<S: Serializer>(
    at: &Option<SystemTime>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match at {
        Some(at) => s.serialize_str(&rfc3339(*at)),
        None => s.serialize_none(),
    }
}

pub(crate) fn ser_opt_secs<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => s.serialize_f64(d.as_secs_f64()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc3339_in_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        // 2026-11-21T09:30:00.250Z
        let at = UNIX_EPOCH + Duration::from_millis(1_795_253_400_250);
        assert_eq!(rfc3339(at), "2026-11-21T09:30:00.250Z");
        // Leap day.
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
        let before = UNIX_EPOCH - Duration::from_millis(1_500);
        assert_eq!(rfc3339(before), "1969-12-31T23:59:58.500Z");
    }

    #[test]
    fn micros_round_trip() {
        assert_eq!(
            from_micros(1_500_000),
            UNIX_EPOCH + Duration::from_micros(1_500_000)
        );
        assert_eq!(from_micros(-1), UNIX_EPOCH - Duration::from_micros(1));
        assert_eq!(age_from_micros(-5), Duration::ZERO);
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_millis(850)), "850ms");
        assert_eq!(human(Duration::from_secs(42)), "42s");
        assert_eq!(human(Duration::from_secs(192)), "3m12s");
        assert_eq!(human(Duration::from_secs(5 * 3_600 + 180)), "5h03m");
        assert_eq!(human(Duration::from_secs(2 * 86_400 + 4 * 3_600)), "2d04h");
    }
}
