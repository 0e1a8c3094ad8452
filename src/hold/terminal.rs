//! The terminal and job control: who has the terminal's foreground, and whether a stop
//! of conlock's own group reaches a shell. Async-signal-safe where the spawn needs it.

use super::procfs;

/// True when conlock's process group is provably not orphaned: its parent (a shell with
/// job control) is in the same session but another group, so a stop signal is not
/// discarded and the shell will see it.
pub(super) fn own_group_has_job_control() -> bool {
    let (ppid, pgrp, sid) = unsafe { (libc::getppid(), libc::getpgrp(), libc::getsid(0)) };
    procfs::stat(ppid).is_some_and(|p| p.session == sid && p.pgrp != pgrp)
}

/// True when stdin is a terminal whose foreground group is ours.
pub(super) fn foreground_terminal() -> bool {
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
