// conlock's own entry point instead of std's on glibc, where std still gets the
// arguments (from glibc's init hook): see `main`. Elsewhere (musl) std's start stays.
#![cfg_attr(all(not(test), target_env = "gnu"), no_main)]
use clap::Parser;
use conlock::error::exit;

/// musl's own allocator makes a short run about 0.4 ms slower (clap's parse alone took
/// twice as long); dlmalloc behind one lock is as quick as glibc's. The spawned command's
/// child code allocates nothing, so a lock held by another thread cannot block it.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOC: dlmalloc::GlobalDlmalloc = dlmalloc::GlobalDlmalloc;

/// The C entry point. std's own start would also read /proc/self/maps (for the main
/// thread's stack guard) and set up an alternate signal stack in every thread, only to
/// name a stack overflow: about 0.15 ms of every run. A stack overflow still ends
/// conlock with SIGSEGV, and the guardian then stops the command as for any death.
#[cfg(all(not(test), target_env = "gnu"))]
#[no_mangle]
extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // SAFETY: first thing, with a single thread.
    unsafe { start() };
    // std reads the arguments itself (glibc hands them to its init function).
    run()
}

#[cfg(all(not(test), not(target_env = "gnu")))]
fn main() {
    run()
}

/// What std's start does that conlock needs: standard streams that are open, so that
/// no socket or pipe becomes fd 0, 1 or 2 (and the command's output, for example, would
/// go to Consul); and SIGPIPE ignored, so a closed pipe is an error, not a death.
// The test harness has its own main; std's start does this elsewhere.
#[cfg_attr(any(test, not(target_env = "gnu")), allow(dead_code))]
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
fn run() -> ! {
    if holds_a_claim(std::env::args_os().skip(1)) {
        // Before anything starts a thread: see guardian.rs.
        conlock::hold::guardian::prefork();
    }
    let cli = match conlock::cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            conlock::ui::error(usage_error_line(&e.render().to_string()));
            std::process::exit(exit::INTERNAL);
        }
        Err(e) => {
            // --help and --version.
            let _ = e.print();
            std::process::exit(0);
        }
    };
    let code = match conlock::app::run(cli) {
        Ok(code) => code,
        Err(e) => {
            conlock::ui::error(&e);
            e.exit_code()
        }
    };
    conlock::events::flush();
    conlock::ui::flush();
    std::process::exit(code);
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
