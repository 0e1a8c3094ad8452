//! What `status`, `watch` and `break` read: a lock or a semaphore and its holders, as
//! neutral data (`Snapshot`). The reads themselves are the store's (Consul's KV here).

use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::describe::{decode_value, holder, Holder};
use super::etcd_lock::{parse_record, record_key, HolderRecord};
use super::etcd_semaphore::{contenders_of, limit_key_of, records_of};
use super::lockdelay;
use super::semaphore::LockState;
use super::store::Store;
use super::WATCH_WAIT;
use crate::consul::{
    next_index, Client, KvPair, QueryMeta, QueryOptions, LOCK_FLAGS, SEMAPHORE_FLAGS,
};
use crate::error::{Error, Result};
use crate::etcd::types::*;
use crate::etcd::{EtcdClient, EtcdError};

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
    /// The value left in the key (etcd: the holder record).
    pub value: Value,
    /// etcd: the lease of the vanished conlock holder whose cushion conlock waiters keep
    /// (its holder record is not released). None on Consul.
    pub cushion_of: Option<String>,
}

/// etcd: a semaphore holder that vanished without releasing (expired, revoked, key
/// deleted): its slot stays taken for conlock waiters until one has waited its
/// lock-delay.
#[derive(Debug, Clone, PartialEq)]
pub struct Vanished {
    pub session: String,
    pub key: String,
    pub lock_delay_ns: u64,
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
        /// Contenders in line behind the holder, when the store shows them (etcd).
        waiting: Option<usize>,
        /// What the fencing token is: `ModifyIndex` (Consul), `create revision` (etcd).
        fencing: &'static str,
    },
    Semaphore {
        prefix: String,
        limit: Option<u32>,
        holders: Vec<Holder>,
        waiting: usize,
        fencing_token: u64,
        /// etcd: vanished holders whose slots are kept for their cushion (None on Consul,
        /// whose semaphore keeps its cushion inside `.lock`).
        vanished: Option<Vec<Vanished>>,
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

    /// Sessions that ended without releasing and whose cushion conlock waiters keep
    /// (etcd's holder records): how `watch` tells a loss on etcd.
    pub fn cushion_sessions(&self) -> Vec<String> {
        match self {
            Snapshot::Lock { lock_delay, .. } => lock_delay
                .iter()
                .filter_map(|d| d.cushion_of.clone())
                .collect(),
            Snapshot::Semaphore { vanished, .. } => vanished
                .iter()
                .flatten()
                .map(|v| v.session.clone())
                .collect(),
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
            // etcd: no holder runs, but a vanished holder's command may still (its slot
            // is kept for its cushion).
            Snapshot::Semaphore {
                holders,
                vanished: Some(v),
                ..
            } if holders.is_empty() && !v.is_empty() => "lock-delay",
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
                waiting,
                ..
            } => {
                let mut j = json!({
                    "kind": "lock",
                    "key": key,
                    "state": self.state(),
                    "held": holder.is_some(),
                    "holder": holder.as_ref().map(Holder::to_json),
                    "holders": holder.iter().map(Holder::to_json).collect::<Vec<_>>(),
                    "lock_index": lock_index,
                    "modify_index": fencing_token,
                    "lock_delay": lock_delay.as_ref().map(|d| {
                        let mut o = json!({
                            "up_to_ns": d.up_to_ns,
                            "until": d.until,
                            "value": d.value,
                        });
                        if let Some(s) = &d.cushion_of {
                            o["cushion_of"] = json!(s);
                        }
                        o
                    }),
                });
                // Only stores that show their waiting line (etcd) say how long it is.
                if let Some(w) = waiting {
                    j["waiting"] = json!(w);
                }
                j
            }
            Snapshot::Semaphore {
                prefix,
                limit,
                holders,
                waiting,
                fencing_token,
                vanished,
            } => {
                let mut j = json!({
                    "kind": "semaphore",
                    "prefix": prefix,
                    "state": self.state(),
                    "limit": limit,
                    "held": !holders.is_empty(),
                    "holders": holders.iter().map(Holder::to_json).collect::<Vec<_>>(),
                    "waiting": waiting,
                    "modify_index": fencing_token,
                });
                if let Some(v) = vanished {
                    j["vanished"] = v
                        .iter()
                        .map(|v| {
                            json!({
                                "session": v.session,
                                "key": v.key,
                                "lock_delay_ns": v.lock_delay_ns,
                            })
                        })
                        .collect();
                }
                j
            }
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
                cushion_of: None,
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
        waiting: None,
        fencing: "ModifyIndex",
    })
}

