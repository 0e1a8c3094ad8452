//! The lock on etcd, interoperable both ways with `etcdctl lock NAME` (clientv3's
//! concurrency.Mutex, 3.4): each contender puts `NAME/<lease hex>` on its lease; the key
//! with the smallest create revision under `NAME/` holds; a waiter watches only the
//! newest older key. Unlike etcdctl 3.4, a waiter checks after each wake-up that its own
//! key still exists (etcd #11456).
//!
//! etcd has no lock-delay. conlock emulates Consul's for conlock waiters with the holder
//! record `NAME.conlock` (outside the prefix, so etcdctl never sees it as a contender):
//! a holder writes it (its key, create revision and lock-delay) before its command
//! starts, and deletes it, together with its key, only once the command is gone. A
//! conlock contender that finds itself first and another's record left waits the
//! recorded lock-delay from that moment before it holds: whatever ended the previous
//! holder (expiry, revoke, deletion by someone else) happened before. See
//! docs/safety.md, "etcd".

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

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

/// How long one read of a watch may stay silent before it is opened again (a cheap
/// check that the connection still works).
pub(super) const WATCH_READ: Duration = Duration::from_secs(30);
/// How long a waiter's watch of its predecessor may stay silent before it looks again
/// (one txn and a new watch): a watch on a member that froze is silent, and the
/// waiter would otherwise notice only after `WATCH_READ`.
const WAITER_READ: Duration = Duration::from_secs(3);
/// How long a read of etcd's history (past events, sent at once) may stay silent.
const HISTORY_READ: Duration = Duration::from_secs(1);
/// Pause after a failure that may pass, while waiting.
const UNREACHABLE_RETRY: Duration = Duration::from_secs(1);
/// How long a waiter that gave up may spend taking back a take-over (or slot write)
/// whose answer did not come by `--timeout`: no command ran under it, and left alone it
/// would cost conlock waiters its cushion.
const UNCERTAIN_CLEANUP: Duration = Duration::from_secs(1);

/// A waiter gives up (`--timeout`): if it sent a take (`maybe_took`), the take may have
/// landed, with no command run under it. `release` takes it back through a store
/// bounded to `UNCERTAIN_CLEANUP`, also through an election.
pub(super) fn take_back(
    maybe_took: &AtomicBool,
    store: &Store,
    release: impl FnOnce(&Store) -> bool,
) {
    if maybe_took.swap(false, Ordering::SeqCst) {
        let bounded = store.with_hard_deadline(
            Instant::now() + UNCERTAIN_CLEANUP,
            "taking back an unanswered take is bounded to 1s",
        );
        release(&bounded);
    }
}

/// The holder record (`NAME.conlock`): the conlock holder that has not let go itself.
/// A release deletes it (earlier builds marked it `released`, which still counts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HolderRecord {
    /// The holder's key (`NAME/<lease hex>`).
    pub key: String,
    /// The key's create revision; 0 in a record written in the txn that created the key
    /// (which cannot know it): then the record's own mod revision (see `parse_record`).
    pub create_revision: i64,
    /// The cushion conlock waiters give it if it did not let go itself.
    pub lock_delay_ms: u64,
    /// Its command was gone when it let go.
    #[serde(default)]
    pub released: bool,
}

/// The holder record stored in `kv`, its create revision resolved (0: written in the txn
/// that created the key, so the record's mod revision).
pub fn parse_record(kv: &KeyValue) -> Option<HolderRecord> {
    let mut rec = serde_json::from_slice::<HolderRecord>(&kv.value).ok()?;
    if rec.create_revision == 0 {
        rec.create_revision = kv.mod_revision;
    }
    Some(rec)
}

pub struct EtcdLock {
    /// The lock's name, as `etcdctl lock NAME`.
    pub name: String,
    pub value: HolderValue,
    /// Our key's create revision once acquired (0: not known).
    my_rev: AtomicI64,
    /// The revision to watch our key from (the acquisition's).
    held_rev: AtomicI64,
    /// `ETCD_LOCK_REV`: the header revision at the acquisition, as etcdctl gives it.
    lock_rev: AtomicI64,
    /// The holder record we wrote when we acquired, and its mod revision: release
    /// marks it released without reading it again (one round trip less per run).
    written: std::sync::Mutex<Option<(HolderRecord, i64)>>,
    /// A record take-over was sent while waiting: it may have landed.
    maybe_took: std::sync::atomic::AtomicBool,
}

