//! The life cycle of a held claim, what `run` and `sem` share: the session, the wait,
//! the child, supervision, the guardian and the exit code. A `Claim` (a lock or a
//! semaphore slot, `crate::claim`) plugs in how to acquire, watch, confirm and release.

pub mod event;
pub mod guardian;
mod holding;
pub mod procfs;
pub mod program;
pub mod session;
mod signals;
mod spawn;
pub mod supervise;
mod terminal;
mod threads;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::claim::{Claim, Held, MonitorPolicy, Store, WaitDisplay};
use crate::error::{exit, Error, Result};
use crate::events;
use crate::ui;
use event::Event;
use guardian::Guardian;
use holding::{Ending, Holding};
use program::Program;
use session::{Session, SessionRef, SessionSpec};
use supervise::{Child, Outcome, StopPolicy};
use threads::keep_joinable;

pub use holding::CLEANUP_BUDGET;

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
    /// Run the command even if the guardian cannot start.
    pub unguarded: bool,
}

/// How long past `--timeout` a request sent just before it may take to be answered.
const ANSWER_GRACE: Duration = Duration::from_secs(2);

/// Set by a terminating signal while holding: no `--min-hold` after the command then.
static STOP_REQUESTED: AtomicBool = AtomicBool::new(false);

/// Set by the first `hold`.
static HELD: AtomicBool = AtomicBool::new(false);

/// Refuses a second hold in one process: the signal thread, the command it reaps for and
/// the guardian are process-wide, and the first hold ended its signal thread for good.
fn first_hold() -> Result<()> {
    if HELD.swap(true, Ordering::SeqCst) {
        return Err(Error::Other(anyhow::anyhow!(
            "a second hold in one process: conlock holds one claim per process (start another conlock)"
        )));
    }
    Ok(())
}

/// Signals that end conlock while it waits, and start the grace period while it holds.
const TERMINATING: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

enum Phase {
    /// No session yet: a terminating signal ends conlock (the guardian tidies up).
    Starting,
    /// Waiting for the claim: a terminating signal ends conlock at once.
    Acquiring {
        client: Store,
        session: SessionRef,
        claim: Arc<dyn Claim>,
    },
    /// Signals go to the supervising loop.
    Holding(Sender<Event>),
}

