//! The leader lock: one key, acquired with a session, wire-compatible with `consul lock`
//! (Consul's api.Lock): flags `LOCK_FLAGS`, key `<prefix>/.lock` for `--prefix`.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::lockdelay::DelayTracker;
use super::{
    self as claim, Claim, ClaimSpec, Held, HolderValue, LossReport, MonitorPolicy, SessionHandle,
    WaitDisplay, Waited, WATCH_WAIT,
};
use crate::clock::BootInstant;
use crate::consul::{
    next_index, Client, ConsulError, KvPair, PutOptions, QueryOptions, TxnAnswer, TxnKvOp,
    LOCK_FLAGS,
};
use crate::error::{Error, Result};
use crate::ui;

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
            return Err(Error::Conflict(format!(
                "key {:?} exists but is not a conlock/consul lock (Flags {:#x}, expected {LOCK_FLAGS:#x}); refusing to touch it",
                self.key, pair.flags
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
                modify_index: p.modify_index,
                confirmed_at: sent,
            });
        if let Some(h) = &held {
            self.held_at.store(h.modify_index, Ordering::SeqCst);
        }
        Ok(held)
    }
}

/// What one attempt to take the lock did.
enum Take {
    Held(Held),
    /// The key is no longer as we saw it (another holder, or written meanwhile).
    Changed,
    /// Refused for a lock-delay of a session that ended.
    LockDelay,
    /// Our session does not exist (any more).
    InvalidSession,
}

