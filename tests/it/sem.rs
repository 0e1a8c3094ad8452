//! `conlock sem` end to end.

use std::process::Stdio;
use std::time::Duration;

use assert_cmd::prelude::*;
use conlock::consul::{PutOptions, QueryOptions, SEMAPHORE_FLAGS};
use predicates::str::contains;

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(90);

fn holders(server: &conlock::devserver::DevServer, prefix: &str) -> Vec<String> {
    let c = client(server);
    let (pair, _) = c
        .kv_get(&format!("{prefix}/.lock"), QueryOptions::default())
        .unwrap();
    let Some(pair) = pair else { return vec![] };
    let v: serde_json::Value = serde_json::from_slice(pair.value_bytes()).unwrap();
    v["Holders"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

fn nothing_left(server: &conlock::devserver::DevServer, prefix: &str) -> bool {
    let c = client(server);
    c.kv_list(prefix, QueryOptions::default())
        .unwrap()
        .0
        .is_empty()
        && c.session_list(QueryOptions::default())
            .unwrap()
            .0
            .is_empty()
}

#[test]
fn forty_contenders_limit_three_with_kills() {
    let server = start_server();
    let dir = scratch("sem40");
    let log = dir.join("log");
    let job = logged_job(&log, "sleep 0.1");
    let mut kids: Vec<_> = (0..40)
        .map(|_| {
            conlock(&server)
                .args([
                    "sem", "--limit", "3", "--prefix", "sem40", "--ttl", "10s", "--", "sh", "-c",
                    &job,
                ])
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    // SIGKILL a pseudo-random quarter of the conlock processes while they wait or hold.
    let mut seed = std::process::id() as u64 | 1;
    let mut killed = vec![false; kids.len()];
    for (i, k) in kids.iter().enumerate() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        if seed % 4 == 0 {
            std::thread::sleep(Duration::from_millis(30));
            signal(k.id(), libc::SIGKILL);
            killed[i] = true;
        }
    }
    for (i, k) in kids.iter_mut().enumerate() {
        let st = wait_exit(k, Duration::from_secs(180));
        if !killed[i] {
            assert!(st.success(), "surviving job {i} failed: {st:?}");
        }
    }
    let iv = intervals(&read(&log));
    let survivors = killed.iter().filter(|k| !**k).count();
    assert!(
        iv.len() >= survivors,
        "{} jobs completed, {survivors} survived",
        iv.len()
    );
    assert!(
        max_overlap(&iv) <= 3,
        "more than 3 at once:\n{}",
        read(&log)
    );
}

#[test]
fn limit_is_respected_and_nothing_is_left() {
    let server = start_server();
    let dir = scratch("sem-limit");
    let log = dir.join("log");
    let job = logged_job(&log, "sleep 0.2");
    let mut kids: Vec<_> = (0..8)
        .map(|_| {
            conlock(&server)
                .args([
                    "sem", "--limit", "2", "--prefix", "limit", "--", "sh", "-c", &job,
                ])
                .spawn()
                .unwrap()
        })
        .collect();
    for k in &mut kids {
        assert!(wait_exit(k, LONG).success());
    }
    let iv = intervals(&read(&log));
    assert_eq!(iv.len(), 8);
    assert_eq!(max_overlap(&iv), 2, "{}", read(&log));
    assert!(nothing_left(&server, "limit"));
}

#[test]
fn child_gets_semaphore_environment() {
    let server = start_server();
    let dir = scratch("sem-env");
    let out = dir.join("env");
    let cmd = format!(
        "env | grep -E '^(CONLOCK_|CONSUL_LOCK_HELD)' | sort > {}",
        out.display()
    );
    conlock(&server)
        .args([
            "sem", "-n", "2", "--prefix", "semenv", "--", "sh", "-c", &cmd,
        ])
        .assert()
        .success();
    let env = read(&out);
    assert!(
        env.contains("CONLOCK_LIMIT=2\n") && env.contains("CONLOCK_PREFIX=semenv\n"),
        "{env}"
    );
    assert!(
        env.contains("CONLOCK_KEY=semenv/") && env.contains("CONSUL_LOCK_HELD=true"),
        "{env}"
    );
    assert!(env.contains("CONLOCK_MODIFY_INDEX="), "{env}");
}

#[test]
fn dead_holder_is_pruned_for_a_waiter() {
    let server = start_server();
    let dir = scratch("prune");
    let started = dir.join("b");
    let a_running = dir.join("a");
    let mut a = conlock(&server)
        .args([
            "sem",
            "--limit",
            "1",
            "--prefix",
            "prune",
            "--lock-delay",
            "2s",
            "--kill-grace",
            "200ms",
            "--",
        ])
        .args(marked(&a_running, "exec sleep 60"))
        .spawn()
        .unwrap();
    assert!(wait_for(LONG, || a_running.exists()));
    assert!(wait_for(LONG, || holders(&server, "prune").len() == 1));
    let a_session = holders(&server, "prune")[0].clone();
    let mut b = conlock(&server)
        .args(["sem", "--limit", "1", "--prefix", "prune", "--", "sh", "-c"])
        .arg(format!("touch {}", started.display()))
        .spawn()
        .unwrap();
    // B waits while A holds.
    assert!(wait_sessions(&server, 2));
    assert!(!started.exists());
    client(&server).session_destroy(&a_session).unwrap();
    assert!(wait_exit(&mut b, LONG).success());
    assert!(started.exists());
    assert_eq!(wait_exit(&mut a, LONG).code(), Some(124));
    assert!(wait_for(LONG, || nothing_left(&server, "prune")));
}

#[test]
fn conflicts_give_125() {
    let server = start_server();
    let mut a = conlock(&server)
        .args([
            "sem", "--limit", "2", "--prefix", "conf", "--", "sleep", "60",
        ])
        .spawn()
        .unwrap();
    assert!(wait_for(LONG, || holders(&server, "conf").len() == 1));
    conlock(&server)
        .args(["sem", "--limit", "3", "--prefix", "conf", "--", "true"])
        .assert()
        .code(125)
        .stderr(contains(
            "semaphore \"conf\" has a limit of 2 (in conf/.lock, set by its first holder), not --limit 3: every user of one prefix must give the same limit",
        ));
    // A lock on the semaphore's prefix: said in words.
    conlock(&server)
        .args(["run", "--prefix", "conf", "--", "true"])
        .assert()
        .code(125)
        .stderr(contains(
            "key \"conf/.lock\" is a semaphore's key (conlock sem, consul lock -n), not a lock's; refusing to touch it; a prefix holds either a lock or a semaphore",
        ));
    signal(a.id(), libc::SIGTERM);
    wait_exit(&mut a, LONG);

    // Foreign flags on .lock.
    let c = client(&server);
    c.kv_put("foreign/.lock", b"{}", PutOptions::default())
        .unwrap();
    conlock(&server)
        .args(["sem", "--limit", "2", "--prefix", "foreign", "--", "true"])
        .assert()
        .code(125)
        .stderr(contains(
            "is a plain key (no lock flags: written by something else), not a semaphore's",
        ));

    // Invalid JSON in a semaphore .lock: clear error, key untouched.
    let put = PutOptions {
        flags: SEMAPHORE_FLAGS,
        ..Default::default()
    };
    c.kv_put("badjson/.lock", b"{not json", put).unwrap();
    let before = c
        .kv_get("badjson/.lock", QueryOptions::default())
        .unwrap()
        .0
        .unwrap();
    conlock(&server)
        .args(["sem", "--limit", "2", "--prefix", "badjson", "--", "true"])
        .assert()
        .code(125)
        .stderr(contains("does not hold a semaphore description"));
    let after = c
        .kv_get("badjson/.lock", QueryOptions::default())
        .unwrap()
        .0
        .unwrap();
    assert_eq!(before, after);
}

#[test]
fn full_slots_with_timeout_zero_is_busy() {
    let server = start_server();
    let mut a = conlock(&server)
        .args([
            "sem", "--limit", "1", "--prefix", "full", "--", "sleep", "60",
        ])
        .spawn()
        .unwrap();
    assert!(wait_for(LONG, || holders(&server, "full").len() == 1));
    conlock(&server)
        .args([
            "sem",
            "--limit",
            "1",
            "--prefix",
            "full",
            "--timeout",
            "0s",
            "--",
            "true",
        ])
        .assert()
        .code(75);
    signal(a.id(), libc::SIGTERM);
    wait_exit(&mut a, LONG);
    assert!(wait_for(LONG, || nothing_left(&server, "full")));
}

#[test]
fn operator_removing_our_holder_entry_stops_the_child() {
    let server = start_server();
    let running = scratch("oper").join("running");
    let mut a = conlock(&server)
        .args(["sem", "--limit", "2", "--prefix", "oper", "--"])
        .args(marked(&running, "exec sleep 60"))
        .spawn()
        .unwrap();
    assert!(wait_for(LONG, || running.exists()));
    assert!(wait_for(LONG, || holders(&server, "oper").len() == 1));
    let c = client(&server);
    let lock = c
        .kv_get("oper/.lock", QueryOptions::default())
        .unwrap()
        .0
        .unwrap();
    let put = PutOptions {
        flags: SEMAPHORE_FLAGS,
        cas: Some(lock.modify_index),
        ..Default::default()
    };
    assert!(c
        .kv_put("oper/.lock", br#"{"Limit":2,"Holders":{}}"#, put)
        .unwrap());
    assert_eq!(wait_exit(&mut a, LONG).code(), Some(124));
}

/// A waiter whose session is invalidated while it waits (an operator, `break`, its node
/// failing) gets a new session and goes on waiting. Consul refuses its old contender key
/// for the lock-delay before it would say the session is gone; that must not end the
/// waiter with 125.
#[test]
fn waiter_whose_session_is_destroyed_waits_on_with_a_new_one() {
    let server = start_server();
    let ran = scratch("semlost").join("ran");
    let mut a = conlock(&server)
        .args(["sem", "--limit", "1", "--prefix", "semlost", "--"])
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    assert!(wait_for(LONG, || holders(&server, "semlost").len() == 1));
    let holder = holders(&server, "semlost")[0].clone();
    let mut b = KillOnDrop(
        conlock(&server)
            .args(["sem", "--limit", "1", "--prefix", "semlost"])
            .args(["--lock-delay", "5s", "--kill-grace", "1s", "--"])
            .args(marked(&ran, "true"))
            .spawn()
            .unwrap(),
    );
    let c = client(&server);
    let waiter = || {
        c.kv_list("semlost", QueryOptions::default())
            .unwrap()
            .0
            .into_iter()
            .filter_map(|p| p.session)
            .find(|s| *s != holder)
    };
    assert!(wait_for(LONG, || waiter().is_some()));
    let old = waiter().unwrap();
    assert!(c.session_destroy(&old).unwrap());
    // It is back in line under a new session.
    assert!(wait_for(LONG, || waiter().is_some_and(|s| s != old)));
    assert!(b.0.try_wait().unwrap().is_none(), "the waiter gave up");
    signal(a.id(), libc::SIGTERM);
    wait_exit(&mut a, LONG);
    assert_eq!(wait_exit(&mut b.0, LONG).code(), Some(0));
    assert!(ran.exists());
}

/// The monitor's two blocking queries hold connections of their own: the release and the
/// session's destroy after the command reuse the acquisition's, with no new connection on
/// the release's path.
#[test]
fn release_reuses_the_acquisitions_connection() {
    let server = start_server();
    let dir = scratch("semconn");
    let go = dir.join("go");
    let wait_go = until_exists(&go);
    let mut kid = conlock(&server)
        .args([
            "sem", "--limit", "2", "--prefix", "semconn", "--ttl", "60s", "--",
        ])
        .args(["sh", "-c", &wait_go])
        .spawn()
        .unwrap();
    assert!(
        wait_for(LONG, || server.blocking_count() >= 2),
        "the monitor's two queries never came ({} waiting)",
        server.blocking_count()
    );
    let connections = server.connection_count();
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut kid, LONG).success());
    assert_eq!(
        server.connection_count(),
        connections,
        "the release opened a connection"
    );
    assert!(nothing_left(&server, "semconn"));
}
