//! Process supervision on the real binary: descendants that escape the process group,
//! terminals (`stty tostop`, job control) on a pty, a blocked stderr, inherited ignored
//! signals, stopped children, and `watch`'s handler.

use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(60);

/// `(state, ppid)` from /proc/<pid>/stat.
fn stat(pid: i32) -> Option<(char, i32)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = s[s.rfind(')')? + 1..].split_whitespace().collect();
    Some((f[0].chars().next()?, f[1].parse().ok()?))
}

fn state(pid: i32) -> Option<char> {
    stat(pid).map(|s| s.0)
}

fn read_pid(path: &Path) -> i32 {
    assert!(
        wait_for(LONG, || read(path).trim().parse::<i32>().is_ok()),
        "no pid in {path:?}"
    );
    read(path).trim().parse().unwrap()
}

/// Kills leftover pids when a failing test unwinds.
struct Reap(Vec<i32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &p in &self.0 {
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

/// An interactive bash on a pty, with job control, driven like a user at a terminal.
struct Shell {
    master: std::fs::File,
    out: Arc<Mutex<String>>,
    _child: KillOnDrop,
}

impl Shell {
    fn start(server: &conlock::devserver::DevServer) -> Shell {
        let pty = nix::pty::openpty(None, None).expect("openpty");
        let slave: OwnedFd = pty.slave;
        let mut cmd = Command::new("bash");
        cmd.args(["--norc", "--noprofile", "-i"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("TERM", "dumb")
            .env("PS1", "PROMPT> ")
            .env("CONSUL_HTTP_ADDR", server.addr().to_string())
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        unsafe {
            cmd.pre_exec(|| {
                // A session of its own with the pty as controlling terminal.
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = KillOnDrop(cmd.spawn().expect("start bash on a pty"));
        let master = std::fs::File::from(pty.master);
        let out = Arc::new(Mutex::new(String::new()));
        let (mut reader, sink) = (master.try_clone().unwrap(), out.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let sh = Shell {
            master,
            out,
            _child: child,
        };
        sh.expect("PROMPT> ");
        sh
    }

    fn send(&self, text: &str) {
        (&self.master).write_all(text.as_bytes()).unwrap();
    }

    fn output(&self) -> String {
        self.out.lock().unwrap().clone()
    }

    /// Waits until the output contains `what`.
    fn expect(&self, what: &str) {
        assert!(
            wait_for(LONG, || self.output().contains(what)),
            "no {what:?} on the terminal:\n{}",
            self.output()
        );
    }

    /// Runs a shell line without waiting for anything.
    fn line(&self, line: &str) {
        self.send(&format!("{line}\n"));
    }
}

/// The command that prints `EXIT=<code>` after `cmd`; quoted so that the echoed input
/// line itself never contains `EXIT=`.
fn with_exit(cmd: &str) -> String {
    format!("{cmd}; {ECHO_EXIT}")
}

/// Prints the last foreground job's exit code as `EXIT=<code>`.
const ECHO_EXIT: &str = "echo \"EX\"\"IT=$?\"";

/// Case 5: a descendant that left the process group and the session (`setsid … &`) and
/// outlived the command is stopped with the kill signal before the lock is released; so
/// is the child it had started. The next holder starts only after both ended (timestamps
/// written by the processes themselves).
#[test]
fn escaped_descendants_are_stopped_before_release() {
    let server = start_server();
    let dir = scratch("escape");
    let d = dir.display();
    std::fs::write(
        dir.join("escaped.sh"),
        format!(
            "echo $$ > {d}/esc; sleep 1000 & echo $! > {d}/esc-child\n\
             trap 'echo \"E $(date +%s%N)\" > {d}/esc-end; exit 0' TERM\n\
             while :; do sleep 0.05; done\n"
        ),
    )
    .unwrap();
    // setsid: a session (and process group) of its own; the command exits at once.
    let cmd = format!(
        "setsid sh {d}/escaped.sh & \
         while [ ! -s {d}/esc-child ]; do sleep 0.01; done; exit 3"
    );
    let mut a = KillOnDrop(start_holder(
        &server,
        "escape",
        &["--kill-grace", "3s"],
        &cmd,
    ));
    let esc = read_pid(&dir.join("esc"));
    let esc_child = read_pid(&dir.join("esc-child"));
    let _reap = Reap(vec![esc, esc_child]);
    let mut b = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "escape", "--", "sh", "-c"])
            .arg(format!("echo \"S $(date +%s%N)\" > {d}/b-start"))
            .spawn()
            .unwrap(),
    );
    assert_eq!(wait_exit(&mut a.0, LONG).code(), Some(3));
    assert!(wait_exit(&mut b.0, LONG).success());
    assert!(
        !process_alive(esc) && !process_alive(esc_child),
        "a descendant outside the process group outlived conlock run"
    );
    let ts = |f: &str| -> u128 {
        read(&dir.join(f))
            .split_whitespace()
            .nth(1)
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("no timestamp in {f}"))
    };
    // It got the kill signal (its trap ran), not just SIGKILL, and ended before B began.
    assert!(
        ts("esc-end") < ts("b-start"),
        "the escaped descendant ended after the next holder started"
    );
}

/// Case 6: with `stty tostop`, conlock is a background process on the terminal while the
/// command owns it. Its "lock lost" message must not stop it (SIGTTOU) before the
/// command is stopped: conlock exits 124 and the command is gone.
#[test]
fn tostop_terminal_does_not_freeze_a_loss() {
    let server = start_server();
    let dir = scratch("tostop");
    let pidfile = dir.join("pid");
    let sh = Shell::start(&server);
    sh.line("stty tostop");
    sh.line(&with_exit(&format!(
        "{BIN} run --key tostop --kill-grace 2s -- sh -c 'echo $$ > {}; exec sleep 1000'",
        pidfile.display()
    )));
    let child = read_pid(&pidfile);
    let _reap = Reap(vec![child]);
    let c = client(&server);
    let session = holder(&c, "tostop").expect("a holder");
    c.session_destroy(&session).unwrap();
    sh.expect("EXIT=124");
    assert!(!process_alive(child), "the command outlived the loss");
    assert!(
        !sh.output().contains("Stopped"),
        "conlock was stopped by terminal output:\n{}",
        sh.output()
    );
}

/// Case 6, pipe: a stderr pipe that nobody reads is full when the lock is lost. The
/// command still gets its stop signal at once, and conlock exits 124.
#[test]
fn full_stderr_pipe_does_not_delay_the_stop() {
    let server = start_server();
    let dir = scratch("stderr-full");
    let d = dir.display();
    // The command's own stderr goes elsewhere: only conlock's is blocked.
    let cmd = format!(
        "exec 2>/dev/null; trap 'date +%s%N > {d}/termed; exit 0' TERM; \
         while :; do sleep 0.05; done"
    );
    let marker = dir.join("running");
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "stderr-full", "--lock-delay", "60s"])
            .args(["--kill-grace", "30s", "--"])
            .args(marked(&marker, &cmd))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || marker.exists()), "the command never ran");
    // From now on, any write to conlock's stderr blocks.
    assert!(fill_pipe(h.0.id(), "2", b'x') > 0);
    let c = client(&server);
    let session = holder(&c, "stderr-full").expect("a holder");
    let lost = Instant::now();
    c.session_destroy(&session).unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || dir.join("termed").exists()),
        "the command got no stop signal while conlock's stderr was full"
    );
    let signalled = lost.elapsed();
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
    println!("stop signal {signalled:?} after the loss with a full stderr pipe");
}

