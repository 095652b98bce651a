//! Calendar arithmetic for UTC times: the HTTP `Date` header (IMF-fixdate, RFC 9110
//! §5.6.7) and the human-readable times of `toolwall token list`.

use std::time::{SystemTime, UNIX_EPOCH};

/// A UTC time broken into fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UtcParts {
    pub year: i64,
    pub month: u32,
    pub day: u32,
    pub hour: u32,
    pub minute: u32,
    pub second: u32,
    /// 0 = Sunday.
    pub weekday: u32,
}

/// Split seconds since the Unix epoch (negative before it) into UTC fields.
pub fn utc_parts(unix_secs: i64) -> UtcParts {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400) as u32;
    // Days to civil date (proleptic Gregorian), after Howard Hinnant's public-domain
    // derivation: shift to eras of 400 years starting on March 1st.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    UtcParts {
        year,
        month,
        day,
        hour: secs_of_day / 3600,
        minute: secs_of_day / 60 % 60,
        second: secs_of_day % 60,
        // 1970-01-01 was a Thursday.
        weekday: (days + 4).rem_euclid(7) as u32,
    }
}

const WEEKDAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn imf_fixdate(time: SystemTime) -> String {
    let secs = match time.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX / 2),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX / 2),
    };
    let p = utc_parts(secs);
    format!(
        "{}, {:02} {} {:04} {:02}:{:02}:{:02} GMT",
        WEEKDAYS[p.weekday as usize % 7],
        p.day,
        MONTHS[(p.month as usize).saturating_sub(1) % 12],
        p.year,
        p.hour,
        p.minute,
        p.second
    )
}

/// `2026-08-22 10:01:07Z` from milliseconds since the epoch.
pub fn utc_from_ms(unix_ms: i64) -> String {
    let p = utc_parts(unix_ms.div_euclid(1000));
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}Z",
        p.year, p.month, p.day, p.hour, p.minute, p.second
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn known_dates() {
        let t = UNIX_EPOCH + Duration::from_secs(784_111_777);
        assert_eq!(imf_fixdate(t), "Sun, 06 Nov 1994 08:49:37 GMT");
        assert_eq!(imf_fixdate(UNIX_EPOCH), "Thu, 01 Jan 1970 00:00:00 GMT");
        // A leap day and the turn of a century.
        assert_eq!(utc_from_ms(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(utc_from_ms(4_107_542_399_000), "2100-02-28 23:59:59Z");
        assert_eq!(utc_from_ms(-1000), "1969-12-31 23:59:59Z");
    }

    #[test]
    fn round_trips_every_day_for_a_millennium() {
        // Walk day by day and check the fields advance like a calendar.
        let mut prev = utc_parts(0);
        for day in 1..(366 * 1000) {
            let p = utc_parts(day * 86_400);
            assert_eq!(p.weekday, (prev.weekday + 1) % 7);
            if p.day == 1 {
                assert!(prev.day >= 28);
                assert!(p.month == prev.month % 12 + 1);
            } else {
                assert_eq!(p.day, prev.day + 1);
                assert_eq!(p.month, prev.month);
            }
            prev = p;
        }
    }
}
