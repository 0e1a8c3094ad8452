//! Child supervision: spawn the command in its own process group, forward signals,
//! stop the whole group when the lock is lost, and make sure the group dies with us.
//!
//! If conlock itself is SIGKILLed, the guardian (see `guardian.rs`) SIGKILLs the child's
//! process group. PR_SET_PDEATHSIG alone would reach only the direct child.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;

use crate::error::{Error, Result};
use crate::guardian::Guardian;
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
    let shown = name.to_string_lossy();
    let check = |p: &Path| -> Result<PathBuf> {
        let meta = std::fs::metadata(p)
            .map_err(|_| Error::NotFound(format!("command not found: {shown}")))?;
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
    Err(first_err
        .unwrap_or_else(|| Error::NotFound(format!("command not found: {shown} (searched PATH)"))))
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
}

impl Child {
    /// Spawns the program in a new process group guarded against our own death.
    /// A reaper thread reports the child's end as `Event::ChildExited`.
    pub fn spawn(
        program: &Program,
        env: &[(String, String)],
        events: Sender<Event>,
        guardian: Option<&Guardian>,
    ) -> Result<Child> {
        // Orphaned grandchildren are re-parented to us, so zombies never keep the group "alive".
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
        }
        // A SIGCHLD ignored by whoever started us is inherited through exec; then the
        // kernel reaps our children itself, the reaper's waitpid never reports the child,
        // and we would hold the lock forever after it ended. The child keeps what it
        // would have inherited.
        let sigchld_ignored =
            unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) == libc::SIG_IGN };
        let terminal = foreground_terminal();
        let parent = std::process::id() as libc::pid_t;
        let mut cmd = Command::new(&program.path);
        cmd.arg0(&program.argv[0])
            .args(&program.argv[1..])
            .envs(env.iter().map(|(k, v)| (k, v)));
        cmd.process_group(0);
        unsafe {
            cmd.pre_exec(move || {
                // Only async-signal-safe calls here.
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                if sigchld_ignored {
                    libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                }
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
                if terminal {
                    give_terminal(libc::getpid());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| {
            let shown = &program.display;
            match e.kind() {
                std::io::ErrorKind::NotFound => {
                    Error::NotFound(format!("command not found: {shown}"))
                }
                std::io::ErrorKind::PermissionDenied => {
                    Error::NotExecutable(format!("{shown} is not executable: {e}"))
                }
                _ => Error::NotExecutable(format!("cannot run {shown}: {e}")),
            }
        })?;
        let pid = Pid::from_raw(child.id() as i32);
        if terminal {
            unsafe { give_terminal(pid.as_raw()) };
        }
        if let Some(g) = guardian {
            g.process_group(pid.as_raw());
        }
        std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || reap(pid, events))
            .expect("spawn reaper thread");
        ui::verbose(format_args!(
            "started {} as pid {pid} (own process group)",
            program.display
        ));
        Ok(Child { pid, terminal })
    }

    pub fn pid(&self) -> Pid {
        self.pid
    }

    /// Sends a signal to the whole process group.
    pub fn signal_group(&self, sig: Signal) {
        match kill(Pid::from_raw(-self.pid.as_raw()), sig) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => ui::warn(format_args!(
                "cannot signal process group {}: {e}",
                self.pid
            )),
        }
    }

    fn signal_raw(&self, sig: i32) {
        unsafe {
            libc::kill(-self.pid.as_raw(), sig);
        }
    }

    /// True while any process of the group is alive. EPERM means a member exists that
    /// we may not signal (a setuid program, say): alive too. Zombies are dead.
    pub fn group_alive(&self) -> bool {
        !crate::pgroup::gone(self.pid.as_raw())
    }

    /// Takes the terminal back.
    pub fn finish(self) {
        if self.terminal {
            unsafe { give_terminal(libc::getpgrp()) };
        }
    }
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

