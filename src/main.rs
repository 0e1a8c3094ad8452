// conlock's own entry point instead of std's, on Linux (glibc and musl): see `main`.
#![cfg_attr(not(test), no_main)]
use std::ffi::OsString;

use clap::Parser;
use conlock::error::exit;

/// musl's own allocator makes a short run about 0.4 ms slower (clap's parse alone took
/// twice as long); dlmalloc behind one lock is as quick as glibc's. The spawned command's
/// child code allocates nothing, so a lock held by another thread cannot block it.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// The C entry point. std's own start would also set up an alternate signal stack in
/// every thread (on musl: a map and an unmap per thread, each unmap a TLB flush on the
/// other CPU) and, on glibc, read /proc/self/maps for the main thread's stack guard, only
/// to name a stack overflow: about 0.15 ms of every run on glibc, 0.4 ms on musl (both
/// measured in interleaved runs on the bench VM). A stack overflow still ends
/// conlock with SIGSEGV, and the guardian then stops the command as for any death.
#[cfg(not(test))]
#[no_mangle]
extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: first thing, with a single thread.
    unsafe { start() };
    // std never sees the arguments on musl (glibc would hand them to std's init hook), so
    // they are read here, on both.
    use std::os::unix::ffi::OsStringExt;
    let args = (0..usize::try_from(argc).unwrap_or(0))
        // SAFETY: the kernel's argv: argc valid C strings.
        .map(|i| unsafe { std::ffi::CStr::from_ptr(*argv.add(i)) })
        .map(|a| OsString::from_vec(a.to_bytes().to_vec()))
        .collect();
    run(args)
}

/// What std's start does that conlock needs: standard streams that are open, so that
/// no socket or pipe becomes fd 0, 1 or 2 (and the command's output, for example, would
/// go to Consul); and SIGPIPE ignored, so a closed pipe is an error, not a death.
// The test harness has its own main.
#[cfg_attr(test, allow(dead_code))]
unsafe fn start() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    let closed: Vec<bool> = if libc::poll(fds.as_mut_ptr(), 3, 0) >= 0 {
        fds.iter()
            .map(|p| p.revents & libc::POLLNVAL != 0)
            .collect()
    } else {
        // poll refused (a sandbox may): ask each fd.
        (0..3)
            .map(|fd| libc::fcntl(fd, libc::F_GETFD) == -1)
            .collect()
    };
    // Lowest first: open gives each the lowest free number, which is the closed one.
    for _ in closed.iter().filter(|&&c| c) {
        if libc::open(c"/dev/null".as_ptr(), libc::O_RDWR) == -1 {
            libc::abort();
        }
    }
    libc::signal(libc::SIGPIPE, libc::SIG_IGN);
}

#[cfg_attr(test, allow(dead_code))]
fn run(args: Vec<OsString>) -> ! {
    if holds_a_claim(args.iter().skip(1).cloned()) {
        // Before anything starts a thread: see guardian.rs.
        conlock::hold::guardian::prefork();
    }
    let cli = match conlock::cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            conlock::ui::error(usage_error_line(&e.render().to_string()));
            std::process::exit(exit::INTERNAL);
        }
        Err(e) => {
            // --help and --version (clap's `print` would hide a failed write).
            let code = match conlock::ui::out(e.render().to_string()) {
                Ok(()) => 0,
                Err(e) => report(&conlock::error::Error::Stdout(e)),
            };
            std::process::exit(code);
        }
    };
    let code = match conlock::app::run(cli) {
        Ok(code) => code,
        Err(e) => report(&e),
    };
    conlock::events::flush();
    conlock::ui::flush();
    std::process::exit(code);
}

/// Prints the error line (none when stdout's reader went away) and returns the exit code.
#[cfg_attr(test, allow(dead_code))]
fn report(e: &conlock::error::Error) -> i32 {
    if !e.is_quiet() {
        conlock::ui::error(e);
    }
    e.exit_code()
}

/// Whether the arguments may name `run` or `sem` (those start a guardian). A false
/// positive costs one fork; the guardian then exits when conlock does.
fn holds_a_claim(args: impl Iterator<Item = std::ffi::OsString>) -> bool {
    args.take_while(|a| a != "--")
        .any(|a| a == "run" || a == "sem")
}

/// clap's message without its usage block, folded onto one line.
fn usage_error_line(rendered: &str) -> String {
    let message = rendered.split("\n\nUsage:").next().unwrap_or(rendered);
    let message = message
        .split("\n\nFor more information")
        .next()
        .unwrap_or(message);
    let message = message.trim().trim_start_matches("error:").trim();
    let mut folded = message.split_whitespace().collect::<Vec<_>>().join(" ");
    // clap's tip "to pass '-5' as a value, use '-- -5'" is wrong here: `--` starts the
    // command, so the value would become part of it.
    if let Some(at) = folded.find(" tip: to pass '") {
        let value = folded[at + 15..]
            .split('\'')
            .next()
            .unwrap_or("")
            .to_string();
        folded.truncate(at);
        folded.push_str(&format!(
            "; to give {value:?} as an option's value, attach it: --option={value}"
        ));
    }
    format!("{folded} (see 'conlock --help')")
}

#[cfg(test)]
mod tests {
    use super::holds_a_claim;

    fn args(s: &str) -> impl Iterator<Item = std::ffi::OsString> + '_ {
        s.split_whitespace().map(Into::into)
    }

    #[test]
    fn run_and_sem_are_recognized_wherever_the_global_flags_are() {
        assert!(holds_a_claim(args("run --key k -- true")));
        assert!(holds_a_claim(args(
            "-v --http-addr h:1 sem --prefix p -- x"
        )));
        assert!(!holds_a_claim(args("status --key k")));
        assert!(!holds_a_claim(args("watch --key k -- run")));
    }
}
