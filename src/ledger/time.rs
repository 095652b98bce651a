//! Ledger time: Unix milliseconds in the rows, RFC 3339 UTC when printed.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SS.mmmZ` for a Unix time in milliseconds.
pub fn format_utc_ms(ts_ms: i64) -> String {
    let secs = ts_ms.div_euclid(1000);
    let millis = ts_ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let secs_of_day = secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    )
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of `civil_from_days`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// A point in time for `--since` / `--until`: RFC 3339 (`2025-06-01T09:12:44Z`,
/// `2025-06-01T11:12:44.5+02:00`, or a date `2025-06-01` meaning its midnight UTC), or an
/// age before `now_ms` (`90s`, `30m`, `2h`, `7d`, `2w`).
pub fn parse_time(text: &str, now_ms: i64) -> Result<i64, String> {
    let text = text.trim();
    let bad = || {
        format!(
            "{text:?} is not a time: use RFC 3339 (2025-06-01T09:12:44Z, 2025-06-01) or an age \
             (90s, 30m, 2h, 7d, 2w)"
        )
    };
    if let Some(unit) = text.chars().last().filter(|c| c.is_ascii_alphabetic())
        && text.len() > 1
        && text[..text.len() - 1].bytes().all(|b| b.is_ascii_digit())
    {
        let n: i64 = text[..text.len() - 1].parse().map_err(|_| bad())?;
        let unit_ms: i64 = match unit {
            's' => 1000,
            'm' => 60_000,
            'h' => 3_600_000,
            'd' => 86_400_000,
            'w' => 7 * 86_400_000,
            _ => return Err(bad()),
        };
        return n
            .checked_mul(unit_ms)
            .map(|age| now_ms.saturating_sub(age))
            .ok_or_else(bad);
    }
    let b = text.as_bytes();
    let num = |range: std::ops::Range<usize>| -> Result<u32, String> {
        let part = text.get(range).ok_or_else(bad)?;
        if part.bytes().all(|c| c.is_ascii_digit()) {
            part.parse().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    if b.len() < 10 || b[4] != b'-' || b[7] != b'-' {
        return Err(bad());
    }
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    let mut ms = days_from_civil(i64::from(year), month, day) * 86_400_000;
    if b.len() == 10 {
        return Ok(ms);
    }
    if b.len() < 20 || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if hour > 23 || minute > 59 || second > 60 {
        return Err(bad());
    }
    ms += i64::from(hour) * 3_600_000 + i64::from(minute) * 60_000 + i64::from(second) * 1000;
    let mut at = 19;
    if b[at] == b'.' {
        at += 1;
        let start = at;
        while at < b.len() && b[at].is_ascii_digit() {
            at += 1;
        }
        let digits = &text[start..at];
        if digits.is_empty() {
            return Err(bad());
        }
        let millis: String = digits.chars().chain("000".chars()).take(3).collect();
        ms += i64::from(millis.parse::<u32>().map_err(|_| bad())?);
    }
    match &text[at..] {
        "Z" | "z" => Ok(ms),
        zone if zone.len() == 6
            && matches!(zone.as_bytes()[0], b'+' | b'-')
            && zone.as_bytes()[3] == b':' =>
        {
            let hours = num(at + 1..at + 3)?;
            let minutes = num(at + 4..at + 6)?;
            let offset = i64::from(hours) * 3_600_000 + i64::from(minutes) * 60_000;
            Ok(if zone.starts_with('+') {
                ms - offset
            } else {
                ms + offset
            })
        }
        _ => Err(bad()),
    }
}

/// Proleptic Gregorian date of a day count since 1970-01-01, by 400-year eras (146 097
/// days each) counted from 0000-03-01 so the leap day ends each year.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468; // days from 0000-03-01 to 1970-01-01
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097); // [0, 146096]
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153; // [0, 11]
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // day in [1, 31], month in [1, 12] by construction.
    (year, month as u32, day as u32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_instants() {
        assert_eq!(format_utc_ms(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(format_utc_ms(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(format_utc_ms(1_709_251_199_999), "2024-02-29T23:59:59.999Z");
        assert_eq!(format_utc_ms(4_102_444_800_000), "2100-01-01T00:00:00.000Z");
        assert_eq!(format_utc_ms(-1), "1969-12-31T23:59:59.999Z");
    }

    #[test]
    fn times_parse_as_rfc_3339_or_ages() {
        let now = 1_700_000_000_000;
        assert_eq!(parse_time("2h", now), Ok(now - 7_200_000));
        assert_eq!(parse_time("90s", now), Ok(now - 90_000));
        assert_eq!(parse_time("7d", now), Ok(now - 7 * 86_400_000));
        assert_eq!(parse_time("1970-01-01", now), Ok(0));
        assert_eq!(
            parse_time("2024-02-29T23:59:59.999Z", now),
            Ok(1_709_251_199_999)
        );
        assert_eq!(
            parse_time("2024-03-01T01:59:59.999+02:00", now),
            Ok(1_709_251_199_999)
        );
        assert_eq!(
            parse_time("2024-02-29T18:59:59.9-05:00", now),
            Ok(1_709_251_199_900)
        );
        for bad in [
            "",
            "2",
            "h",
            "2x",
            "yesterday",
            "2024-13-01",
            "2024-02-29T25:00:00Z",
            "2024-02-29T23:59:59",
            "2024-02-29T23:59:59+0200",
            "99999999999999999999h",
        ] {
            assert!(parse_time(bad, now).is_err(), "{bad:?}");
        }
        // Every day round-trips through the formatter.
        for days in (-800..60_000).step_by(37) {
            let ms = days * 86_400_000 + 12_345;
            assert_eq!(parse_time(&format_utc_ms(ms), now), Ok(ms));
        }
    }

    #[test]
    fn every_day_follows_the_previous_one() {
        // Walk 1960..2110 day by day: the date must advance by exactly one day each time.
        let mut previous = civil_from_days(-3653);
        for days in -3652..51_000 {
            let (y, m, d) = civil_from_days(days);
            let (py, pm, pd) = previous;
            let next_day = (y, m, d) == (py, pm, pd + 1);
            let next_month = (y, m, d) == (py, pm + 1, 1);
            let next_year = (y, m, d) == (py + 1, 1, 1) && (pm, pd) == (12, 31);
            assert!(
                next_day || next_month || next_year,
                "{previous:?} -> {y}-{m}-{d}"
            );
            previous = (y, m, d);
        }
    }
}
