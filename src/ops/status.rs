//! `conlock status`: who holds a lock or semaphore. Exit 0 held, 1 free.

use std::time::SystemTime;

use super::{inspect, Holder, Snapshot, Target};
use crate::claim::Store;
use crate::error::Result;

pub fn run(store: &Store, target: &Target, json: bool) -> Result<i32> {
    let (snap, _) = inspect(store, target, 0)?;
    let text = if json {
        format!(
            "{}\n",
            serde_json::to_string_pretty(&snap.to_json()).expect("json")
        )
    } else {
        render(&snap, SystemTime::now())
    };
    crate::ui::out(text)?;
    Ok(snap.exit_code())
}

/// The human-readable report.
pub fn render(snap: &Snapshot, now: SystemTime) -> String {
    let mut rows: Vec<(String, String)> = Vec::new();
    match snap {
        Snapshot::Lock {
            key,
            holder,
            lock_index,
            fencing_token,
            lock_delay,
            waiting,
            fencing,
        } => {
            rows.push(("lock".into(), key.clone()));
            match holder {
                None => match lock_delay {
                    None => rows.push(("state".into(), "free".into())),
                    Some(d) if d.cushion_of.is_some() => {
                        let up_to = d.up_to_ns.map_or_else(
                            || "its lock-delay".into(),
                            |ns| crate::duration::format(std::time::Duration::from_nanos(ns)),
                        );
                        rows.push((
                            "state".into(),
                            format!(
                                "free, but conlock waiters first wait {up_to} (the cushion of lease {})",
                                d.cushion_of.as_deref().unwrap_or("?")
                            ),
                        ));
                        rows.push((
                            "why".into(),
                            "the last conlock holder did not release the lock itself (its lease expired or was revoked, or its key was deleted): its command may have run on for its lock-delay; etcdctl waiters do not wait".into(),
                        ));
                        rows.push(("holder record".into(), value_text(&d.value)));
                    }
                    Some(d) => {
                        let up_to = d.up_to_ns.map_or_else(
                            || "the last holder's lock-delay (15s unless it set another)".into(),
                            |ns| {
                                format!(
                                    "up to {}",
                                    crate::duration::format(std::time::Duration::from_nanos(ns))
                                )
                            },
                        );
                        let end = crate::claim::lockdelay::recorded_until(&d.value);
                        match end {
                            Some(end) => {
                                let left = end.duration_since(now).unwrap_or_default();
                                rows.push((
                                    "state".into(),
                                    format!(
                                        "free, but in a lock-delay until about {} ({} from now): Consul refuses new holders until then",
                                        crate::ui::clock_time(end),
                                        crate::duration::format(std::time::Duration::from_secs(
                                            left.as_secs() + 1
                                        ))
                                    ),
                                ));
                                rows.push((
                                    "why".into(),
                                    "the last holder's session was invalidated (lost or broken) rather than released; the end is what the losing conlock or `break` recorded in the key".into(),
                                ));
                            }
                            None => {
                                rows.push((
                                    "state".into(),
                                    format!(
                                        "free, but a lock-delay of {up_to} may still block new holders"
                                    ),
                                ));
                                rows.push((
                                    "why".into(),
                                    "the last holder's session was invalidated (expired, broken or its node failed) rather than released; Consul does not tell when".into(),
                                ));
                            }
                        }
                        rows.push(("last value".into(), value_text(&d.value)));
                    }
                },
                Some(h) => {
                    rows.push(("state".into(), "held".into()));
                    holder_rows(&mut rows, h, now, "", *fencing != "ModifyIndex");
                    if *fencing == "ModifyIndex" {
                        rows.push(("lock index".into(), lock_index.to_string()));
                    }
                    rows.push((
                        "fencing token".into(),
                        format!("{fencing_token} ({fencing})"),
                    ));
                }
            }
            if let Some(w) = waiting {
                rows.push(("waiting".into(), w.to_string()));
            }
        }
        Snapshot::Semaphore {
            prefix,
            limit,
            holders,
            waiting,
            vanished,
            ..
        } => {
            rows.push(("semaphore".into(), prefix.clone()));
            let kept = vanished.as_ref().map_or(0, Vec::len);
            let kept_text = match kept {
                0 => String::new(),
                n => format!(", {n} kept for vanished holders"),
            };
            rows.push((
                "slots".into(),
                match limit {
                    Some(l) => format!("{} of {l} held{kept_text}", holders.len()),
                    None if vanished.is_some() => format!(
                        "{} held{kept_text}; the limit is not known ({} is gone: nobody queues)",
                        holders.len(),
                        crate::claim::etcd_semaphore::limit_key_of(prefix)
                    ),
                    None => format!(
                        "{} held; the limit is not known yet (no .lock)",
                        holders.len()
                    ),
                },
            ));
            rows.push(("waiting".into(), waiting.to_string()));
            for v in vanished.iter().flatten() {
                rows.push((
                    "vanished".into(),
                    format!(
                        "lease {} ({}) ended without releasing (expired, revoked or deleted): conlock waiters keep its slot for its lock-delay of {} after they see it",
                        v.session,
                        v.key,
                        crate::duration::format(std::time::Duration::from_nanos(v.lock_delay_ns))
                    ),
                ));
            }
            for (i, h) in holders.iter().enumerate() {
                rows.push((format!("holder {}", i + 1), String::new()));
                holder_rows(&mut rows, h, now, "  ", vanished.is_some());
            }
        }
    }
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    let mut out = String::new();
    for (k, v) in rows {
        if v.contains('\n') {
            out.push_str(&format!("{k}:\n"));
            for line in v.lines() {
                out.push_str(&format!("    {line}\n"));
            }
        } else {
            out.push_str(format!("{:<width$} {v}", format!("{k}:")).trim_end());
            out.push('\n');
        }
    }
    out
}

