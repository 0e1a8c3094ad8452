//! When is the command gone? (src/hold/procfs.rs, docs/safety.md *Which processes count
//! as gone*): a process whose main thread ended is not dead while another thread runs,
//! and a /proc that cannot show conlock's processes (missing, or another PID namespace's)
//! keeps the command from starting. Overlap is judged from timestamps the processes
//! write themselves.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use conlock::consul::QueryOptions;

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(90);

/// A worker that ends its main thread (SYS_exit, as `pthread_exit` does) while a second
/// thread writes `H worker <ns>` to the log every 20 ms for about 6 s, then `E worker <ns>`
/// and exits. `S worker <ns>` when it starts. SIGTERM ends it early (with its `E` line).
const WORKER_C: &str = r#"
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static const char *logp;
static volatile sig_atomic_t term;
static void stamp(const char *what) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    FILE *f = fopen(logp, "a");
    if (!f) return;
    fprintf(f, "%s worker %lld%09ld\n", what, (long long)ts.tv_sec, ts.tv_nsec);
    fclose(f);
}
static void on_term(int sig) { (void)sig; term = 1; }
static void *beat(void *arg) {
    (void)arg;
    for (int i = 0; i < 300 && !term; i++) {
        stamp("H");
        usleep(20000);
    }
    stamp("E");
    _exit(0);
}
int main(int argc, char **argv) {
    pthread_t t;
    if (argc != 2) return 2;
    logp = argv[1];
    signal(SIGTERM, on_term);
    stamp("S");
    if (pthread_create(&t, 0, beat, 0) != 0) return 3;
    syscall(SYS_exit, 0);
    return 4;
}
"#;

/// Builds the worker in `dir`.
fn worker(dir: &Path) -> PathBuf {
    build_c(dir, "worker", WORKER_C)
}

