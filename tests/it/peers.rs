//! The cron features peers have (--min-hold, --max-time, --events), lock-delay aware
//! waiting, and a bounded cleanup after the agent froze.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use assert_cmd::prelude::*;
use conlock::consul::{PutOptions, SessionRequest, LOCK_FLAGS};
use conlock::devserver::DevServer;
use predicates::str::contains;
use serde_json::Value;

use crate::common::start_server;
use crate::harness::*;

const LONG: Duration = Duration::from_secs(60);

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn read_ns(path: &Path) -> u128 {
    read(path).trim().parse().expect("a ns timestamp")
}

/// The `S <id> <ns>` start timestamps in `log`, in order.
fn starts(log: &str) -> Vec<u128> {
    log.lines()
        .filter(|l| l.starts_with("S "))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------
// --events: a small JSON Schema check (the subset docs/events.schema.json uses).

fn schema() -> Value {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/events.schema.json"
    ))
    .unwrap();
    serde_json::from_str(&text).unwrap()
}

fn type_ok(v: &Value, t: &Value) -> bool {
    let one = |t: &str| match t {
        "string" => v.is_string(),
        "integer" => v.is_u64() || v.is_i64(),
        "null" => v.is_null(),
        "object" => v.is_object(),
        other => panic!("schema type {other} not handled by this check"),
    };
    match t {
        Value::String(s) => one(s),
        Value::Array(a) => a.iter().any(|t| one(t.as_str().unwrap())),
        _ => panic!("bad type {t}"),
    }
}

/// Checks `v` against one (sub)schema: type, const, enum, minimum, maximum, required,
/// properties, additionalProperties and oneOf. Returns what is wrong.
fn check(v: &Value, s: &Value) -> Result<(), String> {
    if s == &Value::Bool(true) {
        return Ok(());
    }
    if let Some(t) = s.get("type") {
        if !type_ok(v, t) {
            return Err(format!("{v} is not of type {t}"));
        }
    }
    if let Some(c) = s.get("const") {
        if v != c {
            return Err(format!("{v} is not {c}"));
        }
    }
    if let Some(e) = s.get("enum").and_then(Value::as_array) {
        if !e.contains(v) {
            return Err(format!("{v} is not one of {e:?}"));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_i64), v.as_i64()) {
        if n < min {
            return Err(format!("{n} < {min}"));
        }
    }
    if let (Some(max), Some(n)) = (s.get("maximum").and_then(Value::as_i64), v.as_i64()) {
        if n > max {
            return Err(format!("{n} > {max}"));
        }
    }
    if let Some(format) = s.get("format").and_then(Value::as_str) {
        if format == "date-time" && v.is_string() {
            let t = v.as_str().unwrap();
            if t.len() != 24 || !t.ends_with('Z') || &t[10..11] != "T" {
                return Err(format!("{t} is not an RFC 3339 UTC timestamp"));
            }
        }
    }
    let obj = v.as_object();
    if let (Some(req), Some(o)) = (s.get("required").and_then(Value::as_array), obj) {
        for r in req {
            if !o.contains_key(r.as_str().unwrap()) {
                return Err(format!("missing {r} in {v}"));
            }
        }
    }
    if let (Some(props), Some(o)) = (s.get("properties").and_then(Value::as_object), obj) {
        for (k, sub) in props {
            if let Some(x) = o.get(k) {
                check(x, sub).map_err(|e| format!("{k}: {e}"))?;
            }
        }
        if s.get("additionalProperties") == Some(&Value::Bool(false)) {
            if let Some(extra) = o.keys().find(|k| !props.contains_key(*k)) {
                return Err(format!("unexpected field {extra} in {v}"));
            }
        }
    }
    if let Some(branches) = s.get("oneOf").and_then(Value::as_array) {
        let ok: Vec<_> = branches.iter().filter(|b| check(v, b).is_ok()).collect();
        if ok.len() != 1 {
            let why: Vec<_> = branches.iter().filter_map(|b| check(v, b).err()).collect();
            return Err(format!("{v} matches {} branches: {why:?}", ok.len()));
        }
    }
    Ok(())
}

