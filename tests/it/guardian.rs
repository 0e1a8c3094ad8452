//! The guardian (conlock killed or stuck) and surviving process groups, on the real binary.

use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conlock::devserver::FaultMode;

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(60);
const NOBODY: u32 = 65534;

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn read_ns(path: &Path) -> u128 {
    assert!(
        wait_for(LONG, || read(path).trim().parse::<u128>().is_ok()),
        "no timestamp in {path:?}"
    );
    read(path).trim().parse().unwrap()
}

fn read_pid(path: &Path) -> i32 {
    assert!(
        wait_for(LONG, || read(path).trim().parse::<i32>().is_ok()),
        "no pid in {path:?}"
    );
    read(path).trim().parse().unwrap()
}

/// Case 1: the guardian's stderr is a pipe whose reader has exited. It must still kill
/// the group and release (the old guardian panicked writing its message, and the lock
/// waited for 2 × TTL plus the 60 s lock-delay).
#[test]
fn guardian_releases_when_its_stderr_is_gone() {
    let server = start_server();
    let dir = scratch("stderr-gone");
    let (pidfile, started) = (dir.join("pid"), dir.join("started"));
    let mut h = conlock(&server)
        .args(["run", "--key", "stderr-gone", "--lock-delay", "60s"])
        .args(["--", "sh", "-c"])
        .arg(format!("echo $$ > {}; exec sleep 600", pidfile.display()))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader exits: every later write to that stderr fails with EPIPE.
    drop(h.stderr.take());
    let child = read_pid(&pidfile);
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "stderr-gone", "--timeout", "90s", "--"])
            .args(["sh", "-c"])
            .arg(format!("date +%s%N > {}", started.display()))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(wait_sessions(&server, 2));
    let killed = now_ns();
    signal(h.id(), libc::SIGKILL);
    wait_exit(&mut h, LONG);
    assert!(
        wait_for(LONG, || !process_alive(child)),
        "the command survived conlock's SIGKILL"
    );
    assert!(wait_exit(&mut w.0, LONG).success());
    let after = (read_ns(&started) - killed) / 1_000_000;
    assert!(
        after < 20_000,
        "the next holder started {after} ms after the kill: the lock was not released"
    );
}

/// Case 3: a PID 1 that never reaps (a PID namespace whose init is `sleep`). The killed
/// command stays a zombie; it must count as dead, so that the guardian releases at once
/// instead of leaving the session to expire.
#[test]
fn failover_when_pid_1_never_reaps() {
    if let Err(why) = unshare_works() {
        return skip(&why);
    }
    let server = start_server();
    let dir = scratch("no-reaper");
    let (marker, go, killed, started) = (
        dir.join("running"),
        dir.join("go"),
        dir.join("killed"),
        dir.join("started"),
    );
    // Inside the namespace the command kills its own conlock, stamping the moment first.
    let inner = format!(
        "touch {m}; while [ ! -e {g} ]; do sleep 0.01; done; date +%s%N > {k}; kill -9 $PPID; exec sleep 600",
        m = marker.display(),
        g = go.display(),
        k = killed.display()
    );
    let mut ns = Command::new("unshare");
    ns.args([
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "sh",
        "-c",
    ])
    .arg(r#""$T_BIN" run --key no-reaper --lock-delay 60s -- sh -c "$T_INNER" & exec sleep 100000"#)
    .env("T_BIN", BIN)
    .env("T_INNER", inner)
    .env("CONSUL_HTTP_ADDR", server.addr().to_string())
    .stdin(Stdio::null());
    for (k, _) in std::env::vars() {
        if k.starts_with("CONLOCK_") || (k.starts_with("CONSUL_") && k != "CONSUL_HTTP_ADDR") {
            ns.env_remove(k);
        }
    }
    let _ns = KillOnDrop(ns.spawn().unwrap());
    assert!(
        wait_for(LONG, || marker.exists()),
        "the holder never started"
    );
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "no-reaper", "--timeout", "90s", "--"])
            .args(["sh", "-c"])
            .arg(format!("date +%s%N > {}", started.display()))
            .spawn()
            .unwrap(),
    );
    assert!(wait_sessions(&server, 2));
    File::create(&go).unwrap();
    assert!(wait_exit(&mut w.0, Duration::from_secs(120)).success());
    let ms = (read_ns(&started) as f64 - read_ns(&killed) as f64) / 1e6;
    eprintln!("failover after kill -9 with a PID 1 that never reaps: {ms:.1} ms");
    assert!(
        ms < 10_000.0,
        "the next holder started {ms:.0} ms after the kill (zombies taken for alive?)"
    );
}

fn unshare_works() -> Result<(), String> {
    let st = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "--kill-child", "true"])
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run unshare: {e}"))?;
    if st.success() {
        Ok(())
    } else {
        Err(format!(
            "unshare --pid --fork --mount-proc failed ({st}); needs root or user namespaces"
        ))
    }
}