/// Builds the C program `source` as `dir/name`.
fn build_c(dir: &Path, name: &str, source: &str) -> PathBuf {
    let src = dir.join(format!("{name}.c"));
    let bin = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let cc = Command::new("cc")
        .args(["-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("these tests need a C compiler (cc) to build their helper programs");
    assert!(cc.success(), "cc failed on {name}: {cc}");
    bin
}

/// Holder A runs `sh -c '<start> worker & sleep 2; exit 0'`; holder B waits for the
/// same key and logs its run. Every line the worker wrote must come before B started.
fn headless_worker_keeps_the_lock(tag: &str, start: &str) {
    let server = start_server();
    let dir = scratch(tag);
    let log = dir.join("log");
    let bin = worker(&dir);
    let key = format!("headless-{tag}");
    let mut a = KillOnDrop(start_holder(
        &server,
        &key,
        &["--kill-grace", "3s"],
        &format!(
            "{start} {} {} & sleep 2; exit 0",
            bin.display(),
            log.display()
        ),
    ));
    assert!(
        wait_for(LONG, || read(&log).contains("H worker")),
        "the worker never ran"
    );
    let a_status = next_holder_runs(&server, &key, &log, &mut a);
    // The worker is gone by now (its TERM, or its own end after about 6 s).
    assert!(
        wait_for(LONG, || read(&log).contains("E worker")),
        "the worker never ended"
    );
    let text = read(&log);
    let late = lines_after_the_next_start(&text, "worker");
    assert_eq!(
        late, 0,
        "the worker wrote {late} lines after the next holder started (holder A: {a_status})"
    );
    let iv = intervals(&text);
    assert_eq!(iv.len(), 2, "log:\n{text}");
    assert_eq!(max_overlap(&iv), 1, "overlap:\n{text}");
}

/// A process whose main thread ended (`Z` in its stat) while another thread runs was
/// taken for dead: conlock released when the shell exited, and the next holder's command
/// ran beside the worker. It counts as alive now, so it gets the stop signal first.
#[test]
fn a_process_whose_main_thread_ended_is_not_gone() {
    headless_worker_keeps_the_lock("group", "");
}

/// The same worker after `setsid`: out of the command's group, re-parented to conlock.
#[test]
fn an_escaped_process_whose_main_thread_ended_is_not_gone() {
    headless_worker_keeps_the_lock("escaped", "setsid");
}

/// `sh -c SCRIPT` under `unshare ARGS`, with conlock's environment for `server`.
fn unshared(server: &conlock::devserver::DevServer, args: &[&str], script: &str) -> Command {
    let mut c = Command::new("unshare");
    for (k, _) in std::env::vars() {
        if k.starts_with("CONSUL_") || k.starts_with("CONLOCK_") {
            c.env_remove(k);
        }
    }
    c.env("CONSUL_HTTP_ADDR", server.addr().to_string())
        .args(args)
        .args(["sh", "-c", script])
        .stdin(Stdio::null());
    c
}

/// Exit code of the mount step in [`unshared`] scripts: the test cannot run here.
const NO_MOUNT: i32 = 97;

/// Runs it and returns (exit code, stderr); None (after saying why) where the namespaces
/// cannot be made.
fn run_unshared(mut c: Command) -> Option<(Option<i32>, String)> {
    let out = c.output().expect("unshare runs");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.code() == Some(NO_MOUNT) || err.contains("unshare failed") {
        skip(&format!("cannot make the namespaces here: {err}"));
        return None;
    }
    Some((out.status.code(), err))
}

/// With /proc hidden (a tmpfs over it in a mount namespace of its own), the escapee
/// search found nothing, so a `setsid` escapee counted as gone: conlock ran the command
/// and released while the escapee ran. It refuses now, before the command starts.
#[test]
fn without_proc_the_command_does_not_start() {
    if !is_root() {
        return skip("needs root, to mount a tmpfs over /proc in a mount namespace");
    }
    let server = start_server();
    let dir = scratch("noproc");
    let ran = dir.join("ran");
    let script = format!(
        "mount -t tmpfs none /proc || exit {NO_MOUNT}; exec {BIN} run --key noproc -- touch {}",
        ran.display()
    );
    let Some((code, err)) = run_unshared(unshared(
        &server,
        &["--mount", "--propagation", "private"],
        &script,
    )) else {
        return;
    };
    assert_eq!(code, Some(125), "stderr: {err}");
    assert!(!ran.exists(), "the command ran");
    assert!(
        err.contains("/proc") && err.contains("mount -t proc proc /proc"),
        "the message does not say what to mount: {err}"
    );
    assert!(
        holder(&client(&server), "noproc").is_none(),
        "the key was taken"
    );
    let sessions = client(&server)
        .session_list(QueryOptions::default())
        .unwrap()
        .0;
    assert!(sessions.is_empty(), "a session was created: {sessions:?}");
}

/// Under `unshare --pid --fork` without a fresh /proc, /proc shows the outer namespace:
/// the escapee scan took host processes for conlock's children and signalled this
/// namespace's processes by their numbers (conlock's own, exit 137). conlock refuses
/// now; with the namespace's own /proc (`--mount-proc`) it runs as usual.
#[test]
fn a_proc_of_another_pid_namespace_is_refused() {
    if !is_root() {
        return skip("needs root, to make a PID namespace");
    }
    let server = start_server();
    let dir = scratch("pidns");
    let (ran, ran_own) = (dir.join("ran"), dir.join("ran-own-proc"));
    let run = |marker: &Path| {
        format!(
            "exec {BIN} run --key pidns -- sh -c 'sleep 1 & touch {}'",
            marker.display()
        )
    };
    let Some((code, err)) = run_unshared(unshared(&server, &["--pid", "--fork"], &run(&ran)))
    else {
        return;
    };
    assert_eq!(code, Some(125), "stderr: {err}");
    assert!(!ran.exists(), "the command ran");
    assert!(
        err.contains("another PID namespace") && err.contains("--mount-proc"),
        "the message does not say why or what to mount: {err}"
    );
    let Some((code, err)) = run_unshared(unshared(
        &server,
        &["--pid", "--fork", "--mount-proc"],
        &run(&ran_own),
    )) else {
        return;
    };
    assert_eq!(code, Some(0), "with its own /proc: {err}");
    assert!(
        ran_own.exists(),
        "with its own /proc the command did not run"
    );
    assert!(
        holder(&client(&server), "pidns").is_none(),
        "the key is still held"
    );
}

/// After the direct child exits, conlock stops what it left behind; a loss found
/// meanwhile was dropped (no message, exit 0: the command's code). It is acted on now:
/// `lock lost` and exit 124, and the leftover is dead when conlock exits.
#[test]
fn a_loss_while_leftovers_are_stopped_is_acted_on() {
    let server = start_server();
    let dir = scratch("leftover-loss");
    let d = dir.display();
    // The leftover ignores TERM, so it lives out the grace; the shell exits at once.
    let cmd = format!(
        "sh -c 'trap \"\" TERM; echo $$ > {d}/left; exec sleep 60' & \
         while [ ! -s {d}/left ]; do sleep 0.01; done; echo $$ > {d}/sh; exit 0"
    );
    let mut a = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "leftover-loss", "--kill-grace", "6s"])
            .args(["--", "sh", "-c", &cmd])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(
        wait_for(LONG, || !read(&dir.join("sh")).trim().is_empty()),
        "the command never started its leftover"
    );
    let sh: i32 = read(&dir.join("sh")).trim().parse().unwrap();
    let left: i32 = read(&dir.join("left")).trim().parse().unwrap();
    // The shell is reaped: conlock is stopping the leftover (its grace is 6 s).
    assert!(
        wait_for(LONG, || !process_alive(sh)),
        "the shell never ended"
    );
    assert!(process_alive(left), "the leftover ended early");
    let c = client(&server);
    let session = holder(&c, "leftover-loss").expect("a holder");
    c.session_destroy(&session).unwrap();
    let status = wait_exit(&mut a.0, LONG);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut a.0.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!process_alive(left), "the leftover outlived conlock");
    assert_eq!(status.code(), Some(124), "stderr: {err}");
    assert!(err.contains("lock lost"), "no loss message: {err}");
}

