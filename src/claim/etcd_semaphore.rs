//! The semaphore on etcd (`conlock sem --backend etcd --prefix P --limit N`). etcdctl
//! has no semaphore, so the layout is conlock's own, shaped like the lock's. `E` is `P`
//! with `%` and `/` escaped (`%25`, `%2F`), as in the lock's holder record `E.conlock`:
//! a key without `/` lies under no lock's or semaphore's prefix (`X/`), and `%` followed
//! by a letter occurs in no escaped name, so no name's keys lie in another's ranges.
//!
//! - `P/<lease hex>`: one contender key per conlock, on its lease (its place in line:
//!   lower create revision first);
//! - `E.conlock%slot-<lease hex>`: a slot record, written (guarded by the contender
//!   key's create revision) right before the command starts and deleted together with
//!   the contender key on a voluntary release. Records are the slots: at most N exist. A
//!   record whose contender key is gone is a vanished holder that did not let go itself
//!   (expired, revoked, key deleted): its command may still run for its lock-delay after
//!   its key went, so its slot stays taken until a waiter has waited that long after it
//!   first saw the key gone; that waiter then deletes the record (the cushion);
//! - `E.conlock%limit`: N, compared in the txn that creates a contender key; created if
//!   absent, replaced only while no contender key exists, deleted by the last one out.
//!
//! A contender takes a slot when it is among the N oldest contender keys and fewer than
//! N records exist, in one txn guarded by its key's create revision and by no record
//! having changed since the read that decided it. See docs/safety.md, "etcd".

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::etcd_lock::{
    confirm_own_key, monitor_own_key, own_key_rev, range_of, record_key, show, take_back,
    while_waiting, HolderRecord, Waited,
};
use super::store::{lease_id, EtcdReleasing, Store, StoreError};
use super::{
    self as claim, Claim, ClaimSpec, Held, HolderValue, LossReport, MonitorPolicy, SessionHandle,
    WaitDisplay,
};
use crate::clock::BootInstant;
use crate::error::{Error, Result};
use crate::etcd::types::*;
use crate::etcd::{EtcdClient, EtcdError};
use crate::ui;

pub struct EtcdSemaphore {
    /// The prefix `P` (contender keys are `P/<lease hex>`).
    pub prefix: String,
    pub limit: u32,
    pub value: HolderValue,
    /// Our key's create revision once acquired (0: not known).
    my_rev: AtomicI64,
    /// The revision to watch our key from (the acquisition's).
    held_rev: AtomicI64,
    /// A slot write was sent while waiting: it may have landed.
    maybe_took: AtomicBool,
}

/// Whether both `key` and `record` are gone (read through `c`'s retries).
fn released_already(c: &mut EtcdReleasing, key: &str, record: &str) -> bool {
    [key, record].iter().all(|k| {
        c.retry(|c| c.range(&RangeRequest::key(k.to_string())))
            .is_ok_and(|g| g.kvs.is_empty())
    })
}

/// The contender keys' prefix of semaphore `prefix`: `P/`.
pub fn contenders_of(prefix: &str) -> String {
    format!("{prefix}/")
}

/// The slot records' prefix of semaphore `prefix`: `E.conlock%slot-` (`E`: `P` escaped;
/// no `/`, so under no lock's or semaphore's prefix).
pub fn records_of(prefix: &str) -> String {
    format!("{}%slot-", record_key(prefix))
}

/// The key that stores semaphore `prefix`'s limit: `E.conlock%limit`.
pub fn limit_key_of(prefix: &str) -> String {
    format!("{}%limit", record_key(prefix))
}

/// How long a waiter's watch may stay silent before it looks again (one txn and a new
/// watch): a watch on a member that froze is silent, as in the lock's waiter (its
/// `WAITER_READ`); the holder's monitor keeps the longer `WATCH_READ`.
const WAITER_READ: Duration = Duration::from_secs(3);