/// `no_times`: the store keeps no time of the acquisition, and conlock's value was
/// written when queueing (etcd).
fn holder_rows(
    rows: &mut Vec<(String, String)>,
    h: &Holder,
    now: SystemTime,
    indent: &str,
    no_times: bool,
) {
    let name = h
        .name
        .as_deref()
        .map(|n| format!(" \"{n}\""))
        .unwrap_or_default();
    rows.push((format!("{indent}session"), format!("{}{name}", h.session)));
    if let Some(node) = &h.node {
        rows.push((format!("{indent}node"), node.clone()));
    }
    let ttl = h.ttl.clone().unwrap_or_else(|| "none".into());
    let delay = h
        .lock_delay_ns
        .map(|ns| crate::duration::format(std::time::Duration::from_nanos(ns)))
        .unwrap_or_else(|| "?".into());
    rows.push((format!("{indent}ttl"), format!("{ttl}, lock-delay {delay}")));
    if let Some(since) = &h.held_since {
        let ago = held_for(since, now)
            .map(|s| format!(" ({s} ago)"))
            .unwrap_or_default();
        rows.push((format!("{indent}held since"), format!("{since}{ago}")));
    } else if no_times {
        rows.push((
            format!("{indent}held since"),
            "unknown (etcd keeps no time of the acquisition)".into(),
        ));
    } else {
        // Only conlock's default value records it: Consul keeps no times, only indexes.
        rows.push((
            format!("{indent}held since"),
            "unknown (the holder stores its own value)".into(),
        ));
    }
    rows.push((format!("{indent}value"), value_text(&h.value)));
}

fn value_text(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "(empty)".to_string(),
        serde_json::Value::String(s) => s.clone(),
        v => serde_json::to_string_pretty(v).expect("json"),
    }
}

/// `1h2m3s` since an RFC 3339 UTC timestamp as conlock writes it.
fn held_for(since: &str, now: SystemTime) -> Option<String> {
    let t = crate::ui::parse_timestamp(since)?;
    let d = now.duration_since(t).ok()?;
    Some(crate::duration::format(std::time::Duration::from_secs(
        d.as_secs(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn holder() -> Holder {
        Holder {
            session: "abc".into(),
            key: "k".into(),
            name: Some("conlock: job on h".into()),
            node: Some("n1".into()),
            ttl: Some("15s".into()),
            lock_delay_ns: Some(15_000_000_000),
            value: json!({"host": "h", "pid": 7, "started": "2026-11-21T13:45:26.123Z"}),
            held_since: Some("2026-11-21T13:45:26.123Z".into()),
        }
    }

    #[test]
    fn parses_our_timestamps() {
        let t = crate::ui::parse_timestamp("2026-11-21T13:45:26.123Z").unwrap();
        assert_eq!(crate::ui::timestamp(t), "2026-11-21T13:45:26.123Z");
        assert!(crate::ui::parse_timestamp("yesterday").is_none());
    }

    #[test]
    fn renders_held_lock_aligned() {
        let snap = Snapshot::Lock {
            key: "svc/.lock".into(),
            holder: Some(holder()),
            lock_index: 1,
            fencing_token: 42,
            lock_delay: None,
            waiting: None,
            fencing: "ModifyIndex",
        };
        let now = crate::ui::parse_timestamp("2026-11-21T13:47:26Z").unwrap()
            + Duration::from_millis(500);
        let text = render(&snap, now);
        assert!(text.contains("state:         held\n"), "{text}");
        assert!(text.contains("fencing token: 42 (ModifyIndex)\n"), "{text}");
        assert!(text.contains("(2m0s ago)"), "{text}");
        assert!(text.contains("lock-delay 15s"), "{text}");
        assert!(text.contains("\"pid\": 7"), "{text}");
    }

    #[test]
    fn holder_descriptions() {
        let mut h = holder();
        assert_eq!(h.describe(), "h pid 7 (session \"conlock: job on h\")");
        h.value = json!("consul-lock-holder-on-web-3");
        assert_eq!(
            h.describe(),
            "consul-lock-holder-on-web-3 (session \"conlock: job on h\")"
        );
        assert_eq!(
            h.describe_session(),
            "session abc of consul-lock-holder-on-web-3 (\"conlock: job on h\")"
        );
        h.value = serde_json::Value::Null;
        h.name = None;
        assert_eq!(h.describe(), "session abc");
        assert_eq!(h.describe_session(), "session abc");
    }

    #[test]
    fn json_schema_is_stable() {
        let snap = Snapshot::Semaphore {
            prefix: "db".into(),
            limit: Some(2),
            holders: vec![holder()],
            waiting: 3,
            fencing_token: 9,
            vanished: None,
        };
        let j = snap.to_json();
        assert_eq!(j["kind"], "semaphore");
        assert_eq!(j["limit"], 2);
        assert_eq!(j["held"], true);
        assert_eq!(j["waiting"], 3);
        assert_eq!(j["holders"][0]["session"], "abc");
        assert_eq!(j["holders"][0]["value"]["pid"], 7);
        // Every duration in nanoseconds.
        assert_eq!(j["holders"][0]["ttl_ns"], 15_000_000_000u64);
        assert_eq!(j["holders"][0]["lock_delay_ns"], 15_000_000_000u64);
    }
}