/// Runs the whole life cycle and returns the exit code. Once per process (a second call
/// is an error): the signal thread, the guardian and the command the signal thread reaps
/// for are process-wide.
pub fn hold(client: &Store, spec: HoldSpec, claim: Arc<dyn Claim>) -> Result<i32> {
    first_hold()?;
    let guardian = match preflight(client, &spec) {
        Ok(g) => g,
        Err(e) => {
            events::exit(
                e.exit_code(),
                "error",
                serde_json::json!({ "error": e.to_string() }),
            );
            return Err(e);
        }
    };
    // Before any thread starts: every thread inherits the mask.
    signals::block();
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

/// What must hold before anything is acquired: conlock can see the command's processes,
/// and the guardian runs (unless `--unguarded`). Returns the guardian.
fn preflight(client: &Store, spec: &HoldSpec) -> Result<Option<Arc<Guardian>>> {
    // conlock releases only once every process of the command is gone: where /proc cannot
    // show them, it would have to guess, so the command does not run.
    if let Err(why) = procfs::check_view() {
        return Err(Error::Usage(format!("cannot run the command: {why}")));
    }
    // A guardian forked here (none was at start) gets the signal mask conlock started with.
    match Guardian::start(&client.config()) {
        Ok(g) => Ok(Some(g)),
        Err(why) if spec.unguarded => {
            ui::warn(format_args!(
                "cannot start the guardian process ({why}); running unguarded (--unguarded): if conlock is killed or stopped, nothing stops its command"
            ));
            Ok(None)
        }
        Err(why) => Err(Error::Usage(format!(
            "cannot start the guardian process ({why}): without it nothing stops the command if conlock is killed or stopped, so it does not run (--unguarded runs it anyway)"
        ))),
    }
}

fn hold_guarded(
    client: &Store,
    spec: HoldSpec,
    claim: Arc<dyn Claim>,
    guardian: Option<&Arc<Guardian>>,
) -> Result<i32> {
    // From here on a stderr nobody reads must not block supervision or renewal.
    ui::detach();
    // Handlers first, so no signal finds the default action once we own anything.
    let phase = Arc::new(Mutex::new(Phase::Starting));
    install_signal_thread(phase.clone())?;
    // --timeout bounds the whole wait, a Consul that does not answer included: requests
    // end by then, with ANSWER_GRACE for one sent just before (`--timeout 0s` too).
    let deadline = spec.timeout.map(|t| Instant::now() + t);
    let waiting = match (deadline, spec.timeout) {
        (Some(d), Some(t)) => client.with_deadline(
            d + ANSWER_GRACE,
            &format!(
                "--timeout {} and {} for an answer",
                crate::duration::format(t),
                crate::duration::format(ANSWER_GRACE)
            ),
        ),
        _ => client.clone(),
    };
    // etcd: a take can outlive the lease (its record), so the guardian knows the claim
    // from the start (Consul's session end drops anything it acquired).
    if let (Some(g), "etcd") = (guardian, client.backend()) {
        g.claim_with_session(claim.spec());
    }
    let session = Session::create(
        client,
        &waiting,
        spec.session.clone(),
        guardian.cloned(),
        claim.renew_while_waiting(),
    )?;
    *phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Acquiring {
        client: client.clone(),
        session: session.handle(),
        claim: claim.clone(),
    };

    let prior = supervise::Prior::now();
    // From here on every way out goes through the guard.
    let holding = Holding::new(client, claim.clone(), session, guardian, prior);
    let wait = WaitDisplay::start(claim.describe());
    let acquired = claim.acquire(&waiting, holding.session(), deadline, &wait);
    wait.finish();
    let waited = wait.waited();
    let held = match acquired {
        Ok(Some(h)) => h,
        Ok(None) => {
            // Say why: held by whom, or free but in a lock-delay.
            let why = wait.last().map(|w| format!(": {w}")).unwrap_or_default();
            ui::notice(format_args!(
                "{} is busy{why}; gave up waiting (exit {})",
                claim.describe(),
                spec.busy_exit_code
            ));
            return holding.give_up(Ok((spec.busy_exit_code, "busy")));
        }
        Err(e) => return holding.give_up(Err(e)),
    };
    let (tx, rx) = mpsc::channel();
    // From here on, signals are queued for the supervising loop instead of ending conlock
    // with a session destroy (which would impose the lock-delay on everyone else).
    *phase.lock().unwrap_or_else(|p| p.into_inner()) = Phase::Holding(tx.clone());
    start_command(holding, &spec, &claim, held, waited, tx, rx)
}

/// From the acquisition to the command's start: the claim is confirmed, announced and
/// told to the guardian, then the command spawned. A way out before it runs is
/// `Holding::abandon`.
fn start_command(
    mut holding: Holding,
    spec: &HoldSpec,
    claim: &Arc<dyn Claim>,
    held: Held,
    waited: Duration,
    tx: Sender<Event>,
    rx: mpsc::Receiver<Event>,
) -> Result<i32> {
    let session_id = holding.held();
    // The guardian learns the claim together with the first deadline, right before the
    // spawn: one write, so one wake-up of it fewer beside the spawn. It learns it
    // earlier wherever a request comes first (the renewal in `start_holding`, a release
    // before the command started), so that a conlock killed during that request is
    // still cleaned up by a release, without a lock-delay. Decided once, for both.
    let renew_first = holding.session().renewal_due();
    if renew_first {
        holding.tell_claim();
    }
    let confirm = {
        let claim = claim.clone();
        Box::new(move |client: &Store, sid: &str| claim.confirm(client, sid))
    };
    // A session that ends (or cannot be renewed) right after acquiring is a loss before
    // the command started: exit 124, as when the deadline passes then.
    let unconfirmed = match holding
        .session()
        .start_holding(held.confirmed_at, confirm, renew_first)
    {
        Ok(true) => None,
        Ok(false) => Some(format!(
            "session {session_id} was invalidated right after acquiring"
        )),
        Err(e) => Some(format!(
            "session {session_id} could not be renewed right after acquiring: {e}"
        )),
    };
    if let Some(reason) = unconfirmed {
        supervise::announce_loss(&reason, "not starting the command");
        return holding.abandon(Ok((exit::LOST, "lost")));
    }
    ui::verbose(format_args!(
        "acquired {} (LockIndex {}, fencing token {})",
        claim.describe(),
        held.lock_index,
        held.fencing_token
    ));
    events::emit(
        "acquired",
        serde_json::json!({
            "session": session_id,
            "fencing_token": held.fencing_token,
            "lock_index": held.lock_index,
            "waited_ms": waited.as_millis() as u64,
        }),
    );
    holding.session().notify_lost(tx.clone());
    // A stop request or a loss that came before the command started: do not start it.
    let pending: Vec<Event> = rx.try_iter().collect();
    let early_exit = pending.iter().find_map(|e| match e {
        Event::Signal(sig) if TERMINATING.contains(sig) => Some((128 + sig, "interrupted")),
        Event::Lost(reason) => {
            supervise::announce_loss(reason, "not starting the command");
            Some((exit::LOST, "lost"))
        }
        _ => None,
    });
    if let Some((code, how)) = early_exit {
        ui::verbose(format_args!(
            "stopping before the command started (exit {code})"
        ));
        return holding.abandon(Ok((code, how)));
    }
    for e in pending {
        let _ = tx.send(e);
    }
    // The store's own variables (Consul's indexes, etcdctl's ETCD_LOCK_*) come from the
    // claim.
    let mut env = vec![
        ("CONLOCK_SESSION".to_string(), session_id.clone()),
        (
            "CONLOCK_FENCING_TOKEN".to_string(),
            held.fencing_token.to_string(),
        ),
    ];
    env.extend(claim.env(&held, &session_id));

    let guardian = holding.guardian();
    if let Some(g) = guardian {
        // conlock SIGKILLs the group `--kill-grace` after the deadline at the latest; if it
        // is stopped or stuck by then, the guardian does, half a margin later (so that a
        // healthy conlock is first), still half a margin before anyone else can hold it.
        let (g, late) = (g.clone(), spec.stop.grace + spec.session.margin() / 2);
        holding
            .session()
            .on_confirmed(Box::new(move |deadline| g.deadline(deadline + late)));
    }
    holding.tell_claim();
    // Stalled since the acquisition (stopped, cut off) past the deadline: another holder
    // may already run, so the command must not start.
    // The child checks the deadline again right before its exec: it may be stopped
    // between (Ok(None)).
    let deadline = holding.session().boot_deadline();
    let spawned = if deadline.has_passed() {
        Ok(None)
    } else {
        let prior = holding.take_prior();
        Child::spawn(&spec.program, &env, tx.clone(), guardian, deadline, prior)
    };
    let child = match spawned {
        Ok(Some(c)) => c,
        Ok(None) => {
            supervise::announce_loss(supervise::DEADLINE_PASSED, "not starting the command");
            return holding.abandon(Ok((exit::LOST, "lost")));
        }
        Err(e) => return holding.abandon(Err(e)),
    };
    Ok(run_command(holding, spec, claim, child, held, tx, rx))
}

/// The command runs: supervised until it is gone (or survives SIGKILL), the claim kept
/// for survivors and `--min-hold`, then `Holding::finish`.
fn run_command(
    holding: Holding,
    spec: &HoldSpec,
    claim: &Arc<dyn Claim>,
    child: Child,
    held: Held,
    tx: Sender<Event>,
    rx: mpsc::Receiver<Event>,
) -> i32 {
    let session_id = holding.session_id().to_string();
    // The spawn returned after the exec: the command has started (--min-hold and
    // --max-time count from here).
    let started = Instant::now();
    events::command_started();
    // Started a little after the child, by the supervising loop: a job that ends within
    // MONITOR_DELAY costs no thread and no request for it. A loss meanwhile is still
    // seen at once when it starts (the watch starts from the acquisition's index), and
    // the deadline does not depend on the monitor.
    let start_monitor: Box<dyn FnMut() -> bool> = {
        let (claim, client, sid, held, policy, tx, stop) = (
            claim.clone(),
            holding.client().clone(),
            session_id.clone(),
            held.clone(),
            spec.monitor,
            tx.clone(),
            holding.stop_monitor(),
        );
        let mut warned = false;
        Box::new(move || {
            let tx = tx.clone();
            let report: crate::claim::LossReport = Arc::new(move |reason| {
                let _ = tx.send(Event::Lost(reason));
            });
            // Its blocking queries keep a connection busy: on connections of its own,
            // the release after the command finds the main one idle.
            let (claim, client, sid, held, stop) = (
                claim.clone(),
                client.with_own_connections(),
                sid.clone(),
                held.clone(),
                stop.clone(),
            );
            let started = std::thread::Builder::new()
                .name("monitor".into())
                .spawn(move || claim.monitor(client, sid, held, policy, report, stop));
            if let Err(e) = &started {
                // The command may use up the threads allowed (RLIMIT_NPROC). Confirmations
                // still find a loss before the deadline; the monitor only makes it fast.
                if !std::mem::replace(&mut warned, true) {
                    ui::warn(format_args!(
                        "cannot start the monitor thread ({e}); a loss is seen at the next confirmation instead; trying again every second"
                    ));
                }
            }
            started.is_ok()
        })
    };
    let mut later: supervise::Later = Some((started + MONITOR_DELAY, start_monitor));

    if let Some(limit) = spec.max_time {
        start_max_time_timer(limit, started, tx.clone());
    }

    let (outcome, group_gone) = supervise::supervise(
        &child,
        &rx,
        &|| holding.session().deadline(),
        spec.stop,
        &mut later,
    );
    events::command_ended();
    // Still holding after the command (survivors, --min-hold): watch the claim meanwhile.
    if let Some((_, mut start_monitor)) = later.take() {
        if !group_gone || spec.min_hold.is_some() {
            start_monitor();
        }
    }
    let pgid = child.pid();
    child.finish();
    if !group_gone {
        // Releasing now would let a new holder start beside survivors: keep the session
        // (it renews) until they are gone.
        ui::error(format_args!(
            "processes of group {pgid} survive SIGKILL (or may not be signalled); keeping {} (session {session_id}) until they are gone, so that no other holder starts beside them",
            claim.describe()
        ));
        if let Some(reason) = wait_survivors(holding.session(), &child) {
            // Lost while part of the command runs: exit 124, whatever the command's code.
            supervise::announce_loss(
                &reason,
                &format!(
                    "{} may pass to another holder while processes of group {pgid} still run",
                    claim.describe()
                ),
            );
            return holding.finish(Ending::KeepForSurvivors);
        }
        ui::alert(format_args!(
            "the surviving processes of group {pgid} are gone; releasing {}",
            claim.describe()
        ));
    }
    let outcome = match (outcome, spec.min_hold) {
        (o @ (Outcome::Exited(_) | Outcome::MaxTime), Some(min)) => {
            match min_hold(&rx, started + min, &|| holding.session().deadline()) {
                Some(reason) => Outcome::Lost(reason),
                None => o,
            }
        }
        (o, _) => o,
    };
    holding.finish(Ending::Release(outcome))
}

/// How long after the spawn the monitor sends its first query.
const MONITOR_DELAY: Duration = Duration::from_millis(50);

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
            Some(supervise::DEADLINE_PASSED.to_string())
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
            supervise::announce_loss(&reason, "lost during --min-hold, after the command ended");
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
    // shell) stay ignored: not taken, not forwarded, and the child inherits SIG_IGN.
    // SIGTSTP (Ctrl-Z while conlock, not the command, has the terminal) goes to the
    // command like sudo does; conlock stops when the command does. Stopping conlock alone
    // would leave the command running unsupervised with nobody renewing the session.
    let set = signals::block();
    let thread = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || loop {
            let sig = signals::wait(&set);
            if signals::ending() {
                return;
            }
            if sig == libc::SIGCHLD {
                signals::reap_ready();
                continue;
            }
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
                        // A child stopped between clone and exec (a Ctrl-Z there)
                        // keeps conlock waiting in clone: let it go on, so that the
                        // supervising loop runs and hands the signal on.
                        let spawning = spawn::SPAWNING.load(Ordering::SeqCst);
                        if spawning > 0 {
                            unsafe { libc::kill(spawning, libc::SIGCONT) };
                        }
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
                Phase::Acquiring {
                    client,
                    session,
                    claim,
                } => {
                    if [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT].contains(&sig) {
                        ui::clear_status();
                        ui::verbose(format_args!("signal {sig} while waiting; giving up"));
                        // A take that may have landed goes back first (etcd: a record
                        // the revoke leaves); destroying the session drops the rest.
                        claim.take_back(client, &session.id());
                        let _ = client.destroy_session(&session.id());
                        events::exit(128 + sig, "interrupted", serde_json::json!({}));
                        events::flush();
                        ui::flush();
                        std::process::exit(128 + sig);
                    }
                }
            }
        })
        .map_err(|e| Error::Other(e.into()))?;
    keep_joinable(thread);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A second hold in one process is refused: the first one ended the process-wide
    /// signal thread, so a second would never see its command end.
    #[test]
    fn a_second_hold_in_one_process_is_refused() {
        assert!(first_hold().is_ok());
        let second = first_hold().unwrap_err().to_string();
        assert!(second.contains("one claim per process"), "{second}");
    }
}
