//! Model-based property test of the dev server's state machine (KV entries,
//! sessions, lock-delays, check-and-set), driven through the public HTTP API
//! of an in-process dev server (the store itself is private).
//!
//! Four clients, each with a session of random lock-delay and behavior, work
//! on one lock key (Consul lock mode) and one semaphore prefix (Consul's
//! semaphore algorithm with limit 2), while an operator writes the lock key
//! with plain PUTs and sessions are destroyed, expired and re-created. Every
//! read-modify-write of the semaphore's `.lock` is split into a read step and
//! a later CAS step, so that CAS races really interleave. A model predicts
//! every answer and the full KV/session state after every step.
//!
//! Lock-delay runs on the server's wall clock. The model never guesses it: it
//! brackets each invalidation and each acquire between `Instant`s taken just
//! before the request and just after the answer, and only insists on an answer
//! when the bracket decides it (otherwise both answers are accepted and the
//! model follows the server). Short delays are a few ms; long ones (10 s)
//! outlast a case.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use base64::Engine as _;
use conlock::devserver::DevServer;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use serde_json::Value;

use crate::common::start_server;

const LOCK_KEY: &str = "prop/lock/.lock";
const SEM_PREFIX: &str = "prop/sem/";
const SEM_LOCK: &str = "prop/sem/.lock";
/// `consul lock` flags on the lock key.
const LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;
/// `consul lock -n` flags on contender keys and the semaphore `.lock`.
const SEM_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;
/// The operator's plain PUTs use these flags (or `LOCK_FLAGS`).
const OPERATOR_FLAGS: u64 = 42;
const LIMIT: usize = 2;
const CLIENTS: usize = 4;
/// Consul's `structs.MaxLockDelay`.
const MAX_LOCK_DELAY: Duration = Duration::from_secs(60);

type R<T = ()> = Result<T, TestCaseError>;

// ----- a tiny keep-alive HTTP/1.1 client ---------------------------------------

