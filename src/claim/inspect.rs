//! What `status`, `watch` and `break` read: a lock or a semaphore and its holders, as
//! neutral data (`Snapshot`). The reads themselves are the store's (Consul's KV here).

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::describe::{decode_value, holder, Holder};
use super::lockdelay;
use super::semaphore::LockState;
use super::store::Store;
use super::WATCH_WAIT;
use crate::consul::{
    next_index, Client, KvPair, QueryMeta, QueryOptions, LOCK_FLAGS, SEMAPHORE_FLAGS,
};
use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A lock key (`--key K`, or `--prefix P --kind lock`: `P/.lock`).
    Key(String),
    /// A prefix whose kind is read from Consul: a semaphore when `P/.lock` or a contender
    /// key carries the semaphore flags, otherwise the lock `P/.lock`.
    Prefix(String),
    /// `--prefix P --kind semaphore`: a semaphore even when nothing under P shows it.
    Semaphore(String),
}

/// A lock key that exists without a holder. conlock and `consul lock` delete the key
/// when they release, so a key left behind was freed by an invalidated session (TTL
/// expiry, `break`, a failed health check), and Consul may refuse new holders for that
/// session's lock-delay. When it was invalidated cannot be read from Consul.
#[derive(Debug, Clone, PartialEq)]
pub struct LockDelayHint {
    /// The lock-delay the last holder recorded in its value (conlock's default value).
    pub up_to_ns: Option<u64>,
    /// When it ends at the latest, as the losing conlock or `break` recorded it in the
    /// value (RFC 3339 UTC); None when nobody did (consul lock, a holder that died).
    pub until: Option<String>,
    /// The value left in the key.
    pub value: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Snapshot {
    Lock {
        key: String,
        holder: Option<Holder>,
        lock_index: u64,
        fencing_token: u64,
        /// Set when the lock is free but a lock-delay may still block new holders.
        lock_delay: Option<Box<LockDelayHint>>,
    },
    Semaphore {
        prefix: String,
        limit: Option<u32>,
        holders: Vec<Holder>,
        waiting: usize,
        fencing_token: u64,
    },
}

impl Snapshot {
    pub fn is_held(&self) -> bool {
        match self {
            Snapshot::Lock { holder, .. } => holder.is_some(),
            Snapshot::Semaphore { holders, .. } => !holders.is_empty(),
        }
    }

    /// Sessions holding now, for change detection.
    pub fn holder_sessions(&self) -> Vec<String> {
        match self {
            Snapshot::Lock { holder, .. } => holder.iter().map(|h| h.session.clone()).collect(),
            Snapshot::Semaphore { holders, .. } => {
                holders.iter().map(|h| h.session.clone()).collect()
            }
        }
    }

    pub fn holders(&self) -> Vec<&Holder> {
        match self {
            Snapshot::Lock { holder, .. } => holder.iter().collect(),
            Snapshot::Semaphore { holders, .. } => holders.iter().collect(),
        }
    }

    /// `held`, `free`, or (locks only) `lock-delay`: free, but a lock-delay may still
    /// block new holders.
    pub fn state(&self) -> &'static str {
        match self {
            Snapshot::Lock {
                lock_delay: Some(_),
                holder: None,
                ..
            } => "lock-delay",
            s if s.is_held() => "held",
            _ => "free",
        }
    }

    /// The exit code of `status`: 0 held, 1 free, 2 free but possibly in a lock-delay
    /// (where `run --timeout 0s` may still be busy).
    pub fn exit_code(&self) -> i32 {
        match self.state() {
            "held" => 0,
            "free" => 1,
            _ => 2,
        }
    }

    /// The JSON of `status --json`, one schema per kind (docs/status.schema.json).
    pub fn to_json(&self) -> Value {
        match self {
            Snapshot::Lock {
                key,
                holder,
                lock_index,
                fencing_token,
                lock_delay,
            } => json!({
                "kind": "lock",
                "key": key,
                "state": self.state(),
                "held": holder.is_some(),
                "holder": holder.as_ref().map(Holder::to_json),
                "holders": holder.iter().map(Holder::to_json).collect::<Vec<_>>(),
                "lock_index": lock_index,
                "modify_index": fencing_token,
                "lock_delay": lock_delay.as_ref().map(|d| json!({
                    "up_to_ns": d.up_to_ns,
                    "until": d.until,
                    "value": d.value,
                })),
            }),
            Snapshot::Semaphore {
                prefix,
                limit,
                holders,
                waiting,
                fencing_token,
            } => json!({
                "kind": "semaphore",
                "prefix": prefix,
                "state": self.state(),
                "limit": limit,
                "held": !holders.is_empty(),
                "holders": holders.iter().map(Holder::to_json).collect::<Vec<_>>(),
                "waiting": waiting,
                "modify_index": fencing_token,
            }),
        }
    }
}

