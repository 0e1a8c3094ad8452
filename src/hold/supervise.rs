//! Child supervision: spawn the command in its own process group, forward signals,
//! stop the whole group when the lock is lost, and make sure the group dies with us.
//!
//! "The command" is its process group plus every descendant that left the group or the
//! session and was re-parented to conlock (a child subreaper) when its parent died; both
//! get the same stop signal, grace and SIGKILL (see docs/safety.md).
//!
//! If conlock itself is SIGKILLed, the guardian (see `guardian.rs`) SIGKILLs the child's
//! process group. PR_SET_PDEATHSIG alone would reach only the direct child.

use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::event::{ignored, Event};
use super::guardian::Guardian;
use super::procfs::{self, Proc};
use super::program::Program;
use super::terminal::{foreground_terminal, give_terminal, own_group_has_job_control};
use crate::clock::BootInstant;
use crate::error::{Error, Result};
use crate::ui;

/// Forwarded signals after which the group also gets SIGCONT: a stopped process cannot
/// run its handler for them.
const CONTINUE_AFTER: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// The running child and its process group.
pub struct Child {
    pid: Pid,
    terminal: bool,
    /// conlock's children from before the command started (the guardian): never the
    /// command's, as (pid, start time).
    prior: Vec<(i32, u64)>,
    /// Set once no process has the group's ID (zombies included). From then on the ID
    /// may name an unrelated group (once the PID is reused), so it is never signalled
    /// again.
    group_gone: AtomicBool,
    /// The guardian was told the group is gone (`announce_group_gone`).
    group_gone_told: AtomicBool,
    /// The guardian was told the whole command is gone (`announce_command_gone`).
    command_gone_told: AtomicBool,
    guardian: Option<Arc<Guardian>>,
}