/// One persistent connection (one connection thread on the server per case
/// instead of one per request keeps the test fast).
struct Conn {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Conn {
    fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).expect("connect to dev server");
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            addr,
            writer: s.try_clone().unwrap(),
            reader: BufReader::new(s),
        }
    }

    fn request(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> R<(u16, Vec<u8>)> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.addr);
        if let Some(b) = body {
            req.push_str(&format!("Content-Length: {}\r\n", b.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body.unwrap_or_default());
        let fail = |e: std::io::Error| TestCaseError::fail(format!("{method} {path}: {e}"));
        self.writer.write_all(&bytes).map_err(fail)?;
        let mut line = String::new();
        self.reader.read_line(&mut line).map_err(fail)?;
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| TestCaseError::fail(format!("{method} {path}: bad status {line:?}")))?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.reader.read_line(&mut line).map_err(fail)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                if k.eq_ignore_ascii_case("Content-Length") {
                    len = v.trim().parse().unwrap_or(0);
                }
                prop_assert!(
                    !(k.eq_ignore_ascii_case("Connection") && v.trim() == "close"),
                    "{method} {path}: server closed the connection"
                );
            }
        }
        let mut out = vec![0u8; len];
        self.reader.read_exact(&mut out).map_err(fail)?;
        Ok((status, out))
    }

    /// A request that must answer 200 with a JSON body.
    fn json(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> R<Value> {
        let (status, b) = self.request(method, path, body)?;
        prop_assert_eq!(
            status,
            200,
            "{} {}: {}",
            method,
            path,
            String::from_utf8_lossy(&b)
        );
        serde_json::from_slice(&b).map_err(|e| TestCaseError::fail(format!("{path}: {e}")))
    }

    /// A request that must answer 200 `true` or `false`.
    fn boolean(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> R<bool> {
        match self.json(method, path, body)? {
            Value::Bool(b) => Ok(b),
            other => Err(TestCaseError::fail(format!("{path}: not a bool: {other}"))),
        }
    }

    /// A KV listing (`?recurse`); 404 is the empty list.
    fn list(&mut self, prefix: &str) -> R<Vec<Value>> {
        let (status, b) = self.request("GET", &format!("/v1/kv/{prefix}?recurse"), None)?;
        if status == 404 {
            return Ok(Vec::new());
        }
        prop_assert_eq!(
            status,
            200,
            "list {}: {}",
            prefix,
            String::from_utf8_lossy(&b)
        );
        match serde_json::from_slice(&b) {
            Ok(Value::Array(a)) => Ok(a),
            _ => Err(TestCaseError::fail(format!("list {prefix}: not an array"))),
        }
    }
}

// ----- operations -------------------------------------------------------------

#[derive(Debug, Clone, Copy)]
struct SessSpec {
    /// Lock-delay in ms: 0, a few ms, or one that outlasts the case.
    delay_ms: u64,
    delete: bool,
}

#[derive(Debug, Clone)]
enum Op {
    /// `?acquire=` on the lock key.
    Acquire(usize),
    /// `?release=` on the lock key.
    Release(usize),
    /// The client destroys its own session (it knows it is gone).
    Destroy(usize),
    /// The server expires the session (the client does not notice), through
    /// `DevServer::expire_session` or the control endpoint.
    Expire { c: usize, via_http: bool },
    /// A new session for a client whose session is gone.
    Recreate { c: usize, spec: SessSpec },
    /// A plain PUT on the lock key by someone without a session.
    OperatorPut { lock_flags: bool },
    /// The client's next step of Consul's semaphore algorithm (see
    /// [`Phase`]); with `leave`, it gives up or releases instead of going on.
    Sem { c: usize, leave: bool },
    /// Lets the short lock-delays in force run out (bounded sleep).
    WaitShortDelays,
}

fn spec_strategy() -> impl Strategy<Value = SessSpec> {
    (
        prop_oneof![Just(0u64), Just(2), Just(10), Just(10_000)],
        any::<bool>(),
    )
        .prop_map(|(delay_ms, delete)| SessSpec { delay_ms, delete })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let c = || 0..CLIENTS;
    prop_oneof![
        4 => c().prop_map(Op::Acquire),
        2 => c().prop_map(Op::Release),
        1 => c().prop_map(Op::Destroy),
        1 => (c(), any::<bool>()).prop_map(|(c, via_http)| Op::Expire { c, via_http }),
        3 => (c(), spec_strategy()).prop_map(|(c, spec)| Op::Recreate { c, spec }),
        1 => any::<bool>().prop_map(|lock_flags| Op::OperatorPut { lock_flags }),
        10 => (c(), prop::bool::weighted(0.3)).prop_map(|(c, leave)| Op::Sem { c, leave }),
        1 => Just(Op::WaitShortDelays),
    ]
}

// ----- the model ----------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
struct MEntry {
    session: Option<String>,
    lock_index: u64,
    flags: u64,
}

/// A CAS prepared by a read step.
#[derive(Debug, Clone)]
struct Pending {
    /// The `.lock` ModifyIndex the client read (0: missing).
    cas: u64,
    /// The model's `.lock` version at the read: the CAS must succeed exactly
    /// when no other write to `.lock` happened since.
    version: u64,
    holders: BTreeSet<String>,
    join: bool,
}

/// Where a client is in Consul's semaphore algorithm, as the client sees it
/// (an expiry it did not notice changes nothing here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No contender key. Next: acquire `<prefix><session>`.
    Idle,
    /// Contender key acquired. Next: read (list the prefix, prune dead
    /// holders, prepare a CAS adding ourselves when there is room), then the
    /// CAS; or, leaving, delete the contender key.
    Contending,
    /// Our CAS adding ourselves succeeded. Next: nothing, or, leaving, read
    /// `.lock` and prepare a CAS without us, then the CAS.
    Holding,
    /// Out of `.lock`. Next: delete the contender key.
    Leaving,
}

