//! The semaphore: N slots on a prefix, wire-compatible with `consul lock -n N`
//! (Consul's api.Semaphore). Each contender holds `P/<session>` with its session
//! (behavior delete); `P/.lock` holds `{"Limit":N,"Holders":{"<session>":true}}` and is
//! only ever changed by check-and-set.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::store::{Store, StoreError};
use super::{
    self as claim, Claim, ClaimSpec, Held, HolderValue, LossReport, MonitorPolicy, SessionHandle,
    WaitDisplay, Waited, WATCH_WAIT,
};
use crate::clock::BootInstant;
use crate::consul::CONSUL_MAX_LOCK_DELAY;
use crate::consul::{
    next_index, Client, ConsulError, KvPair, PutOptions, QueryOptions, SEMAPHORE_FLAGS,
};
use crate::error::{Error, Result};
use crate::ui;

const LOCK_KEY: &str = ".lock";
/// The least time between a holder's reads of `.lock`.
const LOCK_WATCH_GAP: Duration = Duration::from_millis(200);
/// A waiter that is not first in line for a free slot tries anyway after this long
/// without any change, so that a dead waiter at the head of the line stalls nobody.
const NOT_MY_TURN_WAIT: Duration = Duration::from_millis(500);
/// The pause after a check-and-set that would create `.lock` found it missing again.
const LOCK_RECREATED_PAUSE: Duration = Duration::from_millis(200);
/// The first pause before a release reads `.lock` again after a lost check-and-set.
const RELEASE_RETRY_PAUSE: Duration = Duration::from_millis(5);

pub struct Semaphore {
    pub prefix: String,
    pub limit: u32,
    pub value: HolderValue,
}

/// The decoded `.lock` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockState {
    pub limit: u32,
    pub holders: BTreeMap<String, bool>,
    /// Each conlock holder's lock-delay in ms: the cushion conlock waiters give it once
    /// its contender key is gone. `consul lock` ignores the field (and drops it when it
    /// rewrites `.lock`; a holder without an entry gets Consul's 60 s cap).
    pub delays: BTreeMap<String, u64>,
}

/// The `.lock` field that carries `LockState::delays`.
pub const DELAYS_FIELD: &str = "ConlockLockDelayMs";

#[derive(Deserialize)]
struct RawLock {
    #[serde(rename = "Limit")]
    limit: u32,
    #[serde(rename = "Holders", default)]
    holders: Option<RawHolders>,
    #[serde(rename = "ConlockLockDelayMs", default)]
    delays: Option<BTreeMap<String, u64>>,
}

/// Consul's api writes a map; the Consul tutorial shows a list.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawHolders {
    Map(BTreeMap<String, bool>),
    List(Vec<String>),
}

impl LockState {
    pub fn decode(value: &[u8], key: &str) -> Result<Option<LockState>> {
        if value.is_empty() {
            return Ok(None);
        }
        let raw: RawLock = serde_json::from_slice(value).map_err(|e| {
            Error::Conflict(format!(
                "{key} does not hold a semaphore description ({e}); refusing to touch it"
            ))
        })?;
        let holders = match raw.holders {
            None => BTreeMap::new(),
            Some(RawHolders::Map(m)) => m.into_iter().filter(|(_, held)| *held).collect(),
            Some(RawHolders::List(l)) => l.into_iter().map(|s| (s, true)).collect(),
        };
        let mut delays = raw.delays.unwrap_or_default();
        delays.retain(|s, _| holders.contains_key(s));
        Ok(Some(LockState {
            limit: raw.limit,
            holders,
            delays,
        }))
    }

    /// The cushion a vanished holder gets: its recorded lock-delay, else Consul's cap.
    pub fn cushion(&self, session: &str) -> Duration {
        self.delays
            .get(session)
            .map_or(CONSUL_MAX_LOCK_DELAY, |&ms| Duration::from_millis(ms))
            .min(CONSUL_MAX_LOCK_DELAY)
    }