impl Child {
    /// Spawns the program in a new process group guarded against our own death.
    /// The signal thread reports the child's end as `Event::ChildExited`. `Ok(None)`: the
    /// child reached `deadline` before its exec (it was stopped) and did not exec.
    pub fn spawn(
        program: &Program,
        env: &[(String, String)],
        events: Sender<Event>,
        guardian: Option<&Arc<Guardian>>,
        deadline: BootInstant,
        prior: Prior,
    ) -> Result<Option<Child>> {
        // Orphaned grandchildren are re-parented to us, so zombies never keep the group "alive".
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        }
        // A SIGCHLD ignored by whoever started us (inherited through exec) was set to the
        // default when the hold began (`signals::block`); the child keeps what it would
        // have inherited.
        let sigchld_ignored = super::signals::sigchld_was_ignored();
        let terminal = foreground_terminal();
        let parent = std::process::id() as libc::pid_t;
        // While the command owns the terminal, conlock is a background process there: a
        // message written with `stty tostop`, or a terminal query, must not stop it
        // (SIGTTOU, SIGTTIN) while it supervises. The child gets what conlock inherited.
        let tty_defaults = [libc::SIGTTOU, libc::SIGTTIN].map(|sig| !ignored(sig));
        unsafe {
            libc::signal(libc::SIGTTOU, libc::SIG_IGN);
            libc::signal(libc::SIGTTIN, libc::SIG_IGN);
        }
        // The child tells the guardian its group through a copy of the pipe, so that the
        // pipe's lock is free for the deadlines the renew thread sends meanwhile.
        let pipe = guardian.and_then(|g| g.pipe_copy());
        let announce_gone = || {
            if let Some(g) = guardian {
                g.command_gone();
            }
        };
        let setup = super::spawn::Setup {
            sigchld_ignored,
            tty_defaults,
            terminal,
            parent,
            deadline_ns: deadline.as_nanos(),
            guardian_fd: pipe.as_ref().map_or(-1, |p| p.as_raw_fd()),
            // The child may have told the guardian its group: once reaped, that ID may be
            // reused, so the guardian must never signal it.
            before_reap: &announce_gone,
        };
        let spawned = super::spawn::spawn(&program.path, &program.argv, env, &setup);
        drop(pipe);
        let spawned = match spawned {
            Ok(s) => s,
            Err(e) => {
                // The child may have taken the terminal before it failed.
                if terminal {
                    unsafe { give_terminal(libc::getpgrp()) };
                }
                if e.raw_os_error() == Some(super::spawn::DEADLINE_PASSED) {
                    return Ok(None);
                }
                let shown = &program.display;
                return Err(match e.kind() {
                    std::io::ErrorKind::NotFound => {
                        Error::NotFound(format!("command not found: {shown}"))
                    }
                    std::io::ErrorKind::PermissionDenied => {
                        Error::NotExecutable(format!("{shown} is not executable: {e}"))
                    }
                    _ => Error::NotExecutable(format!("cannot run {shown}: {e}")),
                });
            }
        };
        let pid = Pid::from_raw(spawned.pid);
        // The child took the terminal before its exec; only if it is still conlock's (the
        // child failed to) is it handed over here: once the command runs, it may have
        // given the terminal to a job of its own.
        if terminal && unsafe { libc::tcgetpgrp(0) == libc::getpgrp() } {
            unsafe { give_terminal(pid.as_raw()) };
        }
        match (guardian, spawned.announced) {
            // The child's own line did not get through (a full pipe, no descriptor left).
            (Some(g), false) => g.process_group(pid.as_raw()),
            // A deadline the renew thread could not send meanwhile (the copy of the pipe
            // was being made) would have gone with that message.
            (Some(g), true) => g.flush(),
            (None, _) => {}
        }
        if let Some(sig) = spawned.held_stop {
            // A Ctrl-Z that reached the child before its exec: the command gets it now.
            unsafe { libc::kill(-pid.as_raw(), sig) };
        }
        // The signal thread reaps it from now on and reports its end.
        super::signals::watch_command(pid.as_raw(), events);
        ui::verbose(format_args!(
            "started {} as pid {pid} (own process group)",
            program.display
        ));
        Ok(Some(Child {
            pid,
            terminal,
            prior: prior.0,
            group_gone: AtomicBool::new(false),
            group_gone_told: AtomicBool::new(false),
            command_gone_told: AtomicBool::new(false),
            guardian: guardian.cloned(),
        }))
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Sends a signal to the whole process group.
    pub fn signal_group(&self, sig: Signal) {
        if self.group_is_gone() {
            return;
        }
        match kill(Pid::from_raw(-self.pid.as_raw()), sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => ui::warn(format_args!(
                "cannot signal process group {}: {e}",
                self.pid
            )),
        }
    }

    fn signal_raw(&self, sig: i32) {
        if self.group_is_gone() {
            return;
        }
        unsafe {
            libc::kill(-self.pid.as_raw(), sig);
        }
    }

    /// True while any process of the group is alive. EPERM means a member exists that
    /// we may not signal (a setuid program, say): alive too. Zombies are dead.
    pub fn group_alive(&self) -> bool {
        !self.group_is_gone() && procfs::group(self.pid.as_raw()).maybe_alive()
    }

    /// Whether no process has the group's ID (latched): checked right before each signal
    /// to the group, so that one sent after the leader was reaped (the group may be
    /// empty, its ID free) finds out first.
    fn group_is_gone(&self) -> bool {
        if !self.group_gone.load(Ordering::SeqCst) && procfs::no_such_group(self.pid.as_raw()) {
            self.group_gone.store(true, Ordering::SeqCst);
        }
        self.group_gone.load(Ordering::SeqCst)
    }

    /// Tells the guardian once that the whole command is gone (the group and what
    /// escaped): its watchdog is disarmed, and it never signals the group's ID.
    fn announce_command_gone(&self) {
        if !self.command_gone_told.swap(true, Ordering::SeqCst) {
            if let Some(g) = &self.guardian {
                g.command_gone();
            }
        }
    }