#[derive(Debug)]
struct Client {
    sid: String,
    spec: SessSpec,
    /// The session exists on the server.
    alive: bool,
    phase: Phase,
    /// Holds a semaphore slot by the protocol: its CAS adding itself
    /// succeeded, and since then it has not removed itself, its session has
    /// not died, and no successful CAS has pruned it.
    holding: bool,
    pending: Option<Pending>,
}

/// Lock-delay in force on a key until some instant in `[lo, hi]`.
#[derive(Debug, Clone, Copy)]
struct DelayWindow {
    lo: Instant,
    hi: Instant,
}

#[derive(Debug, PartialEq, Eq)]
enum DelayState {
    Active,
    Over,
    Unknown,
}

struct Harness {
    server: DevServer,
    conn: Conn,
    kv: BTreeMap<String, MEntry>,
    sem_holders: BTreeSet<String>,
    /// Successful writes to the semaphore `.lock` so far (0: missing).
    sem_version: u64,
    delays: BTreeMap<String, DelayWindow>,
    clients: Vec<Client>,
    /// Every session ever created, with whether its behavior is delete.
    all_sessions: Vec<(String, bool)>,
    /// The lock key's ModifyIndex at the last successful acquire.
    last_fence: u64,
    /// Set by a successful acquire of the lock key; checked by `check_state`.
    fence_due: bool,
}

impl Harness {
    fn new(specs: &[SessSpec]) -> R<Harness> {
        let server = start_server();
        let conn = Conn::open(server.addr());
        let mut h = Harness {
            server,
            conn,
            kv: BTreeMap::new(),
            sem_holders: BTreeSet::new(),
            sem_version: 0,
            delays: BTreeMap::new(),
            clients: Vec::new(),
            all_sessions: Vec::new(),
            last_fence: 0,
            fence_due: false,
        };
        for (i, spec) in specs.iter().enumerate() {
            let sid = h.create_session(i, *spec)?;
            h.clients.push(Client {
                sid,
                spec: *spec,
                alive: true,
                phase: Phase::Idle,
                holding: false,
                pending: None,
            });
        }
        h.check_state()?;
        Ok(h)
    }

    fn create_session(&mut self, c: usize, spec: SessSpec) -> R<String> {
        let body = serde_json::json!({
            "Name": format!("prop-client-{c}"),
            "LockDelay": format!("{}ms", spec.delay_ms),
            "Behavior": if spec.delete { "delete" } else { "release" },
        });
        let v = self.conn.json(
            "PUT",
            "/v1/session/create",
            Some(body.to_string().as_bytes()),
        )?;
        let sid = v["ID"]
            .as_str()
            .ok_or_else(|| TestCaseError::fail(format!("session create: {v}")))?
            .to_string();
        self.all_sessions.push((sid.clone(), spec.delete));
        Ok(sid)
    }

    fn delay_state(&self, key: &str, t0: Instant, t1: Instant) -> DelayState {
        match self.delays.get(key) {
            None => DelayState::Over,
            // The server compared its deadline (in [lo, hi]) with its clock
            // (in [t0, t1]): blocked iff deadline > clock.
            Some(w) if w.lo > t1 => DelayState::Active,
            Some(w) if w.hi <= t0 => DelayState::Over,
            Some(_) => DelayState::Unknown,
        }
    }

    fn contender_key(&self, c: usize) -> String {
        format!("{SEM_PREFIX}{}", self.clients[c].sid)
    }