/// Case 4: conlock reported the group gone, then died during a slow release, after the
/// command's PID was reused as a process group ID. The guardian must not signal it.
#[test]
fn guardian_never_signals_a_group_reported_gone() {
    if !is_root() {
        return skip("needs root, to force a PID (ns_last_pid)");
    }
    let server = start_server();
    let dir = scratch("reuse");
    let (pidfile, done) = (dir.join("pid"), dir.join("done"));
    // A long TTL: no renewal comes while the release hangs.
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "reuse", "--ttl", "300s", "--", "sh", "-c"])
            .arg(format!(
                "echo $$ > {}; while [ ! -e {} ]; do sleep 0.01; done",
                pidfile.display(),
                done.display()
            ))
            .spawn()
            .unwrap(),
    );
    let child = read_pid(&pidfile);
    // Let the monitor settle in its blocking query, then make every request hang.
    let mut last = (u64::MAX, Instant::now());
    assert!(wait_for(LONG, || {
        let n = server.request_count();
        if n != last.0 {
            last = (n, Instant::now());
        }
        last.1.elapsed() >= Duration::from_millis(500)
    }));
    server.fault(FaultMode::Hang, Duration::from_secs(600));
    let before = server.request_count();
    File::create(&done).unwrap();
    // The release request arrives (and hangs) only after the group was reported gone.
    assert!(wait_for(LONG, || !process_alive(child)
        && server.request_count() > before));
    let mut reused = force_pid(child).expect("could not create a process with the freed PID");
    assert_eq!(unsafe { libc::getpgid(child) }, child);
    // Reaped as soon as it dies, so that a kill shows as such (not as a zombie group).
    let ended = std::thread::spawn(move || reused.wait().unwrap());
    signal(h.0.id(), libc::SIGKILL);
    wait_exit(&mut h.0, LONG);
    server.clear_fault();
    // The guardian gives the lock back; by then it would have signalled the group.
    assert!(wait_sessions(&server, 0), "the guardian did not clean up");
    assert!(
        !ended.is_finished(),
        "the guardian killed an unrelated process group that reused the command's PID"
    );
    signal(child as u32, libc::SIGKILL);
    ended.join().unwrap();
}