    /// Removes a holder and its cushion entry.
    pub fn remove(&mut self, session: &str) {
        self.holders.remove(session);
        self.delays.remove(session);
    }

    /// Same field order as Consul's api: `{"Limit":N,"Holders":{...}}`, then the
    /// cushions when there are any.
    pub fn encode(&self) -> Vec<u8> {
        #[derive(serde::Serialize)]
        struct Wire<'a> {
            #[serde(rename = "Limit")]
            limit: u32,
            #[serde(rename = "Holders")]
            holders: &'a BTreeMap<String, bool>,
            #[serde(
                rename = "ConlockLockDelayMs",
                skip_serializing_if = "BTreeMap::is_empty"
            )]
            delays: &'a BTreeMap<String, u64>,
        }
        serde_json::to_vec(&Wire {
            limit: self.limit,
            holders: &self.holders,
            delays: &self.delays,
        })
        .expect("json")
    }
}

/// One read of the whole prefix.
struct View {
    lock: Option<KvPair>,
    /// `.lock` as stored (vanished holders included).
    state: LockState,
    /// Contender keys whose session is alive: session -> (CreateIndex, ModifyIndex).
    contenders: BTreeMap<String, (u64, u64)>,
}

impl View {
    /// Holders listed in `.lock` whose contender key is gone (session ended).
    fn vanished(&self) -> Vec<String> {
        self.state
            .holders
            .keys()
            .filter(|s| !self.contenders.contains_key(*s))
            .cloned()
            .collect()
    }
}

impl View {
    /// The waiters in line before a contender created at `created`, oldest first:
    /// (session, CreateIndex, ModifyIndex). A key that is not listed in `.lock` but was
    /// rewritten (ModifyIndex above its CreateIndex) is no waiter: conlock rewrites its
    /// key only once listed, so it is a holder that just gave its slot back and whose
    /// session's destroy deletes the key next. Counted as a waiter, it made the next
    /// waiter wait for that delete before taking the slot it freed (one more read).
    fn waiters_before(&self, created: u64) -> Vec<(&String, u64, u64)> {
        let mut v: Vec<_> = self
            .contenders
            .iter()
            .filter(|(s, _)| !self.state.holders.contains_key(*s))
            .filter(|(_, &(c, m))| c < created && m == c)
            .map(|(s, &(c, m))| (s, c, m))
            .collect();
        v.sort_by_key(|&(_, c, _)| c);
        v
    }
}

/// A waiter's memory of vanished holders. Such a holder's command may still run until
/// its own deadline, which is at most its cushion after the last moment it confirmed
/// its key, so its slot is taken back only a cushion after the waiter first saw the key
/// gone (which is after the key went, which is after that confirmation).
#[derive(Default)]
pub struct Cushions {
    first_seen: std::collections::HashMap<String, Instant>,
}

impl Cushions {
    /// Drops from `state` the vanished holders whose cushion has passed. Returns when
    /// the next cushion ends, if one is still running.
    fn prune(&mut self, view: &View, state: &mut LockState) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let vanished = view.vanished();
        // A holder seen again is forgotten: if it vanishes later, its cushion starts then.
        self.first_seen.retain(|s, _| vanished.contains(s));
        for s in vanished {
            let ends = *self.first_seen.entry(s.clone()).or_insert(now) + view.state.cushion(&s);
            if now >= ends {
                state.remove(&s);
            } else {
                next = Some(next.map_or(ends, |n: Instant| n.min(ends)));
            }
        }
        next
    }
}

/// What our last write should show in the next consistent read of the prefix.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Nothing,
    /// Our contender key (we just created it).
    Key,
    /// Us in `.lock`, or `.lock` changed since this ModifyIndex (our check-and-set).
    Listed(u64),
    /// Our key changed or gone since this ModifyIndex (a refused rewrite).
    TouchRefused(u64),
}

