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
//! calls: no allocation, no lock, no Rust code that could unwind. Everything it needs is
//! prepared here first.

use std::ffi::{CString, OsStr};
use std::io;
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

/// What the child sets up before it execs.
pub struct Setup {
    /// SIGCHLD was ignored when conlock started: the command inherits that.
    pub sigchld_ignored: bool,
    /// SIGTTOU, SIGTTIN were at their default when conlock started (conlock ignores them
    /// while it supervises): the command gets the default back.
    pub tty_defaults: [bool; 2],
    /// Make the child's group the terminal's foreground group.
    pub terminal: bool,
    /// conlock's pid: a child whose parent is already someone else must not run.
    pub parent: libc::pid_t,
}

/// Spawns `path` with `argv` and conlock's environment plus `env` (which overrides), in a
/// new process group. Returns the child's pid once it has exec'd; an exec that failed is
/// an error with the errno, and the child is reaped.
pub fn spawn(
    path: &Path,
    argv: &[impl AsRef<OsStr>],
    env: &[(String, String)],
    setup: &Setup,
) -> io::Result<libc::pid_t> {
    let path = cstring(path.as_os_str().as_bytes())?;
    let argv = argv
        .iter()
        .map(|a| cstring(a.as_ref().as_bytes()))
        .collect::<io::Result<Vec<_>>>()?;
    let envp = environment(env)?;
    let argv_ptrs = null_terminated(&argv);
    let envp_ptrs = null_terminated(&envp);
    let mut child = ChildArgs {
        path: path.as_ptr(),
        argv: argv_ptrs.as_ptr(),
        envp: envp_ptrs.as_ptr(),
        sigchld_ignored: setup.sigchld_ignored,
        tty_defaults: setup.tty_defaults,
        terminal: setup.terminal,
        parent: setup.parent,
        error: 0,
    };
    let mut stack = Stack(MaybeUninit::uninit());
    unsafe {
        // No handler of conlock's may run in the child before it resets them: signals
        // stay blocked from here until the child's exec (it unblocks them itself).
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let top = stack.0.as_mut_ptr().cast::<u8>().add(STACK_SIZE);
        let pid = libc::clone(
            child_main,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            ptr::addr_of_mut!(child).cast(),
        );
        let clone_error = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, ptr::null_mut());
        if pid < 0 {
            return Err(clone_error);
        }
        // Written by the child, in our memory, before it exited.
        let error = ptr::read_volatile(ptr::addr_of!(child.error));
        if error != 0 {
            let mut status = 0;
            while libc::waitpid(pid, &mut status, 0) < 0
                && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
            {}
            return Err(io::Error::from_raw_os_error(error));
        }
        Ok(pid)
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
    sigchld_ignored: bool,
    tty_defaults: [bool; 2],
    terminal: bool,
    parent: libc::pid_t,
    /// Set by the child to the errno of the exec that failed.
    error: libc::c_int,
}

/// Runs in the child, on `Stack`, in conlock's memory: system calls only.
extern "C" fn child_main(arg: *mut libc::c_void) -> libc::c_int {
    unsafe {
        let a = &mut *arg.cast::<ChildArgs>();
        // conlock's handlers (signal-hook's) must not run here: they would act for
        // conlock. Ignored signals stay ignored, as across an exec.
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
        if libc::setpgid(0, 0) != 0 {
            fail(a);
        }
        // The guardian kills the group if conlock dies; this covers the moment before it
        // learns the group's ID.
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        if libc::getppid() != a.parent {
            // conlock died before PDEATHSIG was set.
            libc::_exit(1);
        }
        if a.terminal {
            super::supervise::give_terminal(libc::getpid());
        }
        // std's spawn starts the command with an empty signal mask too.
        let mut none: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut none);
        libc::pthread_sigmask(libc::SIG_SETMASK, &none, ptr::null_mut());
        libc::execve(a.path, a.argv, a.envp);
        fail(a)
    }
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

/// conlock's environment with `extra` set on top, as `KEY=VALUE` strings.
fn environment(extra: &[(String, String)]) -> io::Result<Vec<CString>> {
    let mut vars: Vec<(Vec<u8>, Vec<u8>)> = std::env::vars_os()
        .filter(|(k, _)| !extra.iter().any(|(e, _)| k.as_bytes() == e.as_bytes()))
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect();
    vars.extend(
        extra
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())),
    );
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

    fn setup() -> Setup {
        Setup {
            sigchld_ignored: false,
            tty_defaults: [true, true],
            terminal: false,
            parent: std::process::id() as libc::pid_t,
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
        .unwrap();
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
                &format!("cat /proc/$$/status > {}", out.display()),
            ],
            &[],
            &setup(),
        )
        .unwrap();
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