/// Parses every line of an events file, checks each against the schema, the target and
/// the time order, and returns them.
fn events(path: &Path, kind: &str, target: &str) -> Vec<Value> {
    let text = read(path);
    assert!(text.ends_with('\n'), "events end with a newline: {text:?}");
    let schema = schema();
    let mut last_time = String::new();
    text.lines()
        .map(|l| {
            let v: Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line ({e}): {l:?}"));
            // The common fields lead, in the documented order.
            let order: Vec<usize> = [
                "\"time\":",
                ",\"event\":",
                ",\"kind\":",
                ",\"target\":",
                ",\"pid\":",
                ",\"host\":",
                ",\"command\":",
            ]
            .iter()
            .map(|k| l.find(k).unwrap_or_else(|| panic!("no {k} in {l}")))
            .collect();
            assert!(
                l.starts_with("{\"time\":") && order.windows(2).all(|w| w[0] < w[1]),
                "{l}"
            );
            if let Err(e) = check(&v, &schema) {
                panic!("event does not match docs/events.schema.json: {e}");
            }
            assert_eq!(v["kind"], kind, "{l}");
            assert_eq!(v["target"], target, "{l}");
            let t = v["time"].as_str().unwrap().to_string();
            assert!(t >= last_time, "events out of time order: {text}");
            last_time = t;
            v
        })
        .collect()
}

fn names(evs: &[Value]) -> Vec<&str> {
    evs.iter().map(|e| e["event"].as_str().unwrap()).collect()
}

#[test]
fn schema_check_rejects_what_it_should() {
    let s = schema();
    let ok = serde_json::json!({"time": "2026-11-22T05:00:00.000Z", "event": "lost",
        "kind": "lock", "target": "k", "pid": 7, "host": "h", "command": "job",
        "reason": "gone"});
    assert_eq!(check(&ok, &s), Ok(()));
    let mut extra = ok.clone();
    extra["surprise"] = 1.into();
    assert!(check(&extra, &s).is_err());
    for field in ["reason", "host", "command"] {
        let mut missing = ok.clone();
        missing.as_object_mut().unwrap().remove(field);
        assert!(check(&missing, &s).is_err(), "without {field}");
    }
    let mut bad_how = serde_json::json!({"time": "2026-11-22T05:00:00.000Z", "event": "exit",
        "kind": "lock", "target": "k", "pid": 7, "host": "h", "command": "job", "code": 0,
        "how": "exited", "ran_ms": 5});
    assert_eq!(check(&bad_how, &s), Ok(()));
    bad_how["how"] = "vanished".into();
    assert!(check(&bad_how, &s).is_err());
}

#[test]
fn events_acquire_release_exit() {
    let server = start_server();
    let dir = scratch("ev-ok");
    let ev = dir.join("events.jsonl");
    let out = conlock(&server)
        .args(["run", "--key", "ev/ok", "--events"])
        .arg(&ev)
        .args(["--", "sh", "-c", "echo \"$CONLOCK_MODIFY_INDEX\"; exit 7"])
        .assert()
        .code(7);
    let evs = events(&ev, "lock", "ev/ok");
    assert_eq!(names(&evs), ["acquired", "released", "exit"], "{evs:?}");
    let token: u64 = String::from_utf8_lossy(&out.get_output().stdout)
        .trim()
        .parse()
        .unwrap();
    assert_eq!(evs[0]["fencing_token"], token);
    assert_eq!(evs[0]["lock_index"], 1);
    assert_eq!(evs[0]["session"], evs[1]["session"]);
    assert_eq!(evs[2]["code"], 7);
    assert_eq!(evs[2]["how"], "exited");
    // Who ran what, in every line; how long the command ran, in `exit`.
    let host = conlock::app::hostname();
    for e in &evs {
        assert_eq!(e["host"], host.as_str(), "{e}");
        assert_eq!(
            e["command"], "sh -c echo \"$CONLOCK_MODIFY_INDEX\"; exit 7",
            "{e}"
        );
    }
    assert!(evs[2]["ran_ms"].as_u64().is_some(), "{}", evs[2]);
    // The file is appended to: a second run adds its own lines.
    conlock(&server)
        .args(["run", "--key", "ev/ok", "--events"])
        .arg(&ev)
        .args(["--", "sh", "-c", "kill -USR1 $$"])
        .assert()
        .code(128 + libc::SIGUSR1);
    let evs = events(&ev, "lock", "ev/ok");
    assert_eq!(evs.len(), 6);
    assert_eq!(evs[5]["how"], "signal");
    assert_eq!(evs[5]["signal"], libc::SIGUSR1);
}

