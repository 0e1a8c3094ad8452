//! Starting the command the way posix_spawn does (clone with CLONE_VM | CLONE_VFORK, then
//! exec), plus what posix_spawn cannot do between the two: PR_SET_PDEATHSIG, the check
//! that conlock is still the parent, and handing over the terminal.
//!
//! A fork copies conlock's page tables and leaves every page it writes afterwards to a
//! copy-on-write fault; on the 2-core VM of the benchmark that was about half a
//! millisecond of every run. Here the child borrows conlock's memory until it execs, and
//! conlock's spawning thread sleeps until then.
//!
//! The child runs in conlock's memory, so between clone and exec it only makes system
//! calls (and may run one handler that stores a number): no allocation, no lock, no Rust
//! code that could unwind. Everything it needs is prepared here first.

use std::ffi::{CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

/// What the child sets up before it execs.
pub struct Setup<'a> {
    /// SIGCHLD was ignored when conlock started: the command inherits that.
    pub sigchld_ignored: bool,
    /// SIGTTOU, SIGTTIN were at their default when conlock started (conlock ignores them
    /// while it supervises): the command gets the default back.
    pub tty_defaults: [bool; 2],
    /// Make the child's group the terminal's foreground group.
    pub terminal: bool,
    /// conlock's pid: a child whose parent is already someone else must not run.
    pub parent: libc::pid_t,
    /// CLOCK_BOOTTIME nanoseconds by which the command must be stopped: a child that gets
    /// that far before its exec (it was stopped, say) does not exec.
    pub deadline_ns: u64,
    /// The guardian's pipe (-1: none): the child tells it its process group itself, so
    /// that a conlock stopped right after the exec still has a guardian that knows it.
    pub guardian_fd: libc::c_int,
    /// Called when the child failed, before it is reaped.
    pub before_reap: &'a dyn Fn(),
}

/// The pid of a child between clone and exec (0: none), for the signal thread: a child
/// stopped there (SIGSTOP) keeps conlock waiting in clone until it is continued.
pub static SPAWNING: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// What `spawn` started.
#[derive(Debug)]
pub struct Spawned {
    pub pid: libc::pid_t,
    /// A stop signal (a Ctrl-Z) that reached the child between its setpgid and its exec:
    /// it was held back there, to be sent to the group now.
    pub held_stop: Option<libc::c_int>,
    /// The child told the guardian its group itself (conlock need not tell it again).
    pub announced: bool,
}

/// The errno a child reports when the deadline passed before its exec.
pub const DEADLINE_PASSED: i32 = libc::ETIME;

