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
use std::ffi::{OsStr, OsString};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::guardian::Guardian;
use crate::clock::BootInstant;
use crate::error::{Error, Result};
use crate::ui;

/// What the supervising loop reacts to.
#[derive(Debug)]
pub enum Event {
    /// The direct child ended: exit code, or 128 + signal.
    ChildExited(i32),
    /// conlock received this signal.
    Signal(i32),
    /// The lock or slot is gone.
    Lost(String),
    /// The direct child stopped on this terminal signal (SIGTSTP, SIGTTIN, SIGTTOU).
    Stopped(i32),
    /// The command ran longer than --max-time (the text says so).
    MaxTime(String),
}

/// The signals conlock forwards to the child's process group.
pub const FORWARDED: [i32; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
];

/// Forwarded signals after which the group also gets SIGCONT: a stopped process cannot
/// run its handler for them.
const CONTINUE_AFTER: [i32; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// True when `sig` is ignored (SIG_IGN) right now. Queried before any handler is
/// installed, it tells what conlock inherited: `nohup` ignores SIGHUP, a non-interactive
/// shell ignores SIGINT and SIGQUIT for background jobs. Those stay ignored.
pub fn ignored(sig: i32) -> bool {
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// A command ready to spawn: the program was found and is executable.
#[derive(Debug, Clone)]
pub struct Program {
    pub path: PathBuf,
    pub argv: Vec<OsString>,
    /// For messages and the default session name.
    pub display: String,
}

/// Resolves the command before anything else happens, so that a typo fails fast (127/126)
/// instead of after waiting for the lock.
pub fn resolve(command: &[OsString], shell: bool) -> Result<Program> {
    let Some(first) = command.first() else {
        return Err(Error::Usage("no command given after --".into()));
    };
    if first.is_empty() {
        return Err(Error::Usage("the command is an empty string".into()));
    }
    let display = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    if shell {
        let sh = std::env::var_os("SHELL")
            .filter(|s| !s.is_empty() && Path::new(s).is_absolute() && is_executable(Path::new(s)))
            .unwrap_or_else(|| OsString::from("/bin/sh"));
        let script = OsString::from(&display);
        return Ok(Program {
            path: PathBuf::from(&sh),
            argv: vec![sh, OsString::from("-c"), script],
            display,
        });
    }
    let path = find_program(first)?;
    Ok(Program {
        path,
        argv: command.to_vec(),
        display,
    })
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn find_program(name: &OsStr) -> Result<PathBuf> {
    let raw = name.to_string_lossy();
    // Quoted as typed, so that a whole shell line does not read as one.
    let shown = ui::shell_quote(&raw);
    // A whole shell line given as one word is the usual `consul lock` habit.
    let hint =
        if raw.contains(|c: char| c.is_whitespace() || "|&;<>()$`\\\"'*?[]#~=%{}!".contains(c)) {
            " (a whole shell line? use --shell)"
        } else {
            ""
        };
    let check = |p: &Path| -> Result<PathBuf> {
        let meta = std::fs::metadata(p)
            .map_err(|_| Error::NotFound(format!("command not found: {shown}{hint}")))?;
        if meta.is_dir() {
            return Err(Error::NotExecutable(format!(
                "{shown} is a directory, not a command"
            )));
        }
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(Error::NotExecutable(format!(
                "{shown} is not executable (check its permissions)"
            )));
        }
        if let Some(interp) = missing_interpreter(p) {
            return Err(Error::NotFound(format!(
                "interpreter {} of script {} not found (check its #! line)",
                interp.display(),
                p.display()
            )));
        }
        Ok(p.to_path_buf())
    };
    if name.as_bytes().contains(&b'/') {
        return check(Path::new(name));
    }
    let path_var =
        std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    let mut first_err = None;
    for dir in std::env::split_paths(&path_var) {
        let candidate = dir.join(name);
        match check(&candidate) {
            Ok(p) => return Ok(p),
            Err(Error::NotExecutable(m)) if candidate.is_file() => {
                first_err.get_or_insert(Error::NotExecutable(m));
            }
            Err(_) => {}
        }
    }
    Err(first_err.unwrap_or_else(|| {
        Error::NotFound(format!("command not found: {shown} (searched PATH){hint}"))
    }))
}

/// The `#!` interpreter of script `p` when it does not exist (exec would fail with
/// ENOENT, which reads as if the script itself were missing).
fn missing_interpreter(p: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(p).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?.trim();
    let interp = PathBuf::from(text.split_whitespace().next()?);
    (interp.is_absolute() && !interp.exists()).then_some(interp)
}

/// Parses `TERM`, `SIGTERM`, `sigterm` or `15`.
pub fn parse_signal(s: &str) -> std::result::Result<Signal, String> {
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("unknown signal number {n}"));
    }
    let upper = t.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>()
        .map_err(|_| format!("unknown signal {s:?} (try TERM, INT, HUP or a number)"))
}

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
        !self.group_is_gone() && !super::pgroup::gone(self.pid.as_raw())
    }

    /// Whether no process has the group's ID (latched): checked right before each signal
    /// to the group, so that one sent after the leader was reaped (the group may be
    /// empty, its ID free) finds out first.
    fn group_is_gone(&self) -> bool {
        if !self.group_gone.load(Ordering::SeqCst)
            && super::pgroup::no_such_group(self.pid.as_raw())
        {
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

    /// Live descendants that left the group and were re-parented to conlock.
    fn escapees(&self) -> Vec<Proc> {
        // Once the group's ID is free, a process of the command that gets it as its PID
        // and leads a group of that ID (`setsid`) is no member of the command's group:
        // every adopted child counts then.
        let pgid = if self.group_gone.load(Ordering::SeqCst) {
            i32::MIN
        } else {
            self.pid.as_raw()
        };
        adopted_children(&self.prior, pgid)
    }

    /// True while the group or an escaped descendant is alive. Tells the guardian what
    /// it finds gone.
    pub fn alive(&self) -> bool {
        let alive = self.group_alive() || !self.escapees().is_empty();
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
        self.stop_these(self.escapees(), sig, done);
    }

    fn stop_these(&self, procs: Vec<Proc>, sig: Signal, done: &mut HashSet<(i32, u64)>) {
        for p in procs {
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
        for (pid, st) in descendants(std::process::id() as i32, &prior) {
            if st.pgrp != self.pid.as_raw() {
                signal_if_same(pid, st.start, sig);
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
    "the claim could not be confirmed in time (Consul unreachable or not answering)";

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
/// part of it survives even SIGKILL (the lock must then not be released).
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
    while status.is_none() {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(3600);
        // The deadline as it was before the wait: a confirmation answered while conlock
        // was stopped can move it on once continued, after the guardian killed the
        // command at the old one. On CLOCK_BOOTTIME: a suspend counts.
        let due_before = BootInstant::from_instant(session_deadline());
        if lost.is_none() {
            wake = wake.min(session_deadline());
        }
        if lost.is_some() || timed_out {
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
            Ok(Event::ChildExited(code)) => status = Some(code),
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
                    lose(
                        reason,
                        Instant::now(),
                        &mut lost,
                        &mut kill_at,
                        &mut stopped,
                    );
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
                if lost.is_none() && !timed_out {
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
                // Cannot happen while the signal thread holds a sender; stop rather than spin.
                status = Some(crate::error::exit::INTERNAL);
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
        let due = session_deadline();
        let passed = if status.is_none() {
            now >= due
        } else {
            // The guardian fires `--kill-grace` (and half a margin) after the deadline:
            // a SIGKILL before that is not its.
            let sent_kill = killed || (timed_out && policy.kill_signal == Signal::SIGKILL);
            killed_past_deadline(status, sent_kill) && (due_before + policy.grace).has_passed()
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
        if (lost.is_some() || timed_out) && status.is_none() {
            let sig = if killed {
                Signal::SIGKILL
            } else {
                policy.kill_signal
            };
            child.stop_escapees(sig, &mut stopped);
        }
        if let Some(k) = kill_at {
            if now >= k && !killed && status.is_none() {
                child.stop_all(Signal::SIGKILL, &mut stopped);
                ui::verbose(format_args!(
                    "grace period over; sent SIGKILL to process group {}",
                    child.pid
                ));
                killed = true;
            }
        }
    }
    let gone = stop_leftovers(child, policy, kill_at, &mut stopped);
    let outcome = match lost {
        Some(reason) => Outcome::Lost(reason),
        None if timed_out => Outcome::MaxTime,
        None => Outcome::Exited(status.unwrap_or(crate::error::exit::INTERNAL)),
    };
    (outcome, gone)
}

/// Whether the command's end, seen once the session deadline had passed, is a loss: a
/// SIGKILL that conlock did not send is the guardian's at the deadline, fired while
/// conlock could not run (stopped, or a suspend its monotonic clock did not count).
/// Any other end keeps the command's code: it may have come before the deadline.
fn killed_past_deadline(status: Option<i32>, killed_by_conlock: bool) -> bool {
    status == Some(128 + libc::SIGKILL) && !killed_by_conlock
}

/// Processes the child left behind, in its group or escaped from it, must not outlive
/// the lock. `kill_at`: the SIGKILL time already set by a loss or a forwarded INT/TERM.
/// False if part of the command survives SIGKILL.
fn stop_leftovers(
    child: &Child,
    policy: StopPolicy,
    kill_at: Option<Instant>,
    stopped: &mut HashSet<(i32, u64)>,
) -> bool {
    if !child.alive() {
        return true;
    }
    if kill_at.is_none() {
        // The command ended on its own and left background processes: said at the
        // default level, since flock and `consul lock` leave them running.
        let n = super::pgroup::live_members(child.pid.as_raw())
            .map(|n| n + child.escapees().len())
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
    child.stop_all(policy.kill_signal, stopped);
    // The grace period started with the loss or the forwarded INT/TERM, not when the
    // direct child exited: restarting it here let leftovers outlive the loss by up to
    // twice --kill-grace (past the lock-delay that --kill-grace is meant to stay under).
    let mut grace_end = Instant::now() + policy.grace;
    if let Some(k) = kill_at {
        grace_end = grace_end.min(k);
    }
    if wait_gone(child, grace_end, policy.kill_signal, stopped) {
        return true;
    }
    child.stop_all(Signal::SIGKILL, stopped);
    wait_gone(
        child,
        Instant::now() + Duration::from_secs(10),
        Signal::SIGKILL,
        stopped,
    )
}

/// Waits until the command is gone; escaped descendants that show up meanwhile (their
/// parent just died) get `sig` too. /proc is scanned every 50 ms while the group lives,
/// every 10 ms once only escapees can remain.
fn wait_gone(
    child: &Child,
    until: Instant,
    sig: Signal,
    stopped: &mut HashSet<(i32, u64)>,
) -> bool {
    for round in 0u64.. {
        let group = child.group_alive();
        let escaped = if !group || round % 5 == 0 {
            child.escapees()
        } else {
            Vec::new()
        };
        if !group && escaped.is_empty() {
            child.announce_command_gone();
            return true;
        }
        child.announce_group_gone();
        child.flush_guardian();
        if Instant::now() >= until {
            return false;
        }
        child.stop_these(escaped, sig, stopped);
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// A process re-parented to conlock.
struct Proc {
    pid: i32,
    /// Start time in clock ticks since boot: with the pid, an identity that survives reuse.
    start: u64,
}

impl Proc {
    /// Signals the process only if it is still this process and still ours: through a
    /// pidfd, so that a pid reaped and reused in between is never hit. One whose stat
    /// cannot be read (hidepid) is checked through the pidfd alone: still conlock's child,
    /// not exited. Returns whether the signal was sent.
    fn signal(&self, sig: Signal) -> bool {
        let me = std::process::id() as i32;
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) } as i32;
        let still_ours = || {
            if self.start == UNREADABLE {
                return fd >= 0 && unexited_child(fd);
            }
            proc_stat(self.pid)
                .is_some_and(|st| st.ppid == me && st.start == self.start && st.state != b'Z')
        };
        if fd < 0 {
            // Kernels before 5.3: a narrow race with the signal thread's reaping remains.
            return still_ours() && kill(Pid::from_raw(self.pid), sig).is_ok();
        }
        let sent = still_ours()
            && unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd,
                    sig as i32,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            } == 0;
        unsafe { libc::close(fd) };
        sent
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Stat {
    state: u8,
    ppid: i32,
    pgrp: i32,
    session: i32,
    start: u64,
}

impl Stat {
    pub(super) fn start(&self) -> u64 {
        self.start
    }
}

/// The start time of a process whose stat cannot be read: matches no real one.
const UNREADABLE: u64 = u64::MAX;

/// True if the process behind `pidfd` is conlock's child and has not exited: `waitid`
/// answers ECHILD for another's process, and reports an exit without reaping it.
fn unexited_child(pidfd: i32) -> bool {
    const P_PIDFD: libc::idtype_t = 3;
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::waitid(
            P_PIDFD,
            pidfd as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    r == 0 && unsafe { info.si_pid() } == 0
}

/// True unless no process has this pid (a zombie exists; EPERM means it exists).
fn exists(pid: i32) -> bool {
    !matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH))
}

/// Fields of /proc/<pid>/stat; the command name may contain spaces, parentheses and
/// bytes that are not UTF-8 (it comes from a file name).
fn proc_stat(pid: i32) -> Option<Stat> {
    #[cfg(test)]
    if tests::hidden(pid) {
        return None;
    }
    let text = read_proc(&format!("/proc/{pid}/stat"))?;
    let after_name = text.iter().rposition(|&b| b == b')')? + 1;
    let rest = std::str::from_utf8(&text[after_name..]).ok()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) session(6) … starttime(22).
    Some(Stat {
        state: *f.first()?.as_bytes().first()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// A small /proc file, read whole in 1 KiB reads: a stat for a size hint (procfs reports
/// 0) and a buffer grown from 32 bytes, a read each, as `fs::read` does, cost more.
fn read_proc(path: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 1024]);
    loop {
        match file.read(&mut chunk) {
            Ok(0) => return Some(buf),
            Ok(n) => {
                #[cfg(test)]
                tests::between_reads(path, buf.len());
                buf.extend_from_slice(&chunk[..n])
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// The pids in /proc/self/task/<tid>/children. The kernel resumes each step of a listing
/// from a position (or from the child shown last, if that is still a child): a child
/// reaped meanwhile shifts the rest, and the live child after it is not shown. So a
/// listing counts once two in a row are the same: the reaped child, shown in the first,
/// is missing from the second. If they never settle (children come and go as fast as
/// they are listed), every pid that any of the listings showed, and false: a live child
/// is missed by a listing only if an entry before it is reaped during that listing, and
/// each entry is reaped once, but that is not proof; the caller reads again.
fn children_of(tid: u32) -> Option<(Vec<i32>, bool)> {
    let path = format!("/proc/self/task/{tid}/children");
    let pids = |text: &[u8]| -> Vec<i32> {
        String::from_utf8_lossy(text)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .collect()
    };
    let mut last = read_proc(&path)?;
    let mut seen: HashSet<i32> = HashSet::new();
    for _ in 0..16 {
        let again = read_proc(&path)?;
        if again == last {
            return Some((pids(&again), true));
        }
        seen.extend(pids(&last));
        last = again;
    }
    seen.extend(pids(&last));
    Some((seen.into_iter().collect(), false))
}

/// Every live (not zombie) descendant of `root`, leaving out the subtrees of `skip`.
pub(super) fn descendants(root: i32, skip: &[i32]) -> Vec<(i32, Stat)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let all: Vec<(i32, Stat)> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| Some((pid, proc_stat(pid)?)))
        .collect();
    let mut out = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for (pid, st) in &all {
            if st.ppid == parent && !skip.contains(pid) && *pid != root {
                parents.push(*pid);
                if st.state != b'Z' {
                    out.push((*pid, *st));
                }
            }
        }
    }
    out
}

/// Whether `pid` is still the process that started at `start`.
pub(super) fn is_process(pid: i32, start: u64) -> bool {
    proc_stat(pid).is_some_and(|st| st.start == start)
}

/// Signals `pid` only if it is still the process that started at `start` (a reused pid
/// is left alone; the window between the check and the signal is a few microseconds).
pub(super) fn signal_if_same(pid: i32, start: u64, sig: i32) {
    if is_process(pid, start) {
        unsafe { libc::kill(pid, sig) };
    }
}

/// conlock's live (not zombie) children outside process group `pgid` and not in `prior`.
/// /proc lists only thread-group leaders, so conlock's own threads never show up.
fn adopted_children(prior: &[(i32, u64)], pgid: i32) -> Vec<Proc> {
    let me = std::process::id() as i32;
    // A child that dies between the read of the children lists and the read of its stat
    // hands its own children to us in that gap, and they are in neither read: so while a
    // pass finds a child newly dead (zombie or gone), read the lists again. Once it shows
    // dead, its children are already on our lists.
    let mut dead: Vec<i32> = Vec::new();
    let mut found = Vec::new();
    for _ in 0..64 {
        let Some((candidates, settled)) = own_children() else {
            return adopted_from_proc_scan(prior, pgid);
        };
        // Listings that never settled are read again, as after a death.
        let mut newly_dead = !settled;
        found.clear();
        for pid in candidates {
            match proc_stat(pid) {
                Some(st) if st.state != b'Z' => {
                    let ours = st.ppid == me && st.pgrp != pgid;
                    if ours && !prior.contains(&(pid, st.start)) {
                        found.push(Proc {
                            pid,
                            start: st.start,
                        });
                    }
                }
                // Listed but unreadable: /proc hides it (mounted with hidepid, and it runs
                // as another user or is not dumpable, as ssh-agent), or the read failed.
                // Alive, it counts. `Proc::signal` checks it through a pidfd alone; where
                // that cannot be done, it survives, and conlock keeps the claim until it
                // is gone.
                None if exists(pid) => {
                    // getpgid needs no /proc: a member of the command's group is the
                    // group's (and keeps it alive), not an escapee.
                    let escaped = unsafe { libc::getpgid(pid) } != pgid;
                    if escaped && !prior.iter().any(|&(p, _)| p == pid) {
                        found.push(Proc {
                            pid,
                            start: UNREADABLE,
                        });
                    }
                }
                _ if !dead.contains(&pid) => {
                    dead.push(pid);
                    newly_dead = true;
                }
                _ => {}
            }
        }
        if !newly_dead {
            return found;
        }
    }
    // Children die faster than they are read: what the last pass found, and what a scan
    // of every process finds (it cannot see one that /proc hides).
    for p in adopted_from_proc_scan(prior, pgid) {
        if !found.iter().any(|f| (f.pid, f.start) == (p.pid, p.start)) {
            found.push(p);
        }
    }
    found
}

/// `adopted_children` where /proc/self/task/*/children is missing: every process is read.
/// A grandchild read before its parent dies (pids wrap, so it may come first) is
/// re-parented to conlock after it was read: the scan is repeated until two in a row
/// find the same.
fn adopted_from_proc_scan(prior: &[(i32, u64)], pgid: i32) -> Vec<Proc> {
    let key =
        |procs: &[Proc]| -> Vec<(i32, u64)> { procs.iter().map(|p| (p.pid, p.start)).collect() };
    let mut last = proc_scan_once(prior, pgid);
    for _ in 0..8 {
        let again = proc_scan_once(prior, pgid);
        if key(&again) == key(&last) {
            break;
        }
        last = again;
    }
    last
}

fn proc_scan_once(prior: &[(i32, u64)], pgid: i32) -> Vec<Proc> {
    let me = std::process::id() as i32;
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .collect();
    pids.sort_unstable();
    pids.into_iter()
        .filter_map(|pid| {
            let st = proc_stat(pid)?;
            let ours = st.ppid == me && st.state != b'Z' && st.pgrp != pgid;
            (ours && !prior.contains(&(pid, st.start))).then_some(Proc {
                pid,
                start: st.start,
            })
        })
        .collect()
}

/// conlock's children from before the command (the guardian, children inherited across
/// the exec that started conlock): never the command's. Taken before the wait, so that a
/// waiter that acquires spawns sooner; no child of conlock's appears in between.
pub struct Prior(Vec<(i32, u64)>);

impl Prior {
    pub fn now() -> Prior {
        Prior(prior_children())
    }

    /// As (pid, start time).
    pub fn list(&self) -> &[(i32, u64)] {
        &self.0
    }
}

/// As (pid, start time), from the same lists as `own_children`.
fn prior_children() -> Vec<(i32, u64)> {
    match own_children() {
        // One that cannot be read is known by its pid alone (see `adopted_children`).
        Some((pids, _)) => pids
            .into_iter()
            .map(|pid| (pid, proc_stat(pid).map_or(UNREADABLE, |st| st.start)))
            .collect(),
        None => adopted_children(&[], 0)
            .into_iter()
            .map(|p| (p.pid, p.start))
            .collect(),
    }
}

/// conlock's children that can matter here, from /proc/self/task/<tid>/children: those of
/// the calling thread (the one that spawned the command) and those of the leader (the
/// first live thread, which gets every orphan re-parented to conlock, and the children of
/// an exiting thread). No other thread forks, so two lists at most (one in conlock, where
/// the leader supervises) instead of one per thread. None where the kernel lacks the file
/// (CONFIG_PROC_CHILDREN); the caller then scans /proc.
/// With it, whether the listings settled (see `children_of`).
fn own_children() -> Option<(Vec<i32>, bool)> {
    let leader = std::process::id();
    let me = unsafe { libc::gettid() } as u32;
    let (mut pids, mut settled) = (Vec::new(), true);
    if me != leader {
        let (mine, ok) = children_of(me)?;
        pids.extend(mine);
        settled &= ok;
    }
    // The leader last, so that a child handed to it by an exiting thread meanwhile is read.
    let (leaders, ok) = children_of(leader)?;
    pids.extend(leaders);
    Some((pids, settled && ok))
}

/// True when conlock's process group is provably not orphaned: its parent (a shell with
/// job control) is in the same session but another group, so a stop signal is not
/// discarded and the shell will see it.
fn own_group_has_job_control() -> bool {
    let (ppid, pgrp, sid) = unsafe { (libc::getppid(), libc::getpgrp(), libc::getsid(0)) };
    proc_stat(ppid).is_some_and(|p| p.session == sid && p.pgrp != pgrp)
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

/// The signal the direct child died of (0: none), for telling 128+N from an exit code.
static CHILD_SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The signal the command died of, if it died of one.
pub fn child_signal() -> Option<i32> {
    match CHILD_SIGNAL.load(std::sync::atomic::Ordering::SeqCst) {
        0 => None,
        n => Some(n),
    }
}

/// How the command ended, for messages: "exited with 3" or "was killed by signal 9
/// (SIGKILL; exit code 137)".
pub fn describe_end(code: i32) -> String {
    match child_signal().map(|n| (n, Signal::try_from(n))) {
        Some((n, Ok(sig))) if code == 128 + n => {
            format!(
                "was killed by signal {n} ({}; exit code {code})",
                sig.as_str()
            )
        }
        _ => format!("exited with {code}"),
    }
}

/// Records the signal the command died of (see `child_signal`).
pub(super) fn record_child_signal(sig: i32) {
    CHILD_SIGNAL.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// True when stdin is a terminal whose foreground group is ours.
fn foreground_terminal() -> bool {
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes `pgid` the terminal's foreground group, ignoring SIGTTOU meanwhile.
/// Async-signal-safe: also used between fork and exec.
pub(super) unsafe fn give_terminal(pgid: libc::pid_t) {
    let mut set: libc::sigset_t = std::mem::zeroed();
    let mut old: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    libc::sigaddset(&mut set, libc::SIGTTOU);
    libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
    libc::tcsetpgrp(0, pgid);
    libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

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

    /// `sleep 30` in a process group of its own.
    fn sleeper() -> std::process::Child {
        Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// `sleeper()` run through a symlink called `name` (the process's name), and the
    /// folder to remove after.
    fn sleeper_named(tag: &str, name: &std::ffi::OsStr) -> (std::process::Child, PathBuf) {
        let dir = std::env::temp_dir().join(format!("conlock-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
        // argv[0] "sleep", for a multi-call sleep (busybox); the name comes from the file.
        let child = Command::new(&link)
            .arg0("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        (child, dir)
    }

    type ReadHook = Box<dyn FnMut(&str, usize)>;

    thread_local! {
        /// Runs after each read of a /proc file (its path, the bytes read before it), on
        /// the thread that set it.
        static BETWEEN_READS: std::cell::RefCell<Option<ReadHook>> =
            const { std::cell::RefCell::new(None) };
    }

    thread_local! {
        /// A pid whose stat reads as hidden (as /proc mounted with hidepid shows another
        /// user's process), on the thread that set it.
        static HIDDEN: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    }

    pub(super) fn hidden(pid: i32) -> bool {
        HIDDEN.with(|h| h.get() == pid)
    }

    /// A child conlock cannot read (hidepid, another user's) read as gone: released while
    /// it ran. Found by review. It counts as alive now (see the pidfd test for its signal).
    #[test]
    fn a_child_whose_stat_is_hidden_counts_as_alive() {
        let mut c = sleeper();
        let pid = c.id() as i32;
        HIDDEN.with(|h| h.set(pid));
        let found: Vec<(i32, u64)> = adopted_children(&[], 0)
            .iter()
            .map(|p| (p.pid, p.start))
            .collect();
        // Known from before the command: not counted.
        let prior = Prior::now();
        let after_prior = adopted_children(&prior.0, 0).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        let gone = adopted_children(&[], 0).iter().any(|p| p.pid == pid);
        HIDDEN.with(|h| h.set(0));
        assert!(found.contains(&(pid, UNREADABLE)), "{found:?}");
        assert!(!after_prior);
        assert!(!gone, "a reaped child still counted");
    }

    pub(super) fn between_reads(path: &str, before: usize) {
        BETWEEN_READS.with(|hook| {
            if let Some(run) = hook.borrow_mut().as_mut() {
                run(path, before)
            }
        });
    }

    /// The kernel resumes a children list from a position: a child reaped between two
    /// reads shifted the rest, and the live child after the gap was never shown. A zombie
    /// already seen in an earlier pass and reaped in the middle of the next listing was
    /// not a new death, so nothing read the list again. Found by review: conlock could
    /// release while that child ran.
    #[test]
    fn a_child_reaped_during_a_listing_does_not_hide_another() {
        let zombie = Command::new("true").spawn().unwrap().id() as i32;
        // Enough children after it that a listing takes more than one read.
        let mut live: Vec<_> = (0..250)
            .map(|_| Command::new("sleep").arg("30").spawn().unwrap())
            .collect();
        let exited = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            proc_stat(zombie).is_some_and(|st| st.state == b'Z')
        });
        // The zombie is seen in the first listing of this thread's children; it is reaped
        // after the first read of the second.
        let ours = format!("/proc/self/task/{}/children", unsafe { libc::gettid() });
        let reaped = std::rc::Rc::new(std::cell::Cell::new(false));
        let (mut listings, flag) = (0, reaped.clone());
        BETWEEN_READS.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move |path: &str, before: usize| {
                if path == ours && before == 0 {
                    listings += 1;
                    if listings == 2 && !flag.get() {
                        let r = unsafe { libc::waitpid(zombie, std::ptr::null_mut(), 0) };
                        flag.set(r == zombie);
                    }
                }
            }))
        });
        let found: Vec<i32> = adopted_children(&[], -1).iter().map(|p| p.pid).collect();
        BETWEEN_READS.with(|hook| *hook.borrow_mut() = None);
        let missing: Vec<i32> = live
            .iter()
            .map(|c| c.id() as i32)
            .filter(|pid| !found.contains(pid))
            .collect();
        for c in &mut live {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(exited, "true never exited");
        assert!(reaped.get(), "the zombie was not reaped during a listing");
        assert_eq!(missing, Vec::<i32>::new(), "live children not listed");
    }

    /// Listings that never settle (a child added during each one) give every pid they
    /// showed; before, conlock fell back to a scan of /proc, which cannot see a process
    /// that /proc hides. Found by review.
    #[test]
    fn listings_that_never_settle_still_show_every_child() {
        let mut c = sleeper();
        let pid = c.id() as i32;
        HIDDEN.with(|h| h.set(pid));
        let ours = format!("/proc/self/task/{}/children", unsafe { libc::gettid() });
        let added = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let adding = added.clone();
        BETWEEN_READS.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move |path: &str, before: usize| {
                if path == ours && before == 0 {
                    adding.borrow_mut().push(sleeper());
                }
            }))
        });
        let (listed, settled) = children_of(unsafe { libc::gettid() } as u32).unwrap();
        let found = adopted_children(&[], -1).iter().any(|p| p.pid == pid);
        BETWEEN_READS.with(|hook| *hook.borrow_mut() = None);
        HIDDEN.with(|h| h.set(0));
        for k in added.borrow_mut().iter_mut().chain([&mut c]) {
            let _ = k.kill();
            let _ = k.wait();
        }
        assert!(listed.contains(&pid), "{pid} not in {listed:?}");
        assert!(!settled);
        assert!(found, "the hidden child {pid} was missed");
    }

    /// A child whose stat /proc hides (ssh-agent is not dumpable, so hidepid hides it even
    /// from its own user) was never signalled: conlock held the claim until something else
    /// ended it. Found by review. It is signalled through a pidfd now.
    #[test]
    fn a_child_whose_stat_is_hidden_is_signalled_through_a_pidfd() {
        let mut c = sleeper();
        let pid = c.id() as i32;
        HIDDEN.with(|h| h.set(pid));
        let hidden = Proc {
            pid,
            start: UNREADABLE,
        };
        let sent = hidden.signal(Signal::SIGKILL);
        let status = c.wait().unwrap();
        // Reaped: no longer a child of ours, so nothing is sent.
        let again = hidden.signal(Signal::SIGKILL);
        HIDDEN.with(|h| h.set(0));
        assert!(sent, "not sent");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(!again, "sent to a pid that is no longer ours");
    }

    #[test]
    fn reads_own_stat_and_finds_spawned_children() {
        let me = proc_stat(std::process::id() as i32).expect("own stat");
        assert_eq!(me.pgrp, unsafe { libc::getpgrp() });
        assert_eq!(me.session, unsafe { libc::getsid(0) });
        assert!(me.start > 0);
        let before: Vec<(i32, u64)> = adopted_children(&[], 0)
            .into_iter()
            .map(|p| (p.pid, p.start))
            .collect();
        // A name with spaces and parentheses must not shift the fields.
        let (mut c, dir) = sleeper_named("stat", "a) b (c".as_ref());
        let pid = c.id() as i32;
        let found = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            adopted_children(&before, 0).iter().any(|p| p.pid == pid)
        });
        // Excluded as part of its own group, or as known before.
        let in_group = adopted_children(&before, pid).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(found, "child {pid} not listed");
        assert!(!in_group);
        assert!(!adopted_children(&before, 0).iter().any(|p| p.pid == pid));
    }

    /// A command may be named by any bytes, and its escapees too: one whose name is not
    /// UTF-8 read as "gone", so it was neither stopped nor waited for.
    #[test]
    fn a_child_named_with_bytes_that_are_not_utf8_is_listed() {
        use std::os::unix::ffi::OsStrExt;
        let (mut c, dir) = sleeper_named("utf8", std::ffi::OsStr::from_bytes(b"sl\xffe) p"));
        let pid = c.id() as i32;
        // Listed once its exec has set the name.
        let name_set = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::fs::read(format!("/proc/{pid}/stat")).is_ok_and(|t| t.contains(&0xff))
        });
        let st = proc_stat(pid);
        let adopted = adopted_children(&[], 0).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(name_set, "the exec never set the name");
        assert_eq!(
            st.map(|s| (s.ppid, s.pgrp)),
            Some((std::process::id() as i32, pid))
        );
        assert!(adopted, "child {pid} not listed");
    }

    /// A child that exits while we list our children hands its own child to us (we are a
    /// subreaper, as conlock is): every listing must show one or the other. Found by
    /// review: the grandchild slipped through the gap between the children lists and the
    /// child's stat, and conlock released while it ran.
    #[test]
    fn a_dying_childs_child_is_never_missed() {
        use std::io::Read;
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        let mut misses = 0;
        for _ in 0..150 {
            let mut p = Command::new("sh")
                .args(["-c", "sleep 30 & echo $!; exec sleep 0.002"])
                .process_group(0)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            let mut out = p.stdout.take().unwrap();
            let mut byte = [0u8; 1];
            while out.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
                line.push(byte[0] as char);
            }
            let (pp, e) = (p.id() as i32, line.trim().parse::<i32>().unwrap());
            loop {
                let listed = adopted_children(&[], -1);
                let has = |x: i32| listed.iter().any(|c| c.pid == x);
                if has(e) {
                    break;
                }
                if !has(pp) {
                    misses += 1;
                    break;
                }
            }
            unsafe { libc::kill(e, libc::SIGKILL) };
            let _ = p.wait();
            unsafe { libc::waitpid(e, std::ptr::null_mut(), 0) };
        }
        assert_eq!(
            misses, 0,
            "listings that showed neither the child nor its child"
        );
    }

    #[test]
    fn own_children_lists_children_of_threads_that_exited() {
        // A child forked by a thread that then exits moves to another thread of ours.
        let mut c = std::thread::spawn(|| Command::new("sleep").arg("30").spawn().unwrap())
            .join()
            .unwrap();
        let pid = c.id() as i32;
        let listed = own_children().map(|(pids, _)| pids.contains(&pid));
        let adopted = adopted_children(&[], -1).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        assert_eq!(
            listed,
            Some(true),
            "/proc/self/task/*/children misses {pid}"
        );
        assert!(adopted);
    }

    #[test]
    fn ignored_reports_sig_ign() {
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
        assert!(ignored(libc::SIGUSR2));
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_DFL) };
        assert!(!ignored(libc::SIGUSR2));
    }
}
