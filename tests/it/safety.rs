//! The Consul-side safety model (docs/safety.md): for every way a claim can end, the old
//! holder's command is dead before another holder's command starts. Overlap is judged
//! from timestamps the children write themselves: the old holder's child appends a
//! heartbeat every 20 ms until it dies (it ignores SIGTERM, so only SIGKILL ends it), the
//! new holder's child writes when it starts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use assert_cmd::prelude::*;
use conlock::consul::QueryOptions;
use predicates::str::contains;

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(90);

/// A child that ignores SIGTERM and appends a ns timestamp to `beats` every 20 ms.
fn stubborn_heartbeat(beats: &Path) -> String {
    format!(
        "trap '' TERM; while :; do date +%s%N >> {}; sleep 0.02; done",
        beats.display()
    )
}

/// The last heartbeat written to `beats` (ns since the epoch).
fn last_beat(beats: &Path) -> u128 {
    read(beats)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or_else(|| panic!("no heartbeat in {}", beats.display()))
}

/// A child that writes its start time to `start`, then sleeps a little.
fn stamp_start(start: &Path) -> String {
    format!(
        "date +%s%N > {}.tmp; mv {0}.tmp {0}; sleep 0.2",
        start.display()
    )
}

fn started_at(start: &Path) -> u128 {
    read(start).trim().parse().expect("start stamp")
}

/// `conlock <args> -- sh -c <cmd>` through `addr`.
fn spawn_at(addr: SocketAddr, args: &[&str], cmd: &str) -> Child {
    conlock_at(addr)
        .args(args)
        .args(["--", "sh", "-c", cmd])
        .spawn()
        .unwrap()
}

fn wait_beating(beats: &Path) {
    assert!(
        wait_for(LONG, || read(beats).lines().count() >= 3),
        "the holder's command never ran"
    );
}

/// Asserts that the new holder started after the old holder's last heartbeat.
fn assert_no_overlap(beats: &Path, start: &Path, what: &str) {
    let (last, first) = (last_beat(beats), started_at(start));
    let gap_ms = (first as i128 - last as i128) as f64 / 1e6;
    eprintln!("{what}: new holder started {gap_ms:.1} ms after the old command's last heartbeat");
    assert!(
        first > last,
        "{what}: two holders: the old command still ran {:.1} ms after the new one started",
        -gap_ms
    );
}

/// The holder talks to a client agent on its own node; that agent is frozen (requests
/// hang) and, `detect` later, the servers mark the node failed and invalidate the
/// session through `serfHealth`. A waiter on the primary agent then acquires one
/// lock-delay later. The old command must be dead by then, whatever the TTL.
fn partition(kind: &str, flags: &[&str], detect: Duration) {
    let server = start_server();
    let node = format!("node-{kind}");
    let agent = server.add_agent(&node).unwrap();
    let dir = scratch(&format!("partition-{kind}"));
    let (beats, start) = (dir.join("beats"), dir.join("start"));
    let verb: Vec<&str> = match kind {
        "lock" => vec!["run", "--key", "part/k"],
        _ => vec!["sem", "--limit", "1", "--prefix", "part"],
    };
    let args: Vec<&str> = verb.iter().chain(flags).copied().collect();
    let mut a = KillOnDrop(spawn_at(agent, &args, &stubborn_heartbeat(&beats)));
    wait_beating(&beats);
    let mut b = KillOnDrop(spawn_at(server.addr(), &args, &stamp_start(&start)));
    // B waits (its session exists) before A is cut off.
    assert!(wait_sessions(&server, 2));
    assert!(server.freeze_agent(&node, detect));
    let st = wait_exit(&mut b.0, LONG);
    assert!(st.success(), "the waiter: {st:?}");
    assert_no_overlap(&beats, &start, &format!("{kind} {flags:?}"));
    assert_eq!(
        wait_exit(&mut a.0, LONG).code(),
        Some(124),
        "the cut-off holder"
    );
    server.thaw_agent(&node);
}

#[test]
fn partition_lock_defaults() {
    partition("lock", &[], Duration::from_millis(500));
}

#[test]
fn partition_lock_long_ttl() {
    partition("lock", &["--ttl", "30s"], Duration::from_millis(500));
}

#[test]
fn partition_lock_short_lock_delay() {
    partition(
        "lock",
        &["--lock-delay", "2s", "--kill-grace", "1s"],
        Duration::from_millis(500),
    );
}

/// A semaphore slot has no lock-delay on the server: the waiters' cushion stands in.
#[test]
fn partition_semaphore_short_lock_delay() {
    partition(
        "sem",
        &["--lock-delay", "2s", "--kill-grace", "1s"],
        Duration::from_millis(500),
    );
}

