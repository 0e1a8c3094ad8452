//! The leader lock: one key, acquired with a session, wire-compatible with `consul lock`
//! (Consul's api.Lock): flags `LOCK_FLAGS`, key `<prefix>/.lock` for `--prefix`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lockdelay::DelayTracker;
use super::store::{Store, StoreError};
use super::{
    self as claim, Claim, ClaimSpec, Held, HolderValue, LossReport, MonitorPolicy, SessionHandle,
    WaitDisplay, Waited, WATCH_WAIT,
};
use crate::clock::BootInstant;
use crate::consul::{
    next_index, Client, ConsulError, KvPair, PutOptions, QueryMeta, QueryOptions, LOCK_FLAGS,
};
use crate::error::{Error, Result};
use crate::ui;

/// How long a waiter that lost the race for a freed lock waits before it looks who won
/// (see `Lock::take`). A later change is not missed: the watch goes on from the index of
/// that look.
const LOSER_PAUSE: Duration = Duration::from_millis(5);

pub struct Lock {
    pub key: String,
    pub value: HolderValue,
    /// The key's ModifyIndex when we last saw ourselves holding it (0: unknown). Lets
    /// `release` free and remove the key with one check-and-set delete.
    held_at: AtomicU64,
}

impl Lock {
    pub fn new(key: String, value: HolderValue) -> Lock {
        Lock {
            key,
            value,
            held_at: AtomicU64::new(0),
        }
    }
}

impl Lock {
    fn check_flags(&self, pair: &KvPair) -> Result<()> {
        if pair.flags != LOCK_FLAGS {
            let hint = if pair.flags == crate::consul::SEMAPHORE_FLAGS {
                "; a prefix holds either a lock or a semaphore: use `conlock sem` here as the others do, or another key"
            } else {
                ""
            };
            return Err(Error::Conflict(format!(
                "key {:?} is {}, not a lock's; refusing to touch it{hint}",
                self.key,
                claim::key_kind(pair.flags)
            )));
        }
        Ok(())
    }

    /// Reads the key back after acquiring. Also records where we hold it, so that a job
    /// that ends before the monitor's first answer still releases with one request.
    /// The read is consistent: it is the first confirmation (see `Session::deadline`).
    fn read_held(
        &self,
        client: &Client,
        session_id: &str,
    ) -> std::result::Result<Option<Held>, ConsulError> {
        let sent = BootInstant::now();
        let (pair, _) = client.kv_get(&self.key, QueryOptions::consistent())?;
        let held = pair
            .filter(|p| p.holder() == Some(session_id))
            .map(|p| Held {
                lock_index: p.lock_index,
                fencing_token: p.modify_index,
                confirmed_at: sent,
            });
        if let Some(h) = &held {
            self.held_at.store(h.fencing_token, Ordering::SeqCst);
        }
        Ok(held)
    }
}

/// What one attempt to take the lock did.
enum Take {
    Held(Held),
    /// Another holder was faster: its read, for the next turn.
    Changed((Option<KvPair>, QueryMeta)),
    /// Refused with no holder: a lock-delay of a session that ended.
    LockDelay,
    /// Our session does not exist (any more).
    InvalidSession,
    /// Consul said it took the key for us, but a consistent read right after does not
    /// show it held by us with our flags.
    Puzzling(String),
}

impl Lock {
    /// Takes the key, last seen free and a lock (or absent), with `?acquire` and the flags
    /// in the query string: Consul before 1.7 rounds 64-bit flags in a `/v1/txn` body
    /// (recorded in 12-txn), so transactions never carry them. The consistent read after
    /// it gives the fencing token and is the first confirmation (see `Session::deadline`).
    fn take(
        &self,
        client: &Client,
        session_id: &str,
        deadline: Option<Instant>,
    ) -> std::result::Result<Take, ConsulError> {
        let put = PutOptions {
            flags: LOCK_FLAGS,
            acquire: Some(session_id),
            ..Default::default()
        };
        match client.kv_put(&self.key, &self.value.bytes(), put) {
            Ok(true) => {}
            Ok(false) => {
                // Refused: another waiter was faster, or a lock-delay runs. One look
                // tells them apart; a new holder is then watched as usual. The look
                // waits a little: the winner is reading its key back and starting its
                // command now, on the same CPUs as the agent and every other loser.
                claim::sleep_until_deadline(LOSER_PAUSE, deadline);
                let look = client.kv_get(&self.key, QueryOptions::default())?;
                return Ok(if look.0.as_ref().is_some_and(|p| p.holder().is_some()) {
                    Take::Changed(look)
                } else {
                    Take::LockDelay
                });
            }
            Err(e) if claim::is_invalid_session(&e) => return Ok(Take::InvalidSession),
            Err(e) => return Err(e),
        }
        let sent = BootInstant::now();
        let (pair, meta) = client.kv_get(&self.key, QueryOptions::consistent())?;
        match pair {
            Some(p) if p.holder() == Some(session_id) && p.flags == LOCK_FLAGS => {
                self.held_at.store(p.modify_index, Ordering::SeqCst);
                Ok(Take::Held(Held {
                    lock_index: p.lock_index,
                    fencing_token: p.modify_index,
                    confirmed_at: sent,
                }))
            }
            // Taken from us at once: only an invalidated session explains it, and the
            // next acquire says so (invalid session).
            Some(p) if p.holder().is_some_and(|h| h != session_id) => {
                Ok(Take::Changed((Some(p), meta)))
            }
            other => Ok(Take::Puzzling(format!(
                "Consul answered true to acquiring {:?} with session {session_id} and Flags {LOCK_FLAGS:#x}, but a consistent read right after shows {}",
                self.key,
                claim::describe_pair(other.as_ref())
            ))),
        }
    }
}