/// Case 6, pipe, with no room for a thread: the command uses up conlock's process limit,
/// so the thread that writes conlock's messages cannot start when the lock is lost, and
/// its stderr pipe is full. The stop must still go on: SIGKILL `--kill-grace` after the
/// loss, then exit 124. (The "lock lost" line was written in place and blocked the
/// supervising loop: no SIGKILL came from conlock, and it never exited.)
#[test]
fn full_stderr_and_no_room_for_a_thread_do_not_stop_the_stop() {
    if !is_root() {
        return skip("needs root, to run conlock under its own user ID");
    }
    let server = start_server();
    let shared = reachable_scratch("stderr-full-nproc");
    let (marker, pidfile) = (shared.dir.join("running"), shared.dir.join("pid"));
    // The command ignores TERM: only a SIGKILL ends it.
    let cmd = format!(
        "exec 2>/dev/null; echo $$ > {}; trap '' TERM; exec sleep 600",
        pidfile.display()
    );
    let mut c = shared.conlock(&server);
    // A user ID of its own, so that no other process counts against its limit of 6:
    // conlock's main, signal, renew and monitor threads, the guardian and the command.
    c.args([
        "run",
        "--key",
        "stderr-full-nproc",
        "--kill-grace",
        "2s",
        "--",
    ])
    .args(marked(&marker, &cmd))
    .uid(61_928)
    .gid(61_928)
    .stderr(Stdio::piped());
    limit_processes(&mut c, 6);
    let mut h = KillOnDrop(c.spawn().unwrap());
    assert!(wait_for(LONG, || marker.exists()), "the command never ran");
    let child = read_pid(&pidfile);
    let threads = || std::fs::read_dir(format!("/proc/{}/task", h.0.id())).map_or(0, |d| d.count());
    assert!(
        wait_for(LONG, || threads() == 4),
        "conlock should run 4 threads (main, signals, renew, monitor), runs {}",
        threads()
    );
    assert!(fill_pipe(h.0.id(), "2", b'x') > 0);
    let c = client(&server);
    let session = holder(&c, "stderr-full-nproc").expect("a holder");
    let lost = Instant::now();
    c.session_destroy(&session).unwrap();
    assert!(
        wait_for(LONG, || !process_alive(child)),
        "the command was never killed"
    );
    let killed = lost.elapsed();
    // --kill-grace 2 s after the loss was seen; the guardian's own kill would come only
    // after the deadline (a TTL later).
    assert!(
        killed < Duration::from_secs(6),
        "the command was killed {killed:?} after the loss (--kill-grace 2s)"
    );
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
}

