//! The claims: what it means to hold a lock or a semaphore slot, how to wait for one,
//! watch it, confirm it and give it back. Below the hold life cycle (`crate::hold`), above
//! the Consul client: nothing here knows about processes, signals or the guardian.

mod build;
pub mod describe;
pub mod etcd_lock;
pub mod etcd_semaphore;
pub mod inspect;
pub mod lock;
pub mod lockdelay;
pub mod semaphore;
pub mod store;
pub mod waiting;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::clock::BootInstant;
use crate::consul::{next_index, Client, ConsulError, KvPair, QueryOptions};
use crate::error::Result;
use crate::ui;

pub use store::{Store, StoreConfig, StoreError};
pub use waiting::WaitDisplay;

/// Blocking-query wait while waiting or watching; Consul caps waits at 10 minutes.
pub const WATCH_WAIT: Duration = Duration::from_secs(300);

/// How a monitor decides that Consul is unreachable for good.
#[derive(Debug, Clone, Copy)]
pub struct MonitorPolicy {
    /// Failed reads in a row tolerated before the claim counts as lost.
    pub retries: u32,
    pub retry_time: Duration,
    /// The least time between two reads that found the claim still ours (0: none).
    pub min_gap: Duration,
}

/// The value a holder stores in its key.
#[derive(Debug, Clone)]
pub enum HolderValue {
    /// `--value` or `--value-file`, stored as given.
    Given(Vec<u8>),
    /// conlock's default JSON; `started` is stamped at each write, so the successful one
    /// says when holding began.
    Default {
        host: String,
        command: String,
        /// The session's lock-delay, so that `status` can tell how long a key left by an
        /// invalidated session may block new holders.
        lock_delay: String,
    },
}

impl HolderValue {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            HolderValue::Given(v) => v.clone(),
            HolderValue::Default {
                host,
                command,
                lock_delay,
            } => serde_json::to_vec(&serde_json::json!({
                "host": host,
                "pid": std::process::id(),
                "command": command,
                "started": ui::timestamp(std::time::SystemTime::now()),
                "lock_delay": lock_delay,
            }))
            .expect("json value"),
        }
    }
}

/// What a claim learned when it was acquired.
#[derive(Debug, Clone)]
pub struct Held {
    pub lock_index: u64,
    /// Grows strictly from holder to holder (Consul: the key's ModifyIndex right after
    /// the acquisition).
    pub fencing_token: u64,
    /// When the consistent read that showed us holding was sent: the first confirmation.
    pub confirmed_at: BootInstant,
}

/// What the session keeper (`crate::hold`) offers a claim while it waits.
pub trait SessionHandle {
    /// The current session ID (it changes on `recreate`).
    fn id(&self) -> String;
    /// Why the session is known to be gone, if it is.
    fn lost(&self) -> Option<String>;
    /// Replaces a lost session by a new one, within `deadline` (the wait's `--timeout`).
    fn recreate(&self, deadline: Option<Instant>) -> std::result::Result<(), StoreError>;
    /// The store said the session is gone (`why`): a wait that gives up does not destroy it.
    fn gone(&self, why: String);
    fn ttl(&self) -> Duration;
    /// The effective lock-delay (a semaphore holder's cushion).
    fn lock_delay(&self) -> Duration;
}

/// The variables a Consul claim's child gets beside the common ones (as `consul lock`
/// sets CONSUL_LOCK_HELD; the ModifyIndex under its Consul name).
pub fn consul_env(held: &Held) -> Vec<(String, String)> {
    vec![
        (
            "CONLOCK_LOCK_INDEX".to_string(),
            held.lock_index.to_string(),
        ),
        (
            "CONLOCK_MODIFY_INDEX".to_string(),
            held.fencing_token.to_string(),
        ),
        ("CONSUL_LOCK_HELD".to_string(), "true".to_string()),
    ]
}

/// Where a monitor reports a loss (the hold life cycle stops the command).
pub type LossReport = Arc<dyn Fn(String) + Send + Sync>;