/// `lease(key) == lease`: a key named after our lease but written by someone else, on
/// another lease or none, is not ours.
fn on_lease(key: impl Into<Vec<u8>>, lease: i64) -> Compare {
    Compare::new(key, CompareTarget::Lease(lease), CompareResult::Equal)
}

/// What one look (a txn guarded by our key) saw.
struct Look {
    /// Every contender key, oldest first.
    keys: Vec<KeyValue>,
    /// Every slot record with its key and mod revision.
    records: Vec<(KeyValue, Option<HolderRecord>)>,
    revision: i64,
}

impl Look {
    /// From the answers to `look_ranges`, read at `revision`.
    fn from(responses: &[ResponseOp], revision: i64) -> Look {
        let keys = range_of(responses.first()).map_or_else(Vec::new, |g| g.kvs.clone());
        let records = range_of(responses.get(1)).map_or_else(Vec::new, |g| {
            g.kvs
                .iter()
                .map(|kv| (kv.clone(), serde_json::from_slice(&kv.value).ok()))
                .collect()
        });
        Look {
            keys,
            records,
            revision,
        }
    }
}

/// A slot record is a vanished holder's when its contender key is gone (or is another
/// incarnation). A record conlock cannot read counts as taken (and never vanishes).
fn vanished(rec: &Option<HolderRecord>, keys: &[KeyValue]) -> bool {
    match rec {
        Some(r) => !keys
            .iter()
            .any(|k| k.key == r.key.as_bytes() && k.create_revision == r.create_revision),
        None => false,
    }
}

impl EtcdSemaphore {
    pub fn new(prefix: String, limit: u32, value: HolderValue) -> EtcdSemaphore {
        EtcdSemaphore {
            prefix,
            limit,
            value,
            my_rev: AtomicI64::new(0),
            held_rev: AtomicI64::new(0),
            maybe_took: AtomicBool::new(false),
        }
    }

    pub fn key_of(&self, sid: &str) -> String {
        format!("{}/{sid}", self.prefix)
    }

    fn record_key(&self, sid: &str) -> String {
        format!("{}{sid}", records_of(&self.prefix))
    }

    fn limit_key(&self) -> String {
        limit_key_of(&self.prefix)
    }

    fn conflict(&self, theirs: &[u8]) -> Error {
        Error::Conflict(format!(
            "semaphore {:?} has a limit of {} (in {}, set by its holders), not --limit {}: every user of one prefix must give the same limit (semaphore limit conflict: theirs {}, ours {})",
            self.prefix,
            show(theirs),
            self.limit_key(),
            self.limit,
            show(theirs),
            self.limit
        ))
    }

