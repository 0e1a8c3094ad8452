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
    let words: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let cli = match conlock::cli::Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // A bare `conlock`: the help, on stderr, as for any usage error.
            use std::io::Write;
            let _ = std::io::stderr().write_all(e.render().to_string().as_bytes());
            std::process::exit(exit::INTERNAL);
        }
        Err(e) if e.use_stderr() => {
            use clap::error::{ContextKind, ContextValue, ErrorKind};
            let sub = subcommand(&words);
            let fix = match (e.kind(), e.get(ContextKind::InvalidArg)) {
                (ErrorKind::UnknownArgument, Some(ContextValue::String(a))) => {
                    fix_for_stray(&words, a)
                }
                (ErrorKind::MissingRequiredArgument, Some(ContextValue::Strings(v)))
                    if v.iter().any(|a| a.starts_with("<CMD>")) =>
                {
                    let mut line: Vec<String> = words[1..]
                        .iter()
                        .map(|w| conlock::ui::shell_quote(w))
                        .collect();
                    if line.last().map(String::as_str) != Some("--") {
                        line.push("--".into());
                    }
                    Some(format!(
                        "give the command after `--`: conlock {} CMD…",
                        line.join(" ")
                    ))
                }
                _ => None,
            };
            conlock::ui::error(usage_error_line(
                &e.render().to_string(),
                fix.as_deref(),
                sub,
            ));
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

/// The subcommands, as typed.
const SUBCOMMANDS: [&str; 8] = [
    "run",
    "sem",
    "status",
    "watch",
    "break",
    "dev-server",
    "completions",
    "man",
];

/// The subcommand the arguments name (the first such word before `--`).
fn subcommand(words: &[String]) -> Option<&'static str> {
    words
        .iter()
        .skip(1)
        .take_while(|w| *w != "--")
        .find_map(|w| SUBCOMMANDS.iter().find(|s| *s == w).copied())
}

/// For a word clap did not expect (not an option): the command line that was probably
/// meant. `consul lock PREFIX CMD` habits give `--prefix PREFIX -- CMD`; a command
/// without `--` gets the `--`.
fn fix_for_stray(words: &[String], stray: &str) -> Option<String> {
    if stray.starts_with('-') {
        // A mistyped option.
        return None;
    }
    let sub = subcommand(words)?;
    let at = words.iter().position(|w| w == "--").unwrap_or(words.len());
    let i = words[..at].iter().position(|w| w == stray)?;
    let (before, after) = (&words[1..i], &words[i + 1..]);
    let names_target = before.iter().any(|w| {
        ["--key", "--prefix"]
            .iter()
            .any(|o| w == o || w.starts_with(&format!("{o}=")))
    });
    let mut line: Vec<&str> = vec!["conlock"];
    line.extend(before.iter().map(String::as_str));
    let (fixed, why) = match sub {
        "run" | "sem" if !names_target => {
            line.extend(["--prefix", stray, "--"]);
            let rest = after.strip_prefix(&["--".to_string()]).unwrap_or(after);
            line.extend(rest.iter().map(String::as_str));
            let why = if sub == "run" {
                "`consul lock PREFIX CMD` is `conlock run --prefix PREFIX -- CMD`"
            } else {
                "`consul lock -n N PREFIX CMD` is `conlock sem --limit N --prefix PREFIX -- CMD`"
            };
            (line, why)
        }
        "run" | "sem" => {
            line.extend(["--", stray]);
            line.extend(after.iter().map(String::as_str));
            (line, "the command goes after `--`")
        }
        "watch" if names_target => {
            line.extend(["--", stray]);
            line.extend(after.iter().map(String::as_str));
            (line, "the handler goes after `--`")
        }
        "status" | "watch" | "break" if !names_target => {
            line.extend(["--prefix", stray]);
            line.extend(after.iter().map(String::as_str));
            (line, "name the lock with --key KEY or --prefix PREFIX")
        }
        _ => return None,
    };
    let shown: Vec<String> = fixed.iter().map(|w| conlock::ui::shell_quote(w)).collect();
    Some(format!("{why}: {}", shown.join(" ")))
}

/// clap's message without its usage block, folded onto one line, with `fix` (what was
/// probably meant) and a pointer to the help of `sub`.
fn usage_error_line(rendered: &str, fix: Option<&str>, sub: Option<&str>) -> String {
    let message = rendered.split("\n\nUsage:").next().unwrap_or(rendered);
    let message = message
        .split("\n\nFor more information")
        .next()
        .unwrap_or(message);
    let message = message.trim().trim_start_matches("error:").trim();
    let mut folded = message.split_whitespace().collect::<Vec<_>>().join(" ");
    // clap's tip "to pass '-5' as a value, use '-- -5'" is wrong here: `--` starts the
    // command, so the value would become part of it. For a mistyped option (`--kye`)
    // no value was meant.
    if let Some(at) = folded.find(" tip: to pass '") {
        let value = folded[at + 15..]
            .split('\'')
            .next()
            .unwrap_or("")
            .to_string();
        folded.truncate(at);
        if value.starts_with('-') && value[1..].starts_with(|c: char| c.is_ascii_digit()) {
            folded.push_str(&format!(
                "; to give {value:?} as an option's value, attach it: --option={value}"
            ));
        }
    }
    if let Some(fix) = fix {
        folded.push_str(&format!("; {fix}"));
    }
    match sub {
        Some(sub) => format!("{folded} (see 'conlock {sub} --help')"),
        None => format!("{folded} (see 'conlock --help')"),
    }
}

#[cfg(test)]
mod tests {
    use super::{fix_for_stray, holds_a_claim};

    fn fix(line: &str, stray: &str) -> Option<String> {
        let words: Vec<String> = line.split_whitespace().map(String::from).collect();
        fix_for_stray(&words, stray)
    }

    #[test]
    fn strays_get_the_line_that_was_meant() {
        assert_eq!(
            fix("conlock run --key k true", "true").unwrap(),
            "the command goes after `--`: conlock run --key k -- true"
        );
        assert_eq!(
            fix("conlock run service/x -- ./job 1", "service/x").unwrap(),
            "`consul lock PREFIX CMD` is `conlock run --prefix PREFIX -- CMD`: conlock run --prefix service/x -- ./job 1"
        );
        assert_eq!(
            fix("conlock -q sem -n 2 db ./w", "db").unwrap(),
            "`consul lock -n N PREFIX CMD` is `conlock sem --limit N --prefix PREFIX -- CMD`: conlock -q sem -n 2 --prefix db -- ./w"
        );
        assert_eq!(
            fix("conlock watch --key=k sh -c x", "sh").unwrap(),
            "the handler goes after `--`: conlock watch --key=k -- sh -c x"
        );
        assert_eq!(
            fix("conlock status svc", "svc").unwrap(),
            "name the lock with --key KEY or --prefix PREFIX: conlock status --prefix svc"
        );
        assert_eq!(
            fix("conlock run --key k it's", "it's").unwrap(),
            "the command goes after `--`: conlock run --key k -- 'it'\\''s'"
        );
        assert_eq!(fix("conlock status --key k extra", "extra"), None);
        assert_eq!(fix("conlock completions bash x", "x"), None);
        assert_eq!(fix("conlock run --kye k -- true", "--kye"), None);
    }

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
