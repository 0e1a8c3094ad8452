//! What `run` and `sem` share: the session, the wait, the child, and the exit code.
//! A `Claim` (a lock or a semaphore slot) plugs in how to acquire, watch and release.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::consul::{next_index, Client, ConsulError, KvPair, QueryOptions};
use crate::error::{exit, Error, Result};
use crate::guardian::{ClaimInfo, Guardian};
use crate::session::{Session, SessionRef, SessionSpec};
use crate::supervise::{self, Child, Event, Outcome, Program, StopPolicy};
use crate::ui;

/// Blocking-query wait while waiting or watching; Consul caps waits at 10 minutes.
pub const WATCH_WAIT: Duration = Duration::from_secs(300);

/// How a monitor decides that Consul is unreachable for good.
#[derive(Debug, Clone, Copy)]
pub struct MonitorPolicy {
    /// Failed reads in a row tolerated before the claim counts as lost.
    pub retries: u32,
    pub retry_time: Duration,
}

/// Everything `run`/`sem` need besides the claim itself.
pub struct HoldSpec {
    pub program: Program,
    pub session: SessionSpec,
    pub timeout: Option<Duration>,
    pub busy_exit_code: i32,
    pub stop: StopPolicy,
    pub monitor: MonitorPolicy,
}

/// The value a holder stores in its key.
#[derive(Debug, Clone)]
pub enum HolderValue {
    /// `--value` or `--value-file`, stored as given.
    Given(Vec<u8>),
    /// conlock's default JSON; `started` is stamped at each write, so the successful one
    /// says when holding began.
    Default { host: String, command: String },
}

impl HolderValue {
    pub fn bytes(&self) -> Vec<u8> {
        match self {
            HolderValue::Given(v) => v.clone(),
            HolderValue::Default { host, command } => serde_json::to_vec(&serde_json::json!({
                "host": host,
                "pid": std::process::id(),
                "command": command,
                "started": ui::timestamp(std::time::SystemTime::now()),
            }))
            .expect("json value"),
        }
    }
}

/// What a claim learned when it was acquired.
#[derive(Debug, Clone)]
pub struct Held {
    pub lock_index: u64,
    /// The key's ModifyIndex right after the acquisition: the fencing token.
    pub modify_index: u64,
}

/// A lock or a semaphore slot.
pub trait Claim: Send + Sync + 'static {
    /// For messages: `lock "k"` or `semaphore "p" (limit 2)`.
    fn describe(&self) -> String;
    /// Waits until held (`Some`) or until `deadline` (`None`: busy).
    fn acquire(
        &self,
        client: &Client,
        session: &Session,
        deadline: Option<Instant>,
        wait: &WaitDisplay,
    ) -> Result<Option<Held>>;
    /// Watches the claim until it is lost (sends `Event::Lost`) or `stop` is set.
    fn monitor(
        &self,
        client: Client,
        session_id: String,
        held: Held,
        policy: MonitorPolicy,
        events: Sender<Event>,
        stop: Arc<AtomicBool>,
    );
    /// Gives the claim back and removes what is no longer needed. Best effort.
    fn release(&self, client: &Client, session_id: &str);
    /// Whether the session must be renewed while waiting (a semaphore's contender key
    /// keeps its place in line; a lock waiter holds nothing).
    fn renew_while_waiting(&self) -> bool {
        true
    }
    /// What the guardian must release if conlock dies while holding.
    fn guardian_info(&self) -> ClaimInfo;
    /// Extra environment for the child.
    fn env(&self, held: &Held, session_id: &str) -> Vec<(String, String)>;
}

/// Signals that end conlock while it waits, and start the grace period while it holds.
const TERMINATING: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

enum Phase {
    /// No session yet: a terminating signal ends conlock (the guardian tidies up).
    Starting,
    /// Waiting for the claim: a terminating signal ends conlock at once.
    Acquiring { client: Client, session: SessionRef },
    /// Signals go to the supervising loop.
    Holding(Sender<Event>),
}

/// Runs the whole life cycle and returns the exit code.
pub fn hold(client: &Client, spec: HoldSpec, claim: Arc<dyn Claim>) -> Result<i32> {
    let guardian = Guardian::start(client.config());
    let result = hold_guarded(client, spec, claim, guardian.as_ref());
    if let Some(g) = guardian {
        g.done();
    }
    result
}

