//! A token bucket over a time given to it (no clock reads): how many messages of one kind
//! may pass per second, with a burst. Used per call for relayed notifications, in the
//! gateway's core and in the aggregator worker alike.

use std::time::Instant;

#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_sec: u32,
    burst: u32,
    /// Tokens left, in thousandths (so refills below one per millisecond add up).
    milli_tokens: u64,
    refilled: Option<Instant>,
}

impl TokenBucket {
    /// A full bucket: `burst` messages at once, then `per_sec` a second.
    pub fn new(per_sec: u32, burst: u32) -> TokenBucket {
        TokenBucket {
            per_sec,
            burst: burst.max(1),
            milli_tokens: u64::from(burst.max(1)) * 1000,
            refilled: None,
        }
    }

    /// Whether one more message may pass at `now` (taking its token if so).
    pub fn take(&mut self, now: Instant) -> bool {
        if let Some(then) = self.refilled {
            let ms = now.saturating_duration_since(then).as_millis();
            let gained = u64::try_from(ms)
                .unwrap_or(u64::MAX)
                .saturating_mul(u64::from(self.per_sec));
            self.milli_tokens = self
                .milli_tokens
                .saturating_add(gained)
                .min(u64::from(self.burst) * 1000);
        }
        self.refilled = Some(now);
        if self.milli_tokens >= 1000 {
            self.milli_tokens -= 1000;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn burst_then_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(10, 3);
        assert!((0..3).all(|_| b.take(t0)));
        assert!(!b.take(t0), "the burst is spent");
        // 100 ms at 10/s: one more.
        assert!(b.take(t0 + Duration::from_millis(100)));
        assert!(!b.take(t0 + Duration::from_millis(100)));
        // A long pause refills to the burst, never beyond.
        let later = t0 + Duration::from_secs(3600);
        assert!((0..3).all(|_| b.take(later)));
        assert!(!b.take(later));
        // Time going backwards (a stale `now`) gives nothing and takes nothing away.
        assert!(!b.take(t0));
    }

    #[test]
    fn zero_rate_is_the_burst_only() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(0, 2);
        assert!(b.take(t0) && b.take(t0));
        assert!(!b.take(t0 + Duration::from_secs(10)));
    }
}