/// Case 7: Ctrl-Z stops the command and conlock; the shell gets its prompt back and
/// reports the job stopped. `fg` continues both, with the terminal, and the command
/// finishes normally.
#[test]
fn ctrl_z_stops_the_job_and_fg_continues_it() {
    let server = start_server();
    let dir = scratch("ctrl-z");
    let (pidfile, got) = (dir.join("pid"), dir.join("got"));
    let sh = Shell::start(&server);
    sh.line(&format!(
        "{BIN} run --key ctrl-z -- sh -c 'echo $$ > {}; read line; echo \"$line\" > {}'",
        pidfile.display(),
        got.display()
    ));
    let child = read_pid(&pidfile);
    let conlock_pid = stat(child).unwrap().1;
    let _reap = Reap(vec![child, conlock_pid]);
    assert!(wait_for(LONG, || state(child) == Some('S')));
    for round in 1..=2 {
        let prompts = sh.output().matches("PROMPT> ").count();
        sh.send("\x1a");
        assert!(
            wait_for(LONG, || sh.output().matches("Stopped").count() == round),
            "no Stopped for Ctrl-Z number {round}:\n{}",
            sh.output()
        );
        assert!(
            wait_for(LONG, || sh.output().matches("PROMPT> ").count() > prompts),
            "no prompt after Ctrl-Z:\n{}",
            sh.output()
        );
        assert!(
            wait_for(LONG, || state(conlock_pid) == Some('T')),
            "conlock kept running while its command was stopped"
        );
        assert_eq!(state(child), Some('T'));
        sh.line("fg");
        assert!(
            wait_for(LONG, || state(child) == Some('S')),
            "fg did not continue the command"
        );
    }
    sh.line("hello");
    assert!(wait_for(LONG, || !process_alive(conlock_pid)));
    sh.line(ECHO_EXIT);
    sh.expect("EXIT=0");
    assert_eq!(read(&got).trim(), "hello");
    assert!(wait_sessions(&server, 0), "the session was not destroyed");
}