/// Ends its main thread while a second thread execs the program again, over and over, so
/// that a read of its stat shows the old leader's `Z` and a separate read of its status
/// may show the new image's single thread. Ignores TERM; `H flip <ns>` every 50 ms until
/// `argv[2]` (seconds since the epoch).
const FLIP_C: &str = r#"
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
static char **args;
static void *again(void *p) { (void)p; usleep(1000); execv(args[0], args); _exit(99); }
int main(int argc, char **argv) {
    struct timespec ts;
    if (argc != 4) return 2;
    args = argv;
    signal(SIGTERM, SIG_IGN);
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ts.tv_sec > atol(argv[2])) return 0;
    long long now_ms = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
    if (now_ms - atoll(argv[3]) >= 50) {
        FILE *f = fopen(argv[1], "a");
        if (f) { fprintf(f, "H flip %lld%09ld\n", (long long)ts.tv_sec, ts.tv_nsec); fclose(f); }
        static char buf[32];
        snprintf(buf, sizeof buf, "%lld", now_ms);
        argv[3] = buf;
    }
    usleep(1000);
    pthread_t th;
    pthread_create(&th, NULL, again, NULL);
    syscall(SYS_exit, 0);
    return 4;
}
"#;

/// Keeps an unreaped zombie in its process group, so the group stays joinable, and moves
/// itself out of the group and back in a tight loop. Ignores TERM; `H toggle <ns>` every
/// 50 ms until `argv[2]`.
const TOGGLE_C: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
int main(int argc, char **argv) {
    struct timespec ts;
    long long last = 0;
    if (argc != 3) return 2;
    signal(SIGTERM, SIG_IGN);
    pid_t g = getpgrp();
    if (fork() == 0) _exit(0);
    for (;;) {
        clock_gettime(CLOCK_REALTIME, &ts);
        if (ts.tv_sec > atol(argv[2])) return 0;
        setpgid(0, 0);
        setpgid(0, g);
        long long ms = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
        if (ms - last >= 50) {
            last = ms;
            FILE *f = fopen(argv[1], "a");
            if (f) { fprintf(f, "H toggle %lld%09ld\n", (long long)ts.tv_sec, ts.tv_nsec); fclose(f); }
        }
    }
}
"#;

