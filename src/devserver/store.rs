//! The in-memory state: KV entries with tombstones, sessions, lock-delays and
//! the raft-like indexes, with Consul 1.0.8's state-store semantics.
//!
//! Every operation that real Consul sends through raft consumes one index from
//! the global counter, even when it fails inside the state store or changes
//! nothing (a failed CAS, an acquire with an unknown session, destroying an
//! unknown session). The KV and session "tables" remember the index of their
//! last real change.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::gojson::J;
use crate::gostd::{strconv_quote, uuid_index_parse};
use base64::Engine as _;

/// Consul's `structs.MaxLockDelay`.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);
/// Consul's `structs.SessionTTLMultiplier`.
const TTL_MULTIPLIER: u32 = 2;
/// The raft index a fresh dev agent has reached before serving requests.
const INITIAL_RAFT_INDEX: u64 = 5;

/// What a blocking query waits on: it answers once this changes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Watch {
    /// One key: created, modified or deleted.
    Key(String),
    /// Every key under a prefix.
    Prefix(String),
    Sessions,
    Checks,
}

#[derive(Debug, Clone)]
pub struct KvEntry {
    pub lock_index: u64,
    pub flags: u64,
    pub value: Vec<u8>,
    pub session: Option<String>,
    pub create_index: u64,
    pub modify_index: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behavior {
    Release,
    Delete,
}

impl Behavior {
    pub fn as_str(self) -> &'static str {
        match self {
            Behavior::Release => "release",
            Behavior::Delete => "delete",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Session {
    pub id: String,
    pub name: String,
    pub node: String,
    pub checks: Option<Vec<String>>,
    pub lock_delay_ns: i64,
    pub behavior: Behavior,
    pub ttl: String,
    pub create_index: u64,
    pub modify_index: u64,
    /// Parsed non-zero TTL; the session is invalidated 2 × TTL after the last
    /// renewal.
    pub ttl_dur: Option<Duration>,
    pub expires_at: Option<Instant>,
}

/// What a session create asks for (already validated by the endpoint).
#[derive(Debug, Clone)]
pub struct NewSession {
    pub id: String,
    pub name: String,
    pub node: String,
    pub checks: Option<Vec<String>>,
    pub lock_delay_ns: i64,
    pub behavior: Behavior,
    pub ttl: String,
    pub ttl_dur: Option<Duration>,
}

/// One KV operation of a `/v1/txn` body, decoded.
#[derive(Debug, Clone, Default)]
pub struct TxnKvOp {
    pub verb: String,
    pub key: String,
    pub value: Vec<u8>,
    pub flags: u64,
    pub index: u64,
    pub session: String,
}

/// One result of a transaction: the entry as it is after the op.
#[derive(Debug, Clone)]
pub struct TxnResult {
    pub key: String,
    /// Reads show the value; writes blank it (Consul clones and clears it).
    pub entry: KvEntry,
}

/// Results, or (op index, error text) for each failed op.
pub type TxnOutcome = Result<Vec<TxnResult>, Vec<(usize, String)>>;

#[derive(Debug)]
pub struct Store {
    raft_index: u64,
    kvs_index: u64,
    sessions_index: u64,
    kv: BTreeMap<String, KvEntry>,
    tombstones: BTreeMap<String, u64>,
    sessions: BTreeMap<String, Session>,
    lock_delay: HashMap<String, Instant>,
    /// Registered nodes by lowercased name, each with its `serfHealth` check.
    nodes: BTreeMap<String, Node>,
    checks_index: u64,
}

/// A registered node and the state of its one check, `serfHealth`.
#[derive(Debug, Clone)]
pub struct Node {
    pub name: String,
    pub critical: bool,
    pub check_create_index: u64,
    pub check_modify_index: u64,
    /// When the servers will notice the agent is gone (it is frozen).
    pub fail_at: Option<Instant>,
}

/// Looks up a session the way go-memdb's UUID index does. `Err` carries the
/// "failed session lookup: ..." text.
fn lookup_key(id: &str) -> Result<Option<String>, String> {
    uuid_index_parse(id).map_err(|e| format!("failed session lookup: index error: {e}"))
}

impl Store {
    pub fn new(node_name: &str) -> Store {
        let mut st = Store {
            raft_index: INITIAL_RAFT_INDEX,
            kvs_index: 0,
            sessions_index: 0,
            kv: BTreeMap::new(),
            tombstones: BTreeMap::new(),
            sessions: BTreeMap::new(),
            lock_delay: HashMap::new(),
            nodes: BTreeMap::new(),
            checks_index: 0,
        };
        // The dev agent registered itself before it serves requests.
        st.insert_node(INITIAL_RAFT_INDEX, node_name, false, None);
        st
    }

    fn insert_node(&mut self, idx: u64, name: &str, critical: bool, fail_at: Option<Instant>) {
        self.nodes.insert(
            name.to_lowercase(),
            Node {
                name: name.to_string(),
                critical,
                check_create_index: idx,
                check_modify_index: idx,
                fail_at,
            },
        );
        self.checks_index = self.checks_index.max(idx);
    }

    /// Registers a node with its `serfHealth` check (passing unless
    /// `critical`) in one raft write, as a joining agent does. False when a
    /// node of that name (case-insensitive) exists.
    pub fn node_register(&mut self, name: &str, critical: bool, fail_at: Option<Instant>) -> bool {
        if self.nodes.contains_key(&name.to_lowercase()) {
            return false;
        }
        let idx = self.next_index();
        self.insert_node(idx, name, critical, fail_at);
        true
    }

    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(&name.to_lowercase())
    }

    /// Index of the checks table (never 0).
    pub fn checks_table_index(&self) -> u64 {
        self.checks_index.max(1)
    }

    /// The agent of `name` stopped answering: its `serfHealth` turns critical
    /// at `at` (the earliest time wins when called again).
    pub fn node_fail_at(&mut self, name: &str, at: Instant) -> bool {
        match self.nodes.get_mut(&name.to_lowercase()) {
            Some(n) => {
                if !n.critical {
                    n.fail_at = Some(n.fail_at.map_or(at, |t| t.min(at)));
                }
                true
            }
            None => false,
        }
    }

    /// The agent of `name` answers again: a pending failure is cancelled, and
    /// a critical `serfHealth` turns passing in one raft write.
    pub fn node_alive(&mut self, name: &str) -> bool {
        let key = name.to_lowercase();
        let critical = match self.nodes.get_mut(&key) {
            Some(n) => {
                n.fail_at = None;
                n.critical
            }
            None => return false,
        };
        if critical {
            let idx = self.next_index();
            if let Some(n) = self.nodes.get_mut(&key) {
                n.critical = false;
                n.check_modify_index = idx;
            }
            self.checks_index = idx;
        }
        true
    }

    /// `serfHealth` of `name` turns critical: in the same raft write every
    /// session tied to it is invalidated (Consul's `ensureCheckTxn`), with
    /// its behavior and lock-delay.
    fn node_fail(&mut self, key: &str, now: Instant) {
        let idx = self.next_index();
        let node = match self.nodes.get_mut(key) {
            Some(n) => n,
            None => return,
        };
        node.critical = true;
        node.fail_at = None;
        node.check_modify_index = idx;
        let name = node.name.clone();
        self.checks_index = idx;
        let tied: Vec<String> = self
            .sessions
            .values()
            .filter(|s| {
                s.node.eq_ignore_ascii_case(&name)
                    && s.checks
                        .iter()
                        .flatten()
                        .any(|c| c.eq_ignore_ascii_case("serfHealth"))
            })
            .map(|s| s.id.clone())
            .collect();
        for id in tied {
            self.invalidate(idx, &id, now);
        }
    }

    fn next_index(&mut self) -> u64 {
        self.raft_index += 1;
        self.raft_index
    }

    pub fn kv_count(&self) -> usize {
        self.kv.len()
    }

    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    // ----- KV reads -------------------------------------------------------

    /// What a blocking query on `w` reports now: (index to report, change stamp).
    pub fn probe(&self, w: &Watch) -> (u64, u64) {
        match w {
            Watch::Key(k) => (self.kv_get_index(k), self.kv_key_stamp(k)),
            Watch::Prefix(p) => (self.kv_list_index(p), self.kv_prefix_stamp(p)),
            Watch::Sessions => (self.sessions_table_index(), self.sessions_stamp()),
            Watch::Checks => (self.checks_table_index(), self.checks_table_index()),
        }
    }

    /// Index reported for a missing key / an empty listing (never 0).
    pub fn kvs_table_index(&self) -> u64 {
        self.kvs_index.max(1)
    }

    pub fn kv_get(&self, key: &str) -> Option<&KvEntry> {
        self.kv.get(key)
    }

    /// Index a single-key GET reports: the entry's ModifyIndex, else the table
    /// index.
    pub fn kv_get_index(&self, key: &str) -> u64 {
        match self.kv.get(key) {
            Some(e) => e.modify_index,
            None => self.kvs_table_index(),
        }
    }

    /// Changes when `key` is created, modified or deleted.
    pub fn kv_key_stamp(&self, key: &str) -> u64 {
        match self.kv.get(key) {
            Some(e) => e.modify_index,
            None => self.tombstones.get(key).copied().unwrap_or(0),
        }
    }

    fn range<'a, T>(
        map: &'a BTreeMap<String, T>,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a String, &'a T)> + 'a {
        map.range::<str, _>((
            std::ops::Bound::Included(prefix),
            std::ops::Bound::Unbounded,
        ))
        .take_while(move |(k, _)| k.starts_with(prefix))
    }