    /// Creates our key if `P.limit` says our limit (or finds it, after a txn whose answer
    /// was lost); creates or replaces `P.limit` when that is allowed. `Got(0)`: a key
    /// of our name is on another lease or none (not ours): queue again with a new lease.
    /// A created key comes with the first look, read in the same txn right after the put
    /// (what `look` reads then: one txn less per contender).
    fn enqueue(
        &self,
        c: &EtcdClient,
        sid: &str,
        lease: i64,
        deadline: Option<Instant>,
    ) -> Result<Waited<(i64, Option<Look>)>> {
        let my_key = self.key_of(sid);
        let limit = self.limit.to_string();
        let req = TxnRequest {
            compare: vec![
                Compare::create_revision(my_key.clone(), CompareResult::Equal, 0),
                Compare::new(
                    self.limit_key(),
                    CompareTarget::Value(limit.clone().into_bytes()),
                    CompareResult::Equal,
                ),
            ],
            success: [RequestOp::Put(PutRequest {
                lease,
                ..PutRequest::new(my_key.clone(), self.value.bytes())
            })]
            .into_iter()
            .chain(self.look_ranges())
            .collect(),
            failure: vec![
                RequestOp::Range(RangeRequest::key(my_key.clone())),
                RequestOp::Range(RangeRequest::key(self.limit_key())),
                RequestOp::Range(RangeRequest {
                    count_only: true,
                    ..RangeRequest::prefix(contenders_of(&self.prefix))
                }),
                RequestOp::Range(RangeRequest {
                    count_only: true,
                    ..RangeRequest::prefix(records_of(&self.prefix))
                }),
            ],
        };
        let r = match c.txn(&req) {
            // etcd refused the whole txn (nothing landed): the lease died before it; as
            // a key gone (0), so the caller queues again with a new lease.
            Err(e @ EtcdError::LeaseNotFound { .. }) => {
                ui::notice(format_args!("{e}; queueing with a new lease"));
                return Ok(Waited::Got((0, None)));
            }
            r => r,
        };
        let r = match while_waiting(r, deadline)? {
            Waited::Got(r) => r,
            Waited::Retry => return Ok(Waited::Retry),
            Waited::Busy => return Ok(Waited::Busy),
        };
        if r.succeeded {
            let look = Look::from(&r.responses[1..], r.header.revision);
            return Ok(Waited::Got((r.header.revision, Some(look))));
        }
        match range_of(r.responses.first()).and_then(|g| g.kvs.first()) {
            // Ours already (a txn whose answer was lost); P.limit was ours then.
            Some(kv) if kv.lease == lease => return Ok(Waited::Got((kv.create_revision, None))),
            Some(kv) => {
                // Not ours: treated as gone (a new lease gives a new key name).
                ui::notice(format_args!(
                    "the key {my_key} exists on lease {:x}, not on ours ({sid}); not using it",
                    kv.lease
                ));
                return Ok(Waited::Got((0, None)));
            }
            None => {}
        }
        let contenders = range_of(r.responses.get(2)).map_or(0, |g| g.count);
        let records = range_of(r.responses.get(3)).map_or(0, |g| g.count);
        let put_limit = RequestOp::Put(PutRequest::new(self.limit_key(), limit.clone()));
        let fix = match range_of(r.responses.get(1)).and_then(|g| g.kvs.first()) {
            // No limit yet: ours, if nobody set one meanwhile.
            None => TxnRequest {
                compare: vec![Compare::create_revision(
                    self.limit_key(),
                    CompareResult::Equal,
                    0,
                )],
                success: vec![put_limit],
                failure: vec![],
            },
            Some(kv) if kv.value == limit.as_bytes() => return Ok(Waited::Retry),
            // Another limit left by users who are all gone (no contender key, and no
            // vanished holder's slot record: its command may still run under the old
            // limit for its cushion): ours replaces it.
            Some(kv) if contenders == 0 && records == 0 => TxnRequest {
                compare: vec![
                    Compare::new(
                        self.limit_key(),
                        CompareTarget::Mod(kv.mod_revision),
                        CompareResult::Equal,
                    ),
                    Compare {
                        range_end: prefix_range_end(contenders_of(&self.prefix).as_bytes()),
                        ..Compare::create_revision(
                            contenders_of(&self.prefix),
                            CompareResult::Equal,
                            0,
                        )
                    },
                    Compare {
                        range_end: prefix_range_end(records_of(&self.prefix).as_bytes()),
                        ..Compare::create_revision(
                            records_of(&self.prefix),
                            CompareResult::Equal,
                            0,
                        )
                    },
                ],
                success: vec![put_limit],
                failure: vec![],
            },
            // Only vanished holders' slot records are left: their commands may still run
            // under that limit (for their cushion).
            Some(kv) if contenders == 0 => {
                return Err(Error::Conflict(format!(
                    "semaphore {:?} has a limit of {} (in {}), not --limit {}, and no holder is left, but {records} slot record(s) of holders that did not release are (under {}; their commands may still run under that limit): a run with --limit {} frees them once their lock-delay has passed, or delete them by hand (semaphore limit conflict: theirs {}, ours {})",
                    self.prefix,
                    show(&kv.value),
                    self.limit_key(),
                    self.limit,
                    records_of(&self.prefix),
                    show(&kv.value),
                    show(&kv.value),
                    self.limit
                )))
            }
            Some(kv) => return Err(self.conflict(&kv.value)),
        };
        match while_waiting(c.txn(&fix), deadline)? {
            Waited::Busy => Ok(Waited::Busy),
            // Either way, try again: the limit is now set, by us or by someone else.
            _ => Ok(Waited::Retry),
        }
    }