impl Lock {
    /// Takes the key if it is still as last seen free (ModifyIndex `at`, 0: absent), in
    /// one transaction that also answers with the key as we now hold it: the fencing
    /// token, with no read after. A raft write that shows us holding is the first
    /// confirmation (see `Session::deadline`), as of when it was sent.
    fn take(
        &self,
        client: &Client,
        session_id: &str,
        at: u64,
    ) -> std::result::Result<Take, ConsulError> {
        let value = self.value.bytes();
        // A key that is not free, or not a lock, is never overwritten: the guard fails.
        let guard = if at == 0 {
            TxnKvOp::cas(&self.key, &value, LOCK_FLAGS, 0)
        } else {
            TxnKvOp::check_index(&self.key, at)
        };
        let ops = [
            guard,
            TxnKvOp::lock(&self.key, &value, LOCK_FLAGS, session_id),
        ];
        let sent = BootInstant::now();
        let answer = client.txn(&ops, &format!("acquire of key {:?}", self.key))?;
        if answer.refused_for_lock_delay() {
            return Ok(Take::LockDelay);
        }
        if answer.refused_for_invalid_session() {
            return Ok(Take::InvalidSession);
        }
        let TxnAnswer::Done(results) = answer else {
            return Ok(Take::Changed);
        };
        let Some(p) = results
            .into_iter()
            .rfind(|p| p.key == self.key && p.holder() == Some(session_id))
        else {
            return Ok(Take::Changed);
        };
        self.held_at.store(p.modify_index, Ordering::SeqCst);
        Ok(Take::Held(Held {
            lock_index: p.lock_index,
            modify_index: p.modify_index,
            confirmed_at: sent,
        }))
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
        client: &Client,
        session: &dyn SessionHandle,
        deadline: Option<Instant>,
        wait: &WaitDisplay,
    ) -> Result<Option<Held>> {
        let mut index = 0;
        let mut delay = DelayTracker::default();
        // Take the key as it was last seen free: at this ModifyIndex (0: absent). The
        // first try assumes the usual case, no key, and so needs no read before it.
        let mut take_at = Some(0);
        loop {
            if session.lost().is_some() {
                session.recreate()?;
            }
            let session_id = session.id();
            if let Some(at) = take_at.take() {
                match self.take(client, &session_id, at) {
                    Ok(Take::Held(h)) => return Ok(Some(h)),
                    // Someone else wrote it first: read it and go on from there.
                    Ok(Take::Changed) => {}
                    Ok(Take::LockDelay) => {
                        // Nothing changes on the server until the lock-delay ends: sleep.
                        let retry = delay.refused();
                        wait.lock_delay(retry.until);
                        if claim::deadline_passed(deadline) {
                            return Ok(None);
                        }
                        claim::sleep_until_deadline(retry.after, deadline);
                    }
                    Ok(Take::InvalidSession) => {
                        ui::verbose(format_args!(
                            "session {session_id} is gone; creating a new one"
                        ));
                        session.recreate()?;
                    }
                    // Ambiguous: the next read shows whether the write went through.
                    Err(e) if e.is_retryable() => {
                        if !claim::pause_after_failure(&e, deadline) {
                            return Ok(None);
                        }
                    }
                    Err(e) => return Err(e.into()),
                }
                index = 0;
                continue;
            }
            let q = match deadline {
                _ if index == 0 => QueryOptions::default(),
                Some(d) => QueryOptions::blocking(
                    index,
                    d.saturating_duration_since(Instant::now()).min(WATCH_WAIT),
                ),
                None => QueryOptions::blocking(index, WATCH_WAIT),
            };
            let (pair, meta) = match claim::while_waiting(client.kv_get(&self.key, q), deadline)? {
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
                            Waited::Got(None) | Waited::Retry => {}
                            Waited::Busy => return Ok(None),
                        }
                        index = 0;
                        continue;
                    }
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
            take_at = Some(pair.map_or(0, |p| p.modify_index));
        }
    }

    fn monitor(
        &self,
        client: Client,
        session_id: String,
        held: Held,
        policy: MonitorPolicy,
        lost: LossReport,
        stop: Arc<AtomicBool>,
    ) {
        claim::watch_key(
            &client,
            &self.key,
            held.modify_index,
            policy,
            &*lost,
            &stop,
            |pair| self.lost_because(pair, &session_id),
        );
    }

    fn confirm(
        &self,
        client: &Client,
        session_id: &str,
    ) -> std::result::Result<Option<String>, ConsulError> {
        let (pair, _) = client.kv_get(&self.key, QueryOptions::consistent())?;
        Ok(self.lost_because(pair.as_ref(), session_id))
    }

    fn release(&self, client: &Client, session_id: &str) {
        // One request in the common case: the key is exactly as we last held it, so a
        // check-and-set delete frees it and leaves nothing behind, as `consul lock` does.
        let held_at = self.held_at.load(Ordering::SeqCst);
        if held_at > 0
            && client
                .kv_delete(&self.key, Some(held_at), false)
                .unwrap_or(false)
        {
            ui::verbose(format_args!("released {}", self.describe()));
            return;
        }
        let put = PutOptions {
            flags: LOCK_FLAGS,
            release: Some(session_id),
            ..Default::default()
        };
        match client.kv_put(&self.key, &[], put) {
            Ok(true) => ui::verbose(format_args!("released {}", self.describe())),
            Ok(false) => {}
            Err(e) => ui::warn(format_args!(
                "could not release {}: {e}; destroying the session frees it",
                self.describe()
            )),
        }
        // Like `consul lock`, leave no key behind; the CAS keeps a new holder's key intact.
        if let Ok((Some(p), _)) = client.kv_get(&self.key, QueryOptions::default()) {
            if p.holder().is_none() && p.flags == LOCK_FLAGS {
                let _ = client.kv_delete(&self.key, Some(p.modify_index), false);
            }
        }
    }

    fn renew_while_waiting(&self) -> bool {
        false
    }

    fn spec(&self) -> ClaimSpec {
        ClaimSpec::Lock {
            key: self.key.clone(),
        }
    }

    fn env(&self, _held: &Held, _session_id: &str) -> Vec<(String, String)> {
        vec![("CONLOCK_KEY".to_string(), self.key.clone())]
    }
}
