//! What the signal thread, the session and the supervising loop tell each other, and
//! how the command ended: a leaf of `hold`, so that none of them imports another for it.

use std::sync::atomic::{AtomicI32, Ordering};

use nix::sys::signal::Signal;

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

/// True when `sig` is ignored (SIG_IGN) right now. Queried before any handler is
/// installed, it tells what conlock inherited: `nohup` ignores SIGHUP, a non-interactive
/// shell ignores SIGINT and SIGQUIT for background jobs. Those stay ignored.
pub fn ignored(sig: i32) -> bool {
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// The signal the direct child died of (0: none), for telling 128+N from an exit code.
static CHILD_SIGNAL: AtomicI32 = AtomicI32::new(0);

/// The signal the command died of, if it died of one.
pub fn child_signal() -> Option<i32> {
    match CHILD_SIGNAL.load(Ordering::SeqCst) {
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
    CHILD_SIGNAL.store(sig, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ignored_reports_sig_ign() {
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_IGN) };
        assert!(ignored(libc::SIGUSR2));
        unsafe { libc::signal(libc::SIGUSR2, libc::SIG_DFL) };
        assert!(!ignored(libc::SIGUSR2));
    }
}
