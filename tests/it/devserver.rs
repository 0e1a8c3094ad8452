//! The dev server against the recorded answers of a real Consul 1.0.8
//! (`shared/consul-reference`), plus blocking queries, TTLs, lock-delays,
//! ACLs, fault injection, shutdown and robustness.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::*;
use conlock::devserver::{DevServer, FaultMode, Options};

const NODE: &str = "conlock-dev";

fn reference_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/consul-reference")
}

fn load(name: &str) -> Value {
    let p = reference_dir().join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("reference JSON")
}

/// Learns how recorded raft indexes map onto the server's: the same recorded
/// index must always map to the same actual index, and the order must be
/// kept (so "which equals which, which grows" is checked).
#[derive(Default)]
struct IndexMap {
    pairs: Vec<(u64, u64)>,
}

impl IndexMap {
    fn check(&mut self, recorded: u64, actual: u64, ctx: &str) {
        for &(r, a) in &self.pairs {
            if r == recorded {
                assert_eq!(
                    a, actual,
                    "{ctx}: recorded index {r} was {a} before, now {actual}"
                );
            } else if r < recorded {
                assert!(
                    a < actual,
                    "{ctx}: recorded {r} < {recorded} but actual {a} >= {actual}"
                );
            } else {
                assert!(
                    a > actual,
                    "{ctx}: recorded {r} > {recorded} but actual {a} <= {actual}"
                );
            }
        }
        if recorded == 1 {
            assert_eq!(actual, 1, "{ctx}: index 1 (empty table) must stay 1");
        }
        self.pairs.push((recorded, actual));
    }

    /// Every index (but the special 1) is the recorded one plus one offset:
    /// the server consumes raft indexes exactly as Consul did.
    fn assert_constant_offset(&self, ctx: &str) {
        let offsets: Vec<i64> = self
            .pairs
            .iter()
            .filter(|(r, _)| *r != 1)
            .map(|&(r, a)| a as i64 - r as i64)
            .collect();
        assert!(
            offsets.windows(2).all(|w| w[0] == w[1]),
            "{ctx}: index offsets differ: {:?}",
            self.pairs
        );
    }
}

const PLACEHOLDERS: &[&str] = &["S1", "S2", "S3", "S4", "S5", "S6", "S7", "A", "B", "D", "T"];

struct Replay {
    addr: SocketAddr,
    ids: HashMap<String, String>,
    idx: IndexMap,
    ctx: String,
}

impl Replay {
    fn new(server: &DevServer, name: &str) -> Replay {
        Replay {
            addr: server.addr(),
            ids: HashMap::new(),
            idx: IndexMap::default(),
            ctx: name.to_string(),
        }
    }

    fn real(&self, ph: &str) -> String {
        self.ids
            .get(ph)
            .cloned()
            .unwrap_or_else(|| panic!("{}: placeholder {ph} not known yet", self.ctx))
    }

    /// The actual index for a recorded one (learned, or by the offset seen so
    /// far), for `index=` and `cas=` parameters.
    fn translate(&self, recorded: u64) -> u64 {
        if let Some(&(_, a)) = self.idx.pairs.iter().find(|(r, _)| *r == recorded) {
            return a;
        }
        let &(r, a) = self
            .idx
            .pairs
            .iter()
            .find(|(r, _)| *r != 1)
            .unwrap_or_else(|| panic!("{}: no index learned yet", self.ctx));
        (recorded as i64 + a as i64 - r as i64) as u64
    }

    fn subst_param(&self, kv: &str) -> String {
        match kv.split_once('=') {
            Some((k, v)) if self.ids.contains_key(v) => format!("{k}={}", self.real(v)),
            Some((k @ ("index" | "cas"), v)) => match v.parse::<u64>() {
                Ok(n) if n > 0 => format!("{k}={}", self.translate(n)),
                _ => kv.to_string(),
            },
            _ => kv.to_string(),
        }
    }