/// Spawns `path` with `argv` and conlock's environment plus `env` (which overrides), in a
/// new process group. Returns the child's pid once it has exec'd; an exec that failed is
/// an error with the errno, and the child is reaped.
pub fn spawn(
    path: &Path,
    argv: &[impl AsRef<OsStr>],
    env: &[(String, String)],
    setup: &Setup,
) -> io::Result<Spawned> {
    let path = cstring(path.as_os_str().as_bytes())?;
    let argv = argv
        .iter()
        .map(|a| cstring(a.as_ref().as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let envp = environment(env)?;
    let argv_ptrs = null_terminated(&argv);
    let envp_ptrs = null_terminated(&envp);
    // A script without `#!` is run by /bin/sh, as execvp does (and std's spawn did).
    let sh = c"/bin/sh";
    let script_argv: Vec<*const libc::c_char> = [sh.as_ptr(), path.as_ptr()]
        .into_iter()
        .chain(argv_ptrs.iter().skip(1).copied())
        .collect();
    let mut child = ChildArgs {
        path: path.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        sh: sh.as_ptr(),
        script_argv: script_argv.as_ptr(),
        sigchld_ignored: setup.sigchld_ignored,
        tty_defaults: setup.tty_defaults,
        terminal: setup.terminal,
        parent: setup.parent,
        deadline_ns: setup.deadline_ns,
        guardian_fd: setup.guardian_fd,
        error: 0,
        announced: false,
    };
    let mut stack = Stack(MaybeUninit::uninit());
    unsafe {
        // No handler of conlock's may run in the child before it resets them: signals
        // stay blocked from here until the child's exec (it unblocks them itself).
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        HELD_STOP.store(0, std::sync::atomic::Ordering::SeqCst);
        let top = stack.0.as_mut_ptr().cast::<u8>().add(STACK_SIZE);
        // CLONE_PARENT_SETTID: the kernel writes the child's pid to SPAWNING before the
        // child runs.
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PARENT_SETTID | libc::SIGCHLD,
            ptr::addr_of_mut!(child).cast(),
            SPAWNING.as_ptr(),
        );
        let clone_error = io::Error::last_os_error();
        SPAWNING.store(0, std::sync::atomic::Ordering::SeqCst);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        // Written by the child, in our memory, before it exited.
        let error = ptr::read_volatile(ptr::addr_of!(child.error));
        if error != 0 {
            // Before the reap, while the zombie keeps its pid (and group ID) reserved.
            (setup.before_reap)();
            let mut status = 0;
            while libc::waitpid(pid, &mut status, 0) < 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
            return Err(io::Error::from_raw_os_error(error));
        }
        let held = HELD_STOP.swap(0, std::sync::atomic::Ordering::SeqCst);
        Ok(Spawned {
            pid,
            held_stop: (held != 0).then_some(held),
            announced: ptr::read_volatile(ptr::addr_of!(child.announced)),
        })
    }
}

const STACK_SIZE: usize = 32 * 1024;

/// The child's stack while it shares our memory (it lives in the spawning frame, which
/// waits until the child has exec'd). Uninitialised: only what the child uses is touched.
#[repr(C, align(16))]
struct Stack(MaybeUninit<[u8; STACK_SIZE]>);

#[repr(C)]
struct ChildArgs {
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    sh: *const libc::c_char,
    /// `/bin/sh PATH ARGS...`, for ENOEXEC.
    script_argv: *const *const libc::c_char,
    sigchld_ignored: bool,
    tty_defaults: [bool; 2],
    terminal: bool,
    parent: libc::pid_t,
    deadline_ns: u64,
    guardian_fd: libc::c_int,
    /// Set by the child to the errno of the exec that failed.
    error: libc::c_int,
    /// Set by the child once its line reached the guardian's pipe whole.
    announced: bool,
}

/// Runs in the child, on `Stack`, in conlock's memory: system calls only.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    unsafe {
        let a = &mut *arg.cast::<ChildArgs>();
        // No handler of conlock's process may run here: it would act for conlock (a hold
        // installs none, but a library may). Ignored signals stay ignored, as across an
        // exec.
        for sig in 1..=SIG_MAX {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, ptr::null(), &mut old) == 0
                && old.sa_sigaction != libc::SIG_IGN
                && old.sa_sigaction != libc::SIG_DFL
            {
                set_disposition(sig, libc::SIG_DFL);
            }
        }
        // Rust ignores SIGPIPE; the command gets the default, as std's spawn does.
        set_disposition(libc::SIGPIPE, libc::SIG_DFL);
        if a.sigchld_ignored {
            set_disposition(libc::SIGCHLD, libc::SIG_IGN);
        }
        for (sig, dfl) in [libc::SIGTTOU, libc::SIGTTIN]
            .into_iter()
            .zip(a.tty_defaults)
        {
            if dfl {
                set_disposition(sig, libc::SIG_DFL);
            }
        }
        #[cfg(test)]
        tests::before_setpgid();
        if libc::setpgid(0, 0) != 0 {
            fail(a);
        }
        // A stop signal sent to conlock's group before the setpgid is pending here
        // (blocked). Delivered, it would stop the child before its exec, where conlock
        // (waiting in clone) cannot see it and a SIGCONT to conlock's group cannot reach
        // it. conlock got it too and forwards it after the exec, so it is dropped here.
        drop_pending_stop();
        // From now on a stop signal can only be meant for this group (the terminal's
        // Ctrl-Z once it is ours, or someone who knows the new group): it is recorded
        // by a handler instead of stopping the child before its exec, and conlock sends it
        // to the group after the exec (which resets the handler to the default).
        for (sig, keep) in [
            (libc::SIGTSTP, true),
            (libc::SIGTTOU, a.tty_defaults[0]),
            (libc::SIGTTIN, a.tty_defaults[1]),
        ] {
            let mut now: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, ptr::null(), &mut now);
            if keep && now.sa_sigaction == libc::SIG_DFL {
                let record: extern "C" fn(libc::c_int) = record_stop;
                let mut act: libc::sigaction = std::mem::zeroed();
                act.sa_sigaction = record as libc::sighandler_t;
                // A Ctrl-Z must not make a slow exec (FUSE, CIFS) fail with EINTR.
                act.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut act.sa_mask);
                libc::sigaction(sig, &act, ptr::null_mut());
            }
        }
        if a.guardian_fd >= 0 {
            let mut buf = [0u8; 48];
            let line = process_group_line(libc::getpid(), &mut buf);
            // One line below PIPE_BUF: written whole or not at all. A guardian that is
            // gone leaves a SIGPIPE pending, which would kill the child: dropped.
            let written = libc::syscall(libc::SYS_write, a.guardian_fd, line.as_ptr(), line.len());
            if written < 0 {
                set_disposition(libc::SIGPIPE, libc::SIG_IGN);
                set_disposition(libc::SIGPIPE, libc::SIG_DFL);
            }
            a.announced = written == line.len() as libc::c_long;
        }
        // The guardian kills the group if conlock dies; this covers the moment before it
        // learns the group's ID.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != a.parent {
            // conlock died before PDEATHSIG was set.
            libc::_exit(1);
        }
        if a.terminal {
            super::terminal::give_terminal(libc::getpid());
        }
        #[cfg(test)]
        tests::before_unmask();
        // std's spawn starts the command with an empty signal mask too.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, ptr::null_mut());
        // Stopped (or stalled) since conlock checked its deadline: the claim may be
        // another's by now, so the command must not start.
        let mut ts: libc::timespec = std::mem::zeroed();
        if libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) == 0
            && (ts.tv_sec as u64)
                .saturating_mul(1_000_000_000)
                .saturating_add(ts.tv_nsec as u64)
                >= a.deadline_ns
        {
            *libc::__errno_location() = DEADLINE_PASSED;
            fail(a);
        }
        // Retried after EINTR: the handler above may run during a slow exec.
        while libc::execve(a.path, a.argv, a.envp) < 0 && *libc::__errno_location() == libc::EINTR {
        }
        if *libc::__errno_location() == libc::ENOEXEC {
            while libc::execve(a.sh, a.script_argv, a.envp) < 0
                && *libc::__errno_location() == libc::EINTR
            {}
            *libc::__errno_location() = libc::ENOEXEC;
        }
        fail(a)
    }
}