    /// One look: `None` when our key is gone (#11456) or on another lease, else every
    /// contender key and every slot record, atomically.
    fn look(
        &self,
        c: &EtcdClient,
        sid: &str,
        my_rev: i64,
    ) -> std::result::Result<Option<Look>, EtcdError> {
        let req = TxnRequest {
            compare: vec![
                Compare::create_revision(self.key_of(sid), CompareResult::Equal, my_rev),
                on_lease(self.key_of(sid), lease_id(sid).unwrap_or(0)),
            ],
            success: self.look_ranges().to_vec(),
            failure: vec![],
        };
        let r = c.txn(&req)?;
        if !r.succeeded {
            return Ok(None);
        }
        Ok(Some(Look::from(&r.responses, r.header.revision)))
    }

    /// What a look reads: every contender key, oldest first, and every slot record.
    fn look_ranges(&self) -> [RequestOp; 2] {
        [
            RequestOp::Range(RangeRequest {
                sort_order: SortOrder::Ascend,
                sort_target: SortTarget::Create,
                ..RangeRequest::prefix(contenders_of(&self.prefix))
            }),
            RequestOp::Range(RangeRequest::prefix(records_of(&self.prefix))),
        ]
    }

    /// Waits until we take a slot. `Ok(None)`: busy; `Err`: failed; `Ok(Some(None))`:
    /// our key is gone (queue again).
    fn turn(
        &self,
        c: &EtcdClient,
        session: &dyn SessionHandle,
        sid: &str,
        (my_rev, mut first_look): (i64, Option<Look>),
        deadline: Option<Instant>,
        wait: &WaitDisplay,
    ) -> Result<Option<Option<Held>>> {
        let my_key = self.key_of(sid);
        let my_record = self.record_key(sid);
        let limit = self.limit as usize;
        // When we first saw each vanished holder's record (by its key and mod revision):
        // its command is dead by then + its lock-delay.
        let mut first_seen: HashMap<(Vec<u8>, i64), Instant> = HashMap::new();
        loop {
            if session.lost().is_some() {
                return Ok(Some(None));
            }
            let sent = BootInstant::now();
            let look = match first_look.take() {
                Some(l) => l,
                None => match while_waiting(self.look(c, sid, my_rev), deadline)? {
                    Waited::Got(Some(l)) => l,
                    Waited::Got(None) => return Ok(Some(None)),
                    Waited::Retry => continue,
                    Waited::Busy => return Ok(None),
                },
            };
            // After the answer: whatever it showed gone went before now.
            let seen_at = Instant::now();
            if look
                .records
                .iter()
                .any(|(kv, _)| kv.key == my_record.as_bytes())
            {
                // Our record is there: a slot write whose answer was lost.
                return Ok(Some(Some(self.held(my_rev, look.revision, sent))));
            }
            let rank = look
                .keys
                .iter()
                .filter(|k| k.create_revision < my_rev)
                .count();
            let mut vanished_at: Vec<(&KeyValue, Instant, Duration)> = Vec::new();
            for (kv, rec) in &look.records {
                if vanished(rec, &look.keys) {
                    let at = *first_seen
                        .entry((kv.key.clone(), kv.mod_revision))
                        .or_insert(seen_at);
                    let ld = Duration::from_millis(rec.as_ref().map_or(0, |r| r.lock_delay_ms));
                    vanished_at.push((kv, at, ld));
                }
            }
            let now = Instant::now();
            let over: Vec<&KeyValue> = vanished_at
                .iter()
                .filter(|(_, at, ld)| now >= *at + *ld)
                .map(|(kv, _, _)| *kv)
                .collect();
            let taken = look.records.len() - over.len();
            if rank < limit && (taken < limit || !over.is_empty()) {
                // Take a slot (and free the vanished holders' whose cushion is over),
                // if no record changed since the look.
                let mut compare = vec![
                    Compare::create_revision(my_key.clone(), CompareResult::Equal, my_rev),
                    on_lease(my_key.clone(), lease_id(sid).unwrap_or(0)),
                    Compare {
                        range_end: prefix_range_end(records_of(&self.prefix).as_bytes()),
                        ..Compare::new(
                            records_of(&self.prefix),
                            CompareTarget::Mod(look.revision + 1),
                            CompareResult::Less,
                        )
                    },
                ];
                let mut success = Vec::new();
                for kv in &over {
                    compare.push(Compare::new(
                        kv.key.clone(),
                        CompareTarget::Mod(kv.mod_revision),
                        CompareResult::Equal,
                    ));
                    success.push(RequestOp::DeleteRange(DeleteRangeRequest::key(
                        kv.key.clone(),
                    )));
                    ui::verbose(format_args!(
                        "the cushion of vanished holder {} is over; its slot is free",
                        show(&kv.key)
                    ));
                }
                let take = taken < limit;
                if take {
                    let mine = HolderRecord {
                        key: my_key.clone(),
                        create_revision: my_rev,
                        lock_delay_ms: session.lock_delay().as_millis() as u64,
                        released: false,
                    };
                    success.push(RequestOp::Put(PutRequest::new(
                        my_record.clone(),
                        serde_json::to_vec(&mine).expect("json"),
                    )));
                }
                let sent = BootInstant::now();
                let req = TxnRequest {
                    compare,
                    success,
                    failure: vec![],
                };
                // Until we hold, any slot write sent may have landed (an answer that timed
                // out may still be applied): a waiter that gives up gives it back.
                if take {
                    self.maybe_took.store(true, Ordering::SeqCst);
                }
                match while_waiting(c.txn(&req), deadline)? {
                    Waited::Got(r) if r.succeeded && take => {
                        return Ok(Some(Some(self.held(my_rev, r.header.revision, sent))))
                    }
                    // Something changed (or only vanished slots were freed): look again.
                    Waited::Got(_) | Waited::Retry => continue,
                    Waited::Busy => return Ok(None),
                }
            }
            // Wait: for a deletion in the semaphore's keys, or for the next cushion's end.
            let next_free = vanished_at
                .iter()
                .filter(|_| rank < limit)
                .map(|(_, at, ld)| *at + *ld)
                .min();
            let holders = look.records.len() - vanished_at.len();
            let mut what = format!("{holders} of {} slots, {rank} ahead in line", self.limit);
            if let Some(t) = next_free {
                what.push_str(&format!(
                    ", a vanished holder's slot frees at about {}",
                    ui::clock_time(SystemTime::now() + t.saturating_duration_since(now))
                ));
                ui::verbose(format_args!(
                    "a holder of {} vanished without releasing (expired, revoked or deleted); keeping its lock-delay before its slot is reused",
                    self.describe()
                ));
            }
            wait.holder(Some(what));
            if claim::deadline_passed(deadline) {
                return Ok(None);
            }
            let mut read = WAITER_READ;
            if let Some(t) = next_free {
                read = read.min(t.saturating_duration_since(Instant::now()));
            }
            if let Some(d) = deadline {
                read = read.min(d.saturating_duration_since(Instant::now()));
            }
            let read = read.max(Duration::from_millis(10));
            // Far back in line (`2 * limit` or more keys ahead), a waiter watches only the
            // key `limit` places ahead of it: for its slot record (it took a slot, so
            // fewer than `2 * limit` keys are ahead of us now) or its deletion, then looks
            // again. Only the waiters near the front follow every release: with all of
            // them on the whole prefix, etcd sent each release to every waiter (60 jobs,
            // limit 4: about 6 ms from a freed slot to the next start, 2.6 with 12).
            // This needs a key that takes a slot once it can, a conlock contender
            // (`P/<its lease hex>`): a nested semaphore's key (`P/n/<lease>`), etcdctl's
            // or one on no lease never writes our record, and a waiter asleep on it
            // started up to 3 s late (etcd_sem::a_far_back_waiter_behind_a_nested_...).
            let far_back = rank >= 2 * limit;
            let target = look.keys.get(rank.wrapping_sub(limit)).filter(|t| {
                far_back
                    && t.lease > 0
                    && t.key == self.key_of(&format!("{:x}", t.lease)).as_bytes()
            });
            let narrow = target.is_some();
            let reqs = match target {
                Some(target) => {
                    let lease = format!("{:x}", target.lease);
                    vec![
                        WatchCreateRequest {
                            key: target.key.clone(),
                            start_revision: look.revision + 1,
                            filters: vec![WatchFilter::NoPut],
                            ..Default::default()
                        },
                        WatchCreateRequest {
                            key: self.record_key(&lease).into_bytes(),
                            start_revision: look.revision + 1,
                            ..Default::default()
                        },
                    ]
                }
                // Two watches on one stream: the contender keys `P/` and the slot records.
                _ => [contenders_of(&self.prefix), records_of(&self.prefix)]
                    .map(|p| WatchCreateRequest {
                        range_end: prefix_range_end(p.as_bytes()),
                        key: p.into_bytes(),
                        start_revision: look.revision + 1,
                        filters: vec![WatchFilter::NoPut],
                        ..Default::default()
                    })
                    .to_vec(),
            };
            let watch = match c.watch_all(&reqs, read) {
                // Compacted since the look: look again.
                Err(EtcdError::Compacted { .. }) => continue,
                r => r,
            };
            let mut stream = match while_waiting(watch, deadline)? {
                Waited::Got(s) => s,
                Waited::Retry => continue,
                Waited::Busy => return Ok(None),
            };
            // The keys ahead of us in line. A later key has a larger create revision
            // (E4), so only their deletions move us up: while at least `limit` of them
            // are left no look can take a slot, and a deletion only counts down (every
            // waiter looking again on every release was a txn and a new watch each,
            // times the waiters, per freed slot).
            let contenders = contenders_of(&self.prefix);
            let mut ahead: HashSet<&[u8]> = look
                .keys
                .iter()
                .filter(|k| k.create_revision < my_rev)
                .map(|k| k.key.as_slice())
                .collect();
            loop {
                match stream.next_response() {
                    Ok(Some(r)) if !r.events.is_empty() => {
                        if narrow || ahead.len() < limit {
                            break;
                        }
                        for e in &r.events {
                            if e.kv.key.starts_with(contenders.as_bytes()) {
                                ahead.remove(e.kv.key.as_slice());
                            }
                        }
                        if ahead.len() < limit {
                            break;
                        }
                    }
                    Ok(Some(_)) => {}
                    // Silence (a cushion's end), a broken stream, a compaction: look again.
                    _ => break,
                }
            }
        }
    }