/// The command (a shell) leaves an escaped process that ignores TERM, then exits: its
/// group is gone while the escapee is being stopped. The command's PID, free again, is
/// reused as an unrelated process group meanwhile.
fn reuse_while_escapee_runs(
    server: &conlock::devserver::DevServer,
    name: &str,
    grace: &str,
) -> (KillOnDrop, i32, i32, PathBuf) {
    let dir = scratch(name);
    let (pidfile, escfile, errors) = (dir.join("pid"), dir.join("esc"), dir.join("stderr"));
    let h = KillOnDrop(
        conlock(server)
            .args(["-v", "run", "--key", name, "--kill-grace", grace, "--", "sh", "-c"])
            .arg(format!(
                "echo $$ > {p}; setsid sh -c 'trap \"\" TERM; echo $$ > {e}; exec sleep 600' & while [ ! -s {e} ]; do sleep 0.01; done; exit 0",
                p = pidfile.display(),
                e = escfile.display()
            ))
            .stderr(File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    let child = read_pid(&pidfile);
    let escapee = read_pid(&escfile);
    assert!(
        wait_for(LONG, || read(&errors)
            .contains("the command exited and left")),
        "conlock is not stopping the escapee: {}",
        read(&errors)
    );
    assert!(wait_for(LONG, || !process_alive(child)));
    (h, child, escapee, errors)
}

/// conlock stops what escaped from the command after the command's group is gone: it
/// must never signal that group's ID again (it sent SIGKILL to it after --kill-grace,
/// by then possibly an unrelated group).
#[test]
fn conlock_never_signals_a_group_it_saw_gone() {
    if !is_root() {
        return skip("needs root, to force a PID (ns_last_pid)");
    }
    let server = start_server();
    let (mut h, child, escapee, errors) = reuse_while_escapee_runs(&server, "seen-gone", "3s");
    let mut reused = force_pid(child).expect("could not create a process with the freed PID");
    assert_eq!(unsafe { libc::getpgid(child) }, child);
    let ended = std::thread::spawn(move || reused.wait().unwrap());
    // After --kill-grace the escapee gets SIGKILL; then conlock releases and exits.
    assert_eq!(
        wait_exit(&mut h.0, LONG).code(),
        Some(0),
        "{}",
        read(&errors)
    );
    assert!(!process_alive(escapee), "the escapee outlived conlock");
    assert!(
        !ended.is_finished(),
        "conlock signalled an unrelated process group that reused the command's PID"
    );
    signal(child as u32, libc::SIGKILL);
    ended.join().unwrap();
}

/// conlock is SIGKILLed while it stops what escaped from the command, after it saw the
/// command's group gone: the guardian must not signal that group's ID (the guardian
/// heard of it only once the escapees were gone, so it SIGKILLed the reused group).
#[test]
fn guardian_never_signals_a_group_seen_gone_while_escapees_run() {
    if !is_root() {
        return skip("needs root, to force a PID (ns_last_pid)");
    }
    let server = start_server();
    let (mut h, child, escapee, errors) =
        reuse_while_escapee_runs(&server, "seen-gone-guardian", "10s");
    let mut reused = force_pid(child).expect("could not create a process with the freed PID");
    assert_eq!(unsafe { libc::getpgid(child) }, child);
    let ended = std::thread::spawn(move || reused.wait().unwrap());
    signal(h.0.id(), libc::SIGKILL);
    wait_exit(&mut h.0, LONG);
    // The guardian releases once it has done with the group: by then it would have
    // signalled it.
    assert!(
        wait_for(LONG, || read(&errors).contains("released")),
        "the guardian did not release: {}",
        read(&errors)
    );
    let unrelated_alive = !ended.is_finished();
    // Escaped processes outlive a SIGKILLed conlock (docs/safety.md says so).
    signal(escapee as u32, libc::SIGKILL);
    signal(child as u32, libc::SIGKILL);
    ended.join().unwrap();
    assert!(
        unrelated_alive,
        "the guardian signalled an unrelated process group that reused the command's PID"
    );
}

/// After the command's group is gone, a process of the command (here the child of an
/// escaped process) gets the group's former ID as its PID and leads a group of that ID
/// (`setsid`). It is no member of the command's group, but it is the command's: once
/// re-parented to conlock it must be stopped before the release.
#[test]
fn a_command_process_that_gets_the_gone_groups_id_is_still_stopped() {
    if !is_root() {
        return skip("needs root, to force a PID (ns_last_pid)");
    }
    let server = start_server();
    let dir = scratch("gone-id-reused-by-command");
    let (pidfile, escfile, errors) = (dir.join("pid"), dir.join("esc"), dir.join("stderr"));
    let (go, wfile) = (dir.join("go"), dir.join("w"));
    // The escaped process waits (without forking) for `go.N`, then starts W in a session
    // of its own (its first fork since `go.N`), as often as asked.
    let escaped = format!(
        "trap '' TERM; echo $$ > {e}; n=0; while :; do while [ ! -e {go}.$n ]; do :; done; n=$((n+1)); setsid sleep 600 & echo $! > {w}.new; mv {w}.new {w}; done",
        e = escfile.display(),
        go = go.display(),
        w = wfile.display()
    );
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["-v", "run", "--key", "gone-id", "--kill-grace", "10s", "--", "sh", "-c"])
            .arg(format!(
                "echo $$ > {p}; setsid sh -c \"$0\" & while [ ! -s {e} ]; do sleep 0.01; done; exit 0",
                p = pidfile.display(),
                e = escfile.display()
            ))
            .arg(&escaped)
            .stderr(File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    let child = read_pid(&pidfile);
    let escapee = read_pid(&escfile);
    // Killed at the end only if still the same process: a PID freed meanwhile may be
    // another test's by then.
    struct KillPids(Vec<(i32, Option<u64>)>);
    impl Drop for KillPids {
        fn drop(&mut self) {
            for &(p, start) in &self.0 {
                if start.is_some() && start_time(p) == start {
                    unsafe { libc::kill(p, libc::SIGKILL) };
                }
            }
        }
    }
    let mut cleanup = KillPids(vec![(escapee, start_time(escapee))]);
    assert!(
        wait_for(LONG, || read(&errors)
            .contains("the command exited and left")),
        "conlock is not stopping the escaped process: {}",
        read(&errors)
    );
    assert!(wait_for(LONG, || !process_alive(child)));
    // W gets the command's PID.
    let mut w = 0;
    for n in 0..200 {
        let _ = std::fs::remove_file(&wfile);
        std::fs::write("/proc/sys/kernel/ns_last_pid", (child - 1).to_string()).unwrap();
        File::create(format!("{}.{n}", go.display())).unwrap();
        assert!(wait_for(LONG, || wfile.exists()));
        w = read_pid(&wfile);
        if w == child {
            cleanup.0.push((w, start_time(w)));
            break;
        }
        signal(w as u32, libc::SIGKILL);
    }
    assert_eq!(w, child, "could not give W the command's PID");
    assert!(wait_for(LONG, || unsafe { libc::getpgid(w) } == w));
    // After --kill-grace the escaped process gets SIGKILL, W is re-parented to conlock,
    // and it must get SIGKILL too before conlock releases and exits.
    assert_eq!(
        wait_exit(&mut h.0, LONG).code(),
        Some(0),
        "{}",
        read(&errors)
    );
    assert!(
        !process_alive(w),
        "conlock released while a process of the command that got the group's ID ran"
    );
}

/// The pipe inode behind each of `pid`'s descriptors, as (fd, inode).
fn pipe_fds(pid: u32) -> Vec<(String, String)> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            let target = target.to_str()?.strip_prefix("pipe:")?.to_string();
            Some((e.file_name().to_str()?.to_string(), target))
        })
        .collect()
}