/// A stop signal that reached the child between its setpgid and its exec (0: none).
/// Written by the child's handler, in conlock's memory; one spawn at a time.
static HELD_STOP: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn record_stop(sig: libc::c_int) {
    HELD_STOP.store(sig, std::sync::atomic::Ordering::SeqCst);
}

/// Drops a pending SIGTSTP, SIGTTIN or SIGTTOU (setting SIG_IGN discards a pending
/// signal; the disposition is then put back). Returns one that was pending, or 0.
unsafe fn drop_pending_stop() -> libc::c_int {
    let mut pending: libc::sigset_t = std::mem::zeroed();
    let mut dropped = 0;
    if libc::sigpending(&mut pending) == 0 {
        for sig in [libc::SIGTSTP, libc::SIGTTIN, libc::SIGTTOU] {
            if libc::sigismember(&pending, sig) == 1 {
                let mut now: libc::sigaction = std::mem::zeroed();
                libc::sigaction(sig, ptr::null(), &mut now);
                set_disposition(sig, libc::SIG_IGN);
                libc::sigaction(sig, &now, ptr::null_mut());
                if dropped == 0 {
                    dropped = sig;
                }
            }
        }
    }
    dropped
}

/// The guardian's `{"ProcessGroup":PID}` line, written into `buf` without allocating.
fn process_group_line(pid: libc::pid_t, buf: &mut [u8; 48]) -> &[u8] {
    const HEAD: &[u8] = b"{\"ProcessGroup\":";
    buf[..HEAD.len()].copy_from_slice(HEAD);
    let mut n = HEAD.len();
    let mut digits = [0u8; 12];
    let mut d = 0;
    let mut v = pid.unsigned_abs();
    loop {
        digits[d] = b'0' + (v % 10) as u8;
        d += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    if pid < 0 {
        buf[n] = b'-';
        n += 1;
    }
    while d > 0 {
        d -= 1;
        buf[n] = digits[d];
        n += 1;
    }
    buf[n] = b'}';
    buf[n + 1] = b'\n';
    &buf[..n + 2]
}

/// The highest signal number on Linux (_NSIG - 1).
const SIG_MAX: libc::c_int = 64;

unsafe fn set_disposition(sig: libc::c_int, handler: libc::sighandler_t) {
    let mut act: libc::sigaction = std::mem::zeroed();
    act.sa_sigaction = handler;
    libc::sigemptyset(&mut act.sa_mask);
    libc::sigaction(sig, &act, ptr::null_mut());
}

/// Reports errno to the parent and ends the child.
unsafe fn fail(a: &mut ChildArgs) -> ! {
    let errno = *libc::__errno_location();
    ptr::write_volatile(ptr::addr_of_mut!(a.error), errno.max(1));
    libc::_exit(127)
}

fn cstring(bytes: &[u8]) -> io::Result<CString> {
    CString::new(bytes).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "an argument or environment variable contains a NUL byte",
        )
    })
}