/// A claim as data: what the guardian must give back if conlock dies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClaimSpec {
    Lock {
        key: String,
    },
    Semaphore {
        prefix: String,
        limit: u32,
    },
    /// The etcd lock `NAME` (keys `NAME/<lease hex>`).
    EtcdLock {
        name: String,
    },
    /// The etcd semaphore `P` (keys `P/<lease hex>`, slot records `E.conlock%slot-…`).
    EtcdSemaphore {
        prefix: String,
        limit: u32,
    },
}

impl ClaimSpec {
    /// For messages: `the lock "k"` or `a slot of semaphore "p"`.
    pub fn describe(&self) -> String {
        match self {
            ClaimSpec::Lock { key } => format!("the lock {key:?}"),
            ClaimSpec::Semaphore { prefix, .. } => format!("a slot of semaphore {prefix:?}"),
            ClaimSpec::EtcdLock { name } => format!("the lock {name:?}"),
            ClaimSpec::EtcdSemaphore { prefix, .. } => format!("a slot of semaphore {prefix:?}"),
        }
    }
}

/// A lock or a semaphore slot.
pub trait Claim: Send + Sync + 'static {
    /// For messages: `lock "k"` or `semaphore "p" (limit 2)`.
    fn describe(&self) -> String;
    /// Waits until held (`Some`) or until `deadline` (`None`: busy).
    fn acquire(
        &self,
        store: &Store,
        session: &dyn SessionHandle,
        deadline: Option<Instant>,
        wait: &WaitDisplay,
    ) -> Result<Option<Held>>;
    /// Watches the claim until it is lost (calls `lost` with the reason) or `stop` is set.
    fn monitor(
        &self,
        store: Store,
        session_id: String,
        held: Held,
        policy: MonitorPolicy,
        lost: LossReport,
        stop: Arc<AtomicBool>,
    );
    /// One consistent read that proves the claim is still ours (`Ok(None)`), or says why
    /// it is not (`Ok(Some(reason))`). Repeated while holding; see `Session::deadline`.
    fn confirm(
        &self,
        store: &Store,
        session_id: &str,
    ) -> std::result::Result<Option<String>, StoreError>;
    /// Gives the claim back and removes what is no longer needed. Best effort: false
    /// when Consul could not be told (then the session's end frees it).
    fn release(&self, store: &Store, session_id: &str) -> bool;
    /// Giving up while waiting (a stop request): takes back a take whose answer has not
    /// come and that may have landed (etcd: its record outlives the lease, and would cost
    /// conlock waiters its cushion). Nothing to do where the session's end drops it all.
    fn take_back(&self, _store: &Store, _session_id: &str) {}
    /// Whether the session must be renewed while waiting (a semaphore's contender key
    /// keeps its place in line; a lock waiter holds nothing).
    fn renew_while_waiting(&self) -> bool {
        true
    }
    /// The claim as data (for the guardian, which rebuilds it with `ClaimSpec::build`).
    fn spec(&self) -> ClaimSpec;
    /// Extra environment for the child.
    fn env(&self, held: &Held, session_id: &str) -> Vec<(String, String)>;
}

/// Pause between tries while Consul cannot be reached during a wait.
const UNREACHABLE_RETRY: Duration = Duration::from_secs(1);

/// After a retryable failure while waiting: says so and pauses. False when `deadline`
/// has passed (the caller then gives up as busy).
pub fn pause_after_failure(e: &ConsulError, deadline: Option<Instant>) -> bool {
    if deadline_passed(deadline) {
        // A request cut short by the wait's own end is no news.
        if !e.cut_short() {
            ui::notice(format_args!("{e}; not retrying: --timeout has passed"));
        }
        return false;
    }
    ui::notice(format_args!("{e}; retrying"));
    sleep_until_deadline(UNREACHABLE_RETRY, deadline);
    true
}

/// What a read made while waiting gave.
pub enum Waited<T> {
    Got(T),
    /// A failure that may pass: said so and paused; read again from index 0.
    Retry,
    /// Such a failure with `deadline` passed: give up as busy.
    Busy,
}