/// `break` while the holder is cut off (its agent hangs, the node stays healthy): the
/// next holder may start one lock-delay after the destroy, long before TTL after the
/// holder's last renewal.
#[test]
fn break_while_the_holder_is_cut_off_leaves_no_overlap() {
    let server = start_server();
    let agent = server.add_agent("node-brk").unwrap();
    let dir = scratch("break-cut-off");
    let (beats, start) = (dir.join("beats"), dir.join("start"));
    let args = ["run", "--key", "brk-cut/k", "--ttl", "30s"];
    let mut a = KillOnDrop(spawn_at(agent, &args, &stubborn_heartbeat(&beats)));
    wait_beating(&beats);
    // The node is never marked failed during the test.
    assert!(server.freeze_agent("node-brk", Duration::from_secs(600)));
    let out = conlock(&server)
        .args(["break", "--key", "brk-cut/k", "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mut b = KillOnDrop(spawn_at(server.addr(), &args, &stamp_start(&start)));
    assert!(wait_exit(&mut b.0, LONG).success());
    assert_no_overlap(&beats, &start, "break while cut off");
    assert_eq!(wait_exit(&mut a.0, LONG).code(), Some(124));
    server.thaw_agent("node-brk");
}

/// `break` on a semaphore holder whose command ignores SIGTERM: the slot goes to the
/// waiter only once that command is gone (SIGKILL after --kill-grace).
#[test]
fn semaphore_break_waits_for_the_old_command() {
    let server = start_server();
    let dir = scratch("sem-break");
    let (beats, start) = (dir.join("beats"), dir.join("start"));
    let args = [
        "sem",
        "--limit",
        "1",
        "--prefix",
        "semb",
        "--kill-grace",
        "2s",
    ];
    let mut a = KillOnDrop(spawn_at(server.addr(), &args, &stubborn_heartbeat(&beats)));
    wait_beating(&beats);
    let mut b = KillOnDrop(spawn_at(server.addr(), &args, &stamp_start(&start)));
    assert!(wait_sessions(&server, 2));
    let c = client(&server);
    let holder_session = {
        let (pair, _) = c.kv_get("semb/.lock", QueryOptions::default()).unwrap();
        let v: serde_json::Value = serde_json::from_slice(pair.unwrap().value_bytes()).unwrap();
        v["Holders"]
            .as_object()
            .unwrap()
            .keys()
            .next()
            .unwrap()
            .clone()
    };
    let out = conlock(&server)
        .args(["break", "--prefix", "semb", "--kind", "semaphore", "--yes"])
        .args(["--session", &holder_session])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(wait_exit(&mut a.0, LONG).code(), Some(124));
    assert!(wait_exit(&mut b.0, LONG).success());
    assert_no_overlap(&beats, &start, "semaphore break");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("frees once that holder has stopped its command"),
        "{said}"
    );
}

/// A waiter arriving after a holder vanished without freeing its slot (conlock and its
/// guardian both gone) gives that slot the holder's cushion, then takes it.
#[test]
fn semaphore_vanished_holder_is_pruned_after_its_cushion() {
    let server = start_server();
    let c = client(&server);
    // A holder recorded by a conlock with a 2 s lock-delay, whose session then ends.
    let s = crate::common::create_session(
        server.addr(),
        serde_json::json!({"LockDelay": "2s", "Behavior": "delete"}),
    );
    let flags = 0xe0f6_9a2b_aa41_4de0u64;
    let put = |key: &str, body: &[u8], acquire: Option<&str>, cas: Option<u64>| {
        let opts = conlock::consul::PutOptions {
            flags,
            acquire,
            cas,
            ..Default::default()
        };
        assert!(c.kv_put(key, body, opts).unwrap(), "{key}");
    };
    put(&format!("vanish/{s}"), b"", Some(&s), None);
    let lock =
        format!(r#"{{"Limit":1,"Holders":{{"{s}":true}},"ConlockLockDelayMs":{{"{s}":2000}}}}"#);
    put("vanish/.lock", lock.as_bytes(), None, Some(0));
    assert!(c.session_destroy(&s).unwrap());
    let dir = scratch("vanish");
    let start = dir.join("start");
    let t0 = Instant::now();
    let mut b = KillOnDrop(spawn_at(
        server.addr(),
        &["sem", "--limit", "1", "--prefix", "vanish"],
        &stamp_start(&start),
    ));
    assert!(wait_exit(&mut b.0, LONG).success());
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "took the vanished holder's slot after {waited:?}, inside its 2 s cushion"
    );
}

/// A TCP proxy that closes a connection after `idle` without traffic, like a load
/// balancer's idle timeout. Stops when dropped.
struct IdleCuttingProxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl IdleCuttingProxy {
    fn start(upstream: SocketAddr, idle: Duration) -> IdleCuttingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        std::thread::spawn(move || {
            while !stop2.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let stop3 = stop2.clone();
                        std::thread::spawn(move || relay(down, upstream, idle, &stop3));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        IdleCuttingProxy { addr, stop }
    }
}

impl Drop for IdleCuttingProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

fn relay(down: TcpStream, upstream: SocketAddr, idle: Duration, stop: &AtomicBool) {
    let Ok(up) = TcpStream::connect(upstream) else {
        return;
    };
    let tick = Duration::from_millis(20);
    for s in [&down, &up] {
        let _ = s.set_read_timeout(Some(tick));
        let _ = s.set_nodelay(true);
    }
    let (d, u) = (down, up);
    let mut last = Instant::now();
    let mut buf = [0u8; 16384];
    while !stop.load(Ordering::SeqCst) && last.elapsed() < idle {
        for (mut from, mut to) in [(&d, &u), (&u, &d)] {
            match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    if to.write_all(&buf[..n]).is_err() {
                        return;
                    }
                    last = Instant::now();
                }
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return,
            }
        }
    }
    let _ = d.shutdown(std::net::Shutdown::Both);
    let _ = u.shutdown(std::net::Shutdown::Both);
}