/// conlock's environment with `extra` set on top, as `KEY=VALUE` strings. A name set
/// twice keeps its last value, as with std's spawn.
fn environment(extra: &[(String, String)]) -> io::Result<Vec<CString>> {
    let mut vars: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = std::env::vars_os()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    for (k, v) in extra {
        vars.insert(k.as_bytes().to_vec(), v.as_bytes().to_vec());
    }
    vars.into_iter()
        .map(|(mut k, v)| {
            k.push(b'=');
            k.extend_from_slice(&v);
            cstring(&k)
        })
        .collect()
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Called by the child right before its setpgid (a function pointer, or 0). Set only
    /// in forked helper processes, never in the test process itself.
    static BEFORE_SETPGID: AtomicUsize = AtomicUsize::new(0);

    /// Called by the child right before it empties its signal mask.
    static BEFORE_UNMASK: AtomicUsize = AtomicUsize::new(0);

    fn run_hook(hook: &AtomicUsize) {
        let hook = hook.load(Ordering::SeqCst);
        if hook != 0 {
            let hook: extern "C" fn() = unsafe { std::mem::transmute(hook) };
            hook();
        }
    }

    pub(super) fn before_setpgid() {
        run_hook(&BEFORE_SETPGID);
    }

    pub(super) fn before_unmask() {
        run_hook(&BEFORE_UNMASK);
    }

    #[test]
    fn a_stop_signal_to_the_new_group_before_the_exec_is_held_for_after_it() {
        // A Ctrl-Z that reaches the child in its own group before its exec: before the
        // fix the child stopped there and the helper waited in clone for good.
        let code = in_helper(|| unsafe {
            BEFORE_UNMASK.store(stop_own_group as extern "C" fn() as usize, Ordering::SeqCst);
            let Ok(s) = spawn(Path::new("/bin/true"), &["true"], &[], &setup()) else {
                return 2;
            };
            if s.held_stop != Some(libc::SIGTSTP) {
                return 3;
            }
            let mut status = 0;
            libc::waitpid(s.pid, &mut status, 0);
            if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                4
            }
        });
        assert_eq!(code, Some(0), "the spawn hung, or the stop was not held");
    }

    extern "C" fn stop_own_group() {
        unsafe { libc::kill(0, libc::SIGTSTP) };
    }

    extern "C" fn nothing(_: libc::c_int) {}

    /// Runs `body` in a forked process of its own group; its exit code, or None if it
    /// did not end within 20 s (then it and its group are killed).
    fn in_helper(body: impl FnOnce() -> i32) -> Option<i32> {
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                libc::setpgid(0, 0);
                libc::_exit(body());
            }
        }
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let mut status = 0;
            if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
                return Some(libc::WEXITSTATUS(status));
            }
            if std::time::Instant::now() > until {
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    #[test]
    fn a_stop_signal_to_the_old_group_before_setpgid_does_not_stop_the_child() {
        // The helper catches SIGTSTP like conlock does; its child stops the helper's group
        // while it is still in it. Before the fix the child stopped before its exec and
        // the helper waited in clone for good.
        let code = in_helper(|| unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = nothing as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigaction(libc::SIGTSTP, &act, ptr::null_mut());
            BEFORE_SETPGID.store(stop_own_group as extern "C" fn() as usize, Ordering::SeqCst);
            let Ok(Spawned { pid, .. }) = spawn(Path::new("/bin/true"), &["true"], &[], &setup())
            else {
                return 2;
            };
            let mut status = 0;
            libc::waitpid(pid, &mut status, 0);
            if libc::WIFEXITED(status) {
                libc::WEXITSTATUS(status)
            } else {
                3
            }
        });
        assert_eq!(code, Some(0), "the spawn hung or the command did not run");
    }

    #[test]
    fn a_child_that_reaches_the_deadline_does_not_exec() {
        let dir = std::env::temp_dir().join(format!("conlock-spawn-dl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mark = dir.join("ran");
        let late = Setup {
            deadline_ns: 1,
            ..setup()
        };
        let e = spawn(
            Path::new("/bin/sh"),
            &["sh", "-c", &format!("touch {}", mark.display())],
            &[],
            &late,
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(DEADLINE_PASSED));
        assert!(!mark.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_script_without_a_shebang_runs_with_bin_sh() {
        let dir = std::env::temp_dir().join(format!("conlock-spawn-sh-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("noshebang");
        let out = dir.join("out");
        std::fs::write(&script, format!("echo \"$0 $1\" > {}\n", out.display())).unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let pid = spawn(&script, &["noshebang", "arg1"], &[], &setup())
            .unwrap()
            .pid;
        assert_eq!(wait(pid), 0);
        let text = std::fs::read_to_string(&out).unwrap();
        assert_eq!(text.trim(), format!("{} arg1", script.display()));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_process_group_line_is_the_guardians_format() {
        for pid in [1, 9, 10, 1234, 4_194_304, i32::MAX] {
            let mut buf = [0u8; 48];
            assert_eq!(
                process_group_line(pid, &mut buf),
                format!("{{\"ProcessGroup\":{pid}}}\n").as_bytes()
            );
        }
    }

    fn pipe() -> [libc::c_int; 2] {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        fds
    }

    /// Spawns /bin/true with `fd` as the guardian's pipe.
    fn spawn_true_announcing_to(fd: libc::c_int) -> Spawned {
        let with_pipe = Setup {
            guardian_fd: fd,
            ..setup()
        };
        spawn(Path::new("/bin/true"), &["true"], &[], &with_pipe).unwrap()
    }

    #[test]
    fn the_child_tells_the_guardian_its_group_before_the_exec() {
        let fds = pipe();
        let spawned = spawn_true_announcing_to(fds[1]);
        let pid = spawned.pid;
        assert!(spawned.announced, "not reported as told");
        wait(pid);
        unsafe { libc::close(fds[1]) };
        let mut got = String::new();
        std::io::Read::read_to_string(
            &mut unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) },
            &mut got,
        )
        .unwrap();
        assert_eq!(got, format!("{{\"ProcessGroup\":{pid}}}\n"));
    }

    #[test]
    fn a_guardian_gone_during_the_spawn_does_not_kill_the_child() {
        // The write to a pipe nobody reads raises SIGPIPE, pending while blocked: before
        // the fix it killed the child when it emptied its mask, before the exec.
        let fds = pipe();
        unsafe { libc::close(fds[0]) };
        let spawned = spawn_true_announcing_to(fds[1]);
        // conlock tells the guardian itself then (it fails the same way, harmlessly).
        assert!(!spawned.announced);
        let status = wait(spawned.pid);
        unsafe { libc::close(fds[1]) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "status {status:#x}"
        );
    }

    #[test]
    fn a_pending_stop_signal_is_dropped_and_reported() {
        let code = in_helper(|| unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTSTP);
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, ptr::null_mut());
            libc::raise(libc::SIGTSTP);
            if drop_pending_stop() != libc::SIGTSTP {
                return 2;
            }
            let mut pending: libc::sigset_t = std::mem::zeroed();
            libc::sigpending(&mut pending);
            if libc::sigismember(&pending, libc::SIGTSTP) == 1 {
                return 3;
            }
            if drop_pending_stop() != 0 {
                return 4;
            }
            0
        });
        assert_eq!(code, Some(0));
    }

    #[test]
    fn a_name_set_twice_keeps_the_last_value() {
        let env = environment(&[
            ("CONLOCK_T".into(), "a".into()),
            ("CONLOCK_T".into(), "b".into()),
        ])
        .unwrap();
        let hits: Vec<_> = env
            .iter()
            .filter(|e| e.as_bytes().starts_with(b"CONLOCK_T="))
            .collect();
        assert_eq!(hits.len(), 1);
        assert_eq!(hits[0].as_bytes(), b"CONLOCK_T=b");
    }

    fn setup() -> Setup<'static> {
        Setup {
            sigchld_ignored: false,
            tty_defaults: [true, true],
            terminal: false,
            parent: std::process::id() as libc::pid_t,
            deadline_ns: u64::MAX,
            guardian_fd: -1,
            before_reap: &|| {},
        }
    }

    fn wait(pid: libc::pid_t) -> i32 {
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        status
    }

    #[test]
    fn runs_in_its_own_group_with_the_environment_given() {
        let dir = std::env::temp_dir().join(format!("conlock-spawn-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        let script = format!(
            "echo \"$CONLOCK_X $(cut -d' ' -f5 /proc/$$/stat) $$\" > {}",
            out.display()
        );
        let pid = spawn(
            Path::new("/bin/sh"),
            &["sh", "-c", &script],
            &[("CONLOCK_X".into(), "given".into())],
            &setup(),
        )
        .unwrap()
        .pid;
        assert_eq!(wait(pid), 0);
        let text = std::fs::read_to_string(&out).unwrap();
        let parts: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(parts[0], "given");
        assert_eq!(
            parts[1], parts[2],
            "not the leader of its own group: {text}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_failed_exec_is_an_error_with_its_errno() {
        let e = spawn(
            Path::new("/nonexistent/conlock-test"),
            &["x"],
            &[],
            &setup(),
        )
        .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOENT));
        let e = spawn(Path::new("/"), &["x"], &[], &setup()).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    }

    #[test]
    fn a_nul_byte_is_refused_before_anything_runs() {
        let e = spawn(Path::new("/bin/true"), &["a\0b"], &[], &setup()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn the_command_gets_sigpipe_at_its_default_and_an_empty_mask() {
        // /proc/self/status of the command: SigBlk (mask) and SigIgn (ignored set).
        let dir = std::env::temp_dir().join(format!("conlock-spawn-sig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("status");
        let pid = spawn(
            Path::new("/bin/sh"),
            &[
                "sh",
                "-c",
                // `exec`: sh blocks signals around its own forks, so a child of sh
                // reading sh's status could see sh's mask of the moment.
                &format!("exec cat /proc/self/status > {}", out.display()),
            ],
            &[],
            &setup(),
        )
        .unwrap()
        .pid;
        assert_eq!(wait(pid), 0);
        let status = std::fs::read_to_string(&out).unwrap();
        let field = |name: &str| {
            let line = status.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(field("SigBlk:"), 0, "{status}");
        assert_eq!(field("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{status}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