/// The guardian is stopped and its pipe is full when the command's group is found gone
/// while an escaped process still runs: telling the guardian must not hold up the stop
/// (it waited for room in the pipe, so the escaped process never got its SIGKILL).
#[test]
fn a_stopped_guardian_with_a_full_pipe_does_not_hold_up_the_stop() {
    let server = start_server();
    let dir = scratch("guardian-pipe-full");
    let (pidfile, escfile, go) = (dir.join("pid"), dir.join("esc"), dir.join("go"));
    let errors = dir.join("stderr");
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "guardian-pipe-full", "--kill-grace", "2s", "--"])
            .args(["sh", "-c"])
            .arg(format!(
                "echo $$ > {p}; setsid sh -c 'trap \"\" TERM; echo $$ > {e}; exec sleep 600' & while [ ! -e {go} ]; do sleep 0.01; done; exit 0",
                p = pidfile.display(),
                e = escfile.display(),
                go = go.display()
            ))
            .stderr(File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    let command = read_pid(&pidfile);
    let escapee = read_pid(&escfile);
    let escapee_start = start_time(escapee);
    let guardian = children_of(h.0.id())
        .into_iter()
        .find(|&p| p != command)
        .expect("conlock has a guardian child");
    signal(guardian as u32, libc::SIGSTOP);
    // conlock's write end of the guardian's pipe, filled through /proc.
    let theirs: Vec<String> = pipe_fds(guardian as u32)
        .into_iter()
        .map(|(_, i)| i)
        .collect();
    let (fd, _) = pipe_fds(h.0.id())
        .into_iter()
        .find(|(_, inode)| theirs.contains(inode))
        .expect("conlock's end of the guardian's pipe");
    // Empty lines: the guardian, once continued, skips them.
    assert!(fill_pipe(h.0.id(), &fd, b'\n') > 0);
    File::create(&go).unwrap();
    let gone = wait_for(Duration::from_secs(20), || !process_alive(escapee));
    signal(guardian as u32, libc::SIGCONT);
    if !gone && start_time(escapee) == escapee_start {
        signal(escapee as u32, libc::SIGKILL);
    }
    assert!(
        gone,
        "the escaped process was not stopped while the guardian's pipe was full: {}",
        read(&errors)
    );
    assert_eq!(
        wait_exit(&mut h.0, LONG).code(),
        Some(0),
        "{}",
        read(&errors)
    );
}

/// When `pid` started (clock ticks since boot), if it exists.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// A process (in its own group) whose PID is `pid`, made by setting ns_last_pid.
fn force_pid(pid: i32) -> Option<std::process::Child> {
    for _ in 0..500 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string()).ok()?;
        let c = Command::new("sleep")
            .arg("600")
            .process_group(0)
            .spawn()
            .ok()?;
        if c.id() as i32 == pid {
            return Some(c);
        }
        drop(KillOnDrop(c));
    }
    None
}

/// A setuid-root helper that also sets its real UID to root (like sudo), so that
/// conlock running as `nobody` gets EPERM signalling it. It logs `S helper <ns>` when
/// running and `E helper <ns>` when `stop` appears, then exits.
const HELPER_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static void stamp(const char *log, const char *what) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    FILE *f = fopen(log, "a");
    if (!f) return;
    fprintf(f, "%s helper %lld%09ld\n", what, (long long)ts.tv_sec, ts.tv_nsec);
    fclose(f);
}
int main(int argc, char **argv) {
    if (setuid(0) != 0) return 3;
    if (argc == 2 && strcmp(argv[1], "check") == 0) return getuid() == 0 ? 0 : 4;
    if (argc != 3) return 2;
    stamp(argv[1], "S");
    while (access(argv[2], F_OK) != 0) usleep(10000);
    stamp(argv[1], "E");
    return 0;
}
"#;

/// Why the tests of a setuid-root helper need root.
const HELPER_NEEDS_ROOT: &str = "needs root, to run conlock as nobody beside a setuid-root program";

/// Builds the helper in `shared.dir` (as root), or says why it cannot be used.
fn setuid_helper(shared: &Reachable) -> Result<PathBuf, String> {
    let dir = &shared.dir;
    let src = dir.join("helper.c");
    let bin = dir.join("helper");
    std::fs::write(&src, HELPER_C).unwrap();
    let cc = Command::new("cc")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .status()
        .map_err(|e| format!("no C compiler: {e}"))?;
    if !cc.success() {
        return Err(format!("cc failed: {cc}"));
    }
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let check = Command::new(&bin)
        .arg("check")
        .uid(NOBODY)
        .gid(NOBODY)
        .status()
        .map_err(|e| format!("cannot run the helper as nobody: {e}"))?;
    if !check.success() {
        return Err(format!(
            "the setuid bit has no effect here (nosuid mount or no_new_privs): {check}"
        ));
    }
    let conlock = shared.bin.display();
    let runs = Command::new(&shared.bin)
        .arg("--version")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("nobody cannot run {conlock}: {e}"))?;
    if !runs.success() {
        return Err(format!("nobody cannot run {conlock}: {runs}"));
    }
    Ok(bin)
}