    /// `?acquire=` on `key` for client `c`; checks the answer against the
    /// model and applies it. Returns whether it succeeded.
    fn acquire(&mut self, key: &str, c: usize, flags: u64) -> R<bool> {
        let sid = self.clients[c].sid.clone();
        let path = format!("/v1/kv/{key}?acquire={sid}&flags={flags}");
        let t0 = Instant::now();
        let (status, body) = self.conn.request("PUT", &path, Some(b"held"))?;
        let t1 = Instant::now();
        let text = String::from_utf8_lossy(&body).trim_end().to_string();
        // Some(b): 200 with b; None: 500 "invalid session".
        let got: Option<bool> = match status {
            200 if text == "true" => Some(true),
            200 if text == "false" => Some(false),
            500 => {
                prop_assert_eq!(&text, &format!("invalid session \"{}\"", sid));
                None
            }
            _ => return Err(TestCaseError::fail(format!("{path}: {status} {text}"))),
        };
        // What the server must answer when no lock-delay is in force.
        let free: Option<bool> = if !self.clients[c].alive {
            None
        } else {
            Some(match self.kv.get(key).and_then(|e| e.session.as_deref()) {
                None => true,
                Some(s) => s == sid,
            })
        };
        match self.delay_state(key, t0, t1) {
            DelayState::Active => prop_assert_eq!(got, Some(false), "{}: in lock-delay", path),
            DelayState::Over => prop_assert_eq!(got, free, "{}: no lock-delay", path),
            DelayState::Unknown => prop_assert!(
                got == Some(false) || got == free,
                "{}: got {:?}, want false (lock-delay) or {:?}",
                path,
                got,
                free
            ),
        }
        if got != Some(true) {
            return Ok(false);
        }
        let lock_index = match self.kv.get(key) {
            None => 1,
            Some(e) if e.session.as_deref() == Some(sid.as_str()) => e.lock_index,
            Some(e) => e.lock_index + 1,
        };
        self.kv.insert(
            key.to_string(),
            MEntry {
                session: Some(sid),
                lock_index,
                flags,
            },
        );
        if key == LOCK_KEY {
            self.fence_due = true;
        }
        Ok(true)
    }

    /// The model side of a session invalidation bracketed by `[t0, t1]`.
    fn invalidated(&mut self, c: usize, t0: Instant, t1: Instant) {
        let cl = &mut self.clients[c];
        cl.alive = false;
        cl.holding = false;
        let sid = cl.sid.clone();
        let spec = cl.spec;
        let delay = Duration::from_millis(spec.delay_ms).min(MAX_LOCK_DELAY);
        let held: Vec<String> = self
            .kv
            .iter()
            .filter(|(_, e)| e.session.as_deref() == Some(sid.as_str()))
            .map(|(k, _)| k.clone())
            .collect();
        for k in held {
            if spec.delete {
                self.kv.remove(&k);
            } else if let Some(e) = self.kv.get_mut(&k) {
                e.session = None;
            }
            if !delay.is_zero() {
                self.delays.insert(
                    k,
                    DelayWindow {
                        lo: t0 + delay,
                        hi: t1 + delay,
                    },
                );
            }
        }
    }

    /// Reads `.lock` from a listing: (ModifyIndex or 0, holders).
    fn decode_sem_lock(pairs: &[Value]) -> R<(u64, BTreeSet<String>)> {
        let Some(p) = pairs.iter().find(|p| p["Key"] == SEM_LOCK) else {
            return Ok((0, BTreeSet::new()));
        };
        let raw = p["Value"].as_str().unwrap_or("");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(raw)
            .map_err(|e| TestCaseError::fail(format!(".lock value: {e}")))?;
        let v: Value = serde_json::from_slice(&bytes)
            .map_err(|e| TestCaseError::fail(format!(".lock value: {e}")))?;
        prop_assert_eq!(v["Limit"].as_u64(), Some(LIMIT as u64), ".lock: {}", v);
        let holders = v["Holders"]
            .as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default();
        Ok((p["ModifyIndex"].as_u64().unwrap_or(0), holders))
    }