    fn held(&self, my_rev: i64, revision: i64, sent: BootInstant) -> Held {
        self.my_rev.store(my_rev, Ordering::SeqCst);
        self.held_rev.store(revision, Ordering::SeqCst);
        Held {
            lock_index: 0,
            fencing_token: my_rev as u64,
            confirmed_at: sent,
        }
    }

    /// Why a read of our key means the slot is no longer ours (`None`: it still is).
    fn lost_because(&self, kv: Option<&KeyValue>, sid: &str) -> Option<String> {
        let my_rev = self.my_rev.load(Ordering::SeqCst);
        let lease = lease_id(sid).unwrap_or(0);
        match kv {
            None => Some(format!(
                "the contender key {} was deleted (the lease expired or was revoked, or someone deleted the key)",
                self.key_of(sid)
            )),
            Some(kv) if kv.lease == lease && (my_rev == 0 || kv.create_revision == my_rev) => None,
            Some(kv) => Some(format!(
                "the contender key {} was replaced (create revision {}, lease {:x})",
                self.key_of(sid),
                kv.create_revision,
                kv.lease
            )),
        }
    }
}

impl Claim for EtcdSemaphore {
    fn describe(&self) -> String {
        format!("semaphore {:?} (limit {})", self.prefix, self.limit)
    }

