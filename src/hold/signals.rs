//! The signals a hold takes, and the command's end: no handlers. Every thread blocks
//! them (`block`, before the hold starts any thread; threads inherit the mask), and one
//! thread takes them with `sigwaitinfo`. SIGCHLD is among them, so the same thread reaps
//! the command and every orphan re-parented to conlock (a subreaper): no reaper thread,
//! no self-pipe, and no system call of another thread ever fails with EINTR.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::Mutex;

use super::event::{self, Event};

/// Whether SIGCHLD was ignored when conlock started: the command inherits that.
static SIGCHLD_IGNORED: AtomicBool = AtomicBool::new(false);

/// The command (its pid) and where its end goes, once it has started.
static COMMAND: Mutex<Option<(i32, Sender<Event>)>> = Mutex::new(None);

/// A SIGCHLD was taken before the command was known (written under `COMMAND`'s lock):
/// the command may have ended then, so `watch_command` must have the children looked at.
static MISSED: AtomicBool = AtomicBool::new(false);

/// Set by `end_thread`: the signal thread returns at its next wake-up.
static ENDING: AtomicBool = AtomicBool::new(false);

/// The set `block` blocked.
static BLOCKED: Mutex<Option<libc::sigset_t>> = Mutex::new(None);

/// The set the signal thread takes: the forwarded signals and SIGTSTP, except those
/// ignored when conlock started (`nohup`, background jobs of a non-interactive shell:
/// they stay ignored, and the command inherits SIG_IGN), and SIGCHLD.
fn set() -> libc::sigset_t {
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in event::FORWARDED.into_iter().chain([libc::SIGTSTP]) {
            if !event::ignored(sig) {
                libc::sigaddset(&mut set, sig);
            }
        }
        libc::sigaddset(&mut set, libc::SIGCHLD);
        set
    }
}

/// Blocks `set()` in the calling thread and in every thread it starts from now on. Called
/// first thing in a hold, while conlock has one thread: a signal that arrives before the
/// signal thread runs then waits for it (pending) instead of taking its default action.
/// Later calls only return the set.
pub(super) fn block() -> libc::sigset_t {
    let mut blocked = BLOCKED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(set) = *blocked {
        return set;
    }
    unsafe {
        // SIG_IGN for SIGCHLD would make the kernel reap our children itself: the command's
        // end would never be seen. The command still gets what conlock inherited.
        if libc::signal(libc::SIGCHLD, libc::SIG_DFL) == libc::SIG_IGN {
            SIGCHLD_IGNORED.store(true, Ordering::SeqCst);
        }
        let set = set();
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        *blocked = Some(set);
        set
    }
}

/// Whether the signal thread must return now.
pub(super) fn ending() -> bool {
    ENDING.load(Ordering::SeqCst)
}

/// Has the signal thread end, without waiting for it. From then on no signal of the set
/// is taken: those that come stay pending, and go with conlock's exit.
pub(super) fn end_thread() {
    ENDING.store(true, Ordering::SeqCst);
    // To the process, not the thread: no other thread waits for SIGCHLD, and a signal
    // that came between the store above and this kill may already have ended the thread
    // (its ID would then be stale).
    unsafe { libc::kill(libc::getpid(), libc::SIGCHLD) };
}

/// Whether SIGCHLD was ignored when the hold started.
pub(super) fn sigchld_was_ignored() -> bool {
    SIGCHLD_IGNORED.load(Ordering::SeqCst)
}

/// Waits for the next signal of `set`.
pub(super) fn wait(set: &libc::sigset_t) -> i32 {
    loop {
        let sig = unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) };
        if sig > 0 {
            return sig;
        }
        // EINTR: a stop and continue of conlock.
    }
}

/// From now on the signal thread reaps and reports `pid`'s end (and its stops on terminal
/// signals) to `events`. Until then it reaps nothing, so that the spawn can wait for a
/// child whose exec failed, and tell the guardian before that pid is freed.
/// Returns whether it had the signal thread look at once.
pub(super) fn watch_command(pid: i32, events: Sender<Event>) -> bool {
    let mut command = COMMAND.lock().unwrap_or_else(|p| p.into_inner());
    *command = Some((pid, events));
    let missed = MISSED.swap(false, Ordering::SeqCst);
    drop(command);
    // The command may have ended already (its SIGCHLD taken meanwhile): look now. A
    // SIGCHLD taken from here on finds the command; one still pending will too.
    if missed {
        unsafe { libc::kill(libc::getpid(), libc::SIGCHLD) };
    }
    missed
}

/// Reaps every child that has ended (we are a subreaper), reporting the command's end and
/// stops. Called by the signal thread on SIGCHLD.
pub(super) fn reap_ready() {
    let mut command = COMMAND.lock().unwrap_or_else(|p| p.into_inner());
    let Some((pid, events)) = command.as_mut() else {
        MISSED.store(true, Ordering::SeqCst);
        return;
    };
    loop {
        let mut status = 0;
        let p = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::WUNTRACED) };
        if p < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
            continue;
        }
        if p <= 0 {
            // None ended (0), or no children left (ECHILD): the next SIGCHLD says when.
            return;
        }
        if p != *pid {
            continue;
        }
        if libc::WIFSTOPPED(status) {
            let sig = libc::WSTOPSIG(status);
            if [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU].contains(&sig) {
                let _ = events.send(Event::Stopped(sig));
            }
        } else if libc::WIFEXITED(status) {
            let _ = events.send(Event::ChildExited(libc::WEXITSTATUS(status)));
            // Reaped: its pid may be reused (by a process of the command that conlock
            // adopts, say), and that process's end is not the command's.
            *pid = 0;
        } else if libc::WIFSIGNALED(status) {
            let sig = libc::WTERMSIG(status);
            event::record_child_signal(sig);
            let _ = events.send(Event::ChildExited(128 + sig));
            *pid = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `watch_command` has the children looked at only if a SIGCHLD was taken before the
    /// command was known (it may have been the command's).
    #[test]
    fn watch_command_looks_at_once_only_after_a_missed_sigchld() {
        let (tx, _rx) = std::sync::mpsc::channel();
        // No SIGCHLD taken meanwhile: nothing to look at.
        MISSED.store(false, Ordering::SeqCst);
        assert!(!watch_command(-1, tx.clone()));
        *COMMAND.lock().unwrap() = None;
        // One taken while no command was known.
        reap_ready();
        assert!(MISSED.load(Ordering::SeqCst));
        assert!(watch_command(-1, tx));
        assert!(!MISSED.load(Ordering::SeqCst));
        *COMMAND.lock().unwrap() = None;
    }
}