/// Sorts the answer of a read made while waiting (see `pause_after_failure`).
pub fn while_waiting<T>(
    r: std::result::Result<T, ConsulError>,
    deadline: Option<Instant>,
) -> Result<Waited<T>> {
    match r {
        Ok(v) => Ok(Waited::Got(v)),
        Err(e) if e.is_retryable() => Ok(if pause_after_failure(&e, deadline) {
            Waited::Retry
        } else {
            Waited::Busy
        }),
        Err(e) => Err(e.into()),
    }
}

/// Replaces a lost session (etcd: lease) while waiting. A store that cannot make one now
/// (an election, a member that hangs) is asked again after a pause, as every other
/// failure while waiting is, until `deadline`. False once it has passed: give up as busy.
pub fn replace_session(session: &dyn SessionHandle, deadline: Option<Instant>) -> Result<bool> {
    loop {
        // After a pause that ran to --timeout no request is sent.
        if deadline_passed(deadline) {
            return Ok(false);
        }
        match session.recreate(deadline) {
            Ok(()) => return Ok(true),
            Err(e) if e.is_retryable() || e.cut_short() => {
                if deadline_passed(deadline) {
                    ui::notice(format_args!("{e}; not retrying: --timeout has passed"));
                    return Ok(false);
                }
                ui::notice(format_args!("{e}; retrying"));
                sleep_until_deadline(UNREACHABLE_RETRY, deadline);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Sleeps `d`, but not past `deadline`.
pub fn sleep_until_deadline(d: Duration, deadline: Option<Instant>) {
    let d = match deadline {
        Some(dl) => d.min(dl.saturating_duration_since(Instant::now())),
        None => d,
    };
    std::thread::sleep(d);
}

pub fn deadline_passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

/// Pause between tries of a release that Consul answered with a 5xx.
const RELEASE_RETRY: Duration = Duration::from_millis(250);
/// How long a release answered with 5xx is tried, from the first such answer: longer
/// than a leader election (2.4-4.2 s measured on a 3-server cluster on loopback).
pub const RELEASE_ELECTION_BUDGET: Duration = Duration::from_secs(10);

/// The steps of one release, each run again while Consul answers it with a 5xx (a
/// leader election answers 500 for a few seconds), every 250 ms, for up to
/// `RELEASE_ELECTION_BUDGET` in all from the first such answer, the client's deadline
/// moved out that far: a release that is lost costs the next holder the session's TTL
/// and lock-delay. An agent that does not answer at all is not waited for beyond the
/// client's deadline (until a 5xx came).
pub struct Releasing {
    client: Client,
    until: Option<Instant>,
}

impl Releasing {
    pub fn new(client: &Client) -> Releasing {
        Releasing {
            client: client.clone(),
            until: None,
        }
    }

    /// The client for a step that is not retried.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Whether a step was answered with a 5xx (an election): what follows the release
    /// (the session's destroy, one try) may not get through either.
    pub fn met_election(&self) -> bool {
        self.until.is_some()
    }

    pub fn retry<T>(
        &mut self,
        mut f: impl FnMut(&Client) -> std::result::Result<T, ConsulError>,
    ) -> std::result::Result<T, ConsulError> {
        loop {
            match f(&self.client) {
                Err(e @ ConsulError::Server { .. }) => {
                    let until = *self
                        .until
                        .get_or_insert_with(|| Instant::now() + RELEASE_ELECTION_BUDGET);
                    if Instant::now() + RELEASE_RETRY >= until {
                        return Err(e);
                    }
                    if self.client.deadline().is_some_and(|d| d < until) {
                        self.client = self.client.with_deadline(
                            until,
                            "a release answered with 5xx is retried for up to 10s in all",
                        );
                    }
                    ui::verbose(format_args!("releasing: {e}; retrying"));
                    std::thread::sleep(RELEASE_RETRY);
                }
                other => return other,
            }
        }
    }
}

/// Pause after an answer that made no sense, before trying once more.
const PUZZLED_PAUSE: Duration = Duration::from_millis(200);

/// Answers conlock cannot make sense of (a write Consul said it applied that a consistent
/// read right after does not show). Once can be a race with an operator; twice in a row
/// is a server that stores something else than what it was sent (as Consul before 1.7
/// did with 64-bit flags in a transaction), and retrying would only hammer it.
#[derive(Debug, Default)]
pub struct Puzzles {
    seen: bool,
}

impl Puzzles {
    /// A sensible answer came: the next puzzle is a first one again.
    pub fn clear(&mut self) {
        self.seen = false;
    }

    /// Records a puzzling answer: the second in a row is an error (exit 125) that says
    /// what Consul answered and what was expected; the first pauses. False when
    /// `deadline` passed meanwhile (busy).
    pub fn puzzled(
        &mut self,
        client: &Client,
        what: &str,
        detail: String,
        deadline: Option<Instant>,
    ) -> Result<bool> {
        if self.seen {
            return Err(ConsulError::BadAnswer {
                what: what.to_string(),
                addr: client.config().addr.clone(),
                detail: format!(
                    "{detail} (twice in a row; a Consul agent that changes what it stores, such as 64-bit flags in a transaction before 1.7, or a proxy in between?)"
                ),
            }
            .into());
        }
        self.seen = true;
        ui::notice(format_args!("{what}: {detail}; trying once more"));
        if deadline_passed(deadline) {
            return Ok(false);
        }
        sleep_until_deadline(PUZZLED_PAUSE, deadline);
        Ok(true)
    }
}

/// What a key's Flags make of it, in words: `a lock's key (conlock run, consul lock)`.
pub fn key_kind(flags: u64) -> String {
    match flags {
        crate::consul::LOCK_FLAGS => "a lock's key (conlock run, consul lock)".to_string(),
        crate::consul::SEMAPHORE_FLAGS => {
            "a semaphore's key (conlock sem, consul lock -n)".to_string()
        }
        0 => "a plain key (no lock flags: written by something else)".to_string(),
        f => format!("a key with Flags {f:#x}, used by neither conlock nor consul lock"),
    }
}

/// A key as read, for messages.
pub fn describe_pair(pair: Option<&KvPair>) -> String {
    match pair {
        None => "no key".to_string(),
        Some(p) => format!(
            "the key with Flags {:#x}, {}",
            p.flags,
            match p.holder() {
                Some(h) => format!("held by session {h}"),
                None => "held by no session".to_string(),
            }
        ),
    }
}

/// Is this error Consul saying our session does not exist (any more)?
pub fn is_invalid_session(e: &ConsulError) -> bool {
    e.is_invalid_session()
}

/// Follows one key with consistent blocking queries until `lost` says why it is lost
/// (passed to `report`), `stop` is set, or Consul stays unreadable past the retry
/// policy. After a failed read it starts again from index 0, as Consul's client does: a
/// proxy that cuts idle connections costs one retry, not the claim, and a server that
/// lost its state answers at once instead of blocking on an index it never reached.
pub fn watch_key(
    client: &Client,
    key: &str,
    start_index: u64,
    policy: MonitorPolicy,
    report: &dyn Fn(String),
    stop: &AtomicBool,
    lost: impl Fn(Option<&KvPair>) -> Option<String>,
) {
    let mut index = start_index;
    let mut failures = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let q = if index == 0 {
            QueryOptions::consistent()
        } else {
            QueryOptions::blocking(index, WATCH_WAIT).and_consistent()
        };
        let reason = match client.kv_get(key, q) {
            Ok((pair, meta)) => {
                failures = 0;
                index = next_index(index, meta.index);
                let why = lost(pair.as_ref());
                if why.is_none() && !policy.min_gap.is_zero() {
                    std::thread::sleep(policy.min_gap);
                }
                why
            }
            Err(e) => {
                failures += 1;
                index = 0;
                if failures > policy.retries {
                    Some(format!("cannot read {key} after {failures} tries: {e}"))
                } else {
                    ui::verbose(format_args!(
                        "watching {key} failed ({e}); retry {failures} of {}",
                        policy.retries
                    ));
                    std::thread::sleep(policy.retry_time);
                    None
                }
            }
        };
        if let Some(reason) = reason {
            if !stop.load(Ordering::SeqCst) {
                report(reason);
            }
            return;
        }
    }
}