/// Lets a helper go when the test ends, whatever happened: creates `stop`, then waits
/// (a while) until the helper logged its end in `log`, so that it is gone before its
/// directory is removed (it would wait for `stop` forever).
struct Stop {
    stop: PathBuf,
    log: PathBuf,
}

impl Drop for Stop {
    fn drop(&mut self) {
        let _ = File::create(&self.stop);
        if read(&self.log).contains("S helper") {
            wait_for(Duration::from_secs(10), || {
                read(&self.log).contains("E helper")
            });
        }
    }
}

/// Watches for longer than 2 × TTL (when the server drops a session nobody renews) that
/// `sid` keeps the key and that no other job logged a start.
fn assert_lock_kept(server: &conlock::devserver::DevServer, key: &str, sid: &str, log: &Path) {
    let c = client(server);
    let until = Instant::now() + Duration::from_secs(24);
    while Instant::now() < until {
        assert_eq!(
            holder(&c, key).as_deref(),
            Some(sid),
            "the lock left the session while the survivor ran"
        );
        assert!(
            !read(log)
                .lines()
                .any(|l| l.starts_with("S ") && !l.contains("helper")),
            "the next holder started while the survivor ran"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn assert_no_overlap(log: &Path) {
    let text = read(log);
    let iv = intervals(&text);
    assert_eq!(iv.len(), 2, "log:\n{text}");
    assert_eq!(max_overlap(&iv), 1, "overlap:\n{text}");
}

/// Cases 2 and 5 (guardian side): the command is a setuid program the guardian may not
/// signal (EPERM). The guardian must count it as alive and keep the session (renewing)
/// until it ends, then release; the old one released at once.
#[test]
fn guardian_keeps_the_lock_while_a_setuid_survivor_runs() {
    if !is_root() {
        return skip(HELPER_NEEDS_ROOT);
    }
    let shared = reachable_scratch("eperm-guardian");
    let helper = match setuid_helper(&shared) {
        Ok(h) => h,
        Err(why) => return skip(&why),
    };
    let server = start_server();
    let dir = &shared.dir;
    let (log, stop, errors) = (dir.join("log"), dir.join("stop"), dir.join("stderr"));
    let _stop = Stop {
        stop: stop.clone(),
        log: log.clone(),
    };
    let key = "eperm-guardian";
    let mut h = KillOnDrop(
        shared
            .conlock(&server)
            .uid(NOBODY)
            .gid(NOBODY)
            .args(["run", "--key", key, "--ttl", "10s", "--lock-delay", "2s"])
            .args(["--kill-grace", "1s", "--", "sh", "-c"])
            .arg(format!(
                "exec {} {} {}",
                helper.display(),
                log.display(),
                stop.display()
            ))
            .stderr(File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || read(&log).contains("S helper")));
    let sid = holder(&client(&server), key).unwrap();
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", key, "--timeout", "120s", "--", "sh", "-c"])
            .arg(logged_job(&log, "true"))
            .spawn()
            .unwrap(),
    );
    assert!(wait_sessions(&server, 2));
    signal(h.0.id(), libc::SIGKILL);
    wait_exit(&mut h.0, LONG);
    assert_lock_kept(&server, key, &sid, &log);
    assert!(
        read(&errors).contains("survive SIGKILL"),
        "the guardian did not say why it keeps the lock: {}",
        read(&errors)
    );
    File::create(&stop).unwrap();
    assert!(wait_exit(&mut w.0, LONG).success());
    assert_no_overlap(&log);
}

/// conlock as `nobody`, whose command leaves a setuid-root helper (which it may not
/// signal) in its group and exits; the helper ends when `stop` appears. Bind `_shared`
/// first (dropped last: it may remove the directory of `log` and `stop`).
struct SurvivorRun {
    _shared: Reachable,
    server: conlock::devserver::DevServer,
    h: KillOnDrop,
    log: PathBuf,
    stop: PathBuf,
    errors: PathBuf,
    _stop: Stop,
}

/// Starts a `SurvivorRun` on `key` once the helper runs; `None` (the test recorded as
/// skipped, with why) where a setuid helper cannot be made.
fn survivor_run(key: &str) -> Option<SurvivorRun> {
    if !is_root() {
        skip(HELPER_NEEDS_ROOT);
        return None;
    }
    let shared = reachable_scratch(key);
    let helper = match setuid_helper(&shared) {
        Ok(h) => h,
        Err(why) => {
            skip(&why);
            return None;
        }
    };
    let server = start_server();
    let dir = &shared.dir;
    let (log, stop, errors) = (dir.join("log"), dir.join("stop"), dir.join("stderr"));
    let _stop = Stop {
        stop: stop.clone(),
        log: log.clone(),
    };
    // The helper is left behind in the group once it runs as root; then the shell exits.
    let h = KillOnDrop(
        shared
            .conlock(&server)
            .uid(NOBODY)
            .gid(NOBODY)
            .args(["run", "--key", key, "--ttl", "10s", "--lock-delay", "2s"])
            .args(["--kill-grace", "1s", "--", "sh", "-c"])
            .arg(format!(
                "{} {l} {} & while ! grep -q 'S helper' {l}; do sleep 0.01; done; exit 0",
                helper.display(),
                stop.display(),
                l = log.display(),
            ))
            .stderr(File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || read(&log).contains("S helper")));
    Some(SurvivorRun {
        _shared: shared,
        server,
        h,
        log,
        stop,
        errors,
        _stop,
    })
}

/// Case 5 (conlock side): the command exits and leaves a setuid survivor in its group.
/// conlock must keep the session (renewing) until the survivor ends, then release and
/// exit with the command's code; the old one stopped renewing and exited at once.
#[test]
fn conlock_keeps_the_lock_while_a_setuid_survivor_runs() {
    let key = "eperm-conlock";
    let Some(SurvivorRun {
        _shared,
        server,
        mut h,
        log,
        stop,
        errors,
        _stop,
    }) = survivor_run(key)
    else {
        return;
    };
    let sid = holder(&client(&server), key).unwrap();
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", key, "--timeout", "120s", "--", "sh", "-c"])
            .arg(logged_job(&log, "true"))
            .spawn()
            .unwrap(),
    );
    assert!(wait_sessions(&server, 2));
    assert!(
        wait_for(LONG, || read(&errors).contains("survive SIGKILL")),
        "conlock did not report the survivor: {}",
        read(&errors)
    );
    assert_lock_kept(&server, key, &sid, &log);
    assert!(
        h.0.try_wait().unwrap().is_none(),
        "conlock exited while the survivor ran"
    );
    File::create(&stop).unwrap();
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(0));
    assert!(wait_exit(&mut w.0, LONG).success());
    assert_no_overlap(&log);
}