#[test]
fn events_busy() {
    let server = start_server();
    let holder = KillOnDrop(start_holder(&server, "ev/busy", &[], "sleep 60"));
    let dir = scratch("ev-busy");
    let ev = dir.join("events.jsonl");
    conlock(&server)
        .args(["run", "--key", "ev/busy", "--timeout", "0s", "--events"])
        .arg(&ev)
        .args(["--", "true"])
        .assert()
        .code(75);
    let evs = events(&ev, "lock", "ev/busy");
    assert_eq!(names(&evs), ["waiting", "exit"], "{evs:?}");
    let sid = crate::harness::holder(&client(&server), "ev/busy").unwrap();
    assert_eq!(evs[0]["holder_session"], sid.as_str());
    assert!(
        evs[0]["holder"].as_str().unwrap().contains("pid"),
        "{evs:?}"
    );
    assert_eq!(evs[1]["code"], 75);
    assert_eq!(evs[1]["how"], "busy");
    // The command never started.
    assert_eq!(evs[1]["ran_ms"], Value::Null, "{}", evs[1]);
    drop(holder);
}

#[test]
fn events_loss_and_stderr() {
    let server = start_server();
    let dir = scratch("ev-lost");
    let marker = dir.join("running");
    // `-`: the events go to stderr; stdout stays the command's.
    let child = conlock(&server)
        .args([
            "sem", "--limit", "2", "--prefix", "ev/lost", "--events", "-",
        ])
        .arg("--")
        .args(marked(&marker, "echo out; sleep 60"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(wait_for(LONG, || marker.exists()));
    let c = client(&server);
    let sid = c
        .session_list(conlock::consul::QueryOptions::default())
        .unwrap()
        .0[0]
        .id
        .clone();
    assert!(server.expire_session(&sid));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(124));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    let err = String::from_utf8_lossy(&out.stderr);
    let ev = dir.join("from-stderr.jsonl");
    let json: String = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&ev, json).unwrap();
    let evs = events(&ev, "semaphore", "ev/lost");
    assert_eq!(names(&evs), ["acquired", "lost", "exit"], "{err}");
    assert!(!evs[1]["reason"].as_str().unwrap().is_empty());
    assert_eq!(evs[2]["code"], 124);
    assert_eq!(evs[2]["how"], "lost");
}

#[test]
fn events_to_an_inherited_descriptor_and_bad_paths() {
    let server = start_server();
    let dir = scratch("ev-fd");
    let ev = dir.join("events.jsonl");
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "exec \"$0\" run --key ev/fd --events fd:3 -- true 3>{}",
            ev.display()
        ))
        .arg(BIN)
        .env("CONSUL_HTTP_ADDR", server.addr().to_string())
        .assert()
        .success();
    assert_eq!(
        names(&events(&ev, "lock", "ev/fd")),
        ["acquired", "released", "exit"]
    );
    let before = server.request_count();
    for bad in ["/nonexistent-dir/e.jsonl", "fd:57", "fd:x", ""] {
        conlock(&server)
            .args(["run", "--key", "ev/fd", "--events", bad, "--", "true"])
            .assert()
            .code(125)
            .stderr(contains("--events"));
    }
    assert_eq!(server.request_count(), before, "bad --events sent requests");
}

// ---------------------------------------------------------------------------------------
// --min-hold