impl Semaphore {
    fn lock_key(&self) -> String {
        format!("{}/{LOCK_KEY}", self.prefix)
    }

    fn contender_key(&self, session_id: &str) -> String {
        format!("{}/{session_id}", self.prefix)
    }

    fn view(&self, pairs: Vec<KvPair>) -> Result<View> {
        self.view_checked(pairs, true)
    }

    /// `check_limit` false: accept any stored limit (release, `break`, the guardian).
    fn view_checked(&self, pairs: Vec<KvPair>, check_limit: bool) -> Result<View> {
        let lock_key = self.lock_key();
        let mut lock = None;
        let mut contenders = BTreeMap::new();
        for p in pairs {
            if p.key == lock_key {
                lock = Some(p);
            } else if p.flags == SEMAPHORE_FLAGS
                && p.key.rsplit_once('/').map(|(d, _)| d) == Some(self.prefix.as_str())
            {
                if let Some(s) = p.holder() {
                    contenders.insert(s.to_string(), (p.create_index, p.modify_index));
                }
            }
        }
        let state = match &lock {
            Some(p) => {
                if p.flags != SEMAPHORE_FLAGS {
                    let hint = if p.flags == crate::consul::LOCK_FLAGS {
                        "; a prefix holds either a lock or a semaphore: use `conlock run --prefix` here as the others do, or another prefix"
                    } else {
                        ""
                    };
                    return Err(Error::Conflict(format!(
                        "key {lock_key:?} is {}, not a semaphore's; refusing to touch it{hint}",
                        claim::key_kind(p.flags)
                    )));
                }
                LockState::decode(p.value_bytes(), &lock_key)?
            }
            None => None,
        };
        let state = state.unwrap_or(LockState {
            limit: self.limit,
            holders: BTreeMap::new(),
            delays: BTreeMap::new(),
        });
        if check_limit && state.limit != self.limit {
            return Err(Error::Conflict(format!(
                "semaphore {:?} has a limit of {} (in {lock_key}, set by its first holder), not --limit {}: every user of one prefix must give the same limit (consul lock says \"semaphore limit conflict (lock: {}, local: {})\")",
                self.prefix, state.limit, self.limit, state.limit, self.limit
            )));
        }
        Ok(View {
            lock,
            state,
            contenders,
        })
    }

    /// Writes `.lock` by check-and-set against the view; false when someone else wrote
    /// first. Flags go in the query string: Consul before 1.7 rounds 64-bit flags in a
    /// `/v1/txn` body (recorded in 12-txn), so conlock sends no transactions.
    fn write_lock(
        &self,
        client: &Client,
        view: &View,
        state: &LockState,
    ) -> std::result::Result<bool, ConsulError> {
        let put = PutOptions {
            flags: SEMAPHORE_FLAGS,
            cas: Some(view.lock.as_ref().map_or(0, |p| p.modify_index)),
            ..Default::default()
        };
        client.kv_put(&self.lock_key(), &state.encode(), put)
    }

    /// Creates our contender key with our session, or rewrites it for a new ModifyIndex
    /// (the fencing token; a re-acquire keeps LockIndex 1, as `consul lock -n` has it).
    /// `Ok(false)`: refused, which for our own key means a lock-delay or an invalid
    /// session: our session was invalidated.
    fn write_contender(
        &self,
        client: &Client,
        sid: &str,
    ) -> std::result::Result<bool, ConsulError> {
        let put = PutOptions {
            flags: SEMAPHORE_FLAGS,
            acquire: Some(sid),
            ..Default::default()
        };
        match client.kv_put(&self.contender_key(sid), &self.value.bytes(), put) {
            Err(e) if claim::is_invalid_session(&e) => Ok(false),
            other => other,
        }
    }

    /// Why a read of our contender key means the slot is no longer ours.
    fn contender_lost(&self, pair: Option<&KvPair>, session_id: &str) -> Option<String> {
        match pair.and_then(|p| p.holder()) {
            Some(h) if h == session_id => None,
            _ => Some(format!(
                "our contender key {} is gone (session {session_id} invalidated or destroyed)",
                self.contender_key(session_id)
            )),
        }
    }
}

