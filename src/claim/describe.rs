//! Who holds a lock or a slot, described for people: the waiting line, `status`,
//! `watch` and `break`.

use serde_json::{json, Value};

use crate::consul::{Client, KvPair, QueryOptions};

/// One holder of a lock or slot.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub session: String,
    /// The key that names this holder: the lock key or the contender key.
    pub key: String,
    pub name: Option<String>,
    pub node: Option<String>,
    pub ttl: Option<String>,
    pub lock_delay_ns: Option<u64>,
    /// The stored value: JSON when it parses, else text.
    pub value: Value,
    /// From conlock's default value (`started`), when present.
    pub held_since: Option<String>,
}

impl Holder {
    pub fn to_json(&self) -> Value {
        json!({
            "session": self.session,
            "key": self.key,
            "name": self.name,
            "node": self.node,
            // Nanoseconds, as every duration in status --json (Consul gives the TTL as text).
            "ttl_ns": self.ttl.as_deref().and_then(|t| crate::duration::parse(t).ok()).map(|d| d.as_nanos() as u64),
            "lock_delay_ns": self.lock_delay_ns,
            "value": self.value,
            "held_since": self.held_since,
        })
    }

    /// `host pid 12 (session "name")`, for one-line messages. A value that is not
    /// conlock's JSON stands in for the host, shortened.
    pub fn describe(&self) -> String {
        let name = self.name.as_deref().filter(|n| !n.is_empty());
        match (self.who(), name) {
            (Some(w), Some(n)) => format!("{w} (session \"{n}\")"),
            (Some(w), None) => format!("{w} (session {})", self.session),
            (None, Some(n)) => format!("session \"{n}\""),
            (None, None) => format!("session {}", self.session),
        }
    }

    /// `session ID of host pid 12 ("name")`: the session first, for `break`.
    pub fn describe_session(&self) -> String {
        let mut s = format!("session {}", self.session);
        if let Some(w) = self.who() {
            s.push_str(&format!(" of {w}"));
        }
        if let Some(n) = self.name.as_deref().filter(|n| !n.is_empty()) {
            s.push_str(&format!(" (\"{n}\")"));
        }
        s
    }

    /// `host pid 12`, or the value when it is not conlock's JSON (shortened).
    fn who(&self) -> Option<String> {
        match (&self.value, self.value.get("host").and_then(Value::as_str)) {
            (_, Some(h)) => {
                let pid = self
                    .value
                    .get("pid")
                    .map(|p| format!(" pid {p}"))
                    .unwrap_or_default();
                Some(format!("{h}{pid}"))
            }
            (Value::String(s), None) if !s.trim().is_empty() => {
                Some(s.trim().chars().take(40).collect())
            }
            _ => None,
        }
    }
}

pub fn decode_value(bytes: &[u8]) -> Value {
    if bytes.is_empty() {
        return Value::Null;
    }
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// Reads the holder `session` of `pair`, with its session's details.
pub fn holder(client: &Client, pair: &KvPair, session: &str) -> Holder {
    let info = client
        .session_info(session, QueryOptions::default())
        .ok()
        .and_then(|(s, _)| s);
    holder_with(pair, session, info)
}

/// The holder as far as conlock's own default value tells (host, pid, command, started,
/// lock-delay), without asking Consul. `None` when the value is not conlock's.
pub fn holder_from_value(pair: &KvPair, session: &str) -> Option<Holder> {
    let mut h = holder_with(pair, session, None);
    let delay = h.value.get("lock_delay")?.as_str()?;
    h.value.get("host")?;
    h.lock_delay_ns = Some(crate::duration::parse(delay).ok()?.as_nanos() as u64);
    Some(h)
}

fn holder_with(pair: &KvPair, session: &str, info: Option<crate::consul::SessionEntry>) -> Holder {
    let value = decode_value(pair.value_bytes());
    Holder {
        session: session.to_string(),
        key: pair.key.clone(),
        name: info.as_ref().map(|s| s.name.clone()),
        node: info.as_ref().map(|s| s.node.clone()),
        ttl: info
            .as_ref()
            .map(|s| s.ttl.clone())
            .filter(|t| !t.is_empty()),
        lock_delay_ns: info.as_ref().map(|s| s.lock_delay),
        held_since: value
            .get("started")
            .and_then(Value::as_str)
            .map(str::to_string),
        value,
    }
}
