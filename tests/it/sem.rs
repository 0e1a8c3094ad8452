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
    same_fencing_token(&env);
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

/// A waiter whose session is invalidated right after it created its contender key
/// (before its first read) is a lost session, not a puzzle: it gets a new session and
/// runs. (It exited 125: its second write with the dead session counted as a second
/// answer that made no sense.)
#[test]
fn a_session_lost_right_after_entering_gets_a_new_one() {
    let server = std::sync::Arc::new(start_server());
    let dir = scratch("lost-after-enter");
    let ran = dir.join("ran");
    let s2 = server.clone();
    // The first contender key's session, until the listing after it invalidates it.
    let first = std::sync::Mutex::new((None::<String>, false));
    let relay = inspecting_relay(server.addr(), move |text| {
        let mut first = first.lock().unwrap();
        if let Some(rest) = text.strip_prefix("PUT /v1/kv/enterlost/") {
            if first.0.is_none() && !rest.starts_with(".lock") {
                first.0 = Some(rest.chars().take(36).collect());
            }
        } else if text.starts_with("GET /v1/kv/enterlost?recurse") && !first.1 {
            if let Some(sid) = first.0.clone() {
                first.1 = true;
                assert!(s2.expire_session(&sid), "no session {sid}");
            }
        }
    });
    let out = conlock_at(relay)
        .args([
            "sem",
            "--limit",
            "1",
            "--prefix",
            "enterlost",
            "--timeout",
            "30s",
        ])
        .args(["--"])
        .args(marked(&ran, "true"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(ran.exists(), "{stderr}");
}

/// An agent that refuses every check-and-set of `.lock` though nothing changed it: the
/// second refusal in a row ends the run with 125 and says so (it went on until
/// `--timeout`, exit 75, or forever without one).
#[test]
fn a_lock_check_and_set_refused_for_nothing_ends_with_125() {
    let server = start_server();
    // `.lock` exists (a check-and-set at index 0 found it missing again would be a
    // creation and deletion meanwhile, which `consul lock -n` does; see below).
    let put = PutOptions {
        flags: SEMAPHORE_FLAGS,
        cas: Some(0),
        ..Default::default()
    };
    assert!(client(&server)
        .kv_put("casnever/.lock", br#"{"Limit":2,"Holders":{}}"#, put)
        .unwrap());
    let relay = inspecting_relay_with(server.addr(), |chunk| {
        let text = String::from_utf8_lossy(chunk);
        if text.starts_with("PUT /v1/kv/casnever/.lock?") {
            // An index no key has: every check-and-set fails.
            text.replacen("cas=", "cas=9999", 1).into_bytes()
        } else {
            chunk.to_vec()
        }
    });
    let out = conlock_at(relay)
        .args([
            "sem",
            "--limit",
            "2",
            "--prefix",
            "casnever",
            "--timeout",
            "30s",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{stderr}");
    assert!(stderr.contains("left it unchanged"), "{stderr}");
    assert!(stderr.contains("twice in a row"), "{stderr}");
}

/// A contender whose key is deleted by someone else between its slot's check-and-set and
/// the rewrite of its key runs no command under that session (the rewrite brings the key
/// back; a waiter that saw it gone may already count that holder's cushion, and would
/// cut it short). It goes on with a new session. (It ran under the old one: with a
/// waiter that had seen the key gone, a later `break` let that waiter start while the
/// holder's command was still inside its kill-grace.)
#[test]
fn a_contender_key_deleted_before_the_rewrite_runs_nothing_under_that_session() {
    let server = start_server();
    let dir = scratch("deleted-before-touch");
    let said = dir.join("session");
    let upstream = server.addr();
    // X's first session, and whether its slot's check-and-set went by.
    let state = std::sync::Arc::new(std::sync::Mutex::new((None::<String>, false, false)));
    let seen = state.clone();
    let relay = inspecting_relay(upstream, move |text| {
        let mut st = state.lock().unwrap();
        if text.starts_with("PUT /v1/kv/deltouch/.lock?") {
            st.1 = st.0.is_some();
        } else if let Some(rest) = text.strip_prefix("PUT /v1/kv/deltouch/") {
            let sid: String = rest.chars().take(36).collect();
            match &st.0 {
                None => st.0 = Some(sid),
                Some(first) if *first == sid && st.1 && !st.2 => {
                    // The rewrite after the slot: an operator deletes the key first.
                    st.2 = true;
                    let r = crate::common::http(
                        upstream,
                        "DELETE",
                        &format!("/v1/kv/deltouch/{sid}"),
                        None,
                        &[],
                    );
                    assert_eq!(r.status, 200);
                }
                _ => {}
            }
        }
    });
    let out = conlock_at(relay)
        .args(["sem", "-v", "--limit", "1", "--prefix", "deltouch"])
        .args([
            "--lock-delay",
            "3s",
            "--kill-grace",
            "1s",
            "--timeout",
            "60s",
            "--",
        ])
        .args(["sh", "-c"])
        .arg(format!("echo $CONLOCK_SESSION > {}", said.display()))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let ran_as = read(&said).trim().to_string();
    assert!(!ran_as.is_empty(), "the command did not run: {stderr}");
    let (first, _, deleted) = seen.lock().unwrap().clone();
    assert!(deleted, "the relay never deleted the key: {stderr}");
    assert_ne!(
        Some(ran_as),
        first,
        "ran under the session whose key was deleted: {stderr}"
    );
}

/// An agent that refuses every creation of `.lock` (a check-and-set at index 0) though it
/// stays missing: that is also what a `consul lock -n` holder that creates `.lock` and
/// deletes it on leaving looks like, so it is no puzzle (it ended in 125, a legitimate
/// race). The waiter pauses between tries and gives up at `--timeout` as busy.
#[test]
fn a_lock_created_and_deleted_meanwhile_is_no_puzzle_and_no_spin() {
    let server = start_server();
    let (relay, requests) = rewriting_relay(server.addr(), &[("&cas=0 ", "&cas=9 ")]);
    let started = std::time::Instant::now();
    let out = conlock_at(relay)
        .args([
            "sem",
            "--limit",
            "1",
            "--prefix",
            "casgone",
            "--timeout",
            "3s",
        ])
        .args(["--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{stderr}");
    assert!(!stderr.contains("twice in a row"), "{stderr}");
    let sent = requests.load(std::sync::atomic::Ordering::SeqCst);
    let secs = started.elapsed().as_secs_f64();
    // About two requests per 200 ms pause, plus the session's; far from a spin.
    assert!(
        (sent as f64) < 10.0 + 15.0 * secs,
        "{sent} requests in {secs:.1} s: {stderr}"
    );
}

/// Requests of an uncontended slot: session create, the contender key's creation, a
/// consistent read of the prefix, the `.lock` check-and-set, the rewrite of our key (the
/// fencing token), the consistent read that shows both, the monitor's two blocking
/// queries, the release's read and its check-and-set delete of `.lock` (last one out),
/// the session's destroy. The contender key goes with that destroy (behavior delete): no
/// request of its own (there was one: 12).
#[test]
fn uncontended_slot_sends_eleven_requests() {
    let server = start_server();
    let dir = scratch("semcount");
    let go = dir.join("go");
    let wait_go = until_exists(&go);
    let before = server.request_count();
    // A long lock-delay and TTL: no confirmation or renewal on a slow machine.
    let mut kid = conlock(&server)
        .args(["sem", "--limit", "2", "--prefix", "semcount"])
        .args(["--ttl", "60s", "--lock-delay", "60s", "--"])
        .args(["sh", "-c", &wait_go])
        .spawn()
        .unwrap();
    // The job ends only once the monitor's two queries are in, so the count does not
    // depend on whether the monitor got to run before a very short job ended.
    assert!(
        wait_for(LONG, || server.blocking_count() >= 2),
        "the monitor's two queries never came ({} requests)",
        server.request_count() - before
    );
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut kid, LONG).success());
    assert_eq!(server.request_count() - before, 11);
    assert!(nothing_left(&server, "semcount"));
}

/// A holder that gave its slot back leaves its contender key until its session's
/// destroy deletes it. That key, unlisted but rewritten (conlock rewrites its key only
/// once listed), is no waiter: the next contender takes the free slot at once instead of
/// waiting for the delete as if that key were ahead of it in line, and the last one out
/// still deletes `.lock`.
#[test]
fn a_released_holders_key_is_not_ahead_in_line() {
    let server = start_server();
    let c = client(&server);
    let gone = c
        .session_create(&conlock::consul::SessionRequest {
            name: "released holder".into(),
            behavior: Some("delete".into()),
            ..Default::default()
        })
        .unwrap();
    let key = format!("semghost/{gone}");
    let contender = PutOptions {
        flags: SEMAPHORE_FLAGS,
        acquire: Some(&gone),
        ..Default::default()
    };
    // Created, then rewritten after taking a slot, as a conlock holder does.
    assert!(c.kv_put(&key, b"", contender).unwrap());
    assert!(c.kv_put(&key, b"", contender).unwrap());
    let (pair, _) = c.kv_get(&key, QueryOptions::default()).unwrap();
    let pair = pair.unwrap();
    assert!(pair.modify_index > pair.create_index, "{pair:?}");
    // Its slot given back: `.lock` lists nobody.
    let lock = PutOptions {
        flags: SEMAPHORE_FLAGS,
        cas: Some(0),
        ..Default::default()
    };
    assert!(c
        .kv_put("semghost/.lock", br#"{"Limit":1,"Holders":{}}"#, lock)
        .unwrap());
    // `status` does not count it as waiting either.
    let out = conlock(&server)
        .args(["status", "--prefix", "semghost", "--json"])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["waiting"], 0, "{json}");
    let ev = scratch("semghost").join("events.jsonl");
    conlock(&server)
        .args(["sem", "--limit", "1", "--prefix", "semghost", "--events"])
        .arg(&ev)
        .args(["--", "true"])
        .assert()
        .success();
    let events = std::fs::read_to_string(&ev).unwrap();
    assert!(
        !events.contains(r#""event":"waiting""#),
        "the contender waited behind a released holder's key: {events}"
    );
    assert!(events.contains(r#""event":"acquired""#), "{events}");
    // The last one out deleted `.lock`; the released holder's key is untouched.
    let left: Vec<String> = c
        .kv_list("semghost", QueryOptions::default())
        .unwrap()
        .0
        .into_iter()
        .map(|p| p.key)
        .collect();
    assert_eq!(left, [key]);
}

/// A release that meets an election (5xx for 4 s) spends the cleanup budget, so the
/// session's destroy is skipped: the release itself deletes the contender key then,
/// retried as the rest of it is, instead of leaving it (unlisted, rewritten) to the
/// session's TTL, where an older conlock's waiter counts it ahead of it in line.
#[test]
fn a_release_through_an_election_deletes_its_contender_key() {
    let server = start_server();
    let dir = scratch("sem-elect");
    let go = dir.join("go");
    let mut kid = conlock(&server)
        .args([
            "sem",
            "--limit",
            "1",
            "--prefix",
            "sem-elect",
            "--ttl",
            "60s",
            "--",
        ])
        .args(["sh", "-c", &until_exists(&go)])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Holding: the command's monitor and the slot's watch are in.
    assert!(wait_for(LONG, || server.blocking_count() >= 2));
    server.fault(
        conlock::devserver::FaultMode::Error,
        Duration::from_millis(4000),
    );
    std::fs::write(&go, "").unwrap();
    let st = wait_exit(&mut kid, LONG);
    let mut err = String::new();
    std::io::Read::read_to_string(kid.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(st.success(), "{err}");
    let left: Vec<String> = client(&server)
        .kv_list("sem-elect", QueryOptions::default())
        .unwrap()
        .0
        .into_iter()
        .map(|p| p.key)
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}\n{err}");
}

/// A waiter whose contender key's creation landed but whose answer was lost does not
/// write it again (it reads it first): a second write would make its key look rewritten,
/// a departed holder's, and the waiters behind it would pass it in line.
#[test]
fn a_contender_key_whose_answer_was_lost_is_not_written_twice() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let server = start_server();
    let c = client(&server);
    let dir = scratch("sem-lost-answer");
    let go = dir.join("go");
    let mut h = KillOnDrop(
        conlock(&server)
            .args(["sem", "--limit", "1", "--prefix", "semlost", "--"])
            .args(["sh", "-c", &until_exists(&go)])
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || server.blocking_count() >= 2));
    let muted = Arc::new(AtomicUsize::new(0));
    let m2 = muted.clone();
    let proxy = fault_proxy(server.addr().to_string(), move |req| {
        if bytes_contain(req, b"PUT /v1/kv/semlost/")
            && bytes_contain(req, b"acquire=")
            && m2.fetch_add(1, Ordering::SeqCst) == 0
        {
            return Fault::MuteAnswers;
        }
        Fault::Forward
    });
    let addr = proxy.trim_start_matches("http://").parse().unwrap();
    let mut w = KillOnDrop(
        conlock_at(addr)
            .args(["sem", "--limit", "1", "--prefix", "semlost", "--", "true"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // Waiting: its key is in, and its watch after the retried creation.
    assert!(wait_for(LONG, || muted.load(Ordering::SeqCst) >= 1
        && server.blocking_count() >= 3));
    let keys = c.kv_list("semlost/", QueryOptions::default()).unwrap().0;
    let waiter: Vec<_> = keys
        .iter()
        .filter(|p| !p.key.ends_with("/.lock"))
        .max_by_key(|p| p.create_index)
        .into_iter()
        .collect();
    assert_eq!(waiter.len(), 1, "{keys:?}");
    let shown: Vec<_> = keys
        .iter()
        .map(|p| (&p.key, p.create_index, p.modify_index))
        .collect();
    assert_eq!(
        waiter[0].modify_index, waiter[0].create_index,
        "the waiter's key was written twice: {shown:?}"
    );
    std::fs::write(&go, "").unwrap();
    assert!(wait_exit(&mut h.0, LONG).success());
    let st = wait_exit(&mut w.0, LONG);
    let mut err = String::new();
    std::io::Read::read_to_string(w.0.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert!(st.success(), "{err}");
}