impl Claim for Semaphore {
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
        let client = store.consul();
        let my_delay = session.lock_delay().as_millis() as u64;
        let mut cushions = Cushions::default();
        let mut puzzles = claim::Puzzles::default();
        let mut index = 0;
        let mut wait_for = WATCH_WAIT;
        // Our contender key must be created first: at the start, and with every new
        // session. A session whose key was gone, even for a moment, runs no command: a
        // waiter may have started that vanished holder's cushion then, which a key
        // written again would cut short. So the key must keep the CreateIndex it had.
        let mut enter = true;
        let mut entered_at: Option<u64> = None;
        // The session's first write is still to come: a refusal of it makes no sense.
        let mut fresh = true;
        // What our last write should show in the next consistent read.
        let mut expect = Expect::Nothing;
        // Our key was rewritten after our slot was written, from this ModifyIndex: its
        // new ModifyIndex, the fencing token, is then later than every earlier holder's.
        let mut touched_from: Option<u64> = None;
        // A waiter far back in line watches only the waiter ahead of it, so a freed slot
        // wakes one or two waiters instead of all. Bounded, so a dead one stalls nobody.
        let chain_wait = session.ttl();
        loop {
            if session.lost().is_some() {
                if !claim::replace_session(session, deadline)? {
                    return Ok(None);
                }
                (enter, fresh) = (true, true);
            }
            let sid = session.id();
            if enter {
                let key = self.contender_key(&sid);
                let mut again = false;
                let written = crate::consul::retry_transient(
                    "creating the contender key",
                    client.deadline(),
                    || {
                        // A try whose answer was lost may have landed: writing again would
                        // make our key look rewritten, a departed holder's, to the waiters
                        // behind us (`View::waiters_before`).
                        if std::mem::replace(&mut again, true) {
                            let (pair, _) = client.kv_get(&key, QueryOptions::default())?;
                            if pair.as_ref().and_then(|p| p.holder()) == Some(sid.as_str()) {
                                return Ok(true);
                            }
                        }
                        self.write_contender(client, &sid)
                    },
                )?;
                if !written {
                    // Our session was invalidated: a new one gets a new key. A new
                    // session refused at once makes no sense.
                    if std::mem::take(&mut fresh) {
                        let what = format!("the creation of contender key {key:?}");
                        let detail = format!(
                            "Consul refused to write it with the new session {sid} (invalid session or a lock-delay)"
                        );
                        if !puzzles.puzzled(client, &what, detail, deadline)? {
                            return Ok(None);
                        }
                    }
                    if !claim::replace_session(session, deadline)? {
                        return Ok(None);
                    }
                    fresh = true;
                    continue;
                }
                (enter, fresh) = (false, false);
                expect = Expect::Key;
                entered_at = None;
                touched_from = None;
                index = 0;
            }
            // Plain reads are consistent: the one that shows us holding is the first
            // confirmation (see `Session::deadline`).
            let consistent = index == 0;
            let q = if consistent {
                QueryOptions::consistent()
            } else {
                let left =
                    deadline.map_or(wait_for, |d| d.saturating_duration_since(Instant::now()));
                QueryOptions::blocking(index, wait_for.min(left))
            };
            let sent = BootInstant::now();
            let (pairs, meta) =
                match claim::while_waiting(client.kv_list(&self.prefix, q), deadline)? {
                    Waited::Got(r) => r,
                    Waited::Retry => {
                        index = 0;
                        continue;
                    }
                    Waited::Busy => return Ok(None),
                };
            let timed_out = index != 0 && meta.index == index;
            index = next_index(index, meta.index);
            let my_key = self.contender_key(&sid);
            let mine = pairs.iter().find(|p| p.key == my_key).cloned();
            let view = self.view(pairs)?;
            let listed = view.state.holders.contains_key(&sid);
            let lock_at = view.lock.as_ref().map_or(0, |p| p.modify_index);
            let my_modified = view.contenders.get(&sid).map(|&(_, m)| m);
            let my_created = view.contenders.get(&sid).map(|&(c, _)| c);
            let rewritten =
                my_created.is_some() && entered_at.is_some_and(|c| my_created != Some(c));
            if my_created.is_some() && entered_at.is_none() {
                entered_at = my_created;
            }
            // Did our last write do what Consul said it did?
            let puzzle = match std::mem::replace(&mut expect, Expect::Nothing) {
                Expect::Nothing => None,
                Expect::Key if my_modified.is_none() => {
                    // Gone again at once: only an invalidated session explains that.
                    match client.session_info(&sid, QueryOptions::consistent()) {
                        Ok((None, _)) => None,
                        Ok((Some(_), _)) => Some(format!(
                            "Consul answered true to writing contender key {my_key:?} with session {sid} and Flags {SEMAPHORE_FLAGS:#x}, but a consistent read right after shows {}",
                            claim::describe_pair(mine.as_ref())
                        )),
                        Err(e) => {
                            if !claim::pause_after_failure(&e, deadline) {
                                return Ok(None);
                            }
                            None
                        }
                    }
                }
                // `.lock` missing again after a check-and-set that would create it is no
                // puzzle: it was created and deleted meanwhile (`consul lock -n` deletes
                // it when its last holder leaves, whoever waits). A pause, not a count,
                // so that an agent that refuses every creation is not hammered.
                Expect::Listed(0) if !listed && lock_at == 0 => {
                    if claim::deadline_passed(deadline) {
                        return Ok(None);
                    }
                    claim::sleep_until_deadline(LOCK_RECREATED_PAUSE, deadline);
                    None
                }
                Expect::Listed(at) if !listed && lock_at == at => Some(format!(
                    "a check-and-set of {:?} at ModifyIndex {at} that adds session {sid} left it unchanged",
                    self.lock_key()
                )),
                Expect::TouchRefused(from) if my_modified == Some(from) => Some(format!(
                    "Consul refused to rewrite contender key {my_key:?} at ModifyIndex {from}, but a consistent read right after shows it unchanged"
                )),
                _ => {
                    puzzles.clear();
                    None
                }
            };
            if let Some(detail) = puzzle {
                let what = format!("the acquire of a slot of semaphore {:?}", self.prefix);
                if !puzzles.puzzled(client, &what, detail, deadline)? {
                    return Ok(None);
                }
                index = 0;
                continue;
            }
            let (Some(my_modified), Some(my_created), false) = (my_modified, my_created, rewritten)
            else {
                // Our contender key vanished (session invalidated, or an operator), or
                // came back: a new session and key. Our old entry in `.lock`, if any,
                // ends after its cushion in every waiter's view; no command ran under it.
                ui::verbose(format_args!(
                    "contender key {my_key:?} was deleted; going on with a new session"
                ));
                // Out of time: no new session and key (this loop must not outlast it).
                if claim::deadline_passed(deadline) {
                    return Ok(None);
                }
                if !claim::replace_session(session, deadline)? {
                    return Ok(None);
                }
                (enter, fresh) = (true, true);
                index = 0;
                continue;
            };
            if listed {
                let Some(from) = touched_from else {
                    match self.write_contender(client, &sid) {
                        // The next read must show it rewritten (see below).
                        Ok(true) => touched_from = Some(my_modified),
                        // Rewritten or deleted meanwhile: the next read shows which.
                        Ok(false) => expect = Expect::TouchRefused(my_modified),
                        Err(e) if e.is_retryable() => {
                            if !claim::pause_after_failure(&e, deadline) {
                                return Ok(None);
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                    index = 0;
                    continue;
                };
                if !consistent {
                    index = 0;
                    continue;
                }
                if my_modified <= from {
                    let what = format!("the acquire of a slot of semaphore {:?}", self.prefix);
                    let detail = format!(
                        "Consul answered true to rewriting contender key {my_key:?} at ModifyIndex {from}, but a consistent read right after shows it unchanged"
                    );
                    if !puzzles.puzzled(client, &what, detail, deadline)? {
                        return Ok(None);
                    }
                    touched_from = None;
                    index = 0;
                    continue;
                }
                // We are in (our check-and-set, and the rewrite of our key after it, went
                // through). Only we write our key, so the token is unique.
                return Ok(Some(Held {
                    lock_index: 1,
                    fencing_token: my_modified,
                    confirmed_at: sent,
                }));
            }
            let mut state = view.state.clone();
            let cushion_ends = cushions.prune(&view, &mut state);
            let free = (self.limit as usize).saturating_sub(state.holders.len());
            // First come, first served: only the oldest `free` waiters write, so a freed
            // slot does not make every waiter rewrite `.lock` at once.
            let ahead = view.waiters_before(my_created);
            let rank = ahead.len();
            // Out of time (or `--timeout 0s`): this is the last chance, so try any free slot.
            let my_turn = rank < free || timed_out || claim::deadline_passed(deadline);
            if free > 0 && my_turn {
                state.holders.insert(sid.clone(), true);
                state.delays.insert(sid.clone(), my_delay);
                // Only a rewrite of our key after this write makes the token later than
                // the holders before us.
                touched_from = None;
                match claim::while_waiting(self.write_lock(client, &view, &state), deadline)? {
                    Waited::Got(written) => {
                        expect = Expect::Listed(lock_at);
                        // Rewrite our key at once: that wakes the waiter behind us, and
                        // it fails if our session died meanwhile (then others prune the
                        // slot we wrote after our cushion).
                        if written {
                            match self.write_contender(client, &sid) {
                                Ok(true) => touched_from = Some(my_modified),
                                Ok(false) => {}
                                Err(e) => ui::verbose(format_args!(
                                    "after taking a slot: {e}; checking again"
                                )),
                            }
                        }
                    }
                    // Ambiguous: the next (consistent) read shows whether we are in.
                    Waited::Retry => {}
                    Waited::Busy => return Ok(None),
                }
                index = 0;
                wait_for = WATCH_WAIT;
                continue;
            }
            // Only now is this a wait (and worth a line or an event); a wait is a
            // sensible answer, so a later puzzle is a first one.
            puzzles.clear();
            let vanished = match cushion_ends {
                Some(t) => format!(
                    ", a vanished holder's slot frees at about {}",
                    ui::clock_time(
                        std::time::SystemTime::now() + t.saturating_duration_since(Instant::now())
                    )
                ),
                None => String::new(),
            };
            wait.holder(Some(format!(
                "{} of {} slots, {rank} ahead in line{vanished}",
                state.holders.len(),
                self.limit
            )));
            if claim::deadline_passed(deadline) {
                return Ok(None);
            }
            if free == 0 && rank > 0 {
                // Wait for the waiter just ahead to take a slot or leave.
                let (pred, _, pred_index) = ahead[rank - 1];
                let left =
                    deadline.map_or(chain_wait, |d| d.saturating_duration_since(Instant::now()));
                let q = QueryOptions::blocking(pred_index, chain_wait.min(left));
                let ahead_key = client.kv_get(&self.contender_key(pred), q);
                if let Waited::Busy = claim::while_waiting(ahead_key, deadline)? {
                    return Ok(None);
                }
                index = 0;
                continue;
            }
            wait_for = if free > 0 {
                NOT_MY_TURN_WAIT * (1 + (rank - free) as u32).min(20)
            } else {
                WATCH_WAIT
            };
            // Nothing changes on the server when a cushion ends: wake up for it.
            if let Some(t) = cushion_ends {
                wait_for = wait_for.min(
                    t.saturating_duration_since(Instant::now())
                        .max(Duration::from_millis(1)),
                );
            }
        }
    }

    fn monitor(
        &self,
        store: Store,
        session_id: String,
        held: Held,
        policy: MonitorPolicy,
        lost: LossReport,
        stop: Arc<AtomicBool>,
    ) {
        let client = store.consul();
        // Two narrow watches instead of the whole prefix, so other contenders coming
        // and going do not wake holders.
        let my_key = self.contender_key(&session_id);
        let me = Semaphore {
            prefix: self.prefix.clone(),
            limit: self.limit,
            value: HolderValue::Given(Vec::new()),
        };
        let (c2, s2, e2, stop2) = (
            client.clone(),
            session_id.clone(),
            lost.clone(),
            stop.clone(),
        );
        // From the index at which we took the slot: any change since wakes the watch.
        let from = held.fencing_token;
        let contender_watch = std::thread::Builder::new()
            .name("monitor".into())
            .spawn(move || {
                claim::watch_key(&c2, &my_key, from, policy, &*e2, &stop2, |pair| {
                    me.contender_lost(pair, &s2)
                });
            });
        if let Err(e) = contender_watch {
            // The `.lock` watch below and the confirmations still see a loss.
            crate::ui::warn(format_args!(
                "cannot start the watch of our contender key ({e}); a loss is seen through .lock or at the next confirmation"
            ));
        }
        let lock_key = self.lock_key();
        // `.lock` changes with every slot taken or given back anywhere; only a rewrite
        // that drops us matters (not protected anyway: docs/safety.md), so a busy
        // semaphore does not make every holder read it after every change.
        claim::watch_key(
            client,
            &lock_key,
            held.fencing_token,
            MonitorPolicy {
                min_gap: LOCK_WATCH_GAP,
                ..policy
            },
            &*lost,
            &stop,
            |pair| {
                let in_holders = pair
                    .and_then(|p| LockState::decode(p.value_bytes(), &lock_key).ok().flatten())
                    .is_some_and(|s| s.holders.contains_key(&session_id));
                (!in_holders)
                    .then(|| format!("our session was removed from the holders in {lock_key}"))
            },
        );
    }

    fn confirm(
        &self,
        store: &Store,
        session_id: &str,
    ) -> std::result::Result<Option<String>, StoreError> {
        let client = store.consul();
        let (pair, _) =
            client.kv_get(&self.contender_key(session_id), QueryOptions::consistent())?;
        Ok(self.contender_lost(pair.as_ref(), session_id))
    }

    /// Removes only us: a vanished holder stays listed until a waiter's cushion for it
    /// has passed (its command may still run).
    fn release(&self, store: &Store, session_id: &str) -> bool {
        let client = store.consul();
        // Retried through a leader election's 5xx answers, for 10 s in all.
        let mut r = claim::Releasing::new(client);
        let lock_key = self.lock_key();
        // `.lock` first, by check-and-set against what we read, so that a waiter sees a
        // free slot at once (not a vanished holder with a cushion); the last one out
        // removes `.lock`, also by check-and-set, so a newcomer that just joined keeps it.
        let mut released = false;
        for attempt in 0..100u32 {
            if attempt > 0 {
                // Another holder wrote `.lock` first; a short pause, growing, so that a
                // server that keeps refusing is not hammered.
                std::thread::sleep(RELEASE_RETRY_PAUSE * attempt.min(20));
            }
            let listed = r.retry(|client| client.kv_list(&self.prefix, QueryOptions::default()));
            let mut view = match listed.map(|(pairs, _)| self.view_checked(pairs, false)) {
                Ok(Ok(v)) => v,
                Ok(Err(e)) => {
                    ui::warn(format_args!(
                        "could not release a slot of {}: {e}",
                        self.describe()
                    ));
                    break;
                }
                Err(e) => {
                    ui::warn(format_args!(
                        "could not read {}: {e}; the slot frees when the session ends",
                        self.prefix
                    ));
                    break;
                }
            };
            let Some(at) = view.lock.as_ref().map(|p| p.modify_index) else {
                released = true;
                break;
            };
            // Our own contender key still counts as alive in the view; drop us explicitly.
            view.contenders.remove(session_id);
            if !view.state.holders.contains_key(session_id) {
                released = true;
                break;
            }
            let mut state = view.state.clone();
            state.remove(session_id);
            let done = r.retry(|client| {
                if state.holders.is_empty() && view.waiters_before(u64::MAX).is_empty() {
                    client.kv_delete(&lock_key, Some(at), false)
                } else {
                    self.write_lock(client, &view, &state)
                }
            });
            match done {
                Ok(true) => {
                    ui::verbose(format_args!("released a slot of {}", self.describe()));
                    released = true;
                    break;
                }
                // `.lock` changed since our read: read again.
                Ok(false) => continue,
                Err(e) => {
                    ui::warn(format_args!(
                        "could not update {lock_key}: {e}; the slot frees when the session ends"
                    ));
                    break;
                }
            }
        }
        // After a clean release our contender key is left to the session's destroy, which
        // follows every release (the guardian's too) and deletes it (behavior delete,
        // recorded in 06-behavior-delete): one request fewer. After an election or a
        // failed release it is deleted here, retried as the release is: the destroy is
        // one try and may be skipped when the cleanup budget is spent, and a waiter of
        // an older build counts the key ahead of it until it goes (up to 2 TTL).
        if !released || r.met_election() {
            let mine = self.contender_key(session_id);
            let _ = r.retry(|client| client.kv_delete(&mine, None, false));
        }
        released
    }

    fn spec(&self) -> ClaimSpec {
        ClaimSpec::Semaphore {
            prefix: self.prefix.clone(),
            limit: self.limit,
        }
    }

    fn env(&self, held: &Held, session_id: &str) -> Vec<(String, String)> {
        let mut env = super::consul_env(held);
        env.extend([
            ("CONLOCK_KEY".to_string(), self.contender_key(session_id)),
            ("CONLOCK_PREFIX".to_string(), self.prefix.clone()),
            ("CONLOCK_LIMIT".to_string(), self.limit.to_string()),
        ]);
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_map_and_list_holders() {
        let s = LockState::decode(br#"{"Limit":2,"Holders":{"a":true,"b":true}}"#, "k")
            .unwrap()
            .unwrap();
        assert_eq!(s.limit, 2);
        assert_eq!(s.holders.keys().collect::<Vec<_>>(), ["a", "b"]);
        let s = LockState::decode(br#"{"Limit":3,"Holders":["x"]}"#, "k")
            .unwrap()
            .unwrap();
        assert!(s.holders.contains_key("x"));
        assert_eq!(LockState::decode(b"", "k").unwrap(), None);
        assert!(matches!(
            LockState::decode(b"{not json", "k"),
            Err(Error::Conflict(_))
        ));
    }

    #[test]
    fn encodes_like_consul_api() {
        let mut holders = BTreeMap::new();
        holders.insert("s1".to_string(), true);
        let mut s = LockState {
            limit: 2,
            holders,
            delays: BTreeMap::new(),
        };
        assert_eq!(s.encode(), br#"{"Limit":2,"Holders":{"s1":true}}"#.to_vec());
        s.delays.insert("s1".into(), 15_000);
        assert_eq!(
            s.encode(),
            br#"{"Limit":2,"Holders":{"s1":true},"ConlockLockDelayMs":{"s1":15000}}"#.to_vec()
        );
        let back = LockState::decode(&s.encode(), "k").unwrap().unwrap();
        assert_eq!(back, s);
        assert_eq!(back.cushion("s1"), Duration::from_secs(15));
        // consul lock's holders have no entry: Consul's cap.
        assert_eq!(back.cushion("other"), CONSUL_MAX_LOCK_DELAY);
    }
}