    fn acquire(
        &self,
        store: &Store,
        session: &dyn SessionHandle,
        deadline: Option<Instant>,
        wait: &WaitDisplay,
    ) -> Result<Option<Held>> {
        let c = store.etcd();
        loop {
            if session.lost().is_some() && !claim::replace_session(session, deadline)? {
                return Ok(None);
            }
            let sid = session.id();
            let Some(lease) = lease_id(&sid) else {
                return Err(Error::Other(anyhow::anyhow!(
                    "session {sid:?} is not an etcd lease ID"
                )));
            };
            let queued = match self.enqueue(c, &sid, lease, deadline)? {
                Waited::Got(r) => r,
                Waited::Retry => {
                    if claim::deadline_passed(deadline) {
                        return Ok(None);
                    }
                    continue;
                }
                Waited::Busy => return Ok(None),
            };
            match self.turn(c, session, &sid, queued, deadline, wait)? {
                Some(Some(h)) => return Ok(Some(h)),
                None => {
                    // A slot write may have landed: the slot goes back now, not after its
                    // cushion.
                    take_back(&self.maybe_took, store, |s| self.release(s, &sid));
                    return Ok(None);
                }
                Some(None) => {
                    ui::notice(format_args!(
                        "our key {} is gone while waiting (lease expired or revoked, or the key deleted); queueing again with a new lease",
                        self.key_of(&sid)
                    ));
                    if !claim::replace_session(session, deadline)? {
                        return Ok(None);
                    }
                }
            }
        }
    }