/// Case 5, the session lost while the survivor runs: nothing is left to hold, so conlock
/// says the lock may pass beside the survivor and exits 124 (it exited with the
/// command's 0).
#[test]
fn a_session_lost_while_a_survivor_runs_is_exit_124() {
    let key = "eperm-lost";
    let Some(SurvivorRun {
        _shared,
        server,
        mut h,
        errors,
        _stop,
        ..
    }) = survivor_run(key)
    else {
        return;
    };
    assert!(
        wait_for(LONG, || read(&errors).contains("survive SIGKILL")),
        "conlock did not report the survivor: {}",
        read(&errors)
    );
    let sid = holder(&client(&server), key).unwrap();
    assert!(server.expire_session(&sid));
    assert_eq!(
        wait_exit(&mut h.0, LONG).code(),
        Some(124),
        "{}",
        read(&errors)
    );
    assert!(read(&errors).contains("lock lost"), "{}", read(&errors));
}

/// Case 6: conlock is stopped (SIGSTOP) while its command runs and no renewal can get
/// through. The guardian SIGKILLs the group by the deadline conlock last sent it.
#[test]
fn guardian_kills_the_group_of_a_stopped_conlock_by_its_deadline() {
    let server = start_server();
    let dir = scratch("watchdog");
    let (pidfile, tick, errors) = (dir.join("pid"), dir.join("tick"), dir.join("stderr"));
    let (ttl, lock_delay, grace) = (10, 5, 1);
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "watchdog", "--ttl", &format!("{ttl}s")])
            .args(["--lock-delay", &format!("{lock_delay}s")])
            .args(["--kill-grace", &format!("{grace}s"), "--", "sh", "-c"])
            .arg(format!(
                "echo $$ > {p}; while :; do date +%s%N > {t}.new; mv {t}.new {t}; sleep 0.05; done",
                p = pidfile.display(),
                t = tick.display()
            ))
            .stderr(File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    let child = read_pid(&pidfile);
    read_ns(&tick);
    let stopped = now_ns();
    signal(h.0.id(), libc::SIGSTOP);
    server.fault(FaultMode::Error, Duration::from_secs(600));
    assert!(
        wait_for(Duration::from_secs(90), || !process_alive(child)),
        "the command of a stopped conlock was never killed"
    );
    // The last confirmation came before the stop; the command must be dead within the
    // TTL (or lock-delay) plus the grace after it. One more second for a busy machine.
    let bound = stopped + Duration::from_secs(ttl.max(lock_delay) + grace + 1).as_nanos();
    let last = read_ns(&tick);
    assert!(
        last <= bound,
        "the command still ran {} ms past its deadline",
        (last - bound) / 1_000_000
    );
    assert!(
        wait_for(LONG, || read(&errors).contains("stopped or stuck")),
        "the guardian did not say why it killed the group: {}",
        read(&errors)
    );
    server.clear_fault();
    signal(h.0.id(), libc::SIGCONT);
    // Lost, whichever conlock sees first once continued: its deadline, or the command's
    // end by the guardian's SIGKILL (that was 137).
    assert_eq!(
        wait_exit(&mut h.0, LONG).code(),
        Some(124),
        "{}",
        read(&errors)
    );
}