    /// One step of Consul's semaphore algorithm (api/semaphore.go) for
    /// client `c`. Reads and CASes are separate steps, so other clients'
    /// steps interleave between them.
    fn sem_step(&mut self, c: usize, leave: bool) -> R {
        if self.clients[c].pending.is_some() {
            return self.sem_cas(c);
        }
        match (self.clients[c].phase, leave) {
            (Phase::Idle, _) => {
                let key = self.contender_key(c);
                if self.acquire(&key, c, SEM_FLAGS)? {
                    self.clients[c].phase = Phase::Contending;
                }
                Ok(())
            }
            (Phase::Contending, false) => self.sem_join_read(c),
            (Phase::Holding, false) => Ok(()),
            (Phase::Holding, true) => self.sem_leave_read(c),
            (Phase::Contending | Phase::Leaving, _) => {
                let key = self.contender_key(c);
                let path = format!("/v1/kv/{key}");
                prop_assert!(self.conn.boolean("DELETE", &path, None)?, "{}", path);
                self.kv.remove(&key);
                self.clients[c].phase = Phase::Idle;
                Ok(())
            }
        }
    }

    /// Acquire, read half: list the prefix, prune dead holders, and prepare
    /// a CAS adding ourselves when there is room.
    fn sem_join_read(&mut self, c: usize) -> R {
        let pairs = self.conn.list(SEM_PREFIX)?;
        let (cas, holders) = Self::decode_sem_lock(&pairs)?;
        prop_assert_eq!(&holders, &self.sem_holders);
        // Consul's pruneDeadHolders: a holder stays only while some key under
        // the prefix is held by its session.
        let live: BTreeSet<&str> = pairs.iter().filter_map(|p| p["Session"].as_str()).collect();
        let mut next: BTreeSet<String> = holders
            .into_iter()
            .filter(|h| live.contains(h.as_str()))
            .collect();
        // Full: a real client would block on the prefix and read again.
        if next.len() < LIMIT {
            next.insert(self.clients[c].sid.clone());
            self.clients[c].pending = Some(Pending {
                cas,
                version: self.sem_version,
                holders: next,
                join: true,
            });
        }
        Ok(())
    }

    /// Release, read half: read `.lock` and prepare a CAS without us; when
    /// we are not in it (pruned), go on to deleting the contender key.
    fn sem_leave_read(&mut self, c: usize) -> R {
        let path = format!("/v1/kv/{SEM_LOCK}");
        let (status, body) = self.conn.request("GET", &path, None)?;
        let pairs = match status {
            404 => Vec::new(),
            200 => match serde_json::from_slice(&body) {
                Ok(Value::Array(a)) => a,
                _ => return Err(TestCaseError::fail(format!("{path}: not an array"))),
            },
            _ => return Err(TestCaseError::fail(format!("{path}: {status}"))),
        };
        let (cas, mut holders) = Self::decode_sem_lock(&pairs)?;
        prop_assert_eq!(&holders, &self.sem_holders);
        let sid = self.clients[c].sid.clone();
        if holders.remove(&sid) {
            self.clients[c].pending = Some(Pending {
                cas,
                version: self.sem_version,
                holders,
                join: false,
            });
        } else {
            self.clients[c].phase = Phase::Leaving;
        }
        Ok(())
    }

    /// The write half: the prepared CAS on `.lock`.
    fn sem_cas(&mut self, c: usize) -> R {
        let Some(p) = self.clients[c].pending.take() else {
            return Ok(());
        };
        let holders: serde_json::Map<String, Value> = p
            .holders
            .iter()
            .map(|h| (h.clone(), Value::Bool(true)))
            .collect();
        let body = serde_json::json!({"Limit": LIMIT, "Holders": holders}).to_string();
        let path = format!("/v1/kv/{SEM_LOCK}?cas={}&flags={SEM_FLAGS}", p.cas);
        let got = self.conn.boolean("PUT", &path, Some(body.as_bytes()))?;
        let want = p.version == self.sem_version;
        prop_assert_eq!(
            got,
            want,
            "{} (read at .lock version {}, now {})",
            path,
            p.version,
            self.sem_version
        );
        if !got {
            return Ok(()); // the next step reads again
        }
        self.sem_version += 1;
        self.kv.insert(
            SEM_LOCK.to_string(),
            MEntry {
                session: None,
                lock_index: 0,
                flags: SEM_FLAGS,
            },
        );
        for (i, cl) in self.clients.iter_mut().enumerate() {
            if cl.holding && !p.holders.contains(&cl.sid) {
                // Only the writer may drop itself: a live holder keeps its
                // contender key, so pruning must spare it.
                prop_assert_eq!(i, c, "live holder {} was pruned", cl.sid);
                cl.holding = false;
            }
        }
        let cl = &mut self.clients[c];
        if p.join {
            cl.phase = Phase::Holding;
            // A client whose session died unnoticed may still get in; it
            // does not hold by the protocol, and others prune it.
            cl.holding = cl.alive;
        } else {
            cl.phase = Phase::Leaving;
        }
        self.sem_holders = p.holders;
        Ok(())
    }

