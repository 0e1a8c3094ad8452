//! When a lock waiter may try again after its acquire was refused with no holder (a
//! lock-delay from an invalidated session). During a lock-delay nothing changes on the
//! server, so a blocking query cannot say when it ends; instead the waiter remembers the
//! holder's `LockDelay` (read once per holder session) and the moment it saw the key
//! freed, sleeps until about then and tries once.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::consul::{Client, KvPair, PutOptions, CONSUL_MAX_LOCK_DELAY, LOCK_FLAGS};

/// The field added to conlock's default value in a lock key freed by an invalidated
/// session: when the lock-delay ends at the latest (RFC 3339 UTC). Consul keeps the
/// lock-delay to itself, so this is how `status` can tell.
pub const UNTIL_FIELD: &str = "lock_delay_until";

/// The end of the lock-delay recorded in a key's value, if any.
pub fn recorded_until(value: &Value) -> Option<SystemTime> {
    crate::ui::parse_timestamp(value.get(UNTIL_FIELD)?.as_str()?)
}

/// In a lock key that an invalidation just freed (no holder), records when the
/// lock-delay ends: now plus `delay`, or the lock-delay conlock's value recorded. Only in
/// conlock's default value (another holder's value is not ours to change), by
/// check-and-set on `pair` (a new holder's key stays intact). Returns true when the key
/// says it now, false when it was not written (the caller may delete the key instead).
pub fn record_until(client: &Client, pair: &KvPair, delay: Option<Duration>) -> bool {
    if pair.holder().is_some() || pair.flags != LOCK_FLAGS {
        return false;
    }
    let Ok(Value::Object(mut value)) = serde_json::from_slice::<Value>(pair.value_bytes()) else {
        return false;
    };
    if value.contains_key(UNTIL_FIELD) {
        return true;
    }
    let recorded = value
        .get("lock_delay")
        .and_then(Value::as_str)
        .and_then(|d| crate::duration::parse(d).ok());
    if !value.contains_key("host") || recorded.is_none() {
        return false;
    }
    let Some(delay) = delay.or(recorded) else {
        return false;
    };
    let until = SystemTime::now() + delay.min(CONSUL_MAX_LOCK_DELAY);
    value.insert(UNTIL_FIELD.into(), crate::ui::timestamp(until).into());
    let put = PutOptions {
        flags: LOCK_FLAGS,
        cas: Some(pair.modify_index),
        ..Default::default()
    };
    let bytes = serde_json::to_vec(&value).expect("json");
    matches!(client.kv_put(&pair.key, &bytes, put), Ok(true))
}
/// Refused again after the computed end (clock steps, a key freed earlier than seen):
/// short, bounded retries.
const AFTER_END_FIRST: Duration = Duration::from_millis(10);
const AFTER_END_MAX: Duration = Duration::from_millis(200);
/// No holder was seen (we arrived during the delay): back off up to about 1 s.
const UNKNOWN_FIRST: Duration = Duration::from_millis(20);
const UNKNOWN_MAX: Duration = Duration::from_secs(1);

/// The next try after a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub after: Duration,
    /// When the lock-delay ends, if known (wall clock, for messages and events).
    pub until: Option<SystemTime>,
}

#[derive(Debug, Default)]
pub struct DelayTracker {
    /// The current holder's session and lock-delay (`None`: unknown).
    holder: Option<(String, Option<Duration>)>,
    /// When we saw the key freed, and the lock-delay its last holder had.
    freed: Option<(Instant, SystemTime, Duration)>,
    backoff: Option<Duration>,
}

impl DelayTracker {
    /// Is `session` a holder we have not looked up yet?
    pub fn is_new_holder(&self, session: &str) -> bool {
        self.holder.as_ref().map(|(s, _)| s.as_str()) != Some(session)
    }

    /// A (new) holder and its session's `LockDelay`, if it could be read.
    pub fn held_by(&mut self, session: &str, lock_delay: Option<Duration>) {
        self.holder = Some((
            session.to_string(),
            lock_delay.map(|d| d.min(CONSUL_MAX_LOCK_DELAY)),
        ));
        self.freed = None;
        self.backoff = None;
    }

    /// The key was seen without a holder (released, invalidated or deleted).
    pub fn saw_free(&mut self) {
        if let Some((_, Some(delay))) = self.holder.take() {
            self.freed = Some((Instant::now(), SystemTime::now(), delay));
            self.backoff = None;
        }
    }

    /// The acquire was refused while the key had no holder: how long to wait.
    pub fn refused(&mut self) -> Retry {
        if let Some((seen, wall, delay)) = self.freed {
            let end = seen + delay;
            let now = Instant::now();
            if now < end {
                return Retry {
                    after: end - now,
                    until: Some(wall + delay),
                };
            }
            let after = self.next_backoff(AFTER_END_FIRST, AFTER_END_MAX);
            return Retry {
                after,
                until: Some(wall + delay),
            };
        }
        Retry {
            after: self.next_backoff(UNKNOWN_FIRST, UNKNOWN_MAX),
            until: None,
        }
    }

    fn next_backoff(&mut self, first: Duration, max: Duration) -> Duration {
        let d = self.backoff.map_or(first, |b| (b * 2).min(max));
        self.backoff = Some(d);
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_until_the_end_then_backs_off_briefly() {
        let mut t = DelayTracker::default();
        t.held_by("s1", Some(Duration::from_secs(3)));
        t.saw_free();
        let r = t.refused();
        assert!(r.after > Duration::from_millis(2900) && r.after <= Duration::from_secs(3));
        assert!(r.until.is_some());
        // Past the end (simulated by a zero delay): short bounded retries.
        let mut t = DelayTracker::default();
        t.held_by("s1", Some(Duration::ZERO));
        t.saw_free();
        let steps: Vec<_> = (0..8).map(|_| t.refused().after).collect();
        assert_eq!(steps[0], AFTER_END_FIRST);
        assert!(steps.iter().all(|&d| d <= AFTER_END_MAX));
    }

    #[test]
    fn unknown_delay_backs_off_to_a_second() {
        let mut t = DelayTracker::default();
        t.saw_free();
        let steps: Vec<_> = (0..12).map(|_| t.refused()).collect();
        assert!(steps.iter().all(|r| r.until.is_none()));
        assert_eq!(steps[0].after, UNKNOWN_FIRST);
        assert_eq!(steps[11].after, UNKNOWN_MAX);
        // A holder without a readable lock-delay leaves it unknown.
        let mut t = DelayTracker::default();
        t.held_by("s", None);
        t.saw_free();
        assert_eq!(t.refused().until, None);
    }

    #[test]
    fn lock_delay_is_capped_like_consul() {
        let mut t = DelayTracker::default();
        t.held_by("s", Some(Duration::from_secs(600)));
        t.saw_free();
        assert!(t.refused().after <= CONSUL_MAX_LOCK_DELAY);
        // Once freed, even the same session counts as new (it may hold again).
        assert!(t.is_new_holder("s"));
        t.held_by("s", None);
        assert!(!t.is_new_holder("s") && t.is_new_holder("x"));
    }
}