#[test]
fn min_hold_keeps_the_lock_after_a_short_command() {
    let server = start_server();
    let dir = scratch("minhold");
    let log = dir.join("log");
    let first = conlock(&server)
        .args(["run", "--key", "mh/k", "--min-hold", "2s", "--", "sh", "-c"])
        .arg(format!("{}; exit 3", logged_job(&log, "sleep 0.1")))
        .spawn()
        .unwrap();
    let mut first = KillOnDrop(first);
    assert!(wait_for(LONG, || starts(&read(&log)).len() == 1));
    let second = conlock(&server)
        .args(["run", "--key", "mh/k", "--", "sh", "-c"])
        .arg(logged_job(&log, "true"))
        .spawn()
        .unwrap();
    let mut second = KillOnDrop(second);
    assert_eq!(wait_exit(&mut first.0, LONG).code(), Some(3));
    assert_eq!(wait_exit(&mut second.0, LONG).code(), Some(0));
    let s = starts(&read(&log));
    assert_eq!(s.len(), 2);
    let gap = s[1] - s[0];
    assert!(
        gap >= 2_000_000_000,
        "second child started {} ms after the first, inside --min-hold 2s",
        gap / 1_000_000
    );
    eprintln!(
        "min-hold 2s: second start {} ms after first",
        gap / 1_000_000
    );
}

/// Starts a `--min-hold` holder whose command exits at once, and waits until conlock is
/// in the min-hold (its -v line says so).
fn in_min_hold(server: &DevServer, key: &str, dir: &Path, code: i32) -> KillOnDrop {
    let err = dir.join("stderr");
    let child = conlock(server)
        .args(["run", "-v", "--key", key, "--min-hold", "60s", "--"])
        .args(["sh", "-c", &format!("exit {code}")])
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    assert!(
        wait_for(LONG, || read(&err).contains("--min-hold")),
        "{}",
        read(&err)
    );
    KillOnDrop(child)
}

#[test]
fn min_hold_ends_at_once_on_a_terminating_signal() {
    let server = start_server();
    let dir = scratch("minhold-sig");
    let mut c = in_min_hold(&server, "mh/sig", &dir, 4);
    assert!(crate::harness::holder(&client(&server), "mh/sig").is_some());
    let t = Instant::now();
    signal(c.0.id(), libc::SIGTERM);
    // The command's own code, not 128+15: the command had finished.
    assert_eq!(wait_exit(&mut c.0, LONG).code(), Some(4));
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    assert_eq!(crate::harness::holder(&client(&server), "mh/sig"), None);
}

#[test]
fn min_hold_loss_counts_as_a_loss() {
    let server = start_server();
    let dir = scratch("minhold-loss");
    let mut c = in_min_hold(&server, "mh/loss", &dir, 0);
    let sid = crate::harness::holder(&client(&server), "mh/loss").unwrap();
    assert!(server.expire_session(&sid));
    assert_eq!(wait_exit(&mut c.0, LONG).code(), Some(124));
    assert!(read(&dir.join("stderr")).contains("lost during --min-hold"));
}

// ---------------------------------------------------------------------------------------
// --max-time

#[test]
fn max_time_stops_the_whole_group_with_its_own_code() {
    let server = start_server();
    let dir = scratch("maxtime");
    let (marker, term, bg) = (dir.join("running"), dir.join("term"), dir.join("bg"));
    let ev = dir.join("events.jsonl");
    let t = Instant::now();
    let mut c = KillOnDrop(
        conlock(&server)
            .args([
                "run",
                "--key",
                "mt/k",
                "--max-time",
                "1s",
                "--kill-grace",
                "2s",
            ])
            .arg("--events")
            .arg(&ev)
            .arg("--")
            .args(marked(
                &marker,
                &format!(
                    "trap 'echo TERM > {}; exit 0' TERM; sleep 60 & echo $! > {}; wait",
                    term.display(),
                    bg.display()
                ),
            ))
            .spawn()
            .unwrap(),
    );
    assert_eq!(wait_exit(&mut c.0, LONG).code(), Some(123));
    let took = t.elapsed();
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert_eq!(read(&term).trim(), "TERM", "the command got --kill-signal");
    let bg: i32 = read(&bg).trim().parse().unwrap();
    assert!(
        wait_for(Duration::from_secs(10), || !process_alive(bg)),
        "background process survived"
    );
    assert_eq!(crate::harness::holder(&client(&server), "mt/k"), None);
    let evs = events(&ev, "lock", "mt/k");
    assert_eq!(names(&evs), ["acquired", "released", "exit"]);
    assert_eq!(evs[2]["how"], "max-time");
    assert_eq!(evs[2]["code"], 123);
}