    fn step(&mut self, op: &Op) -> R {
        match *op {
            Op::Acquire(c) => {
                self.acquire(LOCK_KEY, c, LOCK_FLAGS)?;
            }
            Op::Release(c) => {
                let sid = self.clients[c].sid.clone();
                let path = format!("/v1/kv/{LOCK_KEY}?release={sid}&flags={LOCK_FLAGS}");
                let got = self.conn.boolean("PUT", &path, Some(b"released"))?;
                let e = self.kv.get_mut(LOCK_KEY);
                let want = matches!(&e, Some(e) if e.session.as_deref() == Some(sid.as_str()));
                prop_assert_eq!(got, want, "{}", path);
                if let Some(e) = e.filter(|_| want) {
                    // A voluntary release keeps LockIndex and sets no lock-delay.
                    e.session = None;
                    e.flags = LOCK_FLAGS;
                }
            }
            Op::Destroy(c) => {
                let sid = self.clients[c].sid.clone();
                let t0 = Instant::now();
                let got = self
                    .conn
                    .boolean("PUT", &format!("/v1/session/destroy/{sid}"), None)?;
                let t1 = Instant::now();
                // Destroy is idempotent: `true` even for a gone session.
                prop_assert!(got, "destroy answered false");
                if self.clients[c].alive {
                    self.invalidated(c, t0, t1);
                }
                let cl = &mut self.clients[c];
                cl.pending = None;
                cl.phase = Phase::Idle;
            }
            Op::Expire { c, via_http } => {
                let sid = self.clients[c].sid.clone();
                let t0 = Instant::now();
                let got = if via_http {
                    self.conn.boolean(
                        "PUT",
                        &format!("/v1/conlock-dev/session/expire/{sid}"),
                        None,
                    )?
                } else {
                    self.server.expire_session(&sid)
                };
                let t1 = Instant::now();
                prop_assert_eq!(got, self.clients[c].alive, "expire {}", sid);
                if got {
                    // The client does not notice: its pending CAS and its
                    // phase stay.
                    self.invalidated(c, t0, t1);
                }
            }
            Op::Recreate { c, spec } => {
                if !self.clients[c].alive {
                    let sid = self.create_session(c, spec)?;
                    self.clients[c] = Client {
                        sid,
                        spec,
                        alive: true,
                        phase: Phase::Idle,
                        holding: false,
                        pending: None,
                    };
                }
            }
            Op::OperatorPut { lock_flags } => {
                let flags = if lock_flags {
                    LOCK_FLAGS
                } else {
                    OPERATOR_FLAGS
                };
                let path = format!("/v1/kv/{LOCK_KEY}?flags={flags}");
                prop_assert!(self.conn.boolean("PUT", &path, Some(b"operator"))?);
                // LockIndex goes back to 0; the Session stays.
                let session = self.kv.get(LOCK_KEY).and_then(|e| e.session.clone());
                self.kv.insert(
                    LOCK_KEY.to_string(),
                    MEntry {
                        session,
                        lock_index: 0,
                        flags,
                    },
                );
            }
            Op::Sem { c, leave } => self.sem_step(c, leave)?,
            Op::WaitShortDelays => {
                let now = Instant::now();
                let until = self
                    .delays
                    .values()
                    .map(|w| w.hi)
                    .filter(|&hi| hi > now && hi - now <= Duration::from_millis(100))
                    .max();
                if let Some(until) = until {
                    std::thread::sleep(until - now + Duration::from_millis(1));
                }
            }
        }
        Ok(())
    }