    fn monitor(
        &self,
        store: Store,
        session_id: String,
        _held: Held,
        policy: MonitorPolicy,
        lost: LossReport,
        stop: Arc<AtomicBool>,
    ) {
        let from = self.held_rev.load(Ordering::SeqCst) + 1;
        monitor_own_key(
            store.etcd(),
            &self.key_of(&session_id),
            from,
            policy,
            &lost,
            &stop,
            |kv| self.lost_because(kv, &session_id),
        );
    }

    fn confirm(
        &self,
        store: &Store,
        session_id: &str,
    ) -> std::result::Result<Option<String>, StoreError> {
        confirm_own_key(store, self.key_of(session_id), |kv| {
            self.lost_because(kv, session_id)
        })
    }

    fn release(&self, store: &Store, session_id: &str) -> bool {
        // Each step retried through an election, for 10 s in all: a lost release costs
        // the next waiter the TTL and the cushion.
        let mut c = EtcdReleasing::new(store.etcd());
        let key = self.key_of(session_id);
        let lease = lease_id(session_id).unwrap_or(0);
        let known = self.my_rev.load(Ordering::SeqCst);
        let Some(my_rev) = own_key_rev(&mut c, &key, lease, known, &self.describe()) else {
            return false;
        };
        // Our key and our slot record go together, only while the key is ours: a holder
        // whose key went otherwise leaves its record for the waiters' cushion.
        let req = TxnRequest {
            compare: vec![
                Compare::create_revision(key.clone(), CompareResult::Equal, my_rev),
                on_lease(key.clone(), lease),
            ],
            success: vec![
                RequestOp::DeleteRange(DeleteRangeRequest::key(key.clone())),
                RequestOp::DeleteRange(DeleteRangeRequest::key(self.record_key(session_id))),
            ],
            failure: vec![],
        };
        let released = match c.retry(|c| c.txn(&req)) {
            Ok(r) if r.succeeded => {
                ui::verbose(format_args!("released {}", self.describe()));
                true
            }
            // Released already by a try whose answer was lost (the client sends it again
            // on another endpoint): our key and our slot record are both gone.
            Ok(_) if released_already(&mut c, &key, &self.record_key(session_id)) => {
                ui::verbose(format_args!("released {}", self.describe()));
                true
            }
            Ok(_) => false,
            Err(e) => {
                ui::warn(format_args!(
                    "could not release {}: {e}; it frees when the lease ends, after the lock-delay",
                    self.describe()
                ));
                false
            }
        };
        // The last one out removes the limit, so that later users may choose another.
        let contenders = contenders_of(&self.prefix);
        // Not while a slot record is left: a vanished holder's command may still run
        // under the old limit for its cushion, and a new limit must not start more
        // beside it.
        let records = records_of(&self.prefix);
        let last_out = TxnRequest {
            compare: vec![
                Compare {
                    range_end: prefix_range_end(contenders.as_bytes()),
                    ..Compare::create_revision(contenders.clone(), CompareResult::Equal, 0)
                },
                Compare {
                    range_end: prefix_range_end(records.as_bytes()),
                    ..Compare::create_revision(records, CompareResult::Equal, 0)
                },
            ],
            success: vec![RequestOp::DeleteRange(DeleteRangeRequest::key(
                self.limit_key(),
            ))],
            failure: vec![],
        };
        let _ = c.retry(|c| c.txn(&last_out));
        released
    }