#[test]
fn max_time_sigkills_a_command_that_ignores_the_signal() {
    let server = start_server();
    let dir = scratch("maxtime-kill");
    let marker = dir.join("running");
    let mut c = KillOnDrop(
        conlock(&server)
            .args(["sem", "-n", "1", "--prefix", "mt/s", "--max-time", "500ms"])
            .args(["--kill-grace", "500ms", "--"])
            .args(marked(
                &marker,
                "trap '' TERM; while :; do sleep 0.05; done",
            ))
            .spawn()
            .unwrap(),
    );
    assert_eq!(wait_exit(&mut c.0, LONG).code(), Some(123));
    // A command that finishes in time keeps its own code.
    conlock(&server)
        .args([
            "run",
            "--key",
            "mt/fast",
            "--max-time",
            "30s",
            "--",
            "sh",
            "-c",
            "exit 9",
        ])
        .assert()
        .code(9);
    conlock(&server)
        .args(["run", "--key", "mt/fast", "--max-time", "0s", "--", "true"])
        .assert()
        .code(125);
}

// ---------------------------------------------------------------------------------------
// Lock-delay: a waiter sleeps until it ends instead of polling.

/// A session with `lock_delay` holding `key`, made through the API so that the request
/// counter sees only the waiter afterwards.
fn api_holder(server: &DevServer, key: &str, lock_delay: &str) -> String {
    let c = client(server);
    let sid = c
        .session_create(&SessionRequest {
            name: "api holder".into(),
            lock_delay: Some(lock_delay.into()),
            ..Default::default()
        })
        .unwrap();
    let put = PutOptions {
        flags: LOCK_FLAGS,
        acquire: Some(&sid),
        ..Default::default()
    };
    assert!(c.kv_put(key, b"api", put).unwrap());
    sid
}

#[test]
fn waiter_sleeps_through_a_known_lock_delay() {
    let server = start_server();
    let dir = scratch("lockdelay");
    let (start, ev, err) = (
        dir.join("start"),
        dir.join("events.jsonl"),
        dir.join("stderr"),
    );
    let sid = api_holder(&server, "ld/k", "6s");
    let mut w = KillOnDrop(
        conlock(&server)
            // A TTL below twice the wait: the session is renewed once on acquiring, and
            // the renew thread must not renew it again at once.
            .args(["run", "-v", "--key", "ld/k", "--ttl", "10s", "--events"])
            .arg(&ev)
            .args(["--", "sh", "-c"])
            .arg(format!(
                "date +%s%N > {}.tmp; mv {0}.tmp {0}; sleep 2",
                start.display()
            ))
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || read(&ev).contains("\"waiting\"")));
    // Let the waiter's blocking query settle before counting.
    let mut last = server.request_count();
    assert!(wait_for(LONG, || {
        std::thread::sleep(Duration::from_millis(200));
        let now = server.request_count();
        std::mem::replace(&mut last, now) == now
    }));
    let before = server.request_count();
    let t0 = now_ns();
    assert!(server.expire_session(&sid));
    let t1 = now_ns();
    // Requests while the delay runs (sampled shortly before its end).
    std::thread::sleep(Duration::from_millis(5500));
    let during = server.request_count() - before;
    assert!(wait_for(LONG, || start.exists()));
    let to_start = server.request_count() - before;
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    let began = read_ns(&start);
    let delay_end = t1 + 6_000_000_000;
    assert!(
        began >= t0 + 6_000_000_000,
        "child started inside the lock-delay"
    );
    let late_ms = began.saturating_sub(delay_end) as f64 / 1e6;
    eprintln!(
        "lock-delay 6s: {during} requests during the delay, {to_start} until the child ran, child started {late_ms:.1} ms after the delay ended"
    );
    assert!(during <= 5, "{during} requests during a 6 s lock-delay");
    // The refused acquire and the look that finds no holder; after the delay a read (is
    // it still free, and a lock?), the acquire, its read-back and one renewal; and the
    // monitor's first query, 50 ms after the spawn, when this count is read after it.
    assert!(to_start <= 7, "{to_start} requests until the child ran");
    assert!(
        late_ms <= 500.0,
        "child started {late_ms} ms after the lock-delay"
    );
    // Said where people and programs look.
    assert!(
        read(&err).contains("free, in lock-delay until about"),
        "{}",
        read(&err)
    );
    let evs = events(&ev, "lock", "ld/k");
    assert_eq!(
        names(&evs),
        ["waiting", "waiting", "acquired", "released", "exit"],
        "{evs:?}"
    );
    assert_eq!(evs[0]["holder_session"], sid.as_str());
    assert!(evs[1]["lock_delay_until"].is_string(), "{evs:?}");
}