    /// Tells the guardian once that the group is gone, if it was seen gone, while what
    /// escaped from it is still being stopped (and conlock may die meanwhile). When
    /// nothing escaped, `Guardian::command_gone` says it right after, in one write less.
    fn announce_group_gone(&self) {
        if self.group_gone.load(Ordering::SeqCst)
            && !self.group_gone_told.swap(true, Ordering::SeqCst)
        {
            if let Some(g) = &self.guardian {
                g.group_gone();
            }
        }
    }

    /// Live descendants that left the group and were re-parented to conlock; None:
    /// cannot tell (/proc cannot be read, or is another namespace's).
    fn escapees(&self) -> Option<Vec<Proc>> {
        // Every live child of conlock's that was not there before the command counts, in
        // the group or not: a group member /proc hides (hidepid) makes no group alive,
        // and one that moves in and out of the group slips between two checks.
        procfs::adopted_children(&self.prior, i32::MIN)
    }

    /// True while the group or an escaped descendant is alive. Tells the guardian what
    /// it finds gone.
    pub fn alive(&self) -> bool {
        let alive = self.group_alive() || !self.escapees().is_some_and(|e| e.is_empty());
        if alive {
            self.announce_group_gone();
        } else {
            self.announce_command_gone();
        }
        self.flush_guardian();
        alive
    }

    /// Sends what the guardian's full pipe kept back, if it has room now.
    fn flush_guardian(&self) {
        if let Some(g) = &self.guardian {
            g.flush();
        }
    }

    /// The group, then every escaped descendant that `done` does not list yet, gets `sig`
    /// followed by SIGCONT (a stopped process cannot act on it). SIGKILL goes to every
    /// escapee each time.
    fn stop_all(&self, sig: Signal, done: &mut HashSet<(i32, u64)>) {
        self.signal_group(sig);
        if sig != Signal::SIGKILL {
            self.signal_group(Signal::SIGCONT);
        }
        self.stop_escapees(sig, done);
    }

    fn stop_escapees(&self, sig: Signal, done: &mut HashSet<(i32, u64)>) {
        self.stop_these(self.escapees().unwrap_or_default(), sig, done);
    }

    fn stop_these(&self, procs: Vec<Proc>, sig: Signal, done: &mut HashSet<(i32, u64)>) {
        for p in procs {
            // A member of the group gets the group's signal: a second TERM or INT cuts
            // short what a command does on the first. SIGKILL goes to every one again.
            if sig != Signal::SIGKILL
                && !self.group_is_gone()
                && unsafe { libc::getpgid(p.pid) } == self.pid.as_raw()
            {
                continue;
            }
            if sig == Signal::SIGKILL || done.insert((p.pid, p.start)) {
                if p.signal(sig) {
                    ui::verbose(format_args!(
                        "sent {sig} to pid {} (left the command's process group)",
                        p.pid
                    ));
                }
                if sig != Signal::SIGKILL {
                    p.signal(Signal::SIGCONT);
                }
            }
        }
    }