/// Behind a proxy that cuts idle connections every second, the monitor's blocking query
/// fails again and again; each failure is followed by a fresh read, so a healthy lock
/// is not taken for lost and the job ends with its own exit code.
#[test]
fn a_proxy_that_cuts_idle_connections_is_not_a_loss() {
    let server = start_server();
    let proxy = IdleCuttingProxy::start(server.addr(), Duration::from_secs(1));
    let mut h = KillOnDrop(spawn_at(
        proxy.addr,
        &["run", "--key", "proxied"],
        "sleep 8; exit 7",
    ));
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(7));
}

/// A server restart that loses every key and session while we hold: seen at once (the
/// retry after the cut connection reads from index 0), not at the next renewal (TTL/2).
#[test]
fn server_state_loss_is_seen_within_the_monitor_retry_bound() {
    let server = start_server();
    let dir = scratch("state-loss");
    let running = dir.join("running");
    // TTL 60 s: the next renewal would come only 30 s after the acquisition.
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "state-loss", "--ttl", "60s", "--"])
            .args(marked(&running, "exec sleep 600"))
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || running.exists()));
    server.restart_losing_state();
    let restarted = Instant::now();
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
    // 3 retries of 1 s each, plus slack for a busy machine.
    let took = restarted.elapsed();
    assert!(
        took < Duration::from_secs(12),
        "the loss was seen {took:?} after the restart"
    );
}

/// Timings that cannot be made safe are refused before any request; a lock-delay over
/// Consul's 60 s cap is used as 60 s, in the session and in what `break` says.
#[test]
fn lock_delay_is_capped_and_unsafe_timings_are_refused() {
    let server = start_server();
    let before = server.request_count();
    conlock(&server)
        .args(["run", "--key", "cap", "--lock-delay", "120s"])
        .args(["--kill-grace", "90s", "--", "true"])
        .assert()
        .code(125)
        .stderr(contains("caps lock-delays at 1m0s"))
        .stderr(contains(
            "--kill-grace 1m30s does not fit inside the lock-delay 1m0s",
        ));
    for (ld, grace) in [("5s", "5s"), ("0s", "0s"), ("1s", "500ms")] {
        conlock(&server)
            .args(["sem", "--limit", "2", "--prefix", "cap", "--lock-delay", ld])
            .args(["--kill-grace", grace, "--", "true"])
            .assert()
            .code(125)
            .stderr(contains("does not fit inside the lock-delay"));
    }
    assert_eq!(server.request_count(), before, "a request was made");

    // Clamped: the session says 60 s, and so does break.
    let dir = scratch("cap");
    let running = dir.join("running");
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "cap", "--lock-delay", "120s", "--"])
            .args(marked(&running, "exec sleep 600"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || running.exists()));
    let c = client(&server);
    let sessions = c.session_list(QueryOptions::default()).unwrap().0;
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0].lock_delay, 60_000_000_000);
    let out = conlock(&server)
        .args(["break", "--key", "cap", "--yes"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("after 1m0s (lock-delay)"), "{said}");
    assert_eq!(wait_exit(&mut h.0, LONG).code(), Some(124));
}

/// A relay that, once an acquire (`PUT ...?acquire=`) went through it, invalidates the session
/// of the next `session/renew` before passing the renewal on: the session ends between
/// the acquisition and the renewal a waiter makes before it starts its command.
fn expire_on_renew_relay(server: Arc<conlock::devserver::DevServer>) -> SocketAddr {
    let armed = AtomicBool::new(false);
    inspecting_relay(server.addr(), move |text| {
        if text.starts_with("PUT /v1/kv/") && text.contains("acquire=") {
            armed.store(true, Ordering::SeqCst);
        } else if let Some(at) = text.find("PUT /v1/session/renew/") {
            if armed.swap(false, Ordering::SeqCst) {
                let id: String = text[at + 22..].chars().take(36).collect();
                assert!(server.expire_session(&id), "no session {id}");
            }
        }
    })
}