    fn subst_path(&self, path: &str) -> String {
        let (p, q) = match path.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path, None),
        };
        let segs: Vec<String> = p
            .split('/')
            .map(|s| match self.ids.get(s) {
                Some(r) => r.clone(),
                None if s == "vm" => NODE.to_string(),
                None => s.to_string(),
            })
            .collect();
        let mut out = segs.join("/");
        if let Some(q) = q {
            let pairs: Vec<String> = q.split('&').map(|kv| self.subst_param(kv)).collect();
            out.push('?');
            out.push_str(&pairs.join("&"));
        }
        out
    }

    fn subst_text(&self, text: &str) -> String {
        let mut t = text.to_string();
        for (ph, real) in &self.ids {
            t = t.replace(&format!("'{ph}'"), &format!("'{real}'"));
        }
        // Echoed query strings ("Conflicting flags: acquire=A&cas=48").
        if let Some((head, q)) = t.split_once("Conflicting flags: ") {
            let q: Vec<String> = q.split('&').map(|kv| self.subst_param(kv)).collect();
            t = format!("{head}Conflicting flags: {}", q.join("&"));
        }
        t
    }

    fn compare_json(&mut self, exp: &Value, act: &Value, field: &str, ctx: &str) {
        match exp {
            Value::Object(em) => {
                let am = act
                    .as_object()
                    .unwrap_or_else(|| panic!("{ctx}: expected an object, got {act}"));
                let mut ek: Vec<&String> = em.keys().collect();
                let mut ak: Vec<&String> = am.keys().collect();
                ek.sort();
                ak.sort();
                assert_eq!(ek, ak, "{ctx}: field sets differ: {act}");
                for (k, ev) in em {
                    self.compare_json(ev, &am[k], k, &format!("{ctx}.{k}"));
                }
            }
            Value::Array(ea) => {
                let aa = act
                    .as_array()
                    .unwrap_or_else(|| panic!("{ctx}: expected an array, got {act}"));
                assert_eq!(ea.len(), aa.len(), "{ctx}: array lengths differ: {act}");
                let mut ea = ea.clone();
                let mut aa = aa.clone();
                // Session lists are ordered by ID: compare in ID order.
                if ea.iter().all(|e| e.get("ID").is_some()) {
                    for e in ea.iter_mut() {
                        let ph = e["ID"].as_str().unwrap_or("").to_string();
                        if let Some(r) = self.ids.get(&ph) {
                            e["ID"] = Value::String(r.clone());
                        }
                    }
                    let key = |v: &Value| v["ID"].as_str().unwrap_or("").to_string();
                    ea.sort_by_key(key);
                    aa.sort_by_key(key);
                    let ids: Vec<String> = act.as_array().unwrap().iter().map(key).collect();
                    let mut sorted = ids.clone();
                    sorted.sort();
                    assert_eq!(ids, sorted, "{ctx}: sessions must be listed in ID order");
                }
                for (i, (e, a)) in ea.iter().zip(aa.iter()).enumerate() {
                    self.compare_json(e, a, field, &format!("{ctx}[{i}]"));
                }
            }
            Value::String(s) if field == "ID" || field == "Session" => {
                let a = act
                    .as_str()
                    .unwrap_or_else(|| panic!("{ctx}: expected a string"));
                if PLACEHOLDERS.contains(&s.as_str()) {
                    match self.ids.get(s) {
                        Some(r) => assert_eq!(a, r, "{ctx}"),
                        None => {
                            assert_eq!(a.len(), 36, "{ctx}: a UUID");
                            self.ids.insert(s.clone(), a.to_string());
                        }
                    }
                } else {
                    assert_eq!(a, s, "{ctx}");
                }
            }
            Value::String(s) if field == "Node" && s == "vm" => {
                assert_eq!(act.as_str(), Some(NODE), "{ctx}");
            }
            Value::Number(n) if field == "CreateIndex" || field == "ModifyIndex" => {
                let a = act
                    .as_u64()
                    .unwrap_or_else(|| panic!("{ctx}: expected a number"));
                self.idx.check(n.as_u64().unwrap(), a, ctx);
            }
            _ => assert_eq!(act, exp, "{ctx}"),
        }
    }

    fn request_body(step: &Value) -> Option<Vec<u8>> {
        match &step["request"]["body"] {
            Value::Null => None,
            Value::String(s) => Some(s.as_bytes().to_vec()),
            other => Some(other.to_string().into_bytes()),
        }
    }

    /// Sends the step's request (with `body` overriding the recorded one).
    fn send(&self, step: &Value, body: Option<Vec<u8>>) -> Resp {
        let method = step["request"]["method"].as_str().unwrap();
        let path = self.subst_path(step["request"]["path"].as_str().unwrap());
        http(self.addr, method, &path, body.as_deref(), &[])
    }

    /// Asserts the answer matches the recorded one.
    fn check(&mut self, i: usize, step: &Value, r: &Resp) {
        let ctx = format!(
            "{} step {i} ({} {})",
            self.ctx,
            step["request"]["method"].as_str().unwrap_or(""),
            step["request"]["path"].as_str().unwrap_or("")
        );
        let exp = &step["response"];
        assert_eq!(
            r.status,
            exp["status"].as_u64().unwrap() as u16,
            "{ctx}: status; body {:?}",
            r.text()
        );
        let eh = exp["headers"].as_object().unwrap();
        for (k, v) in eh {
            let got = r
                .header(k)
                .unwrap_or_else(|| panic!("{ctx}: missing header {k}: {r:?}"));
            if k == "X-Consul-Index" {
                self.idx.check(
                    v.as_str().unwrap().parse().unwrap(),
                    got.parse().unwrap(),
                    &ctx,
                );
            } else {
                assert_eq!(got, v.as_str().unwrap(), "{ctx}: header {k}");
            }
        }
        for k in [
            "Content-Type",
            "X-Consul-Index",
            "X-Consul-Knownleader",
            "X-Consul-Lastcontact",
        ] {
            if !eh.contains_key(k) {
                assert!(!r.has_header(k), "{ctx}: unexpected header {k}: {r:?}");
            }
        }
        let body = &exp["body"];
        match exp["body_kind"].as_str().unwrap() {
            "text" => assert_eq!(r.text(), self.subst_text(body.as_str().unwrap()), "{ctx}"),
            _ if body.is_null() => assert!(r.body.is_empty(), "{ctx}: body should be empty"),
            _ => {
                let act = r.json();
                self.compare_json(body, &act, "", &ctx);
            }
        }
    }

    fn run_step(&mut self, i: usize, step: &Value) -> Resp {
        let r = self.send(step, Self::request_body(step));
        self.check(i, step, &r);
        r
    }
}