/// Reads the target once: now (`since` 0), or once the store's index (etcd: revision)
/// has passed `since`, within `WATCH_WAIT`. Also returns the store's index of the
/// answer, for `next_since` and `invalidated_at`.
pub fn inspect(store: &Store, target: &Target, since: u64) -> Result<(Snapshot, u64)> {
    if let Store::Etcd(c) = store {
        return etcd_inspect(c, target, since);
    }
    let client = store.consul();
    let q = if since == 0 {
        QueryOptions::default()
    } else {
        QueryOptions::blocking(since, WATCH_WAIT)
    };
    let (snap, meta) = inspect_consul(client, target, q)?;
    Ok((snap, meta.index))
}

/// Whether conlock's own waiters keep a broken or vanished holder's cushion (etcd: the
/// store frees its keys at once, and only conlock waiters wait), rather than the store
/// applying a lock-delay to everyone (Consul).
pub fn waiters_keep_cushion(store: &Store) -> bool {
    matches!(store, Store::Etcd(_))
}

/// The `since` of the next read after one from `since` answered at `index`.
pub fn next_since(since: u64, index: u64) -> u64 {
    next_index(since, index)
}

/// Whether `session` was invalidated (lost, not released) at the store's index `index`:
/// Consul frees the key in the same raft index as the session change, so the session is
/// gone and the sessions table's index equals `index`.
pub fn invalidated_at(store: &Store, session: &str, index: u64) -> bool {
    // etcd: a loss shows as a cushion in the snapshot (`Snapshot::cushion_sessions`).
    if let Store::Etcd(_) = store {
        return false;
    }
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
    // etcd: the holder record, left unreleased, carries the cushion already.
    if let Store::Etcd(_) = store {
        return;
    }
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
                } else if c.modify_index == c.create_index {
                    // Unlisted but rewritten: a conlock holder that gave its slot back,
                    // its key not yet gone with its session (as the waiters see it).
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
                    vanished: None,
                },
                meta,
            ))
        }
    }
}

// etcd: the lock `NAME` (etcdctl's layout and the holder record `NAME.conlock`) and the
// semaphore `P` (claim/etcd_semaphore.rs), read into the same `Snapshot`.

/// How long a `watch` read waits for a change before it reads again anyway.
const ETCD_WATCH_READ: Duration = Duration::from_secs(30);

/// Reads the target now (`since` 0), or after the first change at a revision above
/// `since` (within `ETCD_WATCH_READ`); returns the snapshot and the read's revision.
fn etcd_inspect(c: &EtcdClient, target: &Target, since: u64) -> Result<(Snapshot, u64)> {
    if since > 0 {
        wait_change(c, target, since)?;
    }
    etcd_read(c, target)
}

/// The name a target reads (a lock's name or a semaphore's prefix).
fn name_of(target: &Target) -> &str {
    match target {
        Target::Key(n) | Target::Prefix(n) | Target::Semaphore(n) => n,
    }
}