/// Holder A starts `prog` in the background and exits; `prog` ignores TERM, so it lives
/// until A's SIGKILL after `--kill-grace`. Holder B waits for the same key: no line of
/// `prog` may come after B started.
fn a_survivor_outlives_nothing(tag: &str, source: &str, args: &str) {
    let server = start_server();
    let dir = scratch(tag);
    let log = dir.join("log");
    let bin = build_c(&dir, tag, source);
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 40;
    let key = format!("survivor-{tag}");
    let mut a = KillOnDrop(start_holder(
        &server,
        &key,
        &["--kill-grace", "3s"],
        &format!(
            "{} {} {until} {args} & sleep 0.3; exit 0",
            bin.display(),
            log.display()
        ),
    ));
    assert!(
        wait_for(LONG, || read(&log).contains(&format!("H {tag}"))),
        "{tag} never ran"
    );
    let a_status = next_holder_runs(&server, &key, &log, &mut a);
    let late = lines_after_the_next_start(&read(&log), tag);
    assert_eq!(
        late, 0,
        "{tag} wrote {late} lines after the next holder started (holder A: {a_status})"
    );
}

/// Holder B waits for `key` and runs a logged job (`S`/`E` lines in `log`); returns how
/// holder A ended.
fn next_holder_runs(
    server: &conlock::devserver::DevServer,
    key: &str,
    log: &Path,
    a: &mut KillOnDrop,
) -> std::process::ExitStatus {
    let mut b = KillOnDrop(
        conlock(server)
            .args(["run", "--key", key, "--", "sh", "-c"])
            .arg(logged_job(log, "true"))
            .spawn()
            .unwrap(),
    );
    let a_status = wait_exit(&mut a.0, LONG);
    assert!(wait_exit(&mut b.0, LONG).success());
    a_status
}

/// How many `H <name> <ns>` lines (or any line of `name`'s) come at or after holder B's
/// `S` line.
fn lines_after_the_next_start(text: &str, name: &str) -> usize {
    let stamp = |l: &str| -> u128 { l.split_whitespace().nth(2).unwrap().parse().unwrap() };
    let b_start = text
        .lines()
        .find(|l| l.starts_with("S ") && !l.contains(&format!(" {name} ")))
        .map(stamp)
        .unwrap_or_else(|| panic!("holder B never ran:\n{text}"));
    text.lines()
        .filter(|l| l.contains(&format!(" {name} ")) && stamp(l) >= b_start)
        .count()
}

/// State and thread count were read from two files: a thread's exec in between showed the
/// old leader's `Z` with the new image's one thread, so the process counted as dead and
/// conlock released 0.1 s into a 3 s grace while it ran on (review of procfs, F2).
#[test]
fn a_process_that_execs_from_a_thread_is_not_taken_for_dead() {
    a_survivor_outlives_nothing("flip", FLIP_C, "0");
}

/// A process that steps out of the command's group and back in, beside a zombie that
/// keeps the group joinable, slipped between the group check (out: only the zombie, so
/// gone) and the escapee check (in: a group member, so not an escapee) (review of procfs,
/// F3). Every live child of conlock counts now.
#[test]
fn a_process_that_toggles_its_group_is_not_taken_for_gone() {
    a_survivor_outlives_nothing("toggle", TOGGLE_C, "");
}

/// Writes `TERM` to `argv[1]` at once on every SIGTERM (no shell in between to merge two
/// deliveries), creates `argv[2]` when ready, and waits for signals.
const COUNT_TERM_C: &str = r#"
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>
static int fd;
static void on_term(int sig) { (void)sig; write(fd, "TERM\n", 5); }
int main(int argc, char **argv) {
    if (argc != 3) return 2;
    fd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND, 0644);
    signal(SIGTERM, on_term);
    close(open(argv[2], O_WRONLY | O_CREAT, 0644));
    for (;;) pause();
}
"#;

/// A background process of the command, re-parented to conlock when the command exits,
/// gets the stop signal once: through its group, not a second time as a child of
/// conlock's (a second TERM or INT cuts short what a command does on the first). It then
/// gets SIGKILL after the grace.
#[test]
fn a_leftover_in_the_group_gets_the_stop_signal_once() {
    let server = start_server();
    let dir = scratch("signal-once");
    let bin = build_c(&dir, "countterm", COUNT_TERM_C);
    let (log, ready) = (dir.join("log"), dir.join("ready"));
    let out = conlock(&server)
        .args([
            "run",
            "--key",
            "once/k",
            "--kill-grace",
            "2s",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!(
            "{bin} {log} {ready} & while [ ! -e {ready} ]; do sleep 0.01; done; exit 0",
            bin = bin.display(),
            log = log.display(),
            ready = ready.display()
        ))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(read(&log).lines().count(), 1, "log: {:?}", read(&log));
}