impl Lock {
    /// Why a read of the key means the lock is no longer ours (`None`: it still is; then
    /// remembers where we hold it).
    fn lost_because(&self, pair: Option<&KvPair>, session_id: &str) -> Option<String> {
        match pair {
            None => Some("the lock key was deleted".to_string()),
            Some(p) if p.holder() == Some(session_id) => {
                self.held_at.store(p.modify_index, Ordering::SeqCst);
                None
            }
            Some(p) => Some(match p.holder() {
                Some(other) => format!("the lock is now held by session {other}"),
                None => "the lock was released (session invalidated or destroyed, or released by an operator)".to_string(),
            }),
        }
    }
}

impl Claim for Lock {
    fn describe(&self) -> String {
        format!("lock {:?}", self.key)
    }

    fn acquire(
        &self,
        store: &Store,
        session: &dyn SessionHandle,
        deadline: Option<Instant>,
        wait: &WaitDisplay,
    ) -> Result<Option<Held>> {
        let client = store.consul();
        let mut index = 0;
        let mut delay = DelayTracker::default();
        let mut puzzles = claim::Puzzles::default();
        // A read made by the last attempt, for the next turn of the loop.
        let mut looked = None;
        // When we last replaced the session: one Consul calls invalid within its TTL (it
        // keeps one 2 TTL) makes no sense, and replacing it again at once would loop.
        let mut replaced_at: Option<Instant> = None;
        loop {
            if session.lost().is_some() {
                if !claim::replace_session(session, deadline)? {
                    return Ok(None);
                }
                replaced_at = Some(Instant::now());
            }
            let session_id = session.id();
            let q = match deadline {
                _ if index == 0 => QueryOptions::default(),
                Some(d) => QueryOptions::blocking(
                    index,
                    d.saturating_duration_since(Instant::now()).min(WATCH_WAIT),
                ),
                None => QueryOptions::blocking(index, WATCH_WAIT),
            };
            let read = match looked.take() {
                Some(r) => Ok(r),
                None => client.kv_get(&self.key, q),
            };
            let (pair, meta) = match claim::while_waiting(read, deadline)? {
                Waited::Got(r) => r,
                Waited::Retry => {
                    index = 0;
                    continue;
                }
                Waited::Busy => return Ok(None),
            };
            index = next_index(index, meta.index);
            if let Some(p) = &pair {
                self.check_flags(p)?;
                if let Some(h) = p.holder() {
                    if h == session_id {
                        // An earlier acquire went through though we did not see its answer.
                        match claim::while_waiting(self.read_held(client, &session_id), deadline)? {
                            Waited::Got(Some(h)) => return Ok(Some(h)),
                            Waited::Got(None) => {
                                let what = format!("the acquire of key {:?}", self.key);
                                let detail = format!(
                                    "a read shows it held by our session {session_id}, but a consistent read right after does not"
                                );
                                if !puzzles.puzzled(client, &what, detail, deadline)? {
                                    return Ok(None);
                                }
                            }
                            Waited::Retry => {}
                            Waited::Busy => return Ok(None),
                        }
                        index = 0;
                        continue;
                    }
                    // Another holder in between: a later puzzle is a first one.
                    puzzles.clear();
                    if delay.is_new_holder(h) {
                        // Once per holder: who it is, for the message, and its lock-delay,
                        // which can only be read while it holds. conlock's own value says
                        // both; only another tool's holder costs a session lookup.
                        let info = super::describe::holder_from_value(p, h)
                            .unwrap_or_else(|| super::describe::holder(client, p, h));
                        delay.held_by(h, info.lock_delay_ns.map(Duration::from_nanos));
                        wait.held_by(info.describe(), h);
                    }
                    if claim::deadline_passed(deadline) {
                        return Ok(None);
                    }
                    continue;
                }
            }
            delay.saw_free();
            index = 0;
            match self.take(client, &session_id, deadline) {
                Ok(Take::Held(h)) => return Ok(Some(h)),
                Ok(Take::Changed(look)) => {
                    puzzles.clear();
                    looked = Some(look);
                }
                Ok(Take::LockDelay) => {
                    puzzles.clear();
                    // Nothing changes on the server until the lock-delay ends: sleep.
                    let retry = delay.refused();
                    wait.lock_delay(retry.until);
                    if claim::deadline_passed(deadline) {
                        return Ok(None);
                    }
                    claim::sleep_until_deadline(retry.after, deadline);
                }
                Ok(Take::InvalidSession) => {
                    if replaced_at.is_some_and(|t| t.elapsed() < session.ttl()) {
                        let what = format!("the acquire of key {:?}", self.key);
                        let detail = format!(
                            "Consul refused it with the new session {session_id} (invalid session)"
                        );
                        if !puzzles.puzzled(client, &what, detail, deadline)? {
                            return Ok(None);
                        }
                    } else {
                        puzzles.clear();
                    }
                    ui::verbose(format_args!(
                        "session {session_id} is gone; creating a new one"
                    ));
                    session.gone(format!("Consul calls session {session_id} invalid"));
                    if !claim::replace_session(session, deadline)? {
                        return Ok(None);
                    }
                    replaced_at = Some(Instant::now());
                }
                Ok(Take::Puzzling(detail)) => {
                    let what = format!("the acquire of key {:?}", self.key);
                    if !puzzles.puzzled(client, &what, detail, deadline)? {
                        return Ok(None);
                    }
                }
                // Ambiguous: the next read shows whether the write went through.
                Err(e) if e.is_retryable() => {
                    if !claim::pause_after_failure(&e, deadline) {
                        return Ok(None);
                    }
                }
                Err(e) => return Err(e.into()),
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
        claim::watch_key(
            client,
            &self.key,
            held.fencing_token,
            policy,
            &*lost,
            &stop,
            |pair| self.lost_because(pair, &session_id),
        );
    }

    fn confirm(
        &self,
        store: &Store,
        session_id: &str,
    ) -> std::result::Result<Option<String>, StoreError> {
        let client = store.consul();
        let (pair, _) = client.kv_get(&self.key, QueryOptions::consistent())?;
        Ok(self.lost_because(pair.as_ref(), session_id))
    }

    fn release(&self, store: &Store, session_id: &str) -> bool {
        let client = store.consul();
        // Retried through a leader election's 5xx answers, for 10 s in all.
        let mut r = claim::Releasing::new(client);
        // One request in the common case: the key is exactly as we last held it, so a
        // check-and-set delete frees it and leaves nothing behind, as `consul lock` does.
        let held_at = self.held_at.load(Ordering::SeqCst);
        if held_at > 0
            && r.retry(|client| client.kv_delete(&self.key, Some(held_at), false))
                .unwrap_or(false)
        {
            ui::verbose(format_args!("released {}", self.describe()));
            return true;
        }
        let put = PutOptions {
            flags: LOCK_FLAGS,
            release: Some(session_id),
            ..Default::default()
        };
        let released = match r.retry(|client| client.kv_put(&self.key, &[], put)) {
            Ok(true) => {
                ui::verbose(format_args!("released {}", self.describe()));
                true
            }
            // Not ours (any more): nothing to give back.
            Ok(false) => false,
            Err(e) => {
                ui::warn(format_args!(
                    "could not release {}: {e}; it frees when the session ends",
                    self.describe()
                ));
                return false;
            }
        };
        // Like `consul lock`, leave no key behind; the CAS keeps a new holder's key intact.
        // Except when an invalidation freed it (not our release): Consul applies a
        // lock-delay now, and the key is left saying until when, for `status`.
        let client = r.client();
        if let Ok((Some(p), _)) = client.kv_get(&self.key, QueryOptions::default()) {
            if p.holder().is_none()
                && p.flags == LOCK_FLAGS
                && (released || !super::lockdelay::record_until(client, &p, None))
            {
                let _ = client.kv_delete(&self.key, Some(p.modify_index), false);
            }
        }
        true
    }

    fn renew_while_waiting(&self) -> bool {
        false
    }

    fn spec(&self) -> ClaimSpec {
        ClaimSpec::Lock {
            key: self.key.clone(),
        }
    }

    fn env(&self, held: &Held, _session_id: &str) -> Vec<(String, String)> {
        let mut env = claim::consul_env(held);
        env.push(("CONLOCK_KEY".to_string(), self.key.clone()));
        env
    }
}