fn lock_snapshot(client: &Client, key: &str, pair: Option<&KvPair>) -> Result<Snapshot> {
    if let Some(p) = pair {
        if p.flags != LOCK_FLAGS {
            return Err(Error::Conflict(format!(
                "key {key:?} is {}, not a lock's",
                super::key_kind(p.flags)
            )));
        }
    }
    let lock_delay = pair
        .filter(|p| p.holder().is_none())
        .map(|p| {
            let value = decode_value(p.value_bytes());
            Box::new(LockDelayHint {
                up_to_ns: value
                    .get("lock_delay")
                    .and_then(Value::as_str)
                    .and_then(|d| crate::duration::parse(d).ok())
                    .map(|d| d.as_nanos() as u64),
                until: value
                    .get(lockdelay::UNTIL_FIELD)
                    .and_then(Value::as_str)
                    .map(str::to_string),
                value,
            })
        })
        // A recorded end that has passed: free (the key stays until the next holder).
        .filter(|h| {
            lockdelay::recorded_until(&h.value).map_or(true, |end| end > SystemTime::now())
        });
    Ok(Snapshot::Lock {
        key: key.to_string(),
        holder: pair.and_then(|p| p.holder().map(|s| holder(client, p, s))),
        lock_index: pair.map_or(0, |p| p.lock_index),
        fencing_token: pair.map_or(0, |p| p.modify_index),
        lock_delay,
    })
}

/// Reads the target once: now (`since` 0), or once the store's index (etcd: revision)
/// has passed `since`, within `WATCH_WAIT`. Also returns the store's index of the
/// answer, for `next_since` and `invalidated_at`.
pub fn inspect(store: &Store, target: &Target, since: u64) -> Result<(Snapshot, u64)> {
    let client = store.consul();
    let q = if since == 0 {
        QueryOptions::default()
    } else {
        QueryOptions::blocking(since, WATCH_WAIT)
    };
    let (snap, meta) = inspect_consul(client, target, q)?;
    Ok((snap, meta.index))
}

/// The `since` of the next read after one from `since` answered at `index`.
pub fn next_since(since: u64, index: u64) -> u64 {
    next_index(since, index)
}

/// Whether `session` was invalidated (lost, not released) at the store's index `index`:
/// Consul frees the key in the same raft index as the session change, so the session is
/// gone and the sessions table's index equals `index`.
pub fn invalidated_at(store: &Store, session: &str, index: u64) -> bool {
    match store
        .consul()
        .session_info(session, QueryOptions::default())
    {
        Ok((None, meta)) => meta.index == index,
        _ => false,
    }
}

/// After `break` destroyed the holder of `key`: records in the key until when the
/// holder's lock-delay (`delay`, if known) runs, so that `status` can tell (conlock's
/// default value only; best effort). Consul keeps the lock-delay to itself.
pub fn record_lock_delay_end(store: &Store, key: &str, delay: Option<Duration>) {
    let client = store.consul();
    if let Ok((Some(p), _)) = client.kv_get(key, QueryOptions::default()) {
        super::lockdelay::record_until(client, &p, delay);
    }
}

fn inspect_consul(
    client: &Client,
    target: &Target,
    q: QueryOptions,
) -> Result<(Snapshot, QueryMeta)> {
    match target {
        Target::Key(key) => {
            let (pair, meta) = client.kv_get(key, q)?;
            Ok((lock_snapshot(client, key, pair.as_ref())?, meta))
        }
        Target::Prefix(prefix) | Target::Semaphore(prefix) => {
            let (pairs, meta) = client.kv_list(prefix, q)?;
            let lock_key = format!("{prefix}/.lock");
            let lock = pairs.iter().find(|p| p.key == lock_key);
            let contenders: Vec<&KvPair> = pairs
                .iter()
                .filter(|p| {
                    p.flags == SEMAPHORE_FLAGS
                        && p.key != lock_key
                        && p.key.rsplit_once('/').map(|(d, _)| d) == Some(prefix)
                })
                .collect();
            let found_semaphore =
                lock.map_or(!contenders.is_empty(), |l| l.flags == SEMAPHORE_FLAGS);
            if let (Target::Semaphore(_), Some(l)) = (target, lock) {
                if l.flags != SEMAPHORE_FLAGS {
                    return Err(Error::Conflict(format!(
                        "{lock_key} is {}, not a semaphore's; drop --kind semaphore to read it as a lock",
                        super::key_kind(l.flags)
                    )));
                }
            }
            if !found_semaphore && !matches!(target, Target::Semaphore(_)) {
                return Ok((lock_snapshot(client, &lock_key, lock)?, meta));
            }
            let state = match lock {
                Some(l) => LockState::decode(l.value_bytes(), &lock_key)?,
                None => None,
            };
            let held: Vec<String> = state
                .as_ref()
                .map(|s| s.holders.keys().cloned().collect())
                .unwrap_or_default();
            let mut holders = Vec::new();
            let mut waiting = 0;
            for c in &contenders {
                let Some(s) = c.holder() else { continue };
                if held.iter().any(|h| h == s) {
                    holders.push(holder(client, c, s));
                } else {
                    waiting += 1;
                }
            }
            Ok((
                Snapshot::Semaphore {
                    prefix: prefix.clone(),
                    limit: state.map(|s| s.limit),
                    holders,
                    waiting,
                    fencing_token: lock.map_or(0, |l| l.modify_index),
                },
                meta,
            ))
        }
    }
}