/// A stopped conlock: the guardian's watchdog also kills what left the command's group
/// (`setsid`, here still below a parent in the group when conlock stops, so it is
/// re-parented only when the guardian kills that parent).
#[test]
fn guardian_kills_escaped_processes_of_a_stopped_conlock() {
    let server = start_server();
    let dir = scratch("watchdog-esc");
    let (pidfile, escfile, tick) = (dir.join("pid"), dir.join("esc"), dir.join("tick"));
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "watchdog-esc", "--ttl", "10s"])
            .args(["--lock-delay", "3s", "--kill-grace", "1s", "--", "sh", "-c"])
            .arg(format!(
                "echo $$ > {p}; setsid sh -c 'echo $$ > {e}; while :; do date +%s%N > {t}.new; mv {t}.new {t}; sleep 0.05; done' & wait",
                p = pidfile.display(),
                e = escfile.display(),
                t = tick.display()
            ))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let child = read_pid(&pidfile);
    let escaped = read_pid(&escfile);
    // A failing run must not leave the escaped loop behind (it leads its own session;
    // a reused pid that happens to do so too is unlikely enough for a test).
    struct KillPid(i32);
    impl Drop for KillPid {
        fn drop(&mut self) {
            let stat = read(Path::new(&format!("/proc/{}/stat", self.0)));
            let session = stat
                .rsplit(')')
                .next()
                .and_then(|r| r.split_whitespace().nth(3));
            if process_alive(self.0) && session == Some(self.0.to_string().as_str()) {
                unsafe { libc::kill(self.0, libc::SIGKILL) };
            }
        }
    }
    let _cleanup = KillPid(escaped);
    read_ns(&tick);
    signal(h.0.id(), libc::SIGSTOP);
    server.fault(FaultMode::Error, Duration::from_secs(600));
    assert!(
        wait_for(Duration::from_secs(90), || !process_alive(child)),
        "the command of a stopped conlock was never killed"
    );
    assert!(
        wait_for(Duration::from_secs(30), || !process_alive(escaped)),
        "the escaped process of a stopped conlock was never killed"
    );
    server.clear_fault();
    signal(h.0.id(), libc::SIGCONT);
    wait_exit(&mut h.0, LONG);
}

/// A stopped conlock: the guardian's watchdog kills the command but not the children
/// conlock had before it (started by the shell that exec'd conlock), as conlock itself
/// leaves them alone (the watchdog killed every descendant of conlock).
#[test]
fn guardian_spares_the_children_conlock_had_before_the_command() {
    let server = start_server();
    let dir = scratch("watchdog-prior");
    let (pidfile, priorfile) = (dir.join("pid"), dir.join("prior"));
    let mut h = KillOnDrop(
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "sleep 600 & echo $! > {q}; exec {BIN} run --key watchdog-prior --ttl 10s --lock-delay 3s --kill-grace 1s -- sh -c 'echo $$ > {p}; exec sleep 600'",
                q = priorfile.display(),
                p = pidfile.display(),
            ))
            .env("CONSUL_HTTP_ADDR", server.addr().to_string())
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let child = read_pid(&pidfile);
    let prior = read_pid(&priorfile);
    // Killed at the end only if still the same process (a freed PID may be another
    // test's by then).
    struct KillPid(i32, Option<u64>);
    impl Drop for KillPid {
        fn drop(&mut self) {
            if self.1.is_some() && start_time(self.0) == self.1 {
                unsafe { libc::kill(self.0, libc::SIGKILL) };
            }
        }
    }
    let _cleanup = KillPid(prior, start_time(prior));
    signal(h.0.id(), libc::SIGSTOP);
    server.fault(FaultMode::Error, Duration::from_secs(600));
    assert!(
        wait_for(Duration::from_secs(90), || !process_alive(child)),
        "the command of a stopped conlock was never killed"
    );
    // The watchdog fired; it would have killed the prior child in the same sweep, and
    // again within its first second.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        process_alive(prior),
        "the guardian killed a child conlock had before the command"
    );
    server.clear_fault();
    signal(h.0.id(), libc::SIGCONT);
    wait_exit(&mut h.0, LONG);
}

/// conlock's direct children, from every thread's list.
fn children_of(pid: u32) -> Vec<i32> {
    let mut found = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        found.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok()),
        );
    }
    found
}