fn steps(doc: &Value) -> Vec<Value> {
    doc["steps"].as_array().unwrap().clone()
}

#[test]
fn reference_01_agent() {
    let server = start_server();
    let a = server.addr();
    let r = get(a, "/v1/agent/self");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("Content-Type"), Some("application/json"));
    assert!(!r.has_header("X-Consul-Index"));
    let v = r.json();
    assert_eq!(v["Config"]["NodeName"], NODE);
    assert_eq!(v["Member"]["Name"], NODE);
    let r = get(a, "/v1/status/leader");
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), json!("127.0.0.1:8300"));
    // The recorded shapes.
    let doc = load("01-agent.json");
    let recorded = &steps(&doc)[1]["response"]["body"];
    assert!(recorded.is_string());
}

#[test]
fn reference_02_session_lifecycle() {
    let server = start_server();
    let mut rp = Replay::new(&server, "02");
    for (i, step) in steps(&load("02-session-lifecycle.json")).iter().enumerate() {
        rp.run_step(i, step);
    }
    rp.idx.assert_constant_offset("02");
}

#[test]
fn reference_03_session_create_validation() {
    // The recorded TTL bounds are Consul's defaults (10s..24h).
    let server = start_server_with(|o| o.session_ttl_min = Duration::from_secs(10));
    let mut rp = Replay::new(&server, "03");
    for (i, step) in steps(&load("03-session-create-validation.json"))
        .iter()
        .enumerate()
    {
        rp.run_step(i, step);
    }
    rp.idx.assert_constant_offset("03");
}

#[test]
fn reference_04_kv_basics() {
    let server = start_server();
    let mut rp = Replay::new(&server, "04");
    for (i, step) in steps(&load("04-kv-basics.json")).iter().enumerate() {
        rp.run_step(i, step);
    }
    rp.idx.assert_constant_offset("04");
}