/// Ctrl-Z also stops what escaped the command's group (`setsid … &` re-parented to
/// conlock): the terminal's SIGTSTP does not reach it, and conlock stops renewing while
/// stopped, so it must not run on beside a later holder. `fg` continues it.
#[test]
fn ctrl_z_stops_escaped_processes_too() {
    let server = start_server();
    let dir = scratch("ctrl-z-esc");
    let (pidfile, escfile, script) = (dir.join("pid"), dir.join("esc"), dir.join("job.sh"));
    std::fs::write(
        &script,
        format!(
            "(setsid sh -c 'echo $$ > {}; exec sleep 1000' &)\necho $$ > {}\nread line\n",
            escfile.display(),
            pidfile.display()
        ),
    )
    .unwrap();
    let sh = Shell::start(&server);
    sh.line(&format!(
        "{BIN} run --key ctrl-z-esc -- sh {}",
        script.display()
    ));
    let child = read_pid(&pidfile);
    let escaped = read_pid(&escfile);
    let conlock_pid = stat(child).unwrap().1;
    let _reap = Reap(vec![child, escaped, conlock_pid]);
    assert!(wait_for(LONG, || state(child) == Some('S')));
    assert!(
        wait_for(LONG, || stat(escaped).map(|s| s.1) == Some(conlock_pid)),
        "the escaped process was not re-parented to conlock"
    );
    sh.send("\x1a");
    assert!(wait_for(LONG, || state(conlock_pid) == Some('T')));
    assert!(
        wait_for(LONG, || state(escaped) == Some('T')),
        "the escaped process kept running while conlock was stopped"
    );
    sh.line("fg");
    assert!(
        wait_for(LONG, || state(escaped) == Some('S')),
        "fg did not continue the escaped process"
    );
    sh.line("bye");
    assert!(wait_for(LONG, || !process_alive(conlock_pid)));
    assert!(
        !process_alive(escaped),
        "the escaped process outlived conlock"
    );
}

/// Case 7, conlock in the foreground (stdin is not the terminal, so the command does not
/// get it): Ctrl-Z reaches conlock, which passes SIGTSTP to the command and stops with
/// it, instead of stopping alone while the command runs on unsupervised.
#[test]
fn ctrl_z_to_conlock_stops_the_command_too() {
    let server = start_server();
    let dir = scratch("ctrl-z-fg");
    let pidfile = dir.join("pid");
    let sh = Shell::start(&server);
    sh.line(&format!(
        "{BIN} run --key ctrl-z-fg -- sh -c 'echo $$ > {}; while :; do sleep 0.05; done' < /dev/null",
        pidfile.display()
    ));
    let child = read_pid(&pidfile);
    let conlock_pid = stat(child).unwrap().1;
    let _reap = Reap(vec![child, conlock_pid]);
    // Twice: the second Ctrl-Z finds conlock's SIGTSTP handler restored.
    for round in 1..=2 {
        sh.send("\x1a");
        assert!(
            wait_for(LONG, || sh.output().matches("Stopped").count() == round),
            "no Stopped for Ctrl-Z number {round}:\n{}",
            sh.output()
        );
        assert!(
            wait_for(LONG, || state(conlock_pid) == Some('T')),
            "conlock did not stop"
        );
        assert!(
            wait_for(LONG, || state(child) == Some('T')),
            "the command ran on while conlock was stopped"
        );
        sh.line("fg");
        assert!(
            wait_for(LONG, || state(conlock_pid).is_some_and(|s| s != 'T')
                && state(child).is_some_and(|s| s != 'T')),
            "fg did not continue conlock and the command"
        );
    }
    // Ctrl-C reaches conlock, which forwards SIGINT: the command dies of it.
    sh.send("\x03");
    assert!(wait_for(LONG, || !process_alive(conlock_pid)));
    sh.line(ECHO_EXIT);
    sh.expect("EXIT=130");
}

/// Case 7: a job stopped for longer than its session deadline is a loss when it is
/// continued: the command is stopped without running on, and conlock exits 124.
#[test]
fn fg_after_the_deadline_passed_is_a_loss() {
    let server = start_server();
    let dir = scratch("ctrl-z-late");
    let (pidfile, got) = (dir.join("pid"), dir.join("got"));
    let sh = Shell::start(&server);
    sh.line(&format!(
        "{BIN} run --key ctrl-z-late --ttl 10s -- sh -c 'echo $$ > {}; read line; echo \"$line\" > {}'",
        pidfile.display(),
        got.display()
    ));
    let child = read_pid(&pidfile);
    let conlock_pid = stat(child).unwrap().1;
    let _reap = Reap(vec![child, conlock_pid]);
    assert!(wait_for(LONG, || state(child) == Some('S')));
    sh.send("\x1a");
    assert!(
        wait_for(LONG, || state(conlock_pid) == Some('T')),
        "conlock kept running while its command was stopped:\n{}",
        sh.output()
    );
    // The deadline is at most TTL - margin (9 s) after the stop; wait past it.
    let stopped = Instant::now();
    while stopped.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    sh.line("fg");
    assert!(wait_for(LONG, || !process_alive(conlock_pid)));
    sh.line(ECHO_EXIT);
    sh.expect("EXIT=124");
    assert!(!process_alive(child), "the command ran on after the loss");
    assert!(!got.exists(), "the command continued after the deadline");
}