fn hold_guarded(
    client: &Client,
    spec: HoldSpec,
    claim: Arc<dyn Claim>,
    guardian: Option<&Arc<Guardian>>,
) -> Result<i32> {
    // From here on a stderr nobody reads must not block supervision or renewal.
    ui::detach();
    // Handlers first, so no signal finds the default action once we own anything.
    let phase = Arc::new(Mutex::new(Phase::Starting));
    install_signal_thread(phase.clone())?;
    let session = Session::create(
        client,
        spec.session.clone(),
        guardian.cloned(),
        claim.renew_while_waiting(),
    )?;
    *phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Acquiring {
        client: client.clone(),
        session: session.handle(),
    };

    let wait = WaitDisplay::start(claim.describe());
    let deadline = spec.timeout.map(|t| Instant::now() + t);
    let acquired = claim.acquire(client, &session, deadline, &wait);
    wait.finish();
    let held = match acquired {
        Ok(Some(h)) => h,
        Ok(None) => {
            ui::notice(format_args!(
                "{} is busy; gave up waiting (exit {})",
                claim.describe(),
                spec.busy_exit_code
            ));
            session.destroy();
            return Ok(spec.busy_exit_code);
        }
        Err(e) => {
            session.destroy();
            return Err(e);
        }
    };
    let (tx, rx) = mpsc::channel();
    // From here on, signals are queued for the supervising loop instead of ending conlock
    // with a session destroy (which would impose the lock-delay on everyone else).
    *phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Holding(tx.clone());
    let session_id = session.id();
    if let Some(g) = guardian {
        g.claim(claim.guardian_info());
    }
    match session.resume_renewing() {
        Ok(true) => {}
        Ok(false) | Err(_) => {
            claim.release(client, &session_id);
            session.destroy();
            return Err(Error::Other(anyhow::anyhow!(
                "the session {session_id} could not be confirmed right after acquiring {}; gave it back",
                claim.describe()
            )));
        }
    }
    ui::verbose(format_args!(
        "acquired {} (LockIndex {}, fencing token {})",
        claim.describe(),
        held.lock_index,
        held.modify_index
    ));
    session.notify_lost(tx.clone());
    // A stop request or a loss that came before the command started: do not start it.
    let pending: Vec<Event> = rx.try_iter().collect();
    let early_exit = pending.iter().find_map(|e| match e {
        Event::Signal(sig) if TERMINATING.contains(sig) => Some(128 + sig),
        Event::Lost(_) => Some(exit::LOST),
        _ => None,
    });
    if let Some(code) = early_exit {
        ui::verbose(format_args!(
            "stopping before the command started (exit {code})"
        ));
        claim.release(client, &session_id);
        session.destroy();
        return Ok(code);
    }
    for e in pending {
        let _ = tx.send(e);
    }
    let mut env = vec![
        ("CONLOCK_SESSION".to_string(), session_id.clone()),
        (
            "CONLOCK_LOCK_INDEX".to_string(),
            held.lock_index.to_string(),
        ),
        (
            "CONLOCK_MODIFY_INDEX".to_string(),
            held.modify_index.to_string(),
        ),
        ("CONSUL_LOCK_HELD".to_string(), "true".to_string()),
    ];
    env.extend(claim.env(&held, &session_id));

    let child = match Child::spawn(&spec.program, &env, tx.clone(), guardian.map(|g| &**g)) {
        Ok(c) => c,
        Err(e) => {
            claim.release(client, &session_id);
            session.destroy();
            return Err(e);
        }
    };
    // Started after the child so that its first request does not slow the spawn; a loss
    // in between is still seen, as the watch starts from the acquisition's index.
    let stop_monitor = Arc::new(AtomicBool::new(false));
    {
        let (claim, client, sid, held, policy, tx, stop) = (
            claim.clone(),
            client.clone(),
            session_id.clone(),
            held.clone(),
            spec.monitor,
            tx.clone(),
            stop_monitor.clone(),
        );
        let lost = tx.clone();
        if let Err(e) = std::thread::Builder::new()
            .name("monitor".into())
            .spawn(move || claim.monitor(client, sid, held, policy, tx, stop))
        {
            // Without a monitor the lock cannot be watched: stop as if it were lost.
            let _ = lost.send(Event::Lost(format!("cannot start the monitor thread: {e}")));
        }
    }

    let (outcome, group_gone) =
        supervise::supervise(&child, &rx, &|| session.deadline(), spec.stop);
    stop_monitor.store(true, Ordering::SeqCst);
    let pgid = child.pid();
    child.finish();
    if !group_gone {
        // Releasing now would let a new holder start beside survivors. Stop renewing
        // instead: the session expires by its TTL, then the lock-delay runs.
        drop(session);
        ui::error(format_args!(
            "processes of the command (group {pgid}) survive SIGKILL (or may not be signalled); not releasing {}: session {session_id} expires by its TTL",
            claim.describe()
        ));
        return Ok(match outcome {
            Outcome::Exited(code) => code,
            Outcome::Lost(_) => exit::LOST,
        });
    }
    // The whole process group is gone: now the claim may go.
    claim.release(client, &session_id);
    session.destroy();
    Ok(match outcome {
        Outcome::Exited(code) => {
            ui::verbose(format_args!(
                "command exited with {code}; released {}",
                claim.describe()
            ));
            code
        }
        Outcome::Lost(reason) => {
            ui::verbose(format_args!(
                "exiting {} after losing {}: {reason}",
                exit::LOST,
                claim.describe()
            ));
            exit::LOST
        }
    })
}