/// Waits for the child while watching `events` and the session deadline; returns once the
/// whole process group is gone, or with `false` if part of it survives even SIGKILL (the
/// lock must then not be released).
pub fn supervise(
    child: &Child,
    events: &Receiver<Event>,
    session_deadline: &dyn Fn() -> Instant,
    policy: StopPolicy,
) -> (Outcome, bool) {
    let mut lost: Option<String> = None;
    let mut timed_out = false;
    let mut kill_at: Option<Instant> = None;
    let mut status: Option<i32> = None;
    let stop = |child: &Child, kill_at: &mut Option<Instant>, sig: Signal| {
        child.signal_group(sig);
        kill_at.get_or_insert(Instant::now() + policy.grace);
    };
    while status.is_none() {
        let now = Instant::now();
        let mut wake = now + Duration::from_secs(3600);
        if lost.is_none() {
            wake = wake.min(session_deadline());
        }
        if let Some(k) = kill_at {
            wake = wake.min(k);
        }
        match events.recv_timeout(wake.saturating_duration_since(now)) {
            Ok(Event::ChildExited(code)) => status = Some(code),
            Ok(Event::Signal(sig)) => {
                ui::verbose(format_args!(
                    "forwarding signal {sig} to process group {}",
                    child.pid
                ));
                child.signal_raw(sig);
                if sig == libc::SIGINT || sig == libc::SIGTERM {
                    kill_at.get_or_insert(Instant::now() + policy.grace);
                }
            }
            Ok(Event::Lost(reason)) => {
                if lost.is_none() {
                    ui::notice(format_args!("lock lost: {reason}; stopping the command"));
                    crate::events::emit("lost", serde_json::json!({ "reason": reason }));
                    lost = Some(reason);
                    stop(child, &mut kill_at, policy.kill_signal);
                }
            }
            Ok(Event::MaxTime(why)) => {
                if lost.is_none() && !timed_out {
                    ui::notice(format_args!("{why}; stopping the command"));
                    timed_out = true;
                    stop(child, &mut kill_at, policy.kill_signal);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                // Cannot happen while the reaper holds a sender; stop rather than spin.
                status = Some(crate::error::exit::INTERNAL);
            }
        }
        let now = Instant::now();
        if lost.is_none() && status.is_none() && now >= session_deadline() {
            let reason =
                "the session could not be renewed in time (Consul unreachable or not answering)"
                    .to_string();
            ui::notice(format_args!("lock lost: {reason}; stopping the command"));
            crate::events::emit("lost", serde_json::json!({ "reason": reason }));
            lost = Some(reason);
            stop(child, &mut kill_at, policy.kill_signal);
        }
        if let Some(k) = kill_at {
            if now >= k && status.is_none() {
                ui::verbose(format_args!(
                    "grace period over; sending SIGKILL to process group {}",
                    child.pid
                ));
                child.signal_group(Signal::SIGKILL);
                kill_at = Some(now + Duration::from_secs(3600));
            }
        }
    }
    let group_gone = stop_leftovers(child, policy, kill_at);
    let outcome = match lost {
        Some(reason) => Outcome::Lost(reason),
        None if timed_out => Outcome::MaxTime,
        None => Outcome::Exited(status.unwrap_or(crate::error::exit::INTERNAL)),
    };
    (outcome, group_gone)
}

/// Processes the child left behind in its group must not outlive the lock.
/// `kill_at`: the SIGKILL time already set by a loss or a forwarded INT/TERM.
/// False if part of the group survives SIGKILL.
fn stop_leftovers(child: &Child, policy: StopPolicy, kill_at: Option<Instant>) -> bool {
    if !child.group_alive() {
        return true;
    }
    ui::verbose(format_args!(
        "processes remain in group {}; stopping them",
        child.pid
    ));
    child.signal_group(policy.kill_signal);
    child.signal_group(Signal::SIGCONT);
    // The grace period started with the loss or the forwarded INT/TERM, not when the
    // direct child exited: restarting it here let leftovers outlive the loss by up to
    // twice --kill-grace (past the lock-delay that --kill-grace is meant to stay under).
    let mut grace_end = Instant::now() + policy.grace;
    if let Some(k) = kill_at {
        grace_end = grace_end.min(k);
    }
    if wait_group_gone(child, grace_end.saturating_duration_since(Instant::now())) {
        return true;
    }
    child.signal_group(Signal::SIGKILL);
    wait_group_gone(child, Duration::from_secs(10))
}

fn wait_group_gone(child: &Child, within: Duration) -> bool {
    let until = Instant::now() + within;
    while child.group_alive() {
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
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

/// Reaps every child (we are a subreaper) and reports the direct child's end.
fn reap(pid: Pid, events: Sender<Event>) {
    loop {
        match waitpid(None, None) {
            Ok(WaitStatus::Exited(p, code)) if p == pid => {
                let _ = events.send(Event::ChildExited(code));
            }
            Ok(WaitStatus::Signaled(p, sig, _)) if p == pid => {
                CHILD_SIGNAL.store(sig as i32, std::sync::atomic::Ordering::SeqCst);
                let _ = events.send(Event::ChildExited(128 + sig as i32));
            }
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(_) => {
                // No children left; wait for new orphans to arrive.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// True when stdin is a terminal whose foreground group is ours.
fn foreground_terminal() -> bool {
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes `pgid` the terminal's foreground group, ignoring SIGTTOU meanwhile.
/// Async-signal-safe: also used between fork and exec.
unsafe fn give_terminal(pgid: libc::pid_t) {
    let mut set: libc::sigset_t = std::mem::zeroed();
    let mut old: libc::sigset_t = std::mem::zeroed();
    libc::sigemptyset(&mut set);
    libc::sigaddset(&mut set, libc::SIGTTOU);
    libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
    libc::tcsetpgrp(0, pgid);
    libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
}