    /// Compares the server's whole state with the model and checks the
    /// invariants.
    fn check_state(&mut self) -> R {
        let pairs = self.conn.list("prop/")?;
        let mut seen = BTreeMap::new();
        for p in &pairs {
            let key = p["Key"].as_str().unwrap_or_default().to_string();
            let e = MEntry {
                session: p["Session"].as_str().map(str::to_string),
                lock_index: p["LockIndex"].as_u64().unwrap_or(u64::MAX),
                flags: p["Flags"].as_u64().unwrap_or(u64::MAX),
            };
            seen.insert(key, e);
        }
        prop_assert_eq!(&seen, &self.kv, "KV state differs from the model");

        let (_, holders) = Self::decode_sem_lock(&pairs)?;
        prop_assert_eq!(&holders, &self.sem_holders, "semaphore holders");
        prop_assert!(holders.len() <= LIMIT, "{} holders in .lock", holders.len());
        let holding: Vec<&Client> = self.clients.iter().filter(|c| c.holding).collect();
        prop_assert!(
            holding.len() <= LIMIT,
            "{} clients hold a slot of {}",
            holding.len(),
            LIMIT
        );
        for c in &holding {
            prop_assert!(
                c.alive && holders.contains(&c.sid),
                "holder {} not in .lock",
                c.sid
            );
        }

        if self.fence_due {
            self.fence_due = false;
            let token = pairs
                .iter()
                .find(|p| p["Key"] == LOCK_KEY)
                .and_then(|p| p["ModifyIndex"].as_u64())
                .unwrap_or(0);
            prop_assert!(
                token > self.last_fence,
                "fencing token {} after {}",
                token,
                self.last_fence
            );
            self.last_fence = token;
        }

        let sessions = self.conn.json("GET", "/v1/session/list", None)?;
        let live: BTreeSet<String> = sessions
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["ID"].as_str().map(str::to_string))
            .collect();
        let want: BTreeSet<String> = self
            .clients
            .iter()
            .filter(|c| c.alive)
            .map(|c| c.sid.clone())
            .collect();
        prop_assert_eq!(live, want, "live sessions");
        Ok(())
    }

    /// Destroys every session, then checks that nothing is held or left over.
    fn finish(&mut self) -> R {
        for c in 0..self.clients.len() {
            self.step(&Op::Destroy(c))?;
        }
        self.check_state()?;
        let pairs = self.conn.list("prop/")?;
        for p in &pairs {
            prop_assert!(
                p["Session"].is_null(),
                "key still held after the end: {}",
                p
            );
        }
        for (sid, delete) in &self.all_sessions {
            if *delete {
                let key = format!("{SEM_PREFIX}{sid}");
                prop_assert!(
                    pairs.iter().all(|p| p["Key"] != key.as_str()),
                    "contender key {} of a delete session left",
                    key
                );
            }
        }
        let stats = self.conn.json("GET", "/v1/conlock-dev/stats", None)?;
        prop_assert_eq!(stats["sessions"].as_u64(), Some(0), "stats: {}", stats);
        Ok(())
    }
}

fn run(specs: &[SessSpec], ops: &[Op]) -> R {
    let mut h = Harness::new(specs)?;
    for op in ops {
        h.step(op)?;
        h.check_state()?;
    }
    h.finish()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        max_shrink_time: 60_000,
        ..ProptestConfig::default()
    })]

    #[test]
    fn devserver_store_matches_model(
        specs in prop::array::uniform4(spec_strategy()),
        ops in prop::collection::vec(op_strategy(), 1..80),
    ) {
        run(&specs, &ops)?;
    }
}