impl EtcdLock {
    pub fn new(name: String, value: HolderValue) -> EtcdLock {
        EtcdLock {
            name,
            value,
            my_rev: AtomicI64::new(0),
            held_rev: AtomicI64::new(0),
            lock_rev: AtomicI64::new(0),
            written: std::sync::Mutex::new(None),
            maybe_took: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The prefix every contender's key is under: `NAME/`.
    pub fn prefix(&self) -> String {
        format!("{}/", self.name)
    }

    /// A session's key: `NAME/<lease hex>`.
    pub fn key_of(&self, session_id: &str) -> String {
        format!("{}/{session_id}", self.name)
    }

    /// The holder record's key: `NAME.conlock`, `/` escaped (see `record_key`).
    pub fn record_key(&self) -> String {
        record_key(&self.name)
    }
}

/// The holder record's key of lock `name`: the name with `%` and `/` escaped, then
/// `.conlock`. A key with no `/` lies under no lock's prefix (`P/`); `P/x.conlock` would
/// count as the oldest contender of lock `P` forever (it has no lease).
pub fn record_key(name: &str) -> String {
    let escaped = name.replace('%', "%25").replace('/', "%2F");
    format!("{escaped}.conlock")
}

/// The first key under `prefix` by create revision (etcdctl's WithFirstCreate).
fn first_by_create(prefix: &str) -> RangeRequest {
    RangeRequest {
        sort_order: SortOrder::Ascend,
        sort_target: SortTarget::Create,
        limit: 1,
        ..RangeRequest::prefix(prefix)
    }
}

/// The newest key under `prefix` created before `my_rev` (the predecessor to watch).
fn older_than(prefix: &str, my_rev: i64) -> RangeRequest {
    RangeRequest {
        sort_order: SortOrder::Descend,
        sort_target: SortTarget::Create,
        limit: 1,
        max_create_revision: my_rev - 1,
        ..RangeRequest::prefix(prefix)
    }
}

/// `record` does not exist: the last conlock holder let go itself (its release deletes
/// the record), or none ever held.
fn no_record(record: String) -> Compare {
    Compare::create_revision(record, CompareResult::Equal, 0)
}

/// Our key's create revision for a release: `known`, or (0: the guardian, which does not
/// know it) the key as it is now, if it is on our `lease`. `None`: nothing to release,
/// or etcd could not say (then said, naming `what`).
pub(super) fn own_key_rev(
    r: &mut EtcdReleasing,
    key: &str,
    lease: i64,
    known: i64,
    what: &str,
) -> Option<i64> {
    if known != 0 {
        return Some(known);
    }
    match r.retry(|c| c.range(&RangeRequest::key(key.to_string()))) {
        Ok(g) => g
            .kvs
            .first()
            .filter(|kv| kv.lease == lease)
            .map(|kv| kv.create_revision),
        Err(e) => {
            ui::warn(format_args!(
                "could not release {what}: {e}; it frees when the lease ends"
            ));
            None
        }
    }
}

/// The revision of the first deletion of `key` from revision `from` on, from etcd's
/// history (`None`: none, or etcd no longer has that history).
fn first_delete(
    c: &EtcdClient,
    key: &str,
    from: i64,
) -> std::result::Result<Option<i64>, EtcdError> {
    let req = WatchCreateRequest {
        key: key.as_bytes().to_vec(),
        start_revision: from,
        filters: vec![WatchFilter::NoPut],
        ..Default::default()
    };
    let mut stream = match c.watch(&req, HISTORY_READ) {
        Err(EtcdError::Compacted { .. }) => return Ok(None),
        r => r?,
    };
    loop {
        match stream.next_response() {
            Ok(Some(r)) => {
                if let Some(e) = r.events.iter().find(|e| e.kind == EventType::Delete) {
                    return Ok(Some(e.kv.mod_revision));
                }
            }
            // Silence: the history has no such deletion.
            Ok(None) | Err(EtcdError::Timeout { .. }) | Err(EtcdError::Compacted { .. }) => {
                return Ok(None)
            }
            Err(e) => return Err(e),
        }
    }
}

/// What `take_after` did.
enum TakeAfter {
    /// We hold: the record is ours, written at this revision.
    Took(i64),
    /// Not taken: what `predecessor` would have read (`None`: our key is gone).
    Looked(Option<(Option<KeyValue>, i64, Record)>),
}

pub(super) fn range_of(r: Option<&ResponseOp>) -> Option<&RangeResponse> {
    match r {
        Some(ResponseOp::Range(r)) => Some(r),
        _ => None,
    }
}

/// The holder record a range of its key found, with its mod revision.
fn record_in(r: Option<&RangeResponse>) -> Record {
    r.and_then(|g| g.kvs.first())
        .and_then(|kv| parse_record(kv).map(|rec| (rec, kv.mod_revision)))
}

/// `lease(key) == lease`: a key named after our lease but written by someone else, on
/// another lease or none, is not ours.
fn on_lease(key: impl Into<Vec<u8>>, lease: i64) -> Compare {
    Compare::new(key, CompareTarget::Lease(lease), CompareResult::Equal)
}

/// A holder record and its mod revision, if there is one.
type Record = Option<(HolderRecord, i64)>;

/// What `enqueue` did: our create revision, whether the uncontended take happened, and,
/// when we are first already, the header revision and the record as of then.
type Enqueued = (i64, bool, Option<(i64, Record)>);

pub(super) fn show(key: &[u8]) -> String {
    String::from_utf8_lossy(key).into_owned()
}

/// Who a contender's key belongs to, for messages: conlock's JSON value says the host
/// and pid; an empty value is etcdctl's (or another clientv3 Mutex).
pub(super) fn describe_holder(kv: &KeyValue) -> String {
    let key = show(&kv.key);
    if kv.value.is_empty() {
        return format!("{key} (no value: etcdctl lock or another client)");
    }
    match serde_json::from_slice::<serde_json::Value>(&kv.value) {
        Ok(v) if v.get("host").is_some() => format!(
            "{key} (conlock on {}, pid {})",
            v["host"].as_str().unwrap_or("?"),
            v["pid"]
        ),
        _ => key,
    }
}

/// What a read made while waiting gave.
pub(super) enum Waited<T> {
    Got(T),
    Retry,
    Busy,
}

/// Sorts a failure while waiting: one that may pass is said and paused for (`Retry`),
/// unless the wait's deadline passed (`Busy`); others end the wait.
pub(super) fn while_waiting<T>(
    r: std::result::Result<T, EtcdError>,
    deadline: Option<Instant>,
) -> Result<Waited<T>> {
    match r {
        Ok(v) => Ok(Waited::Got(v)),
        Err(e) if e.is_retryable() || e.cut_short() => {
            if claim::deadline_passed(deadline) || e.cut_short() {
                if !e.cut_short() {
                    ui::notice(format_args!("{e}; not retrying: --timeout has passed"));
                }
                return Ok(Waited::Busy);
            }
            ui::notice(format_args!("{e}; retrying"));
            claim::sleep_until_deadline(UNREACHABLE_RETRY, deadline);
            Ok(Waited::Retry)
        }
        Err(e) => Err(e.into()),
    }
}

/// Where one turn of the wait got.
enum Turn {
    Held(Held),
    /// Our key is gone (our lease expired or was revoked, or someone deleted it).
    KeyGone,
    Busy,
}

impl EtcdLock {
    /// Creates our key (or finds it, after a txn whose answer was lost): etcdctl's txn,
    /// plus a read of the holder record, plus the uncontended take: a nested txn that
    /// writes our record `mine` if, before our put, no key was under the prefix and no
    /// record was left (rule 3 with nothing to wait for, in the same write). Returns our
    /// create revision, whether that take happened and, when we are first already, the
    /// header revision and the record as of then.
    fn enqueue(
        &self,
        c: &EtcdClient,
        sid: &str,
        lease: i64,
        mine: &HolderRecord,
    ) -> std::result::Result<Enqueued, EtcdError> {
        let my_key = self.key_of(sid);
        let prefix = self.prefix();
        // Nested compares see the store before the outer put (etcd's txn applies all
        // compares first), so "empty prefix" excludes our own new key by construction.
        let uncontended = TxnRequest {
            compare: vec![
                Compare {
                    range_end: prefix_range_end(prefix.as_bytes()),
                    ..Compare::create_revision(prefix.clone(), CompareResult::Equal, 0)
                },
                no_record(self.record_key()),
            ],
            success: vec![RequestOp::Put(PutRequest::new(
                self.record_key(),
                serde_json::to_vec(&HolderRecord {
                    create_revision: 0,
                    ..mine.clone()
                })
                .expect("json"),
            ))],
            failure: vec![],
        };
        let req = TxnRequest {
            compare: vec![Compare::create_revision(
                my_key.clone(),
                CompareResult::Equal,
                0,
            )],
            success: vec![
                RequestOp::Put(PutRequest {
                    lease,
                    ..PutRequest::new(my_key.clone(), self.value.bytes())
                }),
                RequestOp::Range(first_by_create(&prefix)),
                RequestOp::Range(RangeRequest::key(self.record_key())),
                RequestOp::Txn(Box::new(uncontended)),
            ],
            failure: vec![
                RequestOp::Range(RangeRequest::key(my_key.clone())),
                RequestOp::Range(first_by_create(&prefix)),
                RequestOp::Range(RangeRequest::key(self.record_key())),
            ],
        };
        let r = c.txn(&req)?;
        let my_rev = if r.succeeded {
            r.header.revision
        } else {
            match range_of(r.responses.first()).and_then(|g| g.kvs.first()) {
                Some(kv) if kv.lease == lease => kv.create_revision,
                Some(kv) => {
                    // Not ours: treated as gone (a new lease gives a new key name).
                    ui::notice(format_args!(
                        "the key {my_key} exists on lease {:x}, not on ours ({sid}); not using it",
                        kv.lease
                    ));
                    0
                }
                None => 0,
            }
        };
        let first = range_of(r.responses.get(1))
            .and_then(|g| g.kvs.first())
            .map(|kv| kv.create_revision);
        let record = record_in(range_of(r.responses.get(2)));
        let took =
            r.succeeded && matches!(r.responses.get(3), Some(ResponseOp::Txn(t)) if t.succeeded);
        Ok((
            my_rev,
            took,
            (first == Some(my_rev)).then_some((r.header.revision, record)),
        ))
    }

    /// One look: whether our key still exists with `my_rev` and, if so, the newest key
    /// created before it and the holder record (atomically, in one txn).
    fn predecessor(
        &self,
        c: &EtcdClient,
        sid: &str,
        my_rev: i64,
    ) -> std::result::Result<Option<(Option<KeyValue>, i64, Record)>, EtcdError> {
        let req = TxnRequest {
            compare: vec![
                Compare::create_revision(self.key_of(sid), CompareResult::Equal, my_rev),
                on_lease(self.key_of(sid), lease_id(sid).unwrap_or(0)),
            ],
            success: vec![
                RequestOp::Range(older_than(&self.prefix(), my_rev)),
                RequestOp::Range(RangeRequest::key(self.record_key())),
            ],
            failure: vec![],
        };
        let r = c.txn(&req)?;
        if !r.succeeded {
            return Ok(None);
        }
        let pred = range_of(r.responses.first()).and_then(|g| g.kvs.first().cloned());
        Ok(Some((
            pred,
            r.header.revision,
            record_in(range_of(r.responses.get(1))),
        )))
    }

    /// On the wake-up by our predecessor's deletion: takes the lock in one txn if we are
    /// first and no record is left (the last conlock holder let go itself: its release
    /// deletes the record), so no cushion is owed; else reads what `predecessor` reads.
    /// The compares check at one moment what a look and the record write check at two.
    fn take_after(
        &self,
        c: &EtcdClient,
        sid: &str,
        my_rev: i64,
        mine: &HolderRecord,
    ) -> std::result::Result<TakeAfter, EtcdError> {
        let my_key = self.key_of(sid);
        let lease = lease_id(sid).unwrap_or(0);
        let prefix = self.prefix();
        let req = TxnRequest {
            compare: vec![
                Compare::create_revision(my_key.clone(), CompareResult::Equal, my_rev),
                on_lease(my_key.clone(), lease),
                // No key under the prefix older than ours: we are first.
                Compare {
                    range_end: prefix_range_end(prefix.as_bytes()),
                    ..Compare::create_revision(prefix.clone(), CompareResult::Greater, my_rev - 1)
                },
                no_record(self.record_key()),
            ],
            success: vec![RequestOp::Put(PutRequest::new(
                self.record_key(),
                serde_json::to_vec(mine).expect("json"),
            ))],
            failure: vec![
                RequestOp::Range(RangeRequest::key(my_key)),
                RequestOp::Range(older_than(&prefix, my_rev)),
                RequestOp::Range(RangeRequest::key(self.record_key())),
            ],
        };
        let r = c.txn(&req)?;
        if r.succeeded {
            return Ok(TakeAfter::Took(r.header.revision));
        }
        let still_ours = range_of(r.responses.first())
            .and_then(|g| g.kvs.first())
            .is_some_and(|kv| kv.create_revision == my_rev && kv.lease == lease);
        if !still_ours {
            return Ok(TakeAfter::Looked(None));
        }
        let pred = range_of(r.responses.get(1)).and_then(|g| g.kvs.first().cloned());
        Ok(TakeAfter::Looked(Some((
            pred,
            r.header.revision,
            record_in(range_of(r.responses.get(2))),
        ))))
    }

    /// Whether a release of ours whose answer was lost did land: it deletes our key `key`
    /// (created at `my_rev`) and our record in one txn, so etcd's history shows both
    /// deleted at one revision. A revoke or a deletion by someone else deletes the key
    /// alone; our record then goes later (a successor's write after its cushion, or its
    /// release), and that is no release of ours. A history etcd no longer has
    /// (compacted) cannot say: not counted.
    fn released_by_us(&self, r: &mut EtcdReleasing, key: &str, my_rev: i64) -> bool {
        let Ok(Some(at)) = r.retry(|c| first_delete(c, key, my_rev + 1)) else {
            return false;
        };
        matches!(r.retry(|c| first_delete(c, &self.record_key(), at)), Ok(Some(d)) if d == at)
    }

    /// The holder record, if any, with its mod revision.
    fn read_record(&self, c: &EtcdClient) -> std::result::Result<Record, EtcdError> {
        let r = c.range(&RangeRequest::key(self.record_key()))?;
        Ok(record_in(Some(&r)))
    }

    /// Waits for the turn that finds us first, then keeps the cushion and takes over the
    /// holder record.
    fn turn(
        &self,
        c: &EtcdClient,
        session: &dyn SessionHandle,
        sid: &str,
        (mine, mut first_at): (HolderRecord, Option<(i64, Record)>),
        deadline: Option<Instant>,
        wait: &WaitDisplay,
    ) -> Result<Turn> {
        let my_key = self.key_of(sid);
        let my_rev = mine.create_revision;
        // Woken by our predecessor's deletion.
        let mut woke = false;
        // Wait until no older key is left; the record as of that read.
        let (lock_rev, record) = loop {
            if session.lost().is_some() {
                return Ok(Turn::KeyGone);
            }
            if let Some(first) = first_at.take() {
                break first;
            }
            let looked = if std::mem::take(&mut woke) {
                let sent = BootInstant::now();
                self.maybe_took.store(true, Ordering::SeqCst);
                match while_waiting(self.take_after(c, sid, my_rev, &mine), deadline)? {
                    Waited::Got(TakeAfter::Took(rev)) => {
                        // The compares saw the store as of the revision before our put.
                        return Ok(Turn::Held(self.took(mine, rev - 1, rev, sent)));
                    }
                    Waited::Got(TakeAfter::Looked(l)) => l,
                    Waited::Retry => continue,
                    Waited::Busy => return Ok(Turn::Busy),
                }
            } else {
                match while_waiting(self.predecessor(c, sid, my_rev), deadline)? {
                    Waited::Got(l) => l,
                    Waited::Retry => continue,
                    Waited::Busy => return Ok(Turn::Busy),
                }
            };
            let Some((pred, rev, record)) = looked else {
                // The #11456 check: our key (and so our lease) is gone.
                return Ok(Turn::KeyGone);
            };
            let Some(pred) = pred else {
                break (rev, record);
            };
            wait.held_by(describe_holder(&pred), &show(&pred.key));
            if claim::deadline_passed(deadline) {
                return Ok(Turn::Busy);
            }
            // Watch only the predecessor, from right after the read, for its deletion.
            let read = match deadline {
                Some(d) => WAITER_READ.min(
                    d.saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(10)),
                ),
                None => WAITER_READ,
            };
            let req = WatchCreateRequest {
                key: pred.key.clone(),
                start_revision: rev + 1,
                filters: vec![WatchFilter::NoPut],
                prev_kv: true,
                ..Default::default()
            };
            let watch = match c.watch(&req, read) {
                // Compacted since the look: look again.
                Err(EtcdError::Compacted { .. }) => continue,
                r => r,
            };
            let mut stream = match while_waiting(watch, deadline)? {
                Waited::Got(s) => s,
                Waited::Retry => continue,
                Waited::Busy => return Ok(Turn::Busy),
            };
            loop {
                match stream.next_response() {
                    Ok(Some(r)) if r.events.iter().any(|e| e.kind == EventType::Delete) => {
                        woke = true;
                        break;
                    }
                    Ok(Some(_)) => {}
                    // Silence, a broken stream, a compaction: look again.
                    _ => break,
                }
            }
        };
        // First. The cushion: a previous conlock holder that did not let go itself may
        // still be stopping its command, for up to its lock-delay from when its key went,
        // which was before the read that found us first (nobody but the first writes the
        // record, so it is still the one read then).
        if let Some((rec, _)) = &record {
            if !rec.released && rec.create_revision != my_rev && rec.lock_delay_ms > 0 {
                let cushion = Duration::from_millis(rec.lock_delay_ms);
                wait.lock_delay(Some(SystemTime::now() + cushion));
                ui::verbose(format_args!(
                    "the last conlock holder {} did not release the lock itself (expired, revoked or deleted); keeping its lock-delay {} before holding",
                    rec.key,
                    crate::duration::format(cushion)
                ));
                let until = Instant::now() + cushion;
                while Instant::now() < until {
                    if claim::deadline_passed(deadline) {
                        return Ok(Turn::Busy);
                    }
                    if session.lost().is_some() {
                        return Ok(Turn::KeyGone);
                    }
                    claim::sleep_until_deadline(
                        until
                            .saturating_duration_since(Instant::now())
                            .min(Duration::from_millis(200)),
                        deadline,
                    );
                }
            }
        }
        // Take over the record, guarded by our key: the txn's success also proves that
        // we held when it was applied, after `sent` (the first confirmation).
        loop {
            let sent = BootInstant::now();
            let req = TxnRequest {
                compare: vec![
                    Compare::create_revision(my_key.clone(), CompareResult::Equal, my_rev),
                    on_lease(my_key.clone(), lease_id(sid).unwrap_or(0)),
                ],
                success: vec![RequestOp::Put(PutRequest::new(
                    self.record_key(),
                    serde_json::to_vec(&mine).expect("json"),
                ))],
                failure: vec![],
            };
            // Until we hold, any take-over sent may have landed (an answer that timed out
            // may still be applied): a waiter that gives up takes it back.
            self.maybe_took.store(true, Ordering::SeqCst);
            match while_waiting(c.txn(&req), deadline)? {
                Waited::Got(r) if r.succeeded => {
                    let held = self.took(mine, lock_rev, r.header.revision, sent);
                    return Ok(Turn::Held(held));
                }
                Waited::Got(_) => return Ok(Turn::KeyGone),
                Waited::Retry => continue,
                Waited::Busy => return Ok(Turn::Busy),
            }
        }
    }

    /// We hold: the record `mine` (naming our key's create revision) written by a txn at
    /// `revision` (its only put, so the record's mod revision), sent at `sent`;
    /// `lock_rev` is `ETCD_LOCK_REV`.
    fn took(&self, mine: HolderRecord, lock_rev: i64, revision: i64, sent: BootInstant) -> Held {
        let my_rev = mine.create_revision;
        *self.written.lock().unwrap() = Some((mine, revision));
        self.my_rev.store(my_rev, Ordering::SeqCst);
        self.held_rev.store(revision, Ordering::SeqCst);
        self.lock_rev.store(lock_rev, Ordering::SeqCst);
        Held {
            lock_index: 0,
            fencing_token: my_rev as u64,
            confirmed_at: sent,
        }
    }

    /// Why a read of our key means the lock is no longer ours (`None`: it still is).
    fn lost_because(&self, kv: Option<&KeyValue>, sid: &str) -> Option<String> {
        let my_rev = self.my_rev.load(Ordering::SeqCst);
        let lease = lease_id(sid).unwrap_or(0);
        match kv {
            None => Some(format!(
                "the lock key {} was deleted (the lease expired or was revoked, or someone deleted the key)",
                self.key_of(sid)
            )),
            Some(kv) if kv.lease == lease && (my_rev == 0 || kv.create_revision == my_rev) => None,
            Some(kv) => Some(format!(
                "the lock key {} was replaced (create revision {}, lease {:x})",
                self.key_of(sid),
                kv.create_revision,
                kv.lease
            )),
        }
    }
}

/// A holder's monitor on etcd (the lock's and the semaphore's): follows our key from
/// revision `from` with a watch (`prev_kv`), opened again after silence, read afresh after
/// a compaction, and reports the first answer `lost_because` finds fatal, or too many
/// failed watches in a row (`policy`), until `stop`.
pub(super) fn monitor_own_key(
    c: &EtcdClient,
    key: &str,
    mut from: i64,
    policy: MonitorPolicy,
    lost: &LossReport,
    stop: &AtomicBool,
    lost_because: impl Fn(Option<&KeyValue>) -> Option<String>,
) {
    let report = |why: String| {
        if !stop.load(Ordering::SeqCst) {
            lost(why);
        }
    };
    let mut failures = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let req = WatchCreateRequest {
            key: key.as_bytes().to_vec(),
            start_revision: from,
            prev_kv: true,
            ..Default::default()
        };
        let result = c.watch(&req, WATCH_READ).and_then(|mut s| loop {
            match s.next_response() {
                Ok(Some(r)) => {
                    failures = 0;
                    from = from.max(r.header.revision + 1);
                    for e in &r.events {
                        from = from.max(e.kv.mod_revision + 1);
                        let kv = (e.kind != EventType::Delete).then_some(&e.kv);
                        if let Some(why) = lost_because(kv) {
                            return Ok(Some(why));
                        }
                    }
                    if stop.load(Ordering::SeqCst) {
                        return Ok(None);
                    }
                }
                // Silence: open it again (from the last revision seen).
                Err(EtcdError::Timeout { .. }) | Ok(None) => return Ok(None),
                Err(e) => return Err(e),
            }
        });
        match result {
            Ok(Some(why)) => return report(why),
            Ok(None) => {}
            Err(e) => {
                // A compacted start: read the key instead, and watch from its revision.
                if let EtcdError::Compacted { .. } = e {
                    match c.range(&RangeRequest::key(key.to_string())) {
                        Ok(r) => {
                            if let Some(why) = lost_because(r.kvs.first()) {
                                return report(why);
                            }
                            from = r.header.revision + 1;
                            continue;
                        }
                        Err(e2) => ui::verbose(format_args!("reading {key} failed: {e2}")),
                    }
                }
                failures += 1;
                if failures > policy.retries {
                    return report(format!("cannot watch {key} after {failures} tries: {e}"));
                }
                ui::verbose(format_args!(
                    "watching {key} failed ({e}); retry {failures} of {}",
                    policy.retries
                ));
                std::thread::sleep(policy.retry_time);
            }
        }
    }
}