/// Case 8: a signal ignored when conlock started (`nohup`) stays ignored: not forwarded,
/// and inherited by the command as ignored.
#[test]
fn signals_ignored_at_start_stay_ignored() {
    let server = start_server();
    let dir = scratch("nohup");
    let (marker, go) = (dir.join("running"), dir.join("go"));
    let cmd = format!(
        "while [ ! -e {} ]; do sleep 0.02; done; kill -HUP $$; exit 7",
        go.display()
    );
    let mut c = conlock(&server);
    c.args(["run", "--key", "nohup", "--"])
        .args(marked(&marker, &cmd));
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let mut h = KillOnDrop(c.spawn().unwrap());
    assert!(wait_for(LONG, || marker.exists()), "the command never ran");
    signal(h.0.id(), libc::SIGHUP);
    // Give a forwarded signal every chance to arrive before the command goes on.
    let sent = Instant::now();
    while sent.elapsed() < Duration::from_millis(300) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::fs::write(&go, "").unwrap();
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(7));
}

/// The command that stops itself with SIGSTOP after setting a TERM trap that stamps
/// `dir/trapped`; its pid goes to `dir/pid`.
fn self_stopping(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "trap 'date +%s%N > {d}/trapped; exit 0' TERM; echo $$ > {d}/pid; \
         kill -STOP $$; while :; do sleep 0.05; done"
    )
}

/// Case 9: a stopped command gets SIGCONT after the stop signal, so its TERM trap runs
/// at once instead of SIGKILL after the grace.
#[test]
fn stopped_command_gets_sigcont_after_the_stop_signal() {
    let server = start_server();
    let dir = scratch("stopped-loss");
    let mut h = KillOnDrop(start_holder(
        &server,
        "stopped-loss",
        &["--kill-grace", "30s", "--lock-delay", "60s"],
        &self_stopping(&dir),
    ));
    let child = read_pid(&dir.join("pid"));
    assert!(wait_for(LONG, || state(child) == Some('T')));
    let c = client(&server);
    let session = holder(&c, "stopped-loss").expect("a holder");
    c.session_destroy(&session).unwrap();
    assert!(
        wait_for(Duration::from_secs(20), || dir.join("trapped").exists()),
        "the stopped command's TERM trap did not run"
    );
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
}

/// Case 9: the same for a forwarded SIGTERM.
#[test]
fn stopped_command_gets_sigcont_after_a_forwarded_term() {
    let server = start_server();
    let dir = scratch("stopped-term");
    let mut h = KillOnDrop(start_holder(
        &server,
        "stopped-term",
        &["--kill-grace", "30s", "--lock-delay", "60s"],
        &self_stopping(&dir),
    ));
    let child = read_pid(&dir.join("pid"));
    assert!(wait_for(LONG, || state(child) == Some('T')));
    signal(h.0.id(), libc::SIGTERM);
    assert!(
        wait_for(Duration::from_secs(20), || dir.join("trapped").exists()),
        "the stopped command's TERM trap did not run"
    );
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(0));
}

/// Case 10: `conlock watch` stopped by SIGTERM stops its running handler's whole group.
#[test]
fn watch_stops_its_handler_on_sigterm() {
    let server = start_server();
    let dir = scratch("watch-handler");
    let d = dir.display();
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["watch", "--key", "watched", "--", "sh", "-c"])
            .arg(format!(
                "echo $$ > {d}/handler; sleep 1000 & echo $! > {d}/sleeper; wait"
            ))
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let handler = read_pid(&dir.join("handler"));
    let sleeper = read_pid(&dir.join("sleeper"));
    let _reap = Reap(vec![handler, sleeper]);
    signal(w.0.id(), libc::SIGTERM);
    let st = wait_exit(&mut w.0, LONG);
    assert!(
        wait_for(Duration::from_secs(10), || !process_alive(handler)
            && !process_alive(sleeper)),
        "the handler outlived conlock watch"
    );
    assert_eq!(st.code(), Some(128 + libc::SIGTERM));
}