#[test]
fn reference_05_lock_acquire_release() {
    let server = start_server();
    let mut rp = Replay::new(&server, "05");
    let mut destroy_sent: Option<Instant> = None;
    let mut exact = true;
    for (i, step) in steps(&load("05-lock-acquire-release.json"))
        .iter()
        .enumerate()
    {
        let note = step["note"].as_str().unwrap_or("");
        if note.starts_with("B's session is invalidated") {
            destroy_sent = Some(Instant::now());
            rp.run_step(i, step);
        } else if note.starts_with("A acquires inside B's 2s lock-delay") {
            let r = rp.send(step, Replay::request_body(step));
            let elapsed = destroy_sent.unwrap().elapsed();
            if r.json() == json!(true) {
                // Only acceptable when the machine was too slow to get here
                // within the lock-delay.
                assert!(
                    elapsed >= Duration::from_secs(2),
                    "acquire inside lock-delay succeeded"
                );
                exact = false;
            } else {
                rp.check(i, step, &r);
            }
        } else if step.get("after_invalidation_s").is_some() {
            // Retry until the lock-delay is over.
            let deadline = Instant::now() + Duration::from_secs(10);
            let r = loop {
                let r = rp.send(step, Replay::request_body(step));
                assert_eq!(r.status, 200);
                if r.json() == json!(true) || Instant::now() > deadline {
                    break r;
                }
                std::thread::sleep(Duration::from_millis(25));
            };
            let elapsed = destroy_sent.unwrap().elapsed();
            rp.check(i, step, &r);
            assert!(
                elapsed >= Duration::from_secs(2),
                "lock-delay ended early: {elapsed:?}"
            );
            assert!(
                elapsed < Duration::from_secs(8),
                "lock-delay too long: {elapsed:?}"
            );
        } else {
            rp.run_step(i, step);
        }
    }
    if exact {
        rp.idx.assert_constant_offset("05");
    }
}

#[test]
fn reference_06_behavior_delete() {
    let server = start_server();
    let mut rp = Replay::new(&server, "06");
    for (i, step) in steps(&load("06-behavior-delete.json")).iter().enumerate() {
        rp.run_step(i, step);
    }
    rp.idx.assert_constant_offset("06");
}

#[test]
fn reference_07_blocking_queries() {
    let server = start_server();
    let addr = server.addr();
    let mut rp = Replay::new(&server, "07");
    for (i, step) in steps(&load("07-blocking-queries.json")).iter().enumerate() {
        let note = step["note"].as_str().unwrap_or("");
        let path = step["request"]["path"].as_str().unwrap();
        // The writes that woke the recorded queries are not steps of their own.
        let writer = if note.starts_with("a write 0.5s later") {
            Some(("/v1/kv/ref1795268726/watch/x", "2"))
        } else if note.starts_with("a new key under the prefix") {
            Some(("/v1/kv/ref1795268726/watch/y", "3"))
        } else {
            None
        };
        let writer = writer.map(|(p, v)| {
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                assert_eq!(put(addr, p, v.as_bytes()).json(), json!(true));
            })
        });
        let t0 = Instant::now();
        rp.run_step(i, step);
        let took = t0.elapsed();
        if let Some(w) = writer {
            w.join().unwrap();
            assert!(
                took < Duration::from_secs(4),
                "step {i}: not woken by the write ({took:?})"
            );
        } else if path.contains("wait=1s") && note.starts_with("no change")
            || note.starts_with("blocking on a missing key")
        {
            assert!(
                took >= Duration::from_secs(1),
                "step {i}: returned early ({took:?})"
            );
            assert!(
                took < Duration::from_secs(5),
                "step {i}: waited too long ({took:?})"
            );
        } else if path.contains("index=") {
            assert!(
                took < Duration::from_secs(1),
                "step {i}: should answer at once ({took:?})"
            );
        }
    }
    rp.idx.assert_constant_offset("07");
}

#[test]
fn reference_08_session_ttl_expiry() {
    // Scaled down: TTL 1s (minimum lowered to 1s) instead of 10s.
    let server = start_server();
    let addr = server.addr();
    let mut rp = Replay::new(&server, "08");
    let mut renewed_at: Option<Instant> = None;
    for (i, step) in steps(&load("08-session-ttl-expiry.json"))
        .iter()
        .enumerate()
    {
        if step.get("observation").is_some() {
            let t = rp.real("T");
            let gone = wait_until(Duration::from_secs(10), || {
                get(addr, &format!("/v1/session/info/{t}")).json() == json!([])
            });
            let elapsed = renewed_at.unwrap().elapsed();
            assert!(gone, "TTL session never expired");
            assert!(
                elapsed >= Duration::from_millis(1500) && elapsed <= Duration::from_secs(6),
                "1s TTL session expired after {elapsed:?} (want about 2 × TTL)"
            );
            continue;
        }
        let mut step = step.clone();
        if let Some(ttl) = step["request"]["body"].get_mut("TTL") {
            *ttl = json!("1s");
        }
        if let Some(list) = step["response"]["body"].as_array_mut() {
            for s in list {
                if s.get("TTL").is_some() {
                    s["TTL"] = json!("1s");
                }
            }
        }
        if step["request"]["path"]
            .as_str()
            .unwrap()
            .starts_with("/v1/session/renew/")
        {
            renewed_at = Some(Instant::now());
        }
        rp.run_step(i, &step);
    }
}