/// One linearizable (not serializable) read of our key: it proves the key existed after
/// it was sent (a confirmation); `lost_because` says why not.
pub(super) fn confirm_own_key(
    store: &Store,
    key: String,
    lost_because: impl Fn(Option<&KeyValue>) -> Option<String>,
) -> std::result::Result<Option<String>, StoreError> {
    let r = store.etcd().range(&RangeRequest::key(key))?;
    Ok(lost_because(r.kvs.first()))
}

impl Claim for EtcdLock {
    fn describe(&self) -> String {
        format!("lock {:?}", self.name)
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
            let mine = HolderRecord {
                key: self.key_of(&sid),
                create_revision: 0,
                lock_delay_ms: session.lock_delay().as_millis() as u64,
                released: false,
            };
            let sent = BootInstant::now();
            // Its nested take may land unanswered: a waiter that gives up takes it back.
            self.maybe_took.store(true, Ordering::SeqCst);
            let enqueued = match self.enqueue(c, &sid, lease, &mine) {
                // etcd refused the whole txn (nothing landed): the lease died before it.
                Err(e @ EtcdError::LeaseNotFound { .. }) => {
                    self.maybe_took.store(false, Ordering::SeqCst);
                    ui::notice(format_args!("{e}; queueing with a new lease"));
                    session.gone(format!("lease {sid} is gone"));
                    if !claim::replace_session(session, deadline)? {
                        return Ok(None);
                    }
                    continue;
                }
                r => r,
            };
            let (my_rev, took, first_at) = match while_waiting(enqueued, deadline)? {
                Waited::Got(r) => r,
                Waited::Retry => continue,
                Waited::Busy => {
                    take_back(&self.maybe_took, store, |s| self.release(s, &sid));
                    return Ok(None);
                }
            };
            self.maybe_took.store(took, Ordering::SeqCst);
            if took {
                // Uncontended: the txn that created our key (at `my_rev`, its revision)
                // also wrote our record; its success is the first confirmation.
                let mine = HolderRecord {
                    create_revision: my_rev,
                    ..mine
                };
                return Ok(Some(self.took(mine, my_rev, my_rev, sent)));
            }
            if my_rev == 0 {
                // Our txn found the key gone between compare and read: the lease went.
                ui::verbose(format_args!("lease {sid} is gone; granting a new one"));
                if !claim::replace_session(session, deadline)? {
                    return Ok(None);
                }
                continue;
            }
            let mine = HolderRecord {
                create_revision: my_rev,
                ..mine
            };
            match self.turn(c, session, &sid, (mine, first_at), deadline, wait)? {
                Turn::Held(h) => return Ok(Some(h)),
                Turn::Busy => {
                    // A take-over may have landed: marked released, so that conlock
                    // waiters keep no cushion for it.
                    take_back(&self.maybe_took, store, |s| self.release(s, &sid));
                    return Ok(None);
                }
                Turn::KeyGone => {
                    // Never hold with a key that is gone (etcdctl 3.4 does: #11456): a new
                    // lease and a new key, at the end of the line.
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
        // Each step retried through an election, for 10 s in all.
        let mut r = EtcdReleasing::new(store.etcd());
        let key = self.key_of(session_id);
        let lease = lease_id(session_id).unwrap_or(0);
        let known = self.my_rev.load(Ordering::SeqCst);
        let Some(my_rev) = own_key_rev(&mut r, &key, lease, known, &self.describe()) else {
            return false;
        };
        // Delete the record only if it is ours: a holder that never started its command
        // (it gave up during the cushion) leaves the previous holder's. The one
        // we wrote is known here, without a read (the txn compares its mod revision); the
        // guardian, or a record changed since, reads it.
        let written = self.written.lock().unwrap().take();
        let known = written.is_some();
        let record = match written {
            Some(w) => Ok(Some(w)),
            None => r.retry(|c| self.read_record(c)),
        };
        let mut compare = vec![
            Compare::create_revision(key.clone(), CompareResult::Equal, my_rev),
            on_lease(key.clone(), lease),
        ];
        let mut success = vec![RequestOp::DeleteRange(DeleteRangeRequest::key(key.clone()))];
        if let Ok(Some((rec, mod_rev))) = record {
            if rec.key == key && rec.create_revision == my_rev {
                compare.push(Compare::new(
                    self.record_key(),
                    CompareTarget::Mod(mod_rev),
                    CompareResult::Equal,
                ));
                success.push(RequestOp::DeleteRange(DeleteRangeRequest::key(
                    self.record_key(),
                )));
            }
        }
        let req = TxnRequest {
            compare,
            success,
            failure: vec![],
        };
        match r.retry(|c| c.txn(&req)) {
            Ok(r) if r.succeeded => {
                ui::verbose(format_args!("released {}", self.describe()));
                true
            }
            // The record we wrote was changed since: read it, and try once more.
            Ok(_) if known => self.release(store, session_id),
            // Released already by a try whose answer was lost (the client sends it again
            // on another endpoint): our key is gone and no record of ours is left.
            Ok(_) if self.released_by_us(&mut r, &key, my_rev) => {
                ui::verbose(format_args!("released {}", self.describe()));
                true
            }
            // Not ours any more (or the record changed): the lease's end frees the rest.
            Ok(_) => false,
            Err(e) => {
                ui::warn(format_args!(
                    "could not release {}: {e}; it frees when the lease ends",
                    self.describe()
                ));
                false
            }
        }
    }

    fn take_back(&self, store: &Store, session_id: &str) {
        take_back(&self.maybe_took, store, |s| self.release(s, session_id));
    }

    fn spec(&self) -> ClaimSpec {
        ClaimSpec::EtcdLock {
            name: self.name.clone(),
        }
    }

    fn env(&self, held: &Held, session_id: &str) -> Vec<(String, String)> {
        vec![
            ("CONLOCK_KEY".to_string(), self.name.clone()),
            ("ETCD_LOCK_KEY".to_string(), self.key_of(session_id)),
            (
                "ETCD_LOCK_REV".to_string(),
                match self.lock_rev.load(Ordering::SeqCst) {
                    0 => held.fencing_token.to_string(),
                    r => r.to_string(),
                },
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::record_key;

    #[test]
    fn a_record_key_is_under_no_lock_prefix() {
        assert_eq!(record_key("jobs"), "jobs.conlock");
        assert_eq!(record_key("/jobs/x"), "%2Fjobs%2Fx.conlock");
        // Escaping `%` keeps distinct names apart.
        assert_ne!(record_key("a/b"), record_key("a%2Fb"));
        for name in ["a/b", "/a", "a/", "a//b%2F"] {
            assert!(!record_key(name).contains('/'), "{name}");
        }
    }
}
