//! What `run` and `sem` share: the session, the wait, the child, and the exit code.
//! A `Claim` (a lock or a semaphore slot) plugs in how to acquire, watch and release.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::clock::BootInstant;
use crate::consul::{next_index, Client, ConsulError, KvPair, QueryOptions};
use crate::error::{exit, Error, Result};
use crate::events;
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
    /// Keep the claim at least this long after the command started.
    pub min_hold: Option<Duration>,
    /// Stop the command after this long (exit `exit::MAX_TIME`).
    pub max_time: Option<Duration>,
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
    /// The key's ModifyIndex right after the acquisition: the fencing token.
    pub modify_index: u64,
    /// When the consistent read that showed us holding was sent: the first confirmation.
    pub confirmed_at: BootInstant,
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
    /// One consistent read that proves the claim is still ours (`Ok(None)`), or says why
    /// it is not (`Ok(Some(reason))`). Repeated while holding; see `Session::deadline`.
    fn confirm(
        &self,
        client: &Client,
        session_id: &str,
    ) -> std::result::Result<Option<String>, ConsulError>;
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

/// Set by a terminating signal while holding: no `--min-hold` after the command then.
static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

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
    if let Err(e) = &result {
        events::exit(
            e.exit_code(),
            "error",
            serde_json::json!({ "error": e.to_string() }),
        );
    }
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
    let waited = wait.waited();
    let held = match acquired {
        Ok(Some(h)) => h,
        Ok(None) => {
            // Say why: held by whom, or free but in a lock-delay.
            let why = wait.last().map(|w| format!(" ({w})")).unwrap_or_default();
            ui::notice(format_args!(
                "{} is busy{why}; gave up waiting (exit {})",
                claim.describe(),
                spec.busy_exit_code
            ));
            session.destroy();
            return Ok(exit_event(spec.busy_exit_code, "busy"));
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
    {
        let claim = claim.clone();
        session.start_confirming(
            held.confirmed_at,
            Box::new(move |client, sid| claim.confirm(client, sid)),
        );
    }
    ui::verbose(format_args!(
        "acquired {} (LockIndex {}, fencing token {})",
        claim.describe(),
        held.lock_index,
        held.modify_index
    ));
    events::emit(
        "acquired",
        serde_json::json!({
            "session": session_id,
            "fencing_token": held.modify_index,
            "lock_index": held.lock_index,
            "waited_ms": waited.as_millis() as u64,
        }),
    );
    session.notify_lost(tx.clone());
    // A stop request or a loss that came before the command started: do not start it.
    let pending: Vec<Event> = rx.try_iter().collect();
    let early_exit = pending.iter().find_map(|e| match e {
        Event::Signal(sig) if TERMINATING.contains(sig) => Some((128 + sig, "interrupted")),
        Event::Lost(reason) => {
            events::emit("lost", serde_json::json!({ "reason": reason }));
            Some((exit::LOST, "lost"))
        }
        _ => None,
    });
    if let Some((code, how)) = early_exit {
        ui::verbose(format_args!(
            "stopping before the command started (exit {code})"
        ));
        claim.release(client, &session_id);
        session.destroy();
        return Ok(exit_event(code, how));
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

    if let Some(g) = guardian {
        // conlock SIGKILLs the group `--kill-grace` after the deadline at the latest; if it
        // is stopped or stuck by then, the guardian does, half a margin later (so that a
        // healthy conlock is first), still half a margin before anyone else can hold it.
        let (g, late) = (g.clone(), spec.stop.grace + spec.session.margin() / 2);
        session.on_confirmed(Box::new(move |deadline| g.deadline(deadline + late)));
    }
    // Stalled since the acquisition (stopped, cut off) past the deadline: another holder
    // may already run, so the command must not start.
    if Instant::now() >= session.deadline() {
        let reason = "the claim could not be confirmed in time before the command started";
        ui::notice(format_args!(
            "lock lost: {reason}; not starting the command"
        ));
        events::emit("lost", serde_json::json!({ "reason": reason }));
        claim.release(client, &session_id);
        session.destroy();
        return Ok(exit_event(exit::LOST, "lost"));
    }
    let child = match Child::spawn(&spec.program, &env, tx.clone(), guardian.map(|g| &**g)) {
        Ok(c) => c,
        Err(e) => {
            claim.release(client, &session_id);
            session.destroy();
            return Err(e);
        }
    };
    // The spawn returned after the exec: the command has started (--min-hold and
    // --max-time count from here).
    let started = Instant::now();
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

    if let Some(limit) = spec.max_time {
        start_max_time_timer(limit, started, tx.clone());
    }

    let (outcome, group_gone) =
        supervise::supervise(&child, &rx, &|| session.deadline(), spec.stop);
    let pgid = child.pid();
    child.finish();
    if !group_gone {
        // Releasing now would let a new holder start beside survivors: keep the session
        // (it renews) until they are gone.
        ui::error(format_args!(
            "processes of group {pgid} survive SIGKILL (or may not be signalled); keeping {} (session {session_id}) until they are gone, so that no other holder starts beside them",
            claim.describe()
        ));
        if let Some(reason) = wait_survivors(&session, &child) {
            ui::error(format_args!(
                "{reason}: {} may pass to another holder while processes of group {pgid} still run",
                claim.describe()
            ));
            stop_monitor.store(true, Ordering::SeqCst);
            drop(session);
            let (code, how) = exit_of(&outcome);
            return Ok(exit_event(code, how));
        }
        ui::notice(format_args!(
            "the surviving processes of group {pgid} are gone; releasing {}",
            claim.describe()
        ));
    }
    // The whole process group is gone: the guardian must never signal its ID again
    // (it may be reused).
    if let Some(g) = guardian {
        g.group_gone();
    }
    let outcome = match (outcome, spec.min_hold) {
        (o @ (Outcome::Exited(_) | Outcome::MaxTime), Some(min)) => {
            match min_hold(&rx, started + min, &|| session.deadline()) {
                Some(reason) => Outcome::Lost(reason),
                None => o,
            }
        }
        (o, _) => o,
    };
    stop_monitor.store(true, Ordering::SeqCst);
    // The whole process group is gone: now the claim may go. Bounded in total, so an
    // agent that stopped answering does not keep us (and whoever waits for our exit).
    let cleanup_end = Instant::now() + CLEANUP_BUDGET;
    let cleanup = client.with_deadline(cleanup_end);
    claim.release(&cleanup, &session_id);
    if !matches!(outcome, Outcome::Lost(_)) {
        events::emit("released", serde_json::json!({ "session": session_id }));
    }
    if Instant::now() < cleanup_end {
        session.destroy_with(&cleanup);
    } else {
        ui::warn(format_args!(
            "no time left to destroy session {session_id} (cleanup is bounded to {}); it expires by its TTL",
            crate::duration::format(CLEANUP_BUDGET)
        ));
        drop(session);
    }
    let (code, how) = exit_of(&outcome);
    match &outcome {
        Outcome::Lost(reason) => ui::verbose(format_args!(
            "exiting {} after losing {}: {reason}",
            exit::LOST,
            claim.describe()
        )),
        _ => ui::verbose(format_args!(
            "command {}; released {}",
            supervise::describe_end(code),
            claim.describe()
        )),
    }
    Ok(exit_event(code, how))
}

/// Total time for releasing and destroying the session once the command is gone.
pub const CLEANUP_BUDGET: Duration = Duration::from_secs(3);

/// The exit code and the `how` of the `exit` event for an outcome.
fn exit_of(outcome: &Outcome) -> (i32, &'static str) {
    match outcome {
        Outcome::Exited(code) => match supervise::child_signal() {
            Some(sig) if *code == 128 + sig => (*code, "signal"),
            _ => (*code, "exited"),
        },
        Outcome::Lost(_) => (exit::LOST, "lost"),
        Outcome::MaxTime => (exit::MAX_TIME, "max-time"),
    }
}

/// Emits the `exit` event and returns `code`.
fn exit_event(code: i32, how: &str) -> i32 {
    let extra = match (how, supervise::child_signal()) {
        ("signal", Some(sig)) => serde_json::json!({ "signal": sig }),
        _ => serde_json::json!({}),
    };
    events::exit(code, how, extra);
    code
}

/// Sends `Event::MaxTime` once the command has run `limit`.
fn start_max_time_timer(limit: Duration, started: Instant, tx: Sender<Event>) {
    let why = format!(
        "the command ran longer than --max-time {}",
        crate::duration::format(limit)
    );
    let fallback = tx.clone();
    let spawned = std::thread::Builder::new()
        .name("max-time".into())
        .spawn(move || {
            std::thread::sleep((started + limit).saturating_duration_since(Instant::now()));
            let _ = tx.send(Event::MaxTime(why));
        });
    if let Err(e) = spawned {
        // Without the timer the limit cannot be enforced: stop now rather than never.
        let _ = fallback.send(Event::MaxTime(format!(
            "cannot start the --max-time timer ({e})"
        )));
    }
}

/// `--min-hold`: the command is gone but the claim stays until `until`. Returns why it
/// was lost meanwhile, if it was. A terminating signal ends the hold at once (the
/// command already finished; the signal only asks conlock to let go).
fn min_hold(
    events: &mpsc::Receiver<Event>,
    until: Instant,
    session_deadline: &dyn Fn() -> Instant,
) -> Option<String> {
    if STOP_REQUESTED.load(Ordering::SeqCst) {
        ui::verbose("stop requested by a signal; not keeping the claim for --min-hold");
        return None;
    }
    if Instant::now() < until {
        ui::verbose(format_args!(
            "command done; keeping the claim for --min-hold ({} ms more)",
            until.saturating_duration_since(Instant::now()).as_millis()
        ));
    }
    loop {
        let now = Instant::now();
        if now >= until {
            return None;
        }
        let lost = if now >= session_deadline() {
            Some(
                "the session could not be renewed in time (Consul unreachable or not answering)"
                    .to_string(),
            )
        } else {
            let wake = until.min(session_deadline());
            match events.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(Event::Lost(reason)) => Some(reason),
                Ok(Event::Signal(sig)) if TERMINATING.contains(&sig) => {
                    ui::verbose(format_args!(
                        "signal {sig} during --min-hold; releasing now"
                    ));
                    return None;
                }
                Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => None,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Nothing can report a loss any more; only the clock is left.
                    std::thread::sleep(wake.saturating_duration_since(Instant::now()));
                    None
                }
            }
        };
        if let Some(reason) = lost {
            ui::notice(format_args!("lock lost during --min-hold: {reason}"));
            events::emit("lost", serde_json::json!({ "reason": reason }));
            return Some(reason);
        }
    }
}