/// An escaped process that /proc hides from conlock (`/proc` mounted `hidepid=invisible`,
/// and the process is not dumpable, as ssh-agent makes itself) is stopped, and conlock
/// waits for it before it releases. Its stat could not be read, so it read as gone, and
/// conlock released while it ran on. Found by review. Runs as root only: it mounts /proc in a mount namespace of its
/// own and runs conlock as nobody there.
#[test]
fn an_escapee_hidden_by_hidepid_is_stopped() {
    let tools = ["/usr/bin/unshare", "/usr/bin/setpriv", "/usr/bin/python3"];
    // hidepid=invisible needs Linux 5.8, where each mount of /proc has its own options
    // (before, a mount changed those of every /proc): tried first in a throwaway namespace.
    let mount = "mount -t proc -o hidepid=invisible proc /proc";
    let can_mount = || {
        Command::new(tools[0])
            .args(["-m", "--propagation", "private", "sh", "-c", mount])
            .status()
            .is_ok_and(|s| s.success())
    };
    if !is_root() || !tools.iter().all(|t| Path::new(t).exists()) || !can_mount() {
        return skip(&format!(
            "needs root, {} and Linux 5.8 (a /proc mount with hidepid=invisible)",
            tools.join(", ")
        ));
    }
    let server = start_server();
    let shared = reachable_scratch("hidepid");
    let (dir, bin) = (&shared.dir, shared.bin.display());
    let d = dir.display();
    // Not dumpable (PR_SET_DUMPABLE 0), in a session of its own; then it waits.
    std::fs::write(
        dir.join("esc.py"),
        "import ctypes, os, sys, time\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\n\
         open(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(300)\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("cmd.sh"),
        format!(
            "setsid /usr/bin/python3 {d}/esc.py {d}/esc &\n\
             while [ ! -s {d}/esc ]; do sleep 0.01; done\nexit 0\n"
        ),
    )
    .unwrap();
    let inner = format!(
        "{mount} && \
         exec setpriv --reuid=65534 --regid=65534 --clear-groups \
         {bin} run --key hidepid --kill-grace 1s -- sh {d}/cmd.sh"
    );
    let mut run = KillOnDrop(
        Command::new("/usr/bin/unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &inner])
            .env("CONSUL_HTTP_ADDR", server.addr().to_string())
            .current_dir(dir)
            .stdin(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let esc = read_pid(&dir.join("esc"));
    let _reap = Reap(vec![esc]);
    assert!(wait_exit(&mut run.0, LONG).success());
    assert!(
        !process_alive(esc),
        "the hidden escaped process outlived conlock run (it was released beside it)"
    );
}

/// A command that uses up its user's process limit (a `make -j` at `ulimit -u`, a cgroup
/// `pids.max`) must not cost the lock: the threads that renew and confirm the claim exist
/// before it starts. A renew thread started lazily, after the command, could not start
/// here, and the command was stopped as lost (exit 124) at the first deadline.
#[test]
fn a_command_that_uses_up_the_process_limit_keeps_the_lock() {
    if !is_root() {
        return skip("needs root, to run conlock under its own user ID");
    }
    if !Path::new("/usr/bin/python3").exists() {
        return skip("no /usr/bin/python3");
    }
    // A uid of its own: the limit counts every task of the user, other tests' included.
    const UID: u32 = 64999;
    let server = start_server();
    let shared = reachable_scratch("nproc");
    // Forks sleepers until fork fails; they outlive several deadline windows (800 ms).
    let filler = "import os, time\n\
                  kids = []\n\
                  while len(kids) < 500:\n\
                  \x20   try:\n\
                  \x20       pid = os.fork()\n\
                  \x20   except OSError:\n\
                  \x20       break\n\
                  \x20   if pid == 0:\n\
                  \x20       time.sleep(4)\n\
                  \x20       os._exit(0)\n\
                  \x20   kids.append(pid)\n\
                  assert 0 < len(kids) < 500, len(kids)\n\
                  for k in kids:\n\
                  \x20   os.waitpid(k, 0)\n";
    let mut cmd = shared.conlock(&server);
    cmd.args(["run", "--key", "nproc", "--ttl", "10s"])
        .args(["--lock-delay", "2s", "--kill-grace", "1s"])
        .args(["--", "/usr/bin/python3", "-c", filler])
        .uid(UID)
        .gid(UID)
        .stderr(Stdio::piped());
    limit_processes(&mut cmd, 40);
    let o = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("lost"), "{err}");
}
