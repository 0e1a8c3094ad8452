//! Deadlines that also count time the machine spent suspended.
//!
//! `std::time::Instant` is CLOCK_MONOTONIC, which stops while the host sleeps; Consul's
//! clocks (TTL, lock-delay) do not. A holder's deadline on CLOCK_MONOTONIC could therefore
//! still lie ahead after a suspend while the server has already handed the lock on.
//! CLOCK_BOOTTIME counts the suspended time, and it is the same clock in every process of
//! the machine, so conlock and its guardian can exchange points in time as numbers.

use std::ops::{Add, Sub};
use std::time::Duration;

/// A point on CLOCK_BOOTTIME.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BootInstant(Duration);

impl BootInstant {
    pub fn now() -> BootInstant {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // Cannot fail for a valid clock id and pointer (Linux ≥ 2.6.39).
        unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        BootInstant(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// The same moment as a CLOCK_MONOTONIC `Instant` (their offset is fixed while awake).
    pub fn from_instant(i: std::time::Instant) -> BootInstant {
        let (now, boot) = (std::time::Instant::now(), BootInstant::now());
        if i >= now {
            boot + (i - now)
        } else {
            boot - (now - i)
        }
    }

    /// The same moment as a CLOCK_MONOTONIC `Instant`, as seen now: a suspend since
    /// `self` was taken brings it closer.
    pub fn to_instant(self) -> std::time::Instant {
        let (now, boot) = (std::time::Instant::now(), BootInstant::now());
        if self >= boot {
            now + (self.0 - boot.0)
        } else {
            now.checked_sub(boot.0 - self.0).unwrap_or(now)
        }
    }

    /// Nanoseconds since boot, for passing to another process.
    pub fn as_nanos(self) -> u64 {
        self.0.as_nanos() as u64
    }

    pub fn from_nanos(ns: u64) -> BootInstant {
        BootInstant(Duration::from_nanos(ns))
    }

    /// Zero when `earlier` is later than `self`.
    pub fn saturating_duration_since(self, earlier: BootInstant) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    pub fn elapsed(self) -> Duration {
        BootInstant::now().saturating_duration_since(self)
    }

    /// How long from now until `self` (zero if it has passed).
    pub fn remaining(self) -> Duration {
        self.saturating_duration_since(BootInstant::now())
    }

    pub fn has_passed(self) -> bool {
        BootInstant::now() >= self
    }
}

impl Add<Duration> for BootInstant {
    type Output = BootInstant;
    fn add(self, d: Duration) -> BootInstant {
        BootInstant(self.0 + d)
    }
}

impl Sub<Duration> for BootInstant {
    type Output = BootInstant;
    /// Saturates at the boot time itself.
    fn sub(self, d: Duration) -> BootInstant {
        BootInstant(self.0.saturating_sub(d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advances_and_round_trips() {
        let a = BootInstant::now();
        std::thread::sleep(Duration::from_millis(2));
        let b = BootInstant::now();
        assert!(b > a);
        assert!(b.saturating_duration_since(a) >= Duration::from_millis(2));
        assert_eq!(a.saturating_duration_since(b), Duration::ZERO);
        assert_eq!(BootInstant::from_nanos(b.as_nanos()), b);
        assert!((a + Duration::from_secs(5)).remaining() > Duration::from_secs(4));
        assert!((a - Duration::from_secs(1)).has_passed());
        let later = std::time::Instant::now() + Duration::from_secs(3);
        let r = BootInstant::from_instant(later).remaining();
        assert!(r > Duration::from_millis(2900) && r <= Duration::from_secs(3));
        let earlier = std::time::Instant::now() - Duration::from_millis(10);
        assert!(BootInstant::from_instant(earlier).has_passed());
    }
}