/// Waits while processes of the command survive (in its group, or escaped from it), the
/// session renewing meanwhile. `Some(reason)` if the session is lost first.
fn wait_survivors(session: &Session, child: &Child) -> Option<String> {
    loop {
        if !child.alive() {
            return None;
        }
        if let Some(reason) = session.lost() {
            return Some(reason);
        }
        if Instant::now() >= session.deadline() + session.spec().kill_grace {
            return Some("the session could not be confirmed in time".to_string());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn install_signal_thread(phase: Arc<Mutex<Phase>>) -> Result<()> {
    // Signals ignored when conlock started (`nohup`, background jobs of a non-interactive
    // shell) stay ignored: not caught, not forwarded, and the child inherits SIG_IGN.
    // SIGTSTP (Ctrl-Z while conlock, not the command, has the terminal) goes to the
    // command like sudo does; conlock stops when the command does. Stopping conlock alone
    // would leave the command running unsupervised with nobody renewing the session.
    let caught: Vec<i32> = supervise::FORWARDED
        .into_iter()
        .chain([libc::SIGTSTP])
        .filter(|&sig| !supervise::ignored(sig))
        .collect();
    let mut signals = signal_hook::iterator::Signals::new(caught)
        .map_err(|e| Error::Other(anyhow::anyhow!("cannot install signal handlers: {e}")))?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let guard = phase.lock().unwrap_or_else(|p| p.into_inner());
                if sig == libc::SIGTSTP && !matches!(&*guard, Phase::Holding(_)) {
                    // No command yet: what SIGTSTP would have done.
                    unsafe { libc::raise(libc::SIGSTOP) };
                    continue;
                }
                match &*guard {
                    Phase::Holding(tx) => {
                        if TERMINATING.contains(&sig) {
                            STOP_REQUESTED.store(true, Ordering::SeqCst);
                        }
                        let _ = tx.send(Event::Signal(sig));
                    }
                    Phase::Starting => {
                        if TERMINATING.contains(&sig) {
                            events::exit(128 + sig, "interrupted", serde_json::json!({}));
                            events::flush();
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
                            events::exit(128 + sig, "interrupted", serde_json::json!({}));
                            events::flush();
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

/// The waiting status: one line on a terminal, progress lines with -v, `waiting` events.
pub struct WaitDisplay {
    what: String,
    started: Instant,
    /// What the wait is about now, after "waiting for WHAT, " (`None`: nothing yet).
    state: Arc<Mutex<Option<String>>>,
    done: Arc<AtomicBool>,
}

impl WaitDisplay {
    pub fn start(what: String) -> WaitDisplay {
        let d = WaitDisplay {
            what,
            started: Instant::now(),
            state: Arc::new(Mutex::new(None)),
            done: Arc::new(AtomicBool::new(false)),
        };
        if ui::stderr_is_terminal() && ui::level() == ui::Level::Normal {
            let (what, state, done, started) =
                (d.what.clone(), d.state.clone(), d.done.clone(), d.started);
            let _ = std::thread::Builder::new()
                .name("status".into())
                .spawn(move || {
                    // Only draw once the wait is noticeable.
                    std::thread::sleep(Duration::from_millis(300));
                    while !done.load(Ordering::SeqCst) {
                        let st = state.lock().unwrap_or_else(|p| p.into_inner()).clone();
                        let by = st.map(|h| format!(", {h}")).unwrap_or_default();
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

    /// What the wait was about last ("held by …", "free, in lock-delay until about …").
    pub fn last(&self) -> Option<String> {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How long the wait has lasted.
    pub fn waited(&self) -> Duration {
        self.started.elapsed()
    }

    /// Reports who holds the claim now (`None`: nobody, or a lock-delay).
    pub fn holder(&self, who: Option<String>) {
        let text = who.as_ref().map(|w| format!("held by {w}"));
        self.set(
            text,
            serde_json::json!({ "holder": who, "holder_session": null, "lock_delay_until": null }),
        );
    }

    /// A lock's holder, described, and its session.
    pub fn held_by(&self, who: String, session: &str) {
        let text = format!("held by {who}");
        self.set(
            Some(text),
            serde_json::json!({ "holder": who, "holder_session": session, "lock_delay_until": null }),
        );
    }

    /// Free, but refused: a lock-delay runs, until about `until` if known.
    pub fn lock_delay(&self, until: Option<std::time::SystemTime>) {
        let text = match until {
            Some(t) => format!("free, in lock-delay until about {}", ui::clock_time(t)),
            None => "free, in a lock-delay (end unknown: its holder was not seen)".to_string(),
        };
        self.set(
            Some(text),
            serde_json::json!({
                "holder": null,
                "holder_session": null,
                "lock_delay_until": until.map(ui::timestamp),
            }),
        );
    }

    /// Says what changed (-v, events); the terminal line picks it up.
    fn set(&self, text: Option<String>, fields: serde_json::Value) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if *st == text {
            return;
        }
        match &text {
            Some(t) => ui::verbose(format_args!("waiting for {}: {t}", self.what)),
            None => ui::verbose(format_args!("{} has no holder; trying", self.what)),
        }
        if text.is_some() {
            crate::events::emit("waiting", fields);
        }
        *st = text;
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

/// Follows one key with consistent blocking queries until `lost` says why it is lost
/// (sent as `Event::Lost`), `stop` is set, or Consul stays unreadable past the retry
/// policy. After a failed read it starts again from index 0, as Consul's client does: a
/// proxy that cuts idle connections costs one retry, not the claim, and a server that
/// lost its state answers at once instead of blocking on an index it never reached.
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
            QueryOptions::consistent()
        } else {
            QueryOptions::blocking(index, WATCH_WAIT).and_consistent()
        };
        let reason = match client.kv_get(key, q) {
            Ok((pair, meta)) => {
                failures = 0;
                index = next_index(index, meta.index);
                lost(pair.as_ref())
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
                let _ = events.send(Event::Lost(reason));
            }
            return;
        }
    }
}