    /// The command stopped on a terminal signal: conlock takes the terminal back and stops
    /// too, so that the shell gets its prompt (as sudo does). Returns once conlock is
    /// continued (`fg`, `bg`).
    fn suspend_with(&self, sig: i32) {
        // Processes that left the group (re-parented to conlock, or still below a parent
        // in the group) did not get the terminal's stop signal: stop them too, so that
        // nothing of the command runs while conlock does not renew.
        self.signal_outside_group(libc::SIGSTOP);
        unsafe {
            if libc::isatty(0) == 1 && libc::tcgetpgrp(0) == self.pid.as_raw() {
                give_terminal(libc::getpgrp());
            }
            // The kernel discards SIGTSTP/SIGTTIN/SIGTTOU for an orphaned process group;
            // SIGSTOP always stops.
            let sig = if own_group_has_job_control() {
                sig
            } else {
                libc::SIGSTOP
            };
            if sig == libc::SIGSTOP {
                libc::raise(sig);
            } else {
                // The default action for this one raise, and the signal unblocked in this
                // thread for it (SIGTSTP is blocked, for the signal thread); both are
                // restored after.
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                let mut old: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, &dfl, &mut old);
                let mut one: libc::sigset_t = std::mem::zeroed();
                let mut mask: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut one);
                libc::sigaddset(&mut one, sig);
                libc::pthread_sigmask(libc::SIG_UNBLOCK, &one, &mut mask);
                libc::raise(sig);
                libc::pthread_sigmask(libc::SIG_SETMASK, &mask, std::ptr::null_mut());
                libc::sigaction(sig, &old, std::ptr::null_mut());
            }
        }
    }

    /// After conlock was continued: the command gets the terminal back if conlock has it
    /// (`fg`, not `bg`), then SIGCONT.
    fn resume(&self) {
        unsafe {
            if libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() {
                give_terminal(self.pid.as_raw());
            }
        }
        self.signal_group(Signal::SIGCONT);
        self.signal_outside_group(libc::SIGCONT);
    }

    /// `sig` to every descendant of conlock outside the command's group, except what
    /// conlock had before the command (the guardian).
    fn signal_outside_group(&self, sig: i32) {
        let prior: Vec<i32> = self.prior.iter().map(|&(p, _)| p).collect();
        // None: /proc cannot tell; signalling by its pids could hit anything.
        let all = procfs::descendants(std::process::id() as i32, &prior).unwrap_or_default();
        for (pid, st) in all {
            if st.pgrp != self.pid.as_raw() {
                procfs::signal_if_same(pid, st.start, sig);
            }
        }
    }

    /// Takes the terminal back.
    pub fn finish(&self) {
        if self.terminal {
            unsafe { give_terminal(libc::getpgrp()) };
        }
    }
}

/// Why a claim counts as lost when its deadline passed (see `Session::deadline`).
pub const DEADLINE_PASSED: &str =
    "the claim could not be confirmed in time (the store did not answer, or conlock could not run)";

/// The one place a loss is announced, after the command was signalled (printing may
/// block): the message and the `lost` event. `then` says what conlock does about it.
/// Why it was lost is decided by the claim (`Claim::confirm`, `Claim::monitor`) and by
/// the session (`Session::deadline`, renewals).
pub fn announce_loss(reason: &str, then: &str) {
    ui::alert(format_args!("lock lost: {reason}; {then}"));
    crate::events::emit("lost", serde_json::json!({ "reason": reason }));
}

/// How to stop the child when the lock is lost or conlock is asked to stop.
#[derive(Debug, Clone, Copy)]
pub struct StopPolicy {
    pub kill_signal: Signal,
    pub grace: Duration,
}

/// How supervision ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The child ended on its own or after a forwarded signal: its code (or 128+N).
    Exited(i32),
    /// The lock was lost; the group was stopped.
    Lost(String),
    /// --max-time ran out; the group was stopped like on a loss.
    MaxTime,
}

/// Work the supervising loop does once its time comes (starting the monitor), unless the
/// command ended first. It returns false to be tried again a second later.
pub type Later = Option<(Instant, Box<dyn FnMut() -> bool>)>;