fn install_signal_thread(phase: Arc<Mutex<Phase>>) -> Result<()> {
    // Signals ignored when conlock started (`nohup`, background jobs of a non-interactive
    // shell) stay ignored: not caught, not forwarded, and the child inherits SIG_IGN.
    let caught: Vec<i32> = supervise::FORWARDED
        .into_iter()
        .filter(|&sig| !supervise::ignored(sig))
        .collect();
    let mut signals = signal_hook::iterator::Signals::new(caught)
        .map_err(|e| Error::Other(anyhow::anyhow!("cannot install signal handlers: {e}")))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let guard = phase.lock().unwrap_or_else(|p| p.into_inner());
                match &*guard {
                    Phase::Holding(tx) => {
                        let _ = tx.send(Event::Signal(sig));
                    }
                    Phase::Starting => {
                        if TERMINATING.contains(&sig) {
                            ui::flush();
                            std::process::exit(128 + sig);
                        }
                    }
                    Phase::Acquiring { client, session } => {
                        if [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT].contains(&sig)
                        {
                            ui::clear_status();
                            ui::verbose(format_args!("signal {sig} while waiting; giving up"));
                            // Destroying the session also drops anything it may just have acquired.
                            let _ = client.session_destroy(&session.id());
                            ui::flush();
                            std::process::exit(128 + sig);
                        }
                    }
                }
            }
        })
        .map_err(|e| Error::Other(e.into()))?;
    Ok(())
}

/// The waiting status: one line on a terminal, progress lines with -v.
pub struct WaitDisplay {
    what: String,
    started: Instant,
    holder: Arc<Mutex<Option<String>>>,
    done: Arc<AtomicBool>,
}

impl WaitDisplay {
    pub fn start(what: String) -> WaitDisplay {
        let d = WaitDisplay {
            what,
            started: Instant::now(),
            holder: Arc::new(Mutex::new(None)),
            done: Arc::new(AtomicBool::new(false)),
        };
        if ui::stderr_is_terminal() && ui::level() == ui::Level::Normal {
            let (what, holder, done, started) =
                (d.what.clone(), d.holder.clone(), d.done.clone(), d.started);
            let _ = std::thread::Builder::new()
                .name("status".into())
                .spawn(move || {
                    // Only draw once the wait is noticeable.
                    std::thread::sleep(Duration::from_millis(300));
                    while !done.load(Ordering::SeqCst) {
                        let h = holder.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        let by = h.map(|h| format!(", held by {h}")).unwrap_or_default();
                        ui::status_line(&format!(
                            "conlock: waiting for {what}{by} ({}s)",
                            started.elapsed().as_secs()
                        ));
                        std::thread::sleep(Duration::from_millis(500));
                    }
                });
        }
        d
    }

    /// Reports who holds the claim now (`None`: nobody, or a lock-delay).
    pub fn holder(&self, who: Option<String>) {
        let mut h = self.holder.lock().unwrap_or_else(|p| p.into_inner());
        if *h != who {
            match &who {
                Some(w) => ui::verbose(format_args!("waiting for {}: held by {w}", self.what)),
                None => ui::verbose(format_args!("{} has no holder; trying", self.what)),
            }
            *h = who;
        }
    }

    pub fn finish(&self) {
        self.done.store(true, Ordering::SeqCst);
        ui::clear_status();
    }
}

/// Pause between tries while Consul cannot be reached during a wait.
const UNREACHABLE_RETRY: Duration = Duration::from_secs(1);

/// After a retryable failure while waiting: says so and pauses. False when `deadline`
/// has passed (the caller then gives up as busy).
pub fn pause_after_failure(e: &ConsulError, deadline: Option<Instant>) -> bool {
    ui::notice(format_args!("{e}; retrying"));
    if deadline_passed(deadline) {
        return false;
    }
    sleep_until_deadline(UNREACHABLE_RETRY, deadline);
    true
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

/// Is this error Consul saying our session does not exist (any more)?
pub fn is_invalid_session(e: &ConsulError) -> bool {
    match e {
        ConsulError::Server { body, .. } | ConsulError::Rejected { body, .. } => {
            body.contains("invalid session") || body.contains("not found")
        }
        _ => false,
    }
}

/// Follows one key with blocking queries until `lost` says why it is lost (sent as
/// `Event::Lost`), `stop` is set, or Consul stays unreadable past the retry policy.
pub fn watch_key(
    client: &Client,
    key: &str,
    start_index: u64,
    policy: MonitorPolicy,
    events: &Sender<Event>,
    stop: &AtomicBool,
    lost: impl Fn(Option<&KvPair>) -> Option<String>,
) {
    let mut index = start_index;
    let mut failures = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let q = if index == 0 {
            QueryOptions::default()
        } else {
            QueryOptions::blocking(index, WATCH_WAIT)
        };
        let reason = match client.kv_get(key, q) {
            Ok((pair, meta)) => {
                failures = 0;
                index = next_index(index, meta.index);
                lost(pair.as_ref())
            }
            Err(e) => {
                failures += 1;
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
                let _ = events.send(Event::Lost(reason));
            }
            return;
        }
    }
}
