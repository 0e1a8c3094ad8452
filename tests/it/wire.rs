//! Wire compatibility with `consul lock`: what conlock writes matches what the real
//! `consul lock` wrote (tests/fixtures/consul-1.0.8/09-consul-lock-wire.json), and
//! holders written the way `consul lock` writes them exclude conlock.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use conlock::consul::{PutOptions, QueryOptions, SessionRequest, LOCK_FLAGS, SEMAPHORE_FLAGS};
use serde_json::Value;

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(60);

fn recorded() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/consul-1.0.8/09-consul-lock-wire.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("recorded JSON")
}

fn recorded_key(rec: &Value, key: &str) -> Value {
    rec["kv"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["Key"] == key)
        .unwrap()
        .clone()
}

fn recorded_session(rec: &Value, id: &str) -> Value {
    rec["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["ID"] == id)
        .unwrap()
        .clone()
}

/// The session fields that `consul lock` fixes: TTL, lock-delay, behavior, checks.
fn session_shape(s: &Value) -> (Value, Value, Value, Value) {
    (
        s["TTL"].clone(),
        s["LockDelay"].clone(),
        s["Behavior"].clone(),
        s["Checks"].clone(),
    )
}

fn live_session(server: &conlock::devserver::DevServer, id: &str) -> Value {
    let (s, _) = client(server)
        .session_info(id, QueryOptions::default())
        .unwrap();
    serde_json::to_value(s.unwrap()).unwrap()
}

#[test]
fn lock_mode_writes_what_consul_lock_writes() {
    let rec = recorded();
    let want_key = recorded_key(&rec, "wire/lock/.lock");
    let want_session = recorded_session(&rec, want_key["Session"].as_str().unwrap());
    assert_eq!(want_key["Flags"].as_u64(), Some(LOCK_FLAGS));

    let server = start_server();
    let mut h = conlock(&server)
        .args(["run", "--prefix", "wire/lock", "--", "sleep", "60"])
        .spawn()
        .unwrap();
    let c = client(&server);
    assert!(wait_for(LONG, || holder(&c, "wire/lock/.lock").is_some()));
    let pair = c
        .kv_get("wire/lock/.lock", QueryOptions::default())
        .unwrap()
        .0
        .unwrap();
    assert_eq!(pair.flags, LOCK_FLAGS);
    assert_eq!(pair.lock_index, want_key["LockIndex"].as_u64().unwrap());
    let session = live_session(&server, pair.holder().unwrap());
    assert_eq!(session_shape(&session), session_shape(&want_session));
    signal(h.id(), libc::SIGTERM);
    wait_exit(&mut h, LONG);
}

#[test]
fn semaphore_mode_writes_what_consul_lock_n_writes() {
    let rec = recorded();
    let want_lock = recorded_key(&rec, "wire/sem/.lock");
    let want_contender = recorded_key(&rec, "wire/sem/S1");
    let want_session = recorded_session(&rec, "S1");
    let decoded: Value =
        serde_json::from_str(want_lock["Value_decoded"].as_str().unwrap()).unwrap();
    assert_eq!(want_lock["Flags"].as_u64(), Some(SEMAPHORE_FLAGS));

    let server = start_server();
    let mut kids: Vec<_> = (0..2)
        .map(|_| {
            conlock(&server)
                .args([
                    "sem", "-n", "2", "--prefix", "wire/sem", "--", "sleep", "60",
                ])
                .spawn()
                .unwrap()
        })
        .collect();
    let c = client(&server);
    let lock = || {
        c.kv_get("wire/sem/.lock", QueryOptions::default())
            .unwrap()
            .0
    };
    assert!(wait_for(LONG, || lock().is_some_and(|l| {
        serde_json::from_slice::<Value>(l.value_bytes())
            .is_ok_and(|v| v["Holders"].as_object().is_some_and(|h| h.len() == 2))
    })));
    let l = lock().unwrap();
    assert_eq!(l.flags, SEMAPHORE_FLAGS);
    assert_eq!(
        l.holder(),
        None,
        "consul lock does not hold .lock with a session"
    );
    let value: Value = serde_json::from_slice(l.value_bytes()).unwrap();
    // Same document shape: {"Limit":2,"Holders":{"<session>":true,...}}, in the same field order.
    assert_eq!(value["Limit"], decoded["Limit"]);
    assert!(value["Holders"]
        .as_object()
        .unwrap()
        .values()
        .all(|v| v == &Value::Bool(true)));
    assert!(String::from_utf8_lossy(l.value_bytes()).starts_with("{\"Limit\":2,\"Holders\":{"));
    for sid in value["Holders"].as_object().unwrap().keys() {
        let contender = c
            .kv_get(&format!("wire/sem/{sid}"), QueryOptions::default())
            .unwrap()
            .0
            .unwrap();
        assert_eq!(contender.flags, want_contender["Flags"].as_u64().unwrap());
        assert_eq!(contender.holder(), Some(sid.as_str()));
        assert_eq!(
            contender.lock_index,
            want_contender["LockIndex"].as_u64().unwrap()
        );
        assert_eq!(
            session_shape(&live_session(&server, sid)),
            session_shape(&want_session)
        );
    }
    for k in &mut kids {
        signal(k.id(), libc::SIGTERM);
        wait_exit(k, LONG);
    }
}

/// A session like the ones `consul lock` creates (TTL 15s, lock-delay 15s).
fn consul_lock_session(server: &conlock::devserver::DevServer, behavior: &str) -> String {
    client(server)
        .session_create(&SessionRequest {
            name: "Consul lock for 'sleep 3' at 'x'".into(),
            ttl: Some("15s".into()),
            lock_delay: Some("15s".into()),
            behavior: Some(behavior.into()),
            ..Default::default()
        })
        .unwrap()
}

#[test]
fn a_consul_lock_holder_excludes_conlock() {
    let server = start_server();
    let c = client(&server);
    let s = consul_lock_session(&server, "release");
    let put = PutOptions {
        flags: LOCK_FLAGS,
        acquire: Some(&s),
        ..Default::default()
    };
    // consul lock acquires with an empty value (recorded Value null).
    assert!(c.kv_put("cl/.lock", b"", put).unwrap());
    let st = conlock(&server)
        .args(["run", "--prefix", "cl", "--timeout", "0s", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(75));
    // consul lock releases voluntarily: conlock gets it at once (no lock-delay).
    let rel = PutOptions {
        flags: LOCK_FLAGS,
        release: Some(&s),
        ..Default::default()
    };
    assert!(c.kv_put("cl/.lock", b"", rel).unwrap());
    let st = conlock(&server)
        .args(["run", "--prefix", "cl", "--timeout", "0s", "--", "true"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(0));
}

#[test]
fn consul_lock_n_holders_exclude_conlock_sem() {
    let server = start_server();
    let c = client(&server);
    let sessions: Vec<String> = (0..2)
        .map(|_| consul_lock_session(&server, "delete"))
        .collect();
    for s in &sessions {
        let put = PutOptions {
            flags: SEMAPHORE_FLAGS,
            acquire: Some(s),
            ..Default::default()
        };
        assert!(c.kv_put(&format!("cln/{s}"), b"", put).unwrap());
    }
    let doc = format!(
        "{{\"Limit\":2,\"Holders\":{{\"{}\":true,\"{}\":true}}}}",
        sessions[0], sessions[1]
    );
    let put = PutOptions {
        flags: SEMAPHORE_FLAGS,
        cas: Some(0),
        ..Default::default()
    };
    assert!(c.kv_put("cln/.lock", doc.as_bytes(), put).unwrap());
    let run = |limit: &str| {
        conlock(&server)
            .args([
                "sem",
                "--limit",
                limit,
                "--prefix",
                "cln",
                "--timeout",
                "0s",
                "--",
                "true",
            ])
            .status()
            .unwrap()
            .code()
    };
    assert_eq!(
        run("2"),
        Some(75),
        "two consul lock -n 2 holders fill the slots"
    );
    assert_eq!(run("3"), Some(125), "a different limit is a conflict");
    // One consul lock holder dies: its contender key goes (behavior delete). Its command
    // may still run (consul lock does not stop it in time), and it recorded no lock-delay,
    // so conlock gives it Consul's 60 s cap before taking its slot (docs/safety.md).
    c.session_destroy(&sessions[0]).unwrap();
    assert_eq!(
        run("2"),
        Some(75),
        "a vanished holder's slot was taken at once"
    );
    let v: Value = serde_json::from_slice(
        c.kv_get("cln/.lock", QueryOptions::default())
            .unwrap()
            .0
            .unwrap()
            .value_bytes(),
    )
    .unwrap();
    assert_eq!(v["Holders"].as_object().unwrap().len(), 2, "{v}");
}

/// Runs `args -- true` through an agent that stores other flags than it was sent (as
/// Consul before 1.7 did with 64-bit flags in a `/v1/txn` body, recorded in 12-txn: the
/// flags conlock sends are rounded the same way, in the query string and in any JSON
/// body). It must end with 125, within `most` requests, naming both flags.
fn on_a_rounding_agent(args: &[&str], most: usize, stored: &str, expected: &str) -> String {
    let server = start_server();
    let (addr, requests) = rewriting_relay(
        server.addr(),
        &[
            ("3304740253564472344", "3304740253564472320"),
            ("16210313421097356768", "16210313421097357312"),
        ],
    );
    let mut cmd = conlock_at(addr);
    cmd.args(args).args(["--timeout", "20s", "--", "true"]);
    let out = assert_cmd::Command::from_std(cmd)
        .timeout(LONG)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(125), "stderr: {stderr}");
    let sent = requests.load(Ordering::SeqCst);
    assert!(
        sent <= most,
        "{sent} requests before giving up; stderr: {stderr}"
    );
    // What Consul answered, and what was expected.
    assert!(stderr.contains(stored), "{stderr}");
    assert!(stderr.contains(expected), "{stderr}");
    stderr
}

/// A semaphore on such an agent never finds its own contender key: it must give up with
/// exit 125 and say what Consul stored, after a handful of requests (the txn-era code
/// rewrote the key in a loop with no pause: 7,170 raft writes in 2 s on a real agent).
#[test]
fn a_semaphore_on_an_agent_that_changes_flags_ends_with_125_without_hammering() {
    let stderr = on_a_rounding_agent(
        &["sem", "--limit", "2", "--prefix", "rounds/sem"],
        12,
        "0xe0f69a2baa415000",
        "0xe0f69a2baa414de0",
    );
    assert!(stderr.contains("twice in a row"), "{stderr}");
}

/// A lock on such an agent: exit 125 naming the flags found and expected, no loop.
#[test]
fn a_lock_on_an_agent_that_changes_flags_ends_with_125_without_hammering() {
    on_a_rounding_agent(
        &["run", "--key", "rounds/lock"],
        10,
        "0x2ddccbc058a50c00",
        "0x2ddccbc058a50c18",
    );
}

/// The one Consul error text conlock branches on ("invalid session", to replace a
/// session that is gone) is pinned to what a real agent answered an acquire with an
/// unknown session (05-lock-acquire-release), and the client sorts that answer so.
#[test]
fn the_invalid_session_text_is_the_recorded_one() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/consul-1.0.8/05-lock-acquire-release.json");
    let rec: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let step = rec["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["request"]["path"]
                .as_str()
                .is_some_and(|p| p.contains("acquire=00000000-0000-0000-0000-000000000000"))
        })
        .expect("the recorded acquire with an unknown session");
    assert_eq!(step["response"]["status"], 500);
    let recorded = step["response"]["body"].as_str().unwrap().to_string();
    let real = conlock::consul::ConsulError::Server {
        what: "acquire".into(),
        status: 500,
        body: recorded.clone(),
    };
    assert!(conlock::claim::is_invalid_session(&real), "{recorded}");

    // The same answer through the client, from the dev server (which replays 05).
    let server = start_server();
    let put = PutOptions {
        flags: LOCK_FLAGS,
        acquire: Some("00000000-0000-0000-0000-000000000000"),
        ..Default::default()
    };
    let err = client(&server)
        .kv_put("pinned/k", b"v", put)
        .expect_err("an unknown session cannot acquire");
    assert!(conlock::claim::is_invalid_session(&err), "{err}");
    assert!(err.to_string().contains(&recorded), "{err} vs {recorded}");
}