    pub fn kv_list<'a>(&'a self, prefix: &'a str) -> Vec<(&'a String, &'a KvEntry)> {
        Self::range(&self.kv, prefix).collect()
    }

    /// Max ModifyIndex under `prefix`, including tombstones: changes whenever
    /// anything under the prefix changes.
    pub fn kv_prefix_stamp(&self, prefix: &str) -> u64 {
        if prefix.is_empty() {
            return self.kvs_index;
        }
        let live = Self::range(&self.kv, prefix)
            .map(|(_, e)| e.modify_index)
            .max()
            .unwrap_or(0);
        let dead = Self::range(&self.tombstones, prefix)
            .map(|(_, &i)| i)
            .max()
            .unwrap_or(0);
        live.max(dead)
    }

    /// Index a recurse/keys listing reports (Consul's `kvsListTxn`).
    pub fn kv_list_index(&self, prefix: &str) -> u64 {
        let sub = self.kv_prefix_stamp(prefix);
        if sub != 0 {
            sub
        } else {
            self.kvs_table_index()
        }
    }

    pub fn kv_keys(&self, prefix: &str, sep: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut last: Option<String> = None;
        for (k, _) in Self::range(&self.kv, prefix) {
            if sep.is_empty() {
                keys.push(k.clone());
                continue;
            }
            let after = &k[prefix.len()..];
            if let Some(i) = after.find(sep) {
                let folded = k[..prefix.len() + i + sep.len()].to_string();
                if last.as_deref() != Some(folded.as_str()) {
                    keys.push(folded.clone());
                    last = Some(folded);
                }
            } else {
                keys.push(k.clone());
            }
        }
        keys
    }

    // ----- KV writes ------------------------------------------------------

    fn touch_kvs(&mut self, idx: u64) {
        self.kvs_index = self.kvs_index.max(idx);
    }

    fn set_entry(&mut self, idx: u64, key: &str, mut e: KvEntry, update_session: bool) {
        let existing = self.kv.get(key);
        e.create_index = existing.map(|x| x.create_index).unwrap_or(idx);
        e.modify_index = idx;
        if !update_session {
            e.session = existing.and_then(|x| x.session.clone());
        }
        self.tombstones.remove(key);
        self.kv.insert(key.to_string(), e);
        self.touch_kvs(idx);
    }

    fn delete_entry(&mut self, idx: u64, key: &str) -> bool {
        if self.kv.remove(key).is_some() {
            self.tombstones.insert(key.to_string(), idx);
            self.touch_kvs(idx);
            true
        } else {
            false
        }
    }

    fn fresh(flags: u64, value: Vec<u8>) -> KvEntry {
        KvEntry {
            lock_index: 0,
            flags,
            value,
            session: None,
            create_index: 0,
            modify_index: 0,
        }
    }

    /// Plain PUT: LockIndex is reset to 0 but the Session is kept.
    pub fn kv_set(&mut self, key: &str, flags: u64, value: Vec<u8>) -> bool {
        let idx = self.next_index();
        self.set_entry(idx, key, Self::fresh(flags, value), false);
        true
    }

    pub fn kv_cas(&mut self, key: &str, flags: u64, value: Vec<u8>, cas: u64) -> bool {
        let idx = self.next_index();
        self.cas_at(idx, key, flags, value, cas)
    }

    fn cas_at(&mut self, idx: u64, key: &str, flags: u64, value: Vec<u8>, cas: u64) -> bool {
        let ok = match self.kv.get(key) {
            None => cas == 0,
            Some(e) => cas != 0 && cas == e.modify_index,
        };
        if ok {
            self.set_entry(idx, key, Self::fresh(flags, value), false);
        }
        ok
    }

    /// `?acquire=`. `Err` is a 500 text.
    pub fn kv_lock(
        &mut self,
        key: &str,
        flags: u64,
        value: Vec<u8>,
        session: &str,
        now: Instant,
    ) -> Result<bool, String> {
        // Lock-delay is enforced before raft: no index is consumed.
        if self.in_lock_delay(key, now) {
            return Ok(false);
        }
        let idx = self.next_index();
        self.lock_at(idx, key, flags, value, session)
    }

    fn in_lock_delay(&self, key: &str, now: Instant) -> bool {
        self.lock_delay.get(key).is_some_and(|&until| until > now)
    }

    fn lock_at(
        &mut self,
        idx: u64,
        key: &str,
        flags: u64,
        value: Vec<u8>,
        session: &str,
    ) -> Result<bool, String> {
        if session.is_empty() {
            return Err("missing session".to_string());
        }
        let sid = match lookup_key(session)? {
            Some(id) if self.sessions.contains_key(&id) => id,
            _ => return Err(format!("invalid session {}", strconv_quote(session))),
        };
        let mut e = Self::fresh(flags, value);
        e.session = Some(sid.clone());
        match self.kv.get(key) {
            Some(old) if old.session.as_deref() == Some(sid.as_str()) => {
                e.lock_index = old.lock_index;
            }
            Some(old) if old.session.is_some() => return Ok(false),
            Some(old) => e.lock_index = old.lock_index + 1,
            None => e.lock_index = 1,
        }
        self.set_entry(idx, key, e, true);
        Ok(true)
    }

    /// `?release=`. `Err` is a 500 text.
    pub fn kv_unlock(
        &mut self,
        key: &str,
        flags: u64,
        value: Vec<u8>,
        session: &str,
    ) -> Result<bool, String> {
        let idx = self.next_index();
        self.unlock_at(idx, key, flags, value, session)
    }

    fn unlock_at(
        &mut self,
        idx: u64,
        key: &str,
        flags: u64,
        value: Vec<u8>,
        session: &str,
    ) -> Result<bool, String> {
        if session.is_empty() {
            return Err("missing session".to_string());
        }
        let wanted = match uuid_index_parse(session) {
            Ok(Some(id)) => id,
            _ => session.to_string(),
        };
        let lock_index = match self.kv.get(key) {
            Some(old) if old.session.as_deref() == Some(wanted.as_str()) => old.lock_index,
            _ => return Ok(false),
        };
        let mut e = Self::fresh(flags, value);
        e.lock_index = lock_index;
        self.set_entry(idx, key, e, true);
        Ok(true)
    }

    pub fn kv_delete(&mut self, key: &str) -> bool {
        let idx = self.next_index();
        self.delete_entry(idx, key);
        true
    }

    pub fn kv_delete_cas(&mut self, key: &str, cas: u64) -> bool {
        let idx = self.next_index();
        self.delete_cas_at(idx, key, cas)
    }

    fn delete_cas_at(&mut self, idx: u64, key: &str, cas: u64) -> bool {
        match self.kv.get(key) {
            None => true,
            Some(e) if e.modify_index != cas => false,
            Some(_) => self.delete_entry(idx, key),
        }
    }

    pub fn kv_delete_tree(&mut self, prefix: &str) -> bool {
        let idx = self.next_index();
        self.delete_tree_at(idx, prefix);
        true
    }

    fn delete_tree_at(&mut self, idx: u64, prefix: &str) {
        let keys: Vec<String> = Self::range(&self.kv, prefix)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.delete_entry(idx, &k);
        }
    }

    // ----- transactions ---------------------------------------------------

    /// `PUT /v1/txn` with at least one write (Consul's `Txn.Apply`): the pre-checks
    /// (key given, lock-delay) run before raft and consume no index; then every op runs
    /// at one index and, if any fails, none takes effect (the index is still used).
    /// Errors are (op index, Consul's text) for every failed op.
    pub fn txn_apply(&mut self, ops: &[TxnKvOp], now: Instant) -> TxnOutcome {
        let mut errors = self.txn_pre_check(ops, now);
        if !errors.is_empty() {
            return Err(errors);
        }
        let idx = self.next_index();
        let before = (self.kv.clone(), self.tombstones.clone(), self.kvs_index);
        let mut results = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match self.txn_op(idx, op) {
                Ok(r) => results.extend(r),
                Err(e) => errors.push((i, e)),
            }
        }
        if errors.is_empty() {
            return Ok(results);
        }
        (self.kv, self.tombstones, self.kvs_index) = before;
        Err(errors)
    }

    /// Consul's `Txn.preCheck` (`kvsPreApply` of each op), for writes and reads alike.
    fn txn_pre_check(&self, ops: &[TxnKvOp], now: Instant) -> Vec<(usize, String)> {
        let mut errors = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if op.key.is_empty() && op.verb != "delete-tree" {
                errors.push((i, "Must provide key".to_string()));
            } else if op.verb == "lock" && self.in_lock_delay(&op.key, now) {
                errors.push((
                    i,
                    format!(
                        "failed to lock key {} due to lock delay",
                        strconv_quote(&op.key)
                    ),
                ));
            }
        }
        errors
    }

    /// A transaction of reads only (Consul's `Txn.Read`): the same pre-checks, no raft
    /// index.
    pub fn txn_read(&self, ops: &[TxnKvOp], now: Instant) -> TxnOutcome {
        let mut errors = self.txn_pre_check(ops, now);
        if !errors.is_empty() {
            return Err(errors);
        }
        let mut results = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match self.txn_read_op(op) {
                Ok(r) => results.extend(r),
                Err(e) => errors.push((i, e)),
            }
        }
        if errors.is_empty() {
            Ok(results)
        } else {
            Err(errors)
        }
    }

    /// Consul's `txnKVS`; results of writes carry no value.
    fn txn_op(&mut self, idx: u64, op: &TxnKvOp) -> Result<Vec<TxnResult>, String> {
        let key = op.key.as_str();
        let q = strconv_quote(key);
        let (v, flags) = (op.value.clone(), op.flags);
        let written = |st: &Store| -> Vec<TxnResult> {
            st.kv
                .get(key)
                .map(|e| TxnResult {
                    key: key.to_string(),
                    entry: KvEntry {
                        value: Vec::new(),
                        ..e.clone()
                    },
                })
                .into_iter()
                .collect()
        };
        match op.verb.as_str() {
            "set" => {
                self.set_entry(idx, key, Self::fresh(flags, v), false);
                Ok(written(self))
            }
            "cas" => match self.cas_at(idx, key, flags, v, op.index) {
                true => Ok(written(self)),
                false => Err(format!("failed to set key {q}, index is stale")),
            },
            "lock" => match self.lock_at(idx, key, flags, v, &op.session)? {
                true => Ok(written(self)),
                false => Err(format!("failed to lock key {q}, lock is already held")),
            },
            "unlock" => match self.unlock_at(idx, key, flags, v, &op.session)? {
                true => Ok(written(self)),
                false => Err(format!(
                    "failed to unlock key {q}, lock isn't held, or is held by another session"
                )),
            },
            "delete" => {
                self.delete_entry(idx, key);
                Ok(Vec::new())
            }
            "delete-cas" if self.delete_cas_at(idx, key, op.index) => Ok(Vec::new()),
            "delete-cas" => Err(format!("failed to delete key {q}, index is stale")),
            "delete-tree" => {
                self.delete_tree_at(idx, key);
                Ok(Vec::new())
            }
            _ => self.txn_read_op(op),
        }
    }

    fn txn_read_op(&self, op: &TxnKvOp) -> Result<Vec<TxnResult>, String> {
        let key = op.key.as_str();
        let q = strconv_quote(key);
        let shown = |k: &str, e: &KvEntry, value_shown: bool| TxnResult {
            key: k.to_string(),
            entry: KvEntry {
                value: if value_shown {
                    e.value.clone()
                } else {
                    Vec::new()
                },
                ..e.clone()
            },
        };
        match op.verb.as_str() {
            "get" => match self.kv.get(key) {
                Some(e) => Ok(vec![shown(key, e, true)]),
                None => Err(format!("key {q} doesn't exist")),
            },
            "get-tree" => Ok(Self::range(&self.kv, key)
                .map(|(k, e)| shown(k, e, true))
                .collect()),
            "check-index" => match self.kv.get(key) {
                None => Err(format!("failed to check index, key {q} doesn't exist")),
                Some(e) if e.modify_index != op.index => Err(format!(
                    "failed index check for key {q}, current modify index {} != {}",
                    e.modify_index, op.index
                )),
                Some(e) => Ok(vec![shown(key, e, false)]),
            },
            "check-session" => match self.kv.get(key) {
                None => Err(format!("failed to check session, key {q} doesn't exist")),
                Some(e) if e.session.as_deref().unwrap_or("") != op.session => Err(format!(
                    "failed session check for key {q}, current session {} != {}",
                    strconv_quote(e.session.as_deref().unwrap_or("")),
                    strconv_quote(&op.session)
                )),
                Some(e) => Ok(vec![shown(key, e, false)]),
            },
            verb => Err(format!("unknown KV verb {}", strconv_quote(verb))),
        }
    }

    // ----- sessions -------------------------------------------------------

    pub fn sessions_table_index(&self) -> u64 {
        self.sessions_index.max(1)
    }

    /// Changes whenever the sessions table changes.
    pub fn sessions_stamp(&self) -> u64 {
        self.sessions_index
    }

    pub fn session_exists(&self, canonical_id: &str) -> bool {
        self.sessions.contains_key(canonical_id)
    }

    /// Consumes a raft index, then runs the state-store checks. `Err` is a
    /// 500 text.
    pub fn session_create(&mut self, s: NewSession, now: Instant) -> Result<String, String> {
        let idx = self.next_index();
        let node = match self.node(&s.node) {
            Some(n) => n,
            None => return Err("Missing node registration".to_string()),
        };
        for check in s.checks.iter().flatten() {
            if !check.eq_ignore_ascii_case("serfHealth") {
                return Err(format!("Missing check '{check}' registration"));
            }
            if node.critical {
                return Err(format!("Check '{check}' is in critical state"));
            }
        }
        let id = s.id.clone();
        let sess = Session {
            id: s.id,
            name: s.name,
            node: s.node,
            checks: s.checks,
            lock_delay_ns: s.lock_delay_ns,
            behavior: s.behavior,
            ttl: s.ttl,
            create_index: idx,
            modify_index: idx,
            ttl_dur: s.ttl_dur,
            expires_at: s.ttl_dur.map(|t| now + t * TTL_MULTIPLIER),
        };
        self.sessions.insert(id.clone(), sess);
        self.sessions_index = idx;
        Ok(id)
    }

    /// Session lookup by a client-supplied ID. `Err` is a 500 text.
    pub fn session_get(&self, id: &str) -> Result<Option<&Session>, String> {
        Ok(lookup_key(id)?.and_then(|k| self.sessions.get(&k)))
    }

    pub fn session_list(&self) -> Vec<&Session> {
        self.sessions.values().collect()
    }

    pub fn node_sessions(&self, node: &str) -> Vec<&Session> {
        self.sessions
            .values()
            .filter(|s| s.node.eq_ignore_ascii_case(node))
            .collect()
    }

    /// Renew: resets the TTL timer; no index change.
    pub fn session_renew(&mut self, id: &str, now: Instant) -> Result<Option<&Session>, String> {
        let key = match lookup_key(id)? {
            Some(k) => k,
            None => return Ok(None),
        };
        match self.sessions.get_mut(&key) {
            Some(s) => {
                if let Some(t) = s.ttl_dur {
                    s.expires_at = Some(now + t * TTL_MULTIPLIER);
                }
                Ok(Some(&*s))
            }
            None => Ok(None),
        }
    }

    /// `PUT /v1/session/destroy/<id>`: consumes an index even when the session
    /// does not exist. `Err` is a 500 text.
    pub fn session_destroy(&mut self, id: &str, now: Instant) -> Result<(), String> {
        let idx = self.next_index();
        if let Some(key) = lookup_key(id)? {
            self.invalidate(idx, &key, now);
        }
        Ok(())
    }

    /// Invalidates a session now, as a TTL expiry would. Returns whether it
    /// existed.
    pub fn session_expire(&mut self, id: &str, now: Instant) -> bool {
        let key = match lookup_key(id) {
            Ok(Some(k)) if self.sessions.contains_key(&k) => k,
            _ => return false,
        };
        let idx = self.next_index();
        self.invalidate(idx, &key, now)
    }

    fn invalidate(&mut self, idx: u64, key: &str, now: Instant) -> bool {
        let sess = match self.sessions.remove(key) {
            Some(s) => s,
            None => return false,
        };
        self.sessions_index = idx;
        let delay = if sess.lock_delay_ns > 0 {
            Duration::from_nanos(sess.lock_delay_ns as u64).min(MAX_LOCK_DELAY)
        } else {
            Duration::ZERO
        };
        let held: Vec<String> = self
            .kv
            .iter()
            .filter(|(_, e)| e.session.as_deref() == Some(key))
            .map(|(k, _)| k.clone())
            .collect();
        for k in held {
            match sess.behavior {
                Behavior::Release => {
                    if let Some(mut e) = self.kv.get(&k).cloned() {
                        e.session = None;
                        self.set_entry(idx, &k, e, true);
                    }
                }
                Behavior::Delete => {
                    self.delete_entry(idx, &k);
                }
            }
            if !delay.is_zero() {
                self.lock_delay.insert(k, now + delay);
            }
        }
        true
    }

    /// Fails the nodes whose agents went silent long enough ago, invalidates
    /// every TTL session whose deadline has passed; returns how many raft
    /// writes that took. Also forgets lock-delays that are over.
    pub fn reap(&mut self, now: Instant) -> usize {
        let failed: Vec<String> = self
            .nodes
            .iter()
            .filter(|(_, n)| n.fail_at.is_some_and(|t| t <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &failed {
            self.node_fail(key, now);
        }
        let due: Vec<String> = self
            .sessions
            .values()
            .filter(|s| s.expires_at.is_some_and(|t| t <= now))
            .map(|s| s.id.clone())
            .collect();
        for id in &due {
            let idx = self.next_index();
            self.invalidate(idx, id, now);
        }
        self.lock_delay.retain(|_, until| *until > now);
        failed.len() + due.len()
    }
}

pub fn kv_json(key: &str, e: &KvEntry) -> J {
    let mut fields = vec![
        ("LockIndex".to_string(), J::U(e.lock_index)),
        ("Key".to_string(), J::s(key)),
        ("Flags".to_string(), J::U(e.flags)),
        (
            "Value".to_string(),
            if e.value.is_empty() {
                J::Null
            } else {
                J::S(base64::engine::general_purpose::STANDARD.encode(&e.value))
            },
        ),
    ];
    if let Some(s) = &e.session {
        fields.push(("Session".to_string(), J::s(s.as_str())));
    }
    fields.push(("CreateIndex".to_string(), J::U(e.create_index)));
    fields.push(("ModifyIndex".to_string(), J::U(e.modify_index)));
    J::O(fields)
}

pub fn session_json(s: &Session) -> J {
    J::obj([
        ("ID", J::s(s.id.as_str())),
        ("Name", J::s(s.name.as_str())),
        ("Node", J::s(s.node.as_str())),
        (
            "Checks",
            match &s.checks {
                Some(c) => J::A(c.iter().map(|x| J::s(x.as_str())).collect()),
                None => J::Null,
            },
        ),
        ("LockDelay", J::I(s.lock_delay_ns)),
        ("Behavior", J::s(s.behavior.as_str())),
        ("TTL", J::s(s.ttl.as_str())),
        ("CreateIndex", J::U(s.create_index)),
        ("ModifyIndex", J::U(s.modify_index)),
    ])
}

/// One entry of `/v1/health/node/<node>`: the node's `serfHealth` check.
pub fn serf_health_json(n: &Node) -> J {
    let (status, output) = if n.critical {
        ("critical", "Agent not live or unreachable")
    } else {
        ("passing", "Agent alive and reachable")
    };
    J::obj([
        ("Node", J::s(n.name.as_str())),
        ("CheckID", J::s("serfHealth")),
        ("Name", J::s("Serf Health Status")),
        ("Status", J::s(status)),
        ("Notes", J::s("")),
        ("Output", J::s(output)),
        ("ServiceID", J::s("")),
        ("ServiceName", J::s("")),
        ("ServiceTags", J::A(Vec::new())),
        ("Definition", J::O(Vec::new())),
        ("CreateIndex", J::U(n.check_create_index)),
        ("ModifyIndex", J::U(n.check_modify_index)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(st: &mut Store, node: &str, checks: Option<Vec<&str>>, delay: Duration) -> String {
        let id = crate::devserver::util::uuid_v4();
        st.session_create(
            NewSession {
                id,
                name: String::new(),
                node: node.to_string(),
                checks: checks.map(|c| c.into_iter().map(String::from).collect()),
                lock_delay_ns: delay.as_nanos() as i64,
                behavior: Behavior::Release,
                ttl: String::new(),
                ttl_dur: None,
            },
            Instant::now(),
        )
        .expect("session create")
    }

    /// Consul 1.0.8 echoes any LockDelay but applies at most 60 s
    /// (`11-lock-delay-cap.json`: refused at 59 s, acquired at 60 s).
    #[test]
    fn lock_delay_applied_is_capped_at_60s() {
        let mut st = Store::new("n");
        let waiter = session(&mut st, "n", Some(vec!["serfHealth"]), Duration::ZERO);
        // An injected clock that only moves forward.
        let mut t0 = Instant::now();
        for requested in [Duration::from_secs(120), Duration::from_secs(3_600_000)] {
            t0 += Duration::from_secs(100);
            let holder = session(&mut st, "n", Some(vec!["serfHealth"]), requested);
            let echoed = st.session_get(&holder).unwrap().unwrap().lock_delay_ns;
            assert_eq!(echoed as u128, requested.as_nanos(), "echoed unchanged");
            assert_eq!(st.kv_lock("k", 0, b"x".to_vec(), &holder, t0), Ok(true));
            st.session_destroy(&holder, t0).unwrap();
            for (after, want) in [(0, false), (59_000, false), (59_999, false), (60_000, true)] {
                let now = t0 + Duration::from_millis(after);
                let got = st.kv_lock("k", 0, b"w".to_vec(), &waiter, now);
                assert_eq!(
                    got,
                    Ok(want),
                    "{requested:?} delay, acquire {after} ms after"
                );
            }
            st.kv_unlock("k", 0, Vec::new(), &waiter).unwrap();
        }
        // LockDelay 0: free at once.
        let holder = session(&mut st, "n", Some(vec!["serfHealth"]), Duration::ZERO);
        t0 += Duration::from_secs(100);
        assert_eq!(st.kv_lock("z", 0, Vec::new(), &holder, t0), Ok(true));
        st.session_destroy(&holder, t0).unwrap();
        assert_eq!(st.kv_lock("z", 0, Vec::new(), &waiter, t0), Ok(true));
    }

    #[test]
    fn node_failure_invalidates_tied_sessions_in_one_index() {
        let mut st = Store::new("srv");
        assert!(st.node_register("client1", false, None));
        assert!(
            !st.node_register("CLIENT1", false, None),
            "names are case-insensitive"
        );
        let a = session(
            &mut st,
            "client1",
            Some(vec!["serfHealth"]),
            Duration::from_secs(5),
        );
        let t = session(&mut st, "client1", Some(vec![]), Duration::from_secs(5));
        let s = session(
            &mut st,
            "srv",
            Some(vec!["serfHealth"]),
            Duration::from_secs(5),
        );
        let t0 = Instant::now();
        for (key, id) in [("a", &a), ("t", &t), ("s", &s)] {
            assert_eq!(st.kv_lock(key, 0, Vec::new(), id, t0), Ok(true));
        }
        let before = st.raft_index;
        assert!(st.node_fail_at("client1", t0 + Duration::from_secs(6)));
        assert_eq!(
            st.reap(t0 + Duration::from_millis(5999)),
            0,
            "not before detect"
        );
        assert_eq!(st.reap(t0 + Duration::from_secs(6)), 1);
        let idx = before + 1;
        assert_eq!(st.raft_index, idx, "one raft write");
        let n = st.node("client1").unwrap();
        assert!(n.critical);
        assert_eq!(n.check_modify_index, idx);
        assert_eq!(st.checks_table_index(), idx);
        assert!(st.session_get(&a).unwrap().is_none());
        assert_eq!(st.sessions_table_index(), idx);
        let ka = st.kv_get("a").unwrap();
        assert_eq!(
            (ka.session.as_deref(), ka.lock_index, ka.modify_index),
            (None, 1, idx)
        );
        assert_eq!(st.kv_get("t").unwrap().session.as_deref(), Some(t.as_str()));
        assert_eq!(st.kv_get("s").unwrap().session.as_deref(), Some(s.as_str()));
        // Lock-delay from the invalidation.
        let tf = t0 + Duration::from_secs(6);
        assert_eq!(
            st.kv_lock("a", 0, Vec::new(), &s, tf + Duration::from_millis(4999)),
            Ok(false)
        );
        assert_eq!(
            st.kv_lock("a", 0, Vec::new(), &s, tf + Duration::from_secs(5)),
            Ok(true)
        );
        // No new serfHealth session on a failed node.
        let err = st
            .session_create(
                NewSession {
                    id: crate::devserver::util::uuid_v4(),
                    name: String::new(),
                    node: "client1".to_string(),
                    checks: Some(vec!["serfHealth".to_string()]),
                    lock_delay_ns: 0,
                    behavior: Behavior::Release,
                    ttl: String::new(),
                    ttl_dur: None,
                },
                tf,
            )
            .unwrap_err();
        assert_eq!(err, "Check 'serfHealth' is in critical state");
        // Alive again: passing in one more write; sessions stay gone.
        let before = st.raft_index;
        assert!(st.node_alive("client1"));
        assert_eq!(st.raft_index, before + 1);
        assert!(!st.node("client1").unwrap().critical);
        assert_eq!(st.node("client1").unwrap().check_modify_index, before + 1);
        // A thaw before detection cancels the failure.
        assert!(st.node_fail_at("client1", tf));
        assert!(st.node_alive("client1"));
        assert_eq!(st.reap(tf + Duration::from_secs(60)), 0);
        assert!(!st.node_fail_at("nope", tf));
    }
}