    fn take_back(&self, store: &Store, session_id: &str) {
        take_back(&self.maybe_took, store, |s| self.release(s, session_id));
    }

    fn spec(&self) -> ClaimSpec {
        ClaimSpec::EtcdSemaphore {
            prefix: self.prefix.clone(),
            limit: self.limit,
        }
    }

    fn env(&self, _held: &Held, session_id: &str) -> Vec<(String, String)> {
        vec![
            ("CONLOCK_KEY".to_string(), self.key_of(session_id)),
            ("CONLOCK_PREFIX".to_string(), self.prefix.clone()),
            ("CONLOCK_LIMIT".to_string(), self.limit.to_string()),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, rev: i64) -> KeyValue {
        KeyValue {
            key: key.as_bytes().to_vec(),
            create_revision: rev,
            ..Default::default()
        }
    }

    #[test]
    fn a_record_is_vanished_only_when_its_key_incarnation_is_gone() {
        let rec = |k: &str, rev| {
            Some(HolderRecord {
                key: k.into(),
                create_revision: rev,
                lock_delay_ms: 1000,
                released: false,
            })
        };
        let keys = [kv("p/a", 5), kv("p/b", 7)];
        assert!(!vanished(&rec("p/a", 5), &keys));
        assert!(vanished(&rec("p/a", 4), &keys));
        assert!(vanished(&rec("p/c", 9), &keys));
        // Unreadable: taken for good (never freed by a cushion).
        assert!(!vanished(&None, &keys));
    }

    #[test]
    fn the_records_and_the_limit_lie_under_no_prefix_and_in_no_other_names_range() {
        assert_eq!(records_of("a/b"), "a%2Fb.conlock%slot-");
        assert_eq!(limit_key_of("a/b"), "a%2Fb.conlock%limit");
        let names = [
            "a",
            "a/b",
            "a.conlock",
            "a%slot-",
            "a.conlock%slot-1",
            "a%2Fb",
            "a/",
        ];
        for p in names {
            assert!(!records_of(p).contains('/') && !limit_key_of(p).contains('/'));
            for q in names {
                let theirs = [
                    record_key(q),
                    limit_key_of(q),
                    format!("{}7587", records_of(q)),
                ];
                for k in theirs {
                    assert_eq!(
                        k.starts_with(&records_of(p)),
                        p == q && k.contains("%slot-"),
                        "{p} {k}"
                    );
                }
            }
        }
    }
}