/// Waits for an event after revision `since` in the contender keys `NAME/…`, the lock's
/// holder record or the semaphore's records and limit (all `E.conlock…`, `E` the escaped
/// name: apart from `NAME/`). Silence, a broken stream or a compacted start only end the
/// wait: the caller reads afresh.
fn wait_change(c: &EtcdClient, target: &Target, since: u64) -> Result<()> {
    let name = name_of(target);
    let reqs = [contenders_of(name), record_key(name)].map(|p| WatchCreateRequest {
        range_end: prefix_range_end(p.as_bytes()),
        key: p.into_bytes(),
        start_revision: since as i64 + 1,
        ..Default::default()
    });
    let mut stream = match c.watch_all(&reqs, ETCD_WATCH_READ) {
        Ok(s) => s,
        Err(EtcdError::Compacted { .. }) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    loop {
        match stream.next_response() {
            Ok(Some(r)) if !r.events.is_empty() => return Ok(()),
            Ok(Some(_)) => {}
            Ok(None) | Err(EtcdError::Timeout { .. }) | Err(EtcdError::Compacted { .. }) => {
                return Ok(())
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The lease of a contender key `NAME/<lease hex>`, as conlock shows sessions.
fn session_of(kv: &KeyValue) -> String {
    format!("{:x}", kv.lease)
}

/// A contender key's holder: its lease, its value (conlock's JSON, or etcdctl's empty
/// one), the lease's granted TTL when it can be read.
fn etcd_holder(c: &EtcdClient, kv: &KeyValue) -> Holder {
    let value = decode_value(&kv.value);
    let ttl = c
        .lease_time_to_live(kv.lease, false)
        .ok()
        .filter(|t| t.granted_ttl > 0)
        .map(|t| format!("{}s", t.granted_ttl));
    Holder {
        session: session_of(kv),
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        name: None,
        node: None,
        ttl,
        lock_delay_ns: value
            .get("lock_delay")
            .and_then(Value::as_str)
            .and_then(|d| crate::duration::parse(d).ok())
            .map(|d| d.as_nanos() as u64),
        // conlock writes its value when it queues, not when it starts to hold: etcd
        // keeps no time of the acquisition.
        held_since: None,
        value,
    }
}

/// The session (lease hex) a contender key names: its last path element.
fn session_in(key: &str) -> String {
    key.rsplit_once('/').map_or(key, |(_, s)| s).to_string()
}

fn etcd_read(c: &EtcdClient, target: &Target) -> Result<(Snapshot, u64)> {
    let name = name_of(target);
    // One txn: the contender keys oldest first, the lock's record, the semaphore's
    // records and limit.
    let req = TxnRequest {
        compare: vec![],
        success: vec![
            RequestOp::Range(RangeRequest {
                sort_order: SortOrder::Ascend,
                sort_target: SortTarget::Create,
                ..RangeRequest::prefix(contenders_of(name))
            }),
            RequestOp::Range(RangeRequest::key(record_key(name))),
            RequestOp::Range(RangeRequest::prefix(records_of(name))),
            RequestOp::Range(RangeRequest::key(limit_key_of(name))),
        ],
        failure: vec![],
    };
    let r = c.txn(&req)?;
    let range = |i: usize| match r.responses.get(i) {
        Some(ResponseOp::Range(g)) => g.kvs.clone(),
        _ => Vec::new(),
    };
    let (keys, lock_record, records, limit) = (range(0), range(1), range(2), range(3));
    let semaphore = match target {
        Target::Key(_) => false,
        Target::Semaphore(_) => true,
        // A prefix is a semaphore when its limit or a slot record is there.
        Target::Prefix(_) => !limit.is_empty() || !records.is_empty(),
    };
    let rev = r.header.revision as u64;
    if !semaphore {
        let record = lock_record.first().and_then(parse_record);
        // The cushion: a conlock holder's record is left but its key is gone (its end was
        // not its own release). conlock waiters wait its lock-delay before they hold.
        let cushion = record.filter(|rec| {
            !rec.released
                && rec.lock_delay_ms > 0
                && !keys.iter().any(|k| {
                    k.key == rec.key.as_bytes() && k.create_revision == rec.create_revision
                })
        });
        // The first key holds, as etcdctl counts; but a conlock contender (a value: etcdctl
        // writes none) that is first during a cushion is still waiting it out.
        let first = keys
            .first()
            .filter(|kv| cushion.is_none() || kv.value.is_empty());
        let holder = first.map(|kv| etcd_holder(c, kv));
        let lock_delay = match (&holder, cushion) {
            (None, Some(rec)) => Some(Box::new(LockDelayHint {
                up_to_ns: Some(rec.lock_delay_ms * 1_000_000),
                until: None,
                value: serde_json::to_value(&rec).unwrap_or(Value::Null),
                cushion_of: Some(session_in(&rec.key)),
            })),
            _ => None,
        };
        return Ok((
            Snapshot::Lock {
                key: name.to_string(),
                holder,
                lock_index: 0,
                fencing_token: first.map_or(0, |kv| kv.create_revision as u64),
                lock_delay,
                waiting: Some(keys.len() - usize::from(first.is_some())),
                fencing: "create revision",
            },
            rev,
        ));
    }
    let mut holders = Vec::new();
    let mut vanished = Vec::new();
    for kv in &records {
        let Ok(rec) = serde_json::from_slice::<HolderRecord>(&kv.value) else {
            continue;
        };
        match keys
            .iter()
            .find(|k| k.key == rec.key.as_bytes() && k.create_revision == rec.create_revision)
        {
            Some(k) => holders.push((k.create_revision, etcd_holder(c, k))),
            None => vanished.push(Vanished {
                session: session_in(&rec.key),
                key: rec.key.clone(),
                lock_delay_ns: rec.lock_delay_ms * 1_000_000,
            }),
        }
    }
    holders.sort_by_key(|(rev, _)| *rev);
    let waiting = keys.len() - holders.len();
    Ok((
        Snapshot::Semaphore {
            prefix: name.to_string(),
            limit: limit
                .first()
                .and_then(|kv| String::from_utf8_lossy(&kv.value).trim().parse().ok()),
            holders: holders.into_iter().map(|(_, h)| h).collect(),
            waiting,
            fencing_token: limit.first().map_or(0, |kv| kv.mod_revision as u64),
            vanished: Some(vanished),
        },
        rev,
    ))
}