/// Waits for the child while watching `events` and the session deadline; returns once the
/// command (its process group and every escaped descendant) is gone, or with `false` if
/// part of it survives even SIGKILL (the lock must then not be released). Losses, the
/// deadline and signals are acted on until then, also while what the command left behind
/// is being stopped after the direct child ended.
pub fn supervise(
    child: &Child,
    events: &Receiver<Event>,
    session_deadline: &dyn Fn() -> Instant,
    policy: StopPolicy,
    later: &mut Later,
) -> (Outcome, bool) {
    let mut lost: Option<String> = None;
    let mut timed_out = false;
    let mut kill_at: Option<Instant> = None;
    let mut status: Option<i32> = None;
    let mut killed = false;
    // After the direct child ended and something of the command remained: how many
    // rounds it was looked at, and when to give up on it once SIGKILL was sent.
    let mut leftover_rounds: Option<u64> = None;
    let mut give_up: Option<Instant> = None;
    // Escaped descendants that already got the kill signal.
    let mut stopped = HashSet::new();
    // Signal first, print after: the message may block (a full stderr pipe) or, before
    // SIGTTOU was ignored, stop conlock; the command must be stopped regardless.
    // `since`: when the loss happened; the grace counts from there (a deadline that
    // passed while conlock could not run leaves less grace, or none: then SIGKILL only,
    // with no SIGCONT that would let the command run its handler beside a new holder).
    let lose = |reason: String,
                since: Instant,
                lost: &mut Option<String>,
                kill_at: &mut Option<Instant>,
                stopped: &mut HashSet<(i32, u64)>| {
        let at = since + policy.grace;
        if Instant::now() < at {
            child.stop_all(policy.kill_signal, stopped);
        } else {
            child.stop_all(Signal::SIGKILL, stopped);
        }
        *kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
        announce_loss(&reason, "stopping the command");
        *lost = Some(reason);
    };
    loop {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(3600);
        // The deadline as it was before the wait: a confirmation answered while conlock
        // was stopped can move it on once continued, after the guardian killed the
        // command at the old one. On CLOCK_BOOTTIME: a suspend counts.
        let due_before = BootInstant::from_instant(session_deadline());
        if lost.is_none() {
            wake = wake.min(session_deadline());
        }
        if leftover_rounds.is_some() {
            // Only leftovers remain: look for them every 10 ms.
            wake = wake.min(now + Duration::from_millis(10));
        } else if lost.is_some() || timed_out {
            // Descendants may escape while the group is being stopped.
            wake = wake.min(now + Duration::from_millis(50));
        }
        if let Some(k) = kill_at.filter(|_| !killed) {
            wake = wake.min(k);
        }
        if let Some((at, _)) = later {
            wake = wake.min(*at);
        }
        match events.recv_timeout(wake.saturating_duration_since(now)) {
            // The first end is the command's (its pid may be reused once it is reaped).
            Ok(Event::ChildExited(code)) => {
                status.get_or_insert(code);
            }
            Ok(Event::Signal(sig)) => {
                child.signal_raw(sig);
                if CONTINUE_AFTER.contains(&sig) {
                    child.signal_group(Signal::SIGCONT);
                }
                ui::verbose(format_args!(
                    "forwarded signal {sig} to process group {}",
                    child.pid
                ));
                if sig == libc::SIGINT || sig == libc::SIGTERM {
                    kill_at.get_or_insert(Instant::now() + policy.grace);
                }
            }
            Ok(Event::Lost(reason)) => {
                if lost.is_none() {
                    // Handled late (conlock could not run, or the loop was busy): the
                    // grace counts from the deadline if that came first.
                    let since = Instant::now()
                        .min(session_deadline())
                        .min(due_before.to_instant());
                    lose(reason, since, &mut lost, &mut kill_at, &mut stopped);
                }
            }
            Ok(Event::MaxTime(why)) => {
                if lost.is_none() && !timed_out {
                    child.stop_all(policy.kill_signal, &mut stopped);
                    kill_at.get_or_insert(Instant::now() + policy.grace);
                    ui::alert(format_args!("{why}; stopping the command"));
                    timed_out = true;
                }
            }
            Ok(Event::Stopped(sig)) => {
                // While stopping the command, a stop must not stop conlock too.
                if lost.is_none() && !timed_out && status.is_none() {
                    // On CLOCK_BOOTTIME: a suspend while stopped counts.
                    let deadline = BootInstant::from_instant(session_deadline());
                    ui::verbose(format_args!(
                        "the command stopped on signal {sig}; stopping conlock too"
                    ));
                    child.suspend_with(sig);
                    // Continued. The session was not renewed meanwhile: a deadline that
                    // passed while stopped is a loss, and the command must not run on.
                    if deadline.has_passed() {
                        lose(
                            "the session deadline passed while conlock was stopped".into(),
                            deadline.to_instant(),
                            &mut lost,
                            &mut kill_at,
                            &mut stopped,
                        );
                    } else {
                        ui::verbose("continued; continuing the command");
                        child.resume();
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                // Cannot happen while the signal thread holds a sender; stop rather than
                // spin (nothing can be waited for now, so wait for the time instead).
                status.get_or_insert(crate::error::exit::INTERNAL);
                std::thread::sleep(wake.saturating_duration_since(Instant::now()));
            }
        }
        let now = Instant::now();
        if let Some((at, run)) = later {
            if now >= *at {
                if run() {
                    *later = None;
                } else {
                    *at = now + Duration::from_secs(1);
                }
            }
        }
        // Once the direct child ended: is anything of the command left? Escapees are
        // looked for every 50 ms while the group lives, every 10 ms once only they can
        // remain; None: /proc cannot tell, so something may still run.
        let left = status.map(|_| {
            let round = leftover_rounds.unwrap_or(0);
            let group = child.group_alive();
            let escaped = if !group || round % 5 == 0 {
                child.escapees()
            } else {
                Some(Vec::new())
            };
            let alive = group || !escaped.as_ref().is_some_and(Vec::is_empty);
            (alive, escaped)
        });
        let leftovers_alive = matches!(left, Some((true, _)));
        let due = session_deadline();
        let passed = match status {
            None => now >= due,
            // Leftovers that run past the deadline: lost, whatever the command's code.
            Some(_) if leftovers_alive => now >= due,
            Some(_) => {
                // The guardian fires `--kill-grace` (and half a margin) after the
                // deadline: a SIGKILL before that is not its.
                let sent_kill = killed || (timed_out && policy.kill_signal == Signal::SIGKILL);
                killed_past_deadline(status, sent_kill) && (due_before + policy.grace).has_passed()
            }
        };
        if lost.is_none() && passed {
            lose(
                DEADLINE_PASSED.to_string(),
                due.min(due_before.to_instant()),
                &mut lost,
                &mut kill_at,
                &mut stopped,
            );
        }
        match left {
            None => {
                if lost.is_some() || timed_out {
                    let sig = if killed {
                        Signal::SIGKILL
                    } else {
                        policy.kill_signal
                    };
                    child.stop_escapees(sig, &mut stopped);
                }
            }
            Some((false, _)) => {
                child.announce_command_gone();
                child.flush_guardian();
                break;
            }
            Some((true, escaped)) => {
                child.announce_group_gone();
                child.flush_guardian();
                match leftover_rounds.as_mut() {
                    Some(r) => {
                        *r += 1;
                        if killed {
                            // The group too, every round: a process that left it at the
                            // first SIGKILL and came back since must not survive.
                            child.signal_group(Signal::SIGKILL);
                        }
                        let sig = if killed {
                            Signal::SIGKILL
                        } else {
                            policy.kill_signal
                        };
                        child.stop_these(escaped.unwrap_or_default(), sig, &mut stopped);
                    }
                    None => {
                        // The grace started with the loss or the forwarded INT/TERM, not
                        // when the direct child exited: restarting it here let leftovers
                        // outlive the loss by up to twice --kill-grace.
                        if kill_at.is_none() {
                            // The command ended on its own and left background processes:
                            // said at the default level, since flock and `consul lock`
                            // leave them running.
                            // Escapees include conlock's children still in the group.
                            let pgid = child.pid.as_raw();
                            let outside = escaped.as_ref().map_or(0, |e| {
                                e.iter()
                                    .filter(|p| unsafe { libc::getpgid(p.pid) } != pgid)
                                    .count()
                            });
                            let n = super::procfs::live_members(pgid)
                                .map(|n| n + outside)
                                .filter(|&n| n > 0);
                            let what = match n {
                                Some(1) => "1 process running; stopping it".to_string(),
                                Some(n) => format!("{n} processes running; stopping them"),
                                None => "processes running; stopping them".to_string(),
                            };
                            ui::alert(format_args!(
                                "the command exited and left {what} (background processes of the command do not outlive the lock)"
                            ));
                        } else {
                            ui::verbose(format_args!(
                                "processes of the command remain (group {}); stopping them",
                                child.pid
                            ));
                        }
                        leftover_rounds = Some(1);
                        if killed {
                            child.stop_all(Signal::SIGKILL, &mut stopped);
                        } else {
                            child.stop_all(policy.kill_signal, &mut stopped);
                        }
                        let at = now + policy.grace;
                        kill_at = Some(kill_at.map_or(at, |k| k.min(at)));
                    }
                }
            }
        }
        if let Some(k) = kill_at {
            if now >= k && !killed {
                child.stop_all(Signal::SIGKILL, &mut stopped);
                ui::verbose(format_args!(
                    "grace period over; sent SIGKILL to process group {}",
                    child.pid
                ));
                killed = true;
            }
        }
        if killed && leftover_rounds.is_some() {
            // SIGKILL reaches whatever may be signalled within moments; what is left after
            // this long survives it (or may not be signalled).
            let until = *give_up.get_or_insert(now + LEFTOVER_KILL_WAIT);
            if now >= until {
                return (outcome_of(lost, timed_out, status), false);
            }
        }
    }
    (outcome_of(lost, timed_out, status), true)
}

/// How long what is left of the command may take to go after SIGKILL before it counts
/// as surviving it.
const LEFTOVER_KILL_WAIT: Duration = Duration::from_secs(10);

fn outcome_of(lost: Option<String>, timed_out: bool, status: Option<i32>) -> Outcome {
    match lost {
        Some(reason) => Outcome::Lost(reason),
        None if timed_out => Outcome::MaxTime,
        None => Outcome::Exited(status.unwrap_or(crate::error::exit::INTERNAL)),
    }
}

/// Whether the command's end, seen once the session deadline had passed, is a loss: a
/// SIGKILL that conlock did not send is the guardian's at the deadline, fired while
/// conlock could not run (stopped, or a suspend its monotonic clock did not count).
/// Any other end keeps the command's code: it may have come before the deadline.
fn killed_past_deadline(status: Option<i32>, killed_by_conlock: bool) -> bool {
    status == Some(128 + libc::SIGKILL) && !killed_by_conlock
}

/// conlock's children from before the command (the guardian, children inherited across
/// the exec that started conlock): never the command's. Taken before the wait, so that a
/// waiter that acquires spawns sooner; no child of conlock's appears in between.
pub struct Prior(Vec<(i32, u64)>);

impl Prior {
    pub fn now() -> Prior {
        Prior(procfs::prior_children())
    }

    /// As (pid, start time).
    pub fn list(&self) -> &[(i32, u64)] {
        &self.0
    }
}

/// Stops the handler of `conlock watch` (or any process group) as `run` stops its
/// command: `first` and SIGCONT, `grace`, then SIGKILL. False if the group survives.
pub fn stop_group(pgid: i32, first: Signal, grace: Duration) -> bool {
    let group = Pid::from_raw(-pgid);
    let alive = || !matches!(kill(group, None), Err(Errno::ESRCH));
    let wait = |within: Duration| {
        let until = Instant::now() + within;
        while alive() {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    };
    let _ = kill(group, first);
    let _ = kill(group, Signal::SIGCONT);
    if wait(grace) {
        return true;
    }
    let _ = kill(group, Signal::SIGKILL);
    wait(Duration::from_secs(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs the test `name` alone in a process of its own (this test binary, filtered to
    /// it), and says whether this is that process: supervising counts every child of the
    /// process outside the command's group as escaped, so the children of tests running
    /// beside it would be signalled and waited for.
    fn alone(name: &str) -> bool {
        if std::env::var_os("CONLOCK_UNIT_ALONE").is_some() {
            return true;
        }
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env("CONLOCK_UNIT_ALONE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).contains("1 passed"),
            "{name} alone: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        false
    }

    /// A loss the loop handles after the deadline passed (it could not run, or was busy)
    /// got a fresh grace from the moment it was handled: the command got its stop signal
    /// (and ran its handler) and SIGKILL a whole grace later, beside the next holder. The
    /// grace counts from the deadline now: here it is over, so SIGKILL at once and no TERM.
    #[test]
    fn a_loss_handled_after_the_deadline_counts_the_grace_from_the_deadline() {
        if !alone("hold::supervise::tests::a_loss_handled_after_the_deadline_counts_the_grace_from_the_deadline") {
            return;
        }
        use std::os::unix::process::CommandExt;
        let dir = std::env::temp_dir().join(format!("conlock-late-loss-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (termed, ready) = (dir.join("term"), dir.join("ready"));
        let mut c = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "trap 'touch {}' TERM; touch {}; while :; do sleep 0.05; done",
                termed.display(),
                ready.display()
            ))
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = c.id() as i32;
        let until = Instant::now() + Duration::from_secs(60);
        while !ready.exists() {
            assert!(Instant::now() < until, "the command never set its trap");
            std::thread::sleep(Duration::from_millis(10));
        }
        let child = Child {
            pid: Pid::from_raw(pid),
            terminal: false,
            prior: Vec::new(),
            group_gone: AtomicBool::new(false),
            group_gone_told: AtomicBool::new(false),
            command_gone_told: AtomicBool::new(false),
            guardian: None,
        };
        let (tx, rx) = std::sync::mpsc::channel();
        // The loss is queued when the loop first looks, 20 s after the deadline.
        tx.send(Event::Lost("lost late".into())).unwrap();
        let waiter = std::thread::spawn(move || {
            let st = c.wait().unwrap();
            let code = std::os::unix::process::ExitStatusExt::signal(&st).map_or(0, |s| 128 + s);
            let _ = tx.send(Event::ChildExited(code));
            st
        });
        let due = Instant::now()
            .checked_sub(Duration::from_secs(20))
            .expect("up for more than 20 s");
        let policy = StopPolicy {
            kill_signal: Signal::SIGTERM,
            grace: Duration::from_secs(10),
        };
        let started = Instant::now();
        let (outcome, gone) = supervise(&child, &rx, &|| due, policy, &mut None);
        let took = started.elapsed();
        let status = waiter.join().unwrap();
        // The shell's trap runs between its sleeps: give a TERM time to show.
        std::thread::sleep(Duration::from_millis(300));
        let got_term = termed.exists();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(outcome, Outcome::Lost("lost late".into()));
        assert!(gone);
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(
            !got_term,
            "the command got its stop signal after its grace was over"
        );
        assert!(took < Duration::from_secs(8), "SIGKILL after {took:?}");
    }

    /// Past the deadline, only a SIGKILL conlock did not send (the guardian's) turns the
    /// command's end into a loss; it exited 137 before (conlock suspended, or stopped
    /// and continued, saw the guardian's kill before its own deadline check).
    #[test]
    fn a_sigkill_conlock_did_not_send_past_the_deadline_is_a_loss() {
        assert!(killed_past_deadline(Some(137), false));
        assert!(!killed_past_deadline(Some(137), true));
        assert!(!killed_past_deadline(Some(0), false));
        assert!(!killed_past_deadline(Some(143), false));
        assert!(!killed_past_deadline(None, false));
    }
}