#[test]
fn waiter_arriving_during_a_lock_delay_backs_off() {
    let server = start_server();
    let dir = scratch("lockdelay-late");
    let start = dir.join("start");
    let sid = api_holder(&server, "ld/late", "3s");
    let before = server.request_count();
    let t1 = now_ns();
    assert!(server.expire_session(&sid));
    let mut w = KillOnDrop(
        conlock(&server)
            .args(["run", "--key", "ld/late", "--", "sh", "-c"])
            .arg(format!(
                "date +%s%N > {}.tmp; mv {0}.tmp {0}; sleep 1",
                start.display()
            ))
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || start.exists()));
    let to_start = server.request_count() - before;
    assert_eq!(wait_exit(&mut w.0, LONG).code(), Some(0));
    let late_ms = read_ns(&start).saturating_sub(t1 + 3_000_000_000) as f64 / 1e6;
    eprintln!("unseen lock-delay 3s: {to_start} requests until the child ran, started {late_ms:.1} ms after the delay");
    assert!(
        to_start <= 40,
        "{to_start} requests during a 3 s lock-delay"
    );
    assert!(late_ms <= 1500.0, "{late_ms} ms late");
}

// ---------------------------------------------------------------------------------------
// Cleanup after the agent froze is bounded.

#[test]
fn cleanup_after_a_frozen_agent_is_bounded() {
    let server = start_server();
    let dir = scratch("frozen");
    let (marker, term) = (dir.join("running"), dir.join("term"));
    let mut c = KillOnDrop(
        conlock(&server)
            .args([
                "run",
                "--key",
                "fz/k",
                "--ttl",
                "10s",
                "--kill-grace",
                "1s",
                "--",
            ])
            .args(marked(
                &marker,
                &format!(
                    "trap 'date +%s%N > {}; exit 0' TERM; sleep 60 & wait",
                    term.display()
                ),
            ))
            .spawn()
            .unwrap(),
    );
    assert!(wait_for(LONG, || marker.exists()));
    fault(&server, "hang", "");
    // The local deadline (TTL - margin after the last renewal) stops the command.
    let st = wait_exit(&mut c.0, LONG);
    let exited = now_ns();
    fault(&server, "none", "");
    assert_eq!(st.code(), Some(124));
    let stopped = read_ns(&term);
    let ms = (exited - stopped) as f64 / 1e6;
    eprintln!("frozen agent: conlock exited {ms:.0} ms after the command was stopped");
    // Cleanup budget 3 s, plus a generous allowance for a busy machine.
    assert!(ms <= 4500.0, "exit came {ms} ms after the command stopped");
}

/// A refused acquire after a voluntary release means another waiter was faster, not a
/// lock-delay: the losers must not sleep through the (default 15 s) lock-delay.
#[test]
fn waiters_that_lose_a_race_do_not_sleep_through_the_lock_delay() {
    let server = start_server();
    let dir = scratch("race");
    let log = dir.join("log");
    let mut kids: Vec<KillOnDrop> = (0..4)
        .map(|_| {
            KillOnDrop(
                conlock(&server)
                    .args(["run", "--key", "race/k", "--", "sh", "-c"])
                    .arg(logged_job(&log, "sleep 0.3"))
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let t = Instant::now();
    for k in &mut kids {
        assert_eq!(wait_exit(&mut k.0, LONG).code(), Some(0));
    }
    let iv = intervals(&read(&log));
    assert_eq!(iv.len(), 4);
    assert_eq!(max_overlap(&iv), 1);
    // 4 × 0.3 s of work; a loser sleeping a 15 s lock-delay would take far longer.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}
