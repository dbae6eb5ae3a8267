//! A log line a peer can trigger at will (an NBD client's connection flood, a target's stream of
//! asynchronous events) is logged at most once per interval, with a count of the ones left out.

use std::time::{Duration, Instant};

/// At most one log line per `every` for a condition a peer (an NBD client, an SRP target) can cause at will; counts the rest.
pub struct RateLimit {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// A limit of one line per `every`.
    pub const fn new(every: Duration) -> Self {
        RateLimit {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(lines suppressed since the last one)` when a line may be logged now.
    pub fn allow(&mut self, now: Instant) -> Option<u64> {
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < self.every)
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limit_counts_what_it_drops() {
        let mut r = RateLimit::new(Duration::from_secs(10));
        let t = Instant::now();
        assert_eq!(r.allow(t), Some(0));
        assert_eq!(r.allow(t + Duration::from_secs(1)), None);
        assert_eq!(r.allow(t + Duration::from_secs(2)), None);
        assert_eq!(r.allow(t + Duration::from_secs(11)), Some(2));
    }
}
