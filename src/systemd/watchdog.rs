//! The service watchdog: systemd restarts toolwall when `WATCHDOG=1` stops arriving for
//! `WatchdogSec=`. The pings come from the event loop itself, so a stuck loop is caught.

use std::time::{Duration, Instant};

const WATCHDOG_USEC: &str = "WATCHDOG_USEC";
const WATCHDOG_PID: &str = "WATCHDOG_PID";

/// How often to ping: half of the interval systemd asks for (`WATCHDOG_USEC`), so one late
/// turn of the loop does not count as a hang. `None` when no watchdog is asked of this
/// process (unset, zero, or `WATCHDOG_PID` names another process); a malformed value is
/// logged and treated as unset.
pub fn watchdog_interval() -> Option<Duration> {
    let usec = std::env::var(WATCHDOG_USEC).ok();
    let pid = std::env::var(WATCHDOG_PID).ok();
    match parse_watchdog(usec.as_deref(), pid.as_deref(), std::process::id()) {
        Ok(period) => period,
        Err(e) => {
            crate::warn!("ignoring the watchdog request: {e}");
            None
        }
    }
}

/// The pure core of [`watchdog_interval`]: the ping period for `WATCHDOG_USEC` and
/// `WATCHDOG_PID` as seen by the process `our_pid`.
pub fn parse_watchdog(
    usec: Option<&str>,
    pid: Option<&str>,
    our_pid: u32,
) -> Result<Option<Duration>, String> {
    let Some(usec) = usec else {
        return Ok(None);
    };
    let usec: u64 = usec
        .parse()
        .map_err(|_| format!("{WATCHDOG_USEC}={usec:?} is not a number of microseconds"))?;
    if usec == 0 {
        return Ok(None);
    }
    if let Some(pid) = pid {
        let pid: u32 = pid
            .parse()
            .map_err(|_| format!("{WATCHDOG_PID}={pid:?} is not a process id"))?;
        if pid != our_pid {
            return Ok(None);
        }
    }
    Ok(Some(Duration::from_micros((usec / 2).max(1))))
}

/// When the next ping is due; the loop includes [`WatchdogTimer::deadline`] in its poll
/// timeout and calls [`WatchdogTimer::due`] every turn.
#[derive(Debug, Clone)]
pub struct WatchdogTimer {
    period: Duration,
    next: Instant,
}

impl WatchdogTimer {
    /// A timer whose first ping is due at once.
    pub fn new(period: Duration, now: Instant) -> WatchdogTimer {
        WatchdogTimer { period, next: now }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// When the loop must wake up at the latest.
    pub fn deadline(&self) -> Instant {
        self.next
    }

    /// True when a ping is due at `now`; the next one is then due one period later (counted
    /// from `now`, so a stalled loop does not ping in a burst when it resumes).
    pub fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.period;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_the_interval() {
        assert_eq!(
            parse_watchdog(Some("30000000"), None, 7),
            Ok(Some(Duration::from_secs(15)))
        );
        assert_eq!(
            parse_watchdog(Some("30000000"), Some("7"), 7),
            Ok(Some(Duration::from_secs(15)))
        );
        assert_eq!(
            parse_watchdog(Some("1"), None, 7),
            Ok(Some(Duration::from_micros(1)))
        );
    }

    #[test]
    fn not_for_us() {
        assert_eq!(parse_watchdog(None, None, 7), Ok(None));
        assert_eq!(parse_watchdog(Some("0"), None, 7), Ok(None));
        assert_eq!(parse_watchdog(Some("30000000"), Some("8"), 7), Ok(None));
        assert_eq!(parse_watchdog(None, Some("7"), 7), Ok(None));
    }

    #[test]
    fn malformed_values_are_errors() {
        for (usec, pid) in [
            ("x", None),
            ("-5", None),
            ("", None),
            ("99999999999999999999999", None),
            ("30000000", Some("me")),
        ] {
            let err = parse_watchdog(Some(usec), pid, 7).unwrap_err();
            assert!(err.contains("WATCHDOG_"), "{err}");
        }
    }

    #[test]
    fn timer_pings_once_per_period() {
        let start = Instant::now();
        let period = Duration::from_secs(15);
        let mut timer = WatchdogTimer::new(period, start);
        assert_eq!(timer.deadline(), start);
        assert!(timer.due(start));
        assert!(!timer.due(start));
        assert_eq!(timer.deadline(), start + period);
        assert!(!timer.due(start + period - Duration::from_millis(1)));
        assert!(timer.due(start + period));
        // A loop that stalled for three periods pings once, then waits a full period.
        let late = start + period * 4;
        assert!(timer.due(late));
        assert!(!timer.due(late + Duration::from_secs(1)));
        assert_eq!(timer.deadline(), late + period);
    }
}