/// A waiter that waited longer than TTL/2 renews its session before it starts the
/// command; a session invalidated right then is a loss before the command started:
/// exit 124, the command never runs, nothing is left behind (it was 125, an internal
/// error).
#[test]
fn session_lost_right_after_acquiring_is_exit_124() {
    let server = Arc::new(start_server());
    let dir = scratch("lost-after-acquire");
    let ran = dir.join("ran");
    let holder = crate::common::create_session(server.addr(), serde_json::json!({}));
    let flags = conlock::consul::LOCK_FLAGS;
    let path = format!("/v1/kv/after-acquire?acquire={holder}&flags={flags}");
    assert_eq!(
        crate::common::put(server.addr(), &path, b"").text().trim(),
        "true"
    );
    let relay = expire_on_renew_relay(server.clone());
    let mut w = KillOnDrop(
        conlock_at(relay)
            .args(["run", "--key", "after-acquire", "--ttl", "10s", "--"])
            .args(marked(&ran, "true"))
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    assert!(wait_sessions(&server, 2), "the waiter made no session");
    // Waiting (not renewing) for more than TTL/2 since its session was made: the waiter
    // renews before it starts the command. The wait is the condition itself.
    std::thread::sleep(Duration::from_secs(6));
    crate::common::put(
        server.addr(),
        &format!("/v1/kv/after-acquire?release={holder}&flags={flags}"),
        b"",
    );
    let status = wait_exit(&mut w.0, LONG);
    let mut err = String::new();
    w.0.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(124), "{err}");
    assert!(err.contains("invalidated right after acquiring"), "{err}");
    assert!(!ran.exists(), "the command ran");
    assert!(wait_sessions(&server, 1), "the waiter's session is left");
}

/// The command's file is gone when conlock, after waiting, acquires and starts it (it
/// was there when conlock checked it), and the release that follows hangs (the agent
/// stops answering right after the acquisition). conlock is healthy: the guardian must
/// not take the hang for a stuck conlock (its watchdog stayed armed after a failed
/// spawn, so it said conlock was stuck and killed "what was left").
#[test]
fn a_failed_spawn_leaves_the_guardian_disarmed() {
    let server = start_server();
    let dir = scratch("failed-spawn");
    let (errors, script) = (dir.join("stderr"), dir.join("job"));
    std::fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let holder = crate::common::create_session(server.addr(), serde_json::json!({}));
    let flags = conlock::consul::LOCK_FLAGS;
    let path = format!("/v1/kv/failed-spawn?acquire={holder}&flags={flags}");
    assert_eq!(
        crate::common::put(server.addr(), &path, b"").text().trim(),
        "true"
    );
    let open = Arc::new(AtomicBool::new(true));
    let (hold, acquired) = (open.clone(), AtomicBool::new(false));
    // The waiter's acquire and its read-back take the lock: everything after that waits
    // until `open` again.
    let relay = inspecting_relay(server.addr(), move |text| {
        if text.starts_with("PUT /v1/kv/failed-spawn?") && text.contains("acquire=") {
            acquired.store(true, Ordering::SeqCst);
            return;
        }
        if text.starts_with("GET /v1/kv/failed-spawn?consistent ")
            && acquired.swap(false, Ordering::SeqCst)
        {
            hold.store(false, Ordering::SeqCst);
            return;
        }
        while !hold.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
    });
    let mut h = KillOnDrop(
        conlock_at(relay)
            // A 60 s TTL: no renewal is due when it acquires, which the relay would hold.
            .args(["run", "--key", "failed-spawn", "--ttl", "60s"])
            .args(["--lock-delay", "5s", "--kill-grace", "1s", "--"])
            .arg(&script)
            .stderr(std::fs::File::create(&errors).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_sessions(&server, 2), "the waiter made no session");
    std::fs::remove_file(&script).unwrap();
    let path = format!("/v1/kv/failed-spawn?release={holder}&flags={flags}");
    crate::common::put(server.addr(), &path, b"");
    // The deadline is 3.75 s after the acquisition (room for a busy machine between the
    // acquisition and the spawn), the guardian's 1.125 s later.
    let stuck = wait_for(Duration::from_secs(12), || read(&errors).contains("stuck"));
    open.store(true, Ordering::SeqCst);
    assert_eq!(
        wait_exit(&mut h.0, LONG).code(),
        Some(127),
        "{}",
        read(&errors)
    );
    assert!(!stuck, "{}", read(&errors));
}