/// A guardian that dies leaves conlock writing to a pipe nobody reads. That must be an
/// error conlock warns about (SIGPIPE ignored), not a death by SIGPIPE that would skip
/// the release and leave the lock to the session's TTL and lock-delay.
#[test]
fn conlock_outlives_its_guardian() {
    let server = start_server();
    let dir = scratch("guardian-gone");
    let (pidfile, go) = (dir.join("pid"), dir.join("go"));
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "guardian-gone", "--lock-delay", "60s"])
            .args(["--", "sh", "-c"])
            .arg(format!(
                "echo $$ > {}; while [ ! -e {} ]; do sleep 0.01; done",
                pidfile.display(),
                go.display()
            ))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let command = read_pid(&pidfile);
    let guardian = children_of(h.0.id())
        .into_iter()
        .find(|&p| p != command)
        .expect("conlock has a guardian child");
    // Its own name: `killall -9 conlock` (an exact match) leaves it to clean up.
    let comm = read(Path::new(&format!("/proc/{guardian}/comm")));
    assert_eq!(comm.trim(), "conlock-guard", "the guardian's name");
    signal(guardian as u32, libc::SIGKILL);
    assert!(wait_for(LONG, || !process_alive(guardian)));
    File::create(&go).unwrap();
    let status = wait_exit(&mut h.0, LONG);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut h.0.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{status:?}: {err}");
    assert!(err.contains("guardian process is gone"), "{err}");
    assert!(
        holder(&client(&server), "guardian-gone").is_none(),
        "the lock was not released"
    );
}

/// Has `cmd` run under a seccomp filter that fails every fork (a `clone` without
/// CLONE_THREAD or CLONE_VFORK, and `fork`) with EAGAIN, as a container's policy may:
/// conlock's threads and its spawn (CLONE_VM | CLONE_VFORK) still work, its guardian
/// cannot start.
#[cfg(target_arch = "x86_64")]
fn forbid_fork(cmd: &mut Command) {
    const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
    const NR_CLONE: u32 = 56;
    const NR_FORK: u32 = 57;
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jump = |code: u32, k: u32, jt: u8, jf: u8| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let (ld, jeq, jset, ret) = (
        libc::BPF_LD | libc::BPF_W | libc::BPF_ABS,
        libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K,
        libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K,
        libc::BPF_RET | libc::BPF_K,
    );
    let allow = libc::SECCOMP_RET_ALLOW;
    let eagain = libc::SECCOMP_RET_ERRNO | libc::EAGAIN as u32;
    // seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low half, little-endian).
    // Jumps count the instructions skipped.
    let filter: Vec<libc::sock_filter> = vec![
        stmt(ld, 4),
        jump(jeq, AUDIT_ARCH_X86_64, 0, 7),
        stmt(ld, 0),
        jump(jeq, NR_FORK, 4, 0),
        jump(jeq, NR_CLONE, 0, 4),
        stmt(ld, 16),
        jump(jset, libc::CLONE_THREAD as u32, 2, 0),
        jump(jset, libc::CLONE_VFORK as u32, 1, 0),
        stmt(ret, eagain),
        stmt(ret, allow),
    ];
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// A guardian that could not start (every fork refused) left conlock running the command
/// anyway, with a warning: killed or stopped, nothing would stop the command. conlock
/// refuses now (exit 125, before anything is acquired) unless `--unguarded` says to run
/// it unguarded.
#[cfg(target_arch = "x86_64")]
#[test]
fn without_a_guardian_the_command_does_not_run_unless_unguarded() {
    let server = start_server();
    let dir = scratch("no-guardian");
    let ran = dir.join("ran");
    let mut refused = conlock(&server);
    refused
        .args(["run", "--key", "no-guardian", "--", "touch"])
        .arg(&ran);
    forbid_fork(&mut refused);
    let out = refused.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(!ran.exists(), "the command ran without a guardian");
    assert!(
        err.contains("cannot start the guardian process (fork: ") && err.contains("--unguarded"),
        "{err}"
    );
    assert_eq!(server.request_count(), 0, "a request was sent");
    let mut unguarded = conlock(&server);
    unguarded
        .args(["run", "--key", "no-guardian", "--unguarded", "--", "touch"])
        .arg(&ran);
    forbid_fork(&mut unguarded);
    let out = unguarded.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(ran.exists(), "--unguarded did not run the command");
    assert!(err.contains("running unguarded"), "{err}");
}

/// What the guardian says after conlock died, on Consul: the release and the session
/// destroy it did, each said.
#[test]
fn guardian_says_what_it_released_and_destroyed() {
    let server = start_server();
    let dir = scratch("guardian-says");
    let sidfile = dir.join("sid");
    let key = "guardian-says";
    let mut h = conlock(&server)
        .args(["run", "--key", key, "--"])
        .args(["sh", "-c"])
        .arg(format!(
            "echo $CONLOCK_SESSION > {0}.tmp; mv {0}.tmp {0}; exec sleep 600",
            sidfile.display()
        ))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(LONG, || !read(&sidfile).trim().is_empty()));
    let sid = read(&sidfile).trim().to_string();
    signal(h.id(), libc::SIGKILL);
    wait_exit(&mut h, LONG);
    let mut err = String::new();
    std::io::Read::read_to_string(h.stderr.as_mut().unwrap(), &mut err).unwrap();
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("conlock guardian:") && l.contains("release"))
        .collect();
    assert_eq!(said.len(), 1, "{err}");
    let expected = format!("released the lock {key:?}; session {sid} destroyed");
    assert!(said[0].contains(&expected), "{expected}: {err}");
}
