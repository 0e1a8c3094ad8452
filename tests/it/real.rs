//! The real-agent tier (`make test-real CONSUL_BIN=/path/to/consul`): conlock against a
//! real `consul agent -dev` on loopback, and beside the same binary's `consul lock`.
//! Overlap is judged from timestamps the commands write; what Consul stored is read back
//! over HTTP. Tests that do not fault the agent share one (each on its own keys); those
//! that stop or kill it start their own.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::harness::*;
use crate::real_agent::{consul, http, RealAgent};

const LONG: Duration = Duration::from_secs(120);
/// What `consul lock` stores on its lock key, and on every key of a semaphore.
const LOCK_FLAGS: u64 = 3304740253564472344;
const SEM_FLAGS: u64 = 16210313421097356768;

fn shared() -> SocketAddr {
    RealAgent::shared().addr()
}

/// A GET that must be answered: its status and JSON body (None for a 404).
fn get_json(addr: SocketAddr, path: &str) -> Option<Value> {
    let (status, body) =
        http(addr, "GET", path, None).unwrap_or_else(|| panic!("GET {path}: no answer"));
    match status {
        404 => None,
        200 => Some(
            serde_json::from_str(&body)
                .unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}")),
        ),
        s => panic!("GET {path}: {s} {body}"),
    }
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

// ---------------------------------------------------------------------------------------
// Processes whose output goes to a file, killed if the test fails.

struct Proc {
    what: String,
    child: KillOnDrop,
    out: PathBuf,
    code: Option<Option<i32>>,
}

impl Proc {
    fn spawn(mut cmd: Command, what: &str, dir: &Path) -> Proc {
        let out = dir.join(format!("{}.out", what.replace(['/', ' '], "_")));
        let f = std::fs::File::create(&out).unwrap();
        cmd.stdout(f.try_clone().unwrap()).stderr(f);
        let child = cmd.spawn().unwrap_or_else(|e| panic!("start {what}: {e}"));
        Proc {
            what: what.to_string(),
            child: KillOnDrop(child),
            out,
            code: None,
        }
    }

    fn output(&self) -> String {
        read(&self.out)
    }

    fn exited(&mut self) -> bool {
        self.code.is_some() || self.child.0.try_wait().unwrap().is_some()
    }

    /// The exit code (waits with a generous deadline).
    fn finish(&mut self) -> Option<i32> {
        if self.code.is_none() {
            self.code = Some(wait_exit(&mut self.child.0, LONG).code());
        }
        self.code.unwrap()
    }
}

impl Drop for Proc {
    /// A test that fails midway stops what it started: SIGTERM first, which `consul lock`
    /// passes to its command (its SIGKILL would leave the command running), then SIGKILL.
    fn drop(&mut self) {
        if !self.exited() {
            signal(self.child.0.id(), libc::SIGTERM);
            wait_for(Duration::from_secs(10), || self.exited());
        }
    }
}

/// Waits for all and asserts each exited 0, naming those that did not and what they said.
fn assert_all_succeed(procs: &mut [Proc], log: &Path) {
    let mut bad = Vec::new();
    for p in procs.iter_mut() {
        let code = p.finish();
        if code != Some(0) {
            bad.push(format!("{} exited {code:?}: {}", p.what, p.output().trim()));
        }
    }
    assert!(bad.is_empty(), "{}\nlog:\n{}", bad.join("\n"), read(log));
}

fn conlock_proc(addr: SocketAddr, args: &[&str], script: &str, what: &str, dir: &Path) -> Proc {
    let mut c = conlock_at(addr);
    c.args(args).args(["--", "sh", "-c", script]);
    Proc::spawn(c, what, dir)
}

/// `consul lock [-n N] -name NAME PREFIX SCRIPT` (it runs SCRIPT through a shell).
fn consul_lock_proc(
    addr: SocketAddr,
    n: u32,
    prefix: &str,
    script: &str,
    what: &str,
    dir: &Path,
) -> Proc {
    let mut c = consul();
    c.arg("lock")
        .arg(format!("-http-addr={addr}"))
        .arg(format!("-name={what}"))
        .arg(format!("-n={n}"))
        .args([prefix, script]);
    Proc::spawn(c, what, dir)
}

// ---------------------------------------------------------------------------------------
// What the agent stores, read over HTTP.

/// The key's entry, or None (404).
fn kv(addr: SocketAddr, key: &str) -> Option<Value> {
    get_json(addr, &format!("/v1/kv/{key}")).map(|j| j[0].clone())
}

/// Every entry under `prefix/`.
fn kv_tree(addr: SocketAddr, prefix: &str) -> Vec<Value> {
    get_json(addr, &format!("/v1/kv/{prefix}/?recurse"))
        .map(|j| j.as_array().unwrap().clone())
        .unwrap_or_default()
}

fn flags(entry: &Value) -> u64 {
    entry["Flags"]
        .as_u64()
        .unwrap_or_else(|| panic!("no integer Flags in {entry}"))
}

fn value_json(entry: &Value) -> Value {
    use base64::Engine;
    let b64 = entry["Value"].as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

/// IDs of the live sessions named `name`.
fn sessions_named(addr: SocketAddr, name: &str) -> Vec<String> {
    get_json(addr, "/v1/session/list")
        .expect("the session list")
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["Name"] == name)
        .map(|s| s["ID"].as_str().unwrap().to_string())
        .collect()
}

/// How many first reads (no `index=`) of keys under `prefix` `consul lock` sent: it
/// reads once before it blocks on a taken lock or full semaphore, and checks the flags
/// then. (conlock sends `wait=` only with an index.) Read from the agent's debug log.
fn consul_lock_reads(agent: &RealAgent, prefix: &str) -> usize {
    let path = format!("/v1/kv/{prefix}");
    agent
        .log()
        .lines()
        .filter(|l| {
            l.contains(&path)
                && (l.contains(&format!("{path}?")) || l.contains(&format!("{path}/")))
                && l.contains("wait=")
                && !l.contains("index=")
        })
        .count()
}

fn wait_consul_lock_read(agent: &RealAgent, prefix: &str, n: usize) {
    assert!(
        wait_for(LONG, || consul_lock_reads(agent, prefix) >= n),
        "consul lock never read {prefix} ({n} reads expected) in the agent's log"
    );
}

fn starts(log: &Path) -> usize {
    read(log).lines().filter(|l| l.starts_with("S ")).count()
}

fn wait_starts(log: &Path, n: usize, procs: &mut [Proc]) {
    let ok = wait_for(LONG, || {
        starts(log) >= n || procs.iter_mut().any(|p| p.exited())
    });
    let mut said = String::new();
    for p in procs.iter_mut() {
        if p.exited() {
            let code = p.finish();
            said.push_str(&format!(
                "\n{} exited {code:?}: {}",
                p.what,
                p.output().trim()
            ));
        }
    }
    assert!(
        ok && starts(log) >= n,
        "{n} commands should have started:{said}\nlog:\n{}",
        read(log)
    );
}

fn wait_event(events: &Path, event: &str, p: &mut Proc) {
    let needle = format!("\"{event}\"");
    let ok = wait_for(LONG, || read(events).contains(&needle) || p.exited());
    assert!(
        ok && read(events).contains(&needle),
        "{} never reported {event}: {}\nevents:\n{}",
        p.what,
        p.output().trim(),
        read(events)
    );
}

fn assert_turns(log: &Path, n: usize, limit: usize) {
    let iv = intervals(&read(log));
    assert_eq!(iv.len(), n, "every command ran once:\n{}", read(log));
    let most = max_overlap(&iv);
    assert!(
        most <= limit,
        "{most} commands ran at once, the limit is {limit}:\n{}",
        read(log)
    );
}

/// A logged command that runs until `go` exists (at most about 5 minutes, should the
/// test die without saying so) and records a SIGTERM in `term`.
fn held_until(log: &Path, go: &Path, term: &Path) -> String {
    let wait = format!(
        "i=0; while [ ! -e {} ] && [ $i -lt 30000 ]; do sleep 0.01; i=$((i+1)); done",
        go.display()
    );
    format!(
        "trap 'date +%s%N > {}; exit 0' TERM; {}",
        term.display(),
        logged_job(log, &wait)
    )
}

// ---------------------------------------------------------------------------------------
// 1-2. conlock alone: turns and what it stores.

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn lock_contenders_take_turns_and_store_the_consul_lock_flags() {
    let addr = shared();
    let dir = scratch("real-lock");
    let (log, go, term) = (dir.join("log"), dir.join("go"), dir.join("term"));
    let key = "real/lock/k";
    let mut procs = vec![conlock_proc(
        addr,
        &["run", "--key", key],
        &held_until(&log, &go, &term),
        "holder",
        &dir,
    )];
    wait_starts(&log, 1, &mut procs);
    let held = kv(addr, key).expect("the lock key exists while held");
    for i in 0..5 {
        procs.push(conlock_proc(
            addr,
            &["run", "--key", key, "--session-name", "real-lock-waiter"],
            &logged_job(&log, "sleep 0.05"),
            &format!("waiter{i}"),
            &dir,
        ));
    }
    // Let them all find the key held before it is released.
    wait_for(LONG, || {
        sessions_named(addr, "real-lock-waiter").len() == 5 || procs.iter_mut().any(|p| p.exited())
    });
    std::fs::write(&go, "").unwrap();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 6, 1);
    assert!(
        held["Session"].is_string(),
        "held key has no session: {held}"
    );
    assert_eq!(flags(&held), LOCK_FLAGS, "Flags stored while held: {held}");
    assert!(
        wait_for(LONG, || kv(addr, key).is_none()),
        "the key is left after the last holder: {:?}",
        kv(addr, key)
    );
}

/// On a real agent, waiters that take the lock in turn each get the key's exact
/// ModifyIndex as their fencing token, as the key shows it while they hold.
#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn waiters_get_the_keys_exact_modify_index_as_their_fencing_token() {
    let addr = shared();
    let dir = scratch("real-readahead");
    let (log, go, term) = (dir.join("log"), dir.join("go"), dir.join("term"));
    let key = "real/readahead/k";
    let mut procs = vec![conlock_proc(
        addr,
        &["run", "--key", key],
        &held_until(&log, &go, &term),
        "holder",
        &dir,
    )];
    wait_starts(&log, 1, &mut procs);
    for i in 0..3 {
        procs.push(conlock_proc(
            addr,
            &[
                "run",
                "--key",
                key,
                "--session-name",
                "real-readahead-waiter",
            ],
            &token_then_wait(&dir),
            &format!("waiter{i}"),
            &dir,
        ));
    }
    wait_for(LONG, || {
        sessions_named(addr, "real-readahead-waiter").len() == 3
            || procs.iter_mut().any(|p| p.exited())
    });
    tokens_in_turn(
        &dir,
        3,
        || std::fs::write(&go, "").unwrap(),
        || kv(addr, key).and_then(|e| e["ModifyIndex"].as_u64()),
    );
    assert_all_succeed(&mut procs, &log);
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn semaphore_contenders_keep_the_limit_and_store_the_semaphore_flags() {
    let addr = shared();
    let dir = scratch("real-sem");
    let (log, go, term) = (dir.join("log"), dir.join("go"), dir.join("term"));
    let prefix = "real/sem";
    let sem = ["sem", "--limit", "2", "--prefix", prefix];
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            conlock_proc(
                addr,
                &sem,
                &held_until(&log, &go, &term),
                &format!("holder{i}"),
                &dir,
            )
        })
        .collect();
    wait_starts(&log, 2, &mut procs);
    let tree = kv_tree(addr, prefix);
    let lock = kv(addr, &format!("{prefix}/.lock"));
    for i in 0..4 {
        let args: Vec<&str> = sem
            .iter()
            .copied()
            .chain(["--session-name", "real-sem-waiter"])
            .collect();
        procs.push(conlock_proc(
            addr,
            &args,
            &logged_job(&log, "sleep 0.1"),
            &format!("waiter{i}"),
            &dir,
        ));
    }
    wait_for(LONG, || {
        sessions_named(addr, "real-sem-waiter").len() == 4 || procs.iter_mut().any(|p| p.exited())
    });
    std::fs::write(&go, "").unwrap();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 6, 2);
    assert_eq!(
        max_overlap(&intervals(&read(&log))),
        2,
        "both holders ran together"
    );

    // While the two held: two contender keys and .lock, all with the semaphore flags.
    let lock = lock.expect(".lock exists while held");
    let holders = value_json(&lock);
    assert_eq!(holders["Limit"], 2, ".lock: {holders}");
    let listed: Vec<&String> = holders["Holders"].as_object().unwrap().keys().collect();
    assert_eq!(listed.len(), 2, ".lock: {holders}");
    assert_eq!(tree.len(), 3, "keys while held: {tree:?}");
    for e in &tree {
        assert_eq!(flags(e), SEM_FLAGS, "Flags stored while held: {e}");
        let key = e["Key"].as_str().unwrap();
        if !key.ends_with("/.lock") {
            let session = e["Session"]
                .as_str()
                .expect("a contender key has a session");
            assert_eq!(key, format!("{prefix}/{session}"));
            assert!(listed.iter().any(|s| *s == session), "{key} not in .lock");
        }
    }
    assert!(
        wait_for(LONG, || kv_tree(addr, prefix)
            .iter()
            .all(|e| e["Key"] == format!("{prefix}/.lock"))),
        "contender keys left: {:?}",
        kv_tree(addr, prefix)
    );
}

// ---------------------------------------------------------------------------------------
// 3. Interop with `consul lock` (the same binary as the agent).

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn consul_lock_waits_for_conlock_and_conlock_for_consul_lock() {
    let agent = RealAgent::shared();
    let addr = agent.addr();
    let dir = scratch("real-interop-lock");

    // conlock holds; consul lock reads the key (and checks its flags), waits, then runs.
    let (log, go, term) = (dir.join("log-a"), dir.join("go-a"), dir.join("term-a"));
    let prefix = "real/interop-lock-a";
    let mut procs = vec![conlock_proc(
        addr,
        &["run", "--prefix", prefix],
        &held_until(&log, &go, &term),
        "conlock-holder",
        &dir,
    )];
    wait_starts(&log, 1, &mut procs);
    procs.push(consul_lock_proc(
        addr,
        1,
        prefix,
        &logged_job(&log, "sleep 0.05"),
        "consul-lock-waiter",
        &dir,
    ));
    wait_consul_lock_read(agent, prefix, 1);
    std::fs::write(&go, "").unwrap();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 2, 1);
    for p in &procs {
        assert!(
            !p.output().contains("does not match"),
            "{}: {}",
            p.what,
            p.output()
        );
    }

    // consul lock holds; conlock waits, then runs.
    let (log, go, term) = (dir.join("log-b"), dir.join("go-b"), dir.join("term-b"));
    let prefix = "real/interop-lock-b";
    let events = dir.join("events-b");
    let mut procs = vec![consul_lock_proc(
        addr,
        1,
        prefix,
        &held_until(&log, &go, &term),
        "consul-lock-holder",
        &dir,
    )];
    wait_starts(&log, 1, &mut procs);
    let held = kv(addr, &format!("{prefix}/.lock")).expect("consul lock's key");
    assert_eq!(flags(&held), LOCK_FLAGS, "consul lock's own key: {held}");
    procs.push(conlock_proc(
        addr,
        &[
            "run",
            "--prefix",
            prefix,
            "--events",
            events.to_str().unwrap(),
        ],
        &logged_job(&log, "sleep 0.05"),
        "conlock-waiter",
        &dir,
    ));
    wait_event(&events, "waiting", &mut procs[1]);
    std::fs::write(&go, "").unwrap();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 2, 1);

    // Both kinds at once on one prefix.
    let log = dir.join("log-c");
    let prefix = "real/interop-lock-c";
    let mut procs: Vec<Proc> = (0..3)
        .flat_map(|i| {
            [
                conlock_proc(
                    addr,
                    &["run", "--prefix", prefix],
                    &logged_job(&log, "sleep 0.1"),
                    &format!("conlock{i}"),
                    &dir,
                ),
                consul_lock_proc(
                    addr,
                    1,
                    prefix,
                    &logged_job(&log, "sleep 0.1"),
                    &format!("consul-lock{i}"),
                    &dir,
                ),
            ]
        })
        .collect();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 6, 1);
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn consul_lock_semaphore_and_conlock_sem_share_the_slots() {
    let agent = RealAgent::shared();
    let addr = agent.addr();
    let dir = scratch("real-interop-sem");

    // Two conlock holders fill the slots; consul lock -n 2 reads (flags), waits, runs.
    let (log, go, term) = (dir.join("log-a"), dir.join("go-a"), dir.join("term-a"));
    let prefix = "real/interop-sem-a";
    let sem = ["sem", "--limit", "2", "--prefix", prefix];
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            conlock_proc(
                addr,
                &sem,
                &held_until(&log, &go, &term),
                &format!("conlock-holder{i}"),
                &dir,
            )
        })
        .collect();
    wait_starts(&log, 2, &mut procs);
    procs.push(consul_lock_proc(
        addr,
        2,
        prefix,
        &logged_job(&log, "sleep 0.05"),
        "consul-lock-waiter",
        &dir,
    ));
    wait_consul_lock_read(agent, prefix, 1);
    // conlock status sees the two holders and consul lock's contender key as waiting.
    let ok = wait_for(LONG, || {
        let (_, j) = status_json(addr, &["--prefix", prefix]);
        j["holders"].as_array().map_or(0, Vec::len) == 2 && j["waiting"] == 1
    });
    assert!(ok, "status: {}", status_json(addr, &["--prefix", prefix]).1);
    let (code, j) = status_json(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(0), "{j}");
    assert_eq!(
        (j["kind"].as_str(), j["limit"].as_u64()),
        (Some("semaphore"), Some(2))
    );
    std::fs::write(&go, "").unwrap();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 3, 2);
    for p in &procs {
        assert!(
            !p.output().contains("does not match"),
            "{}: {}",
            p.what,
            p.output()
        );
    }

    // Two consul lock -n 2 holders fill the slots; conlock sem waits, then runs.
    let (log, go, term) = (dir.join("log-b"), dir.join("go-b"), dir.join("term-b"));
    let prefix = "real/interop-sem-b";
    let events = dir.join("events-b");
    let mut procs: Vec<Proc> = (0..2)
        .map(|i| {
            consul_lock_proc(
                addr,
                2,
                prefix,
                &held_until(&log, &go, &term),
                &format!("consul-lock-holder{i}"),
                &dir,
            )
        })
        .collect();
    wait_starts(&log, 2, &mut procs);
    for e in kv_tree(addr, prefix) {
        assert_eq!(flags(&e), SEM_FLAGS, "consul lock -n 2 stored {e}");
    }
    let (code, j) = status_json(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(0), "{j}");
    let names: Vec<&str> = j["holders"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|h| h["name"].as_str())
        .collect();
    assert_eq!(names.len(), 2, "status of consul lock's holders: {j}");
    assert!(
        names.iter().all(|n| n.starts_with("consul-lock-holder")),
        "{j}"
    );
    procs.push(conlock_proc(
        addr,
        &[
            "sem",
            "--limit",
            "2",
            "--prefix",
            prefix,
            "--events",
            events.to_str().unwrap(),
        ],
        &logged_job(&log, "sleep 0.05"),
        "conlock-waiter",
        &dir,
    ));
    wait_event(&events, "waiting", &mut procs[2]);
    std::fs::write(&go, "").unwrap();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 3, 2);

    // Three of each at once on one prefix.
    let log = dir.join("log-c");
    let prefix = "real/interop-sem-c";
    let mut procs: Vec<Proc> = (0..3)
        .flat_map(|i| {
            [
                conlock_proc(
                    addr,
                    &["sem", "--limit", "2", "--prefix", prefix],
                    &logged_job(&log, "sleep 0.2"),
                    &format!("conlock{i}"),
                    &dir,
                ),
                consul_lock_proc(
                    addr,
                    2,
                    prefix,
                    &logged_job(&log, "sleep 0.2"),
                    &format!("consul-lock{i}"),
                    &dir,
                ),
            ]
        })
        .collect();
    assert_all_succeed(&mut procs, &log);
    assert_turns(&log, 6, 2);
}

// ---------------------------------------------------------------------------------------
// 4. status, watch, break.

fn status_json(addr: SocketAddr, args: &[&str]) -> (Option<i32>, Value) {
    let mut c = conlock_at(addr);
    c.arg("status").args(args).arg("--json");
    let (code, out, err) = run_out(c);
    let j = serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("status {args:?} --json: {e}: {out}{err}"));
    (code, j)
}

/// Runs `cmd` to its end (killed, and the test failed, past a generous deadline): its
/// exit code, stdout and stderr.
fn run_out(mut cmd: Command) -> (Option<i32>, String, String) {
    let dir = scratch("real-cmd");
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    cmd.stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    let mut child = KillOnDrop(cmd.spawn().unwrap());
    let code = wait_exit(&mut child.0, LONG).code();
    (code, read(&out), read(&err))
}

fn status_text(addr: SocketAddr, args: &[&str]) -> (Option<i32>, String) {
    let mut c = conlock_at(addr);
    c.arg("status").args(args);
    let (code, out, err) = run_out(c);
    (code, format!("{out}{err}"))
}

/// `conlock watch ARGS --json`, its lines read on a thread so that a missing line fails
/// the test instead of hanging it.
struct Watch {
    lines: Receiver<String>,
    child: KillOnDrop,
}

impl Watch {
    fn start(addr: SocketAddr, args: &[&str]) -> Watch {
        use std::io::BufRead;
        let mut child = conlock_at(addr)
            .arg("watch")
            .args(args)
            .arg("--json")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
            {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Watch {
            lines,
            child: KillOnDrop(child),
        }
    }

    /// The next event and its holder's session.
    fn next(&mut self) -> (String, Option<String>) {
        let l = match self.lines.recv_timeout(LONG) {
            Ok(l) => l,
            Err(e) => panic!(
                "watch printed no line ({e}); it exited {:?} (its stderr is above)",
                self.child.0.try_wait()
            ),
        };
        let j: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"));
        (
            j["event"].as_str().unwrap_or_default().to_string(),
            j["holder"]["session"].as_str().map(str::to_string),
        )
    }
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn status_watch_and_break_on_a_lock_conlock_holds() {
    let addr = shared();
    let dir = scratch("real-ops-conlock");
    let prefix = "real/ops-conlock";
    let (log, go, term) = (dir.join("log"), dir.join("go"), dir.join("term"));
    let mut w = Watch::start(addr, &["--prefix", prefix]);
    assert_eq!(w.next().0, "free");
    let (code, text) = status_text(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(1), "{text}");
    assert!(text.contains("state: free"), "{text}");

    let mut h = conlock_proc(
        addr,
        &[
            "run",
            "--prefix",
            prefix,
            "--session-name",
            "real-ops-holder",
            "--lock-delay",
            "3s",
            "--kill-grace",
            "200ms",
        ],
        &held_until(&log, &go, &term),
        "holder",
        &dir,
    );
    wait_starts(&log, 1, std::slice::from_mut(&mut h));
    let (event, session) = w.next();
    assert_eq!(event, "acquired");
    let session = session.expect("the acquired event names the session");

    let (code, text) = status_text(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(0), "{text}");
    for want in [
        "held",
        "real-ops-holder",
        "fencing token:",
        "lock-delay 3s",
        &session,
    ] {
        assert!(text.contains(want), "status lacks {want:?}:\n{text}");
    }
    let (code, j) = status_json(addr, &["--key", &format!("{prefix}/.lock")]);
    assert_eq!(code, Some(0), "{j}");
    assert_eq!(
        (
            j["kind"].as_str(),
            j["held"].as_bool(),
            j["lock_index"].as_u64()
        ),
        (Some("lock"), Some(true), Some(1)),
        "{j}"
    );
    assert_eq!(j["holder"]["name"], "real-ops-holder", "{j}");
    assert_eq!(j["holder"]["session"], session.as_str(), "{j}");
    let stored = kv(addr, &format!("{prefix}/.lock")).unwrap();
    assert_eq!(j["modify_index"], stored["ModifyIndex"], "{j} vs {stored}");

    // Without --yes (no terminal): refused, still held.
    let mut c = conlock_at(addr);
    c.args(["break", "--prefix", prefix]);
    let (code, _, err) = run_out(c);
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(status_json(addr, &["--prefix", prefix]).0, Some(0));

    let mut c = conlock_at(addr);
    c.args(["break", "--prefix", prefix, "--yes"]);
    let (code, out, err) = run_out(c);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("destroyed session {session}")),
        "{out}"
    );
    assert_eq!(h.finish(), Some(124), "{}", h.output());
    assert!(h.output().contains("lock lost"), "{}", h.output());
    assert!(
        !read(&term).is_empty(),
        "the holder's command got no SIGTERM"
    );
    assert_eq!(w.next(), ("lost".to_string(), Some(session.clone())));
    // Free, in the lock-delay that break and the losing holder recorded in the key
    // (Consul does not show it); run sees the same.
    let (code, text) = status_text(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(2), "{text}");
    assert!(
        text.contains("free, but in a lock-delay until about"),
        "{text}"
    );
    let mut c = conlock_at(addr);
    c.args(["break", "--prefix", prefix, "--yes"]);
    let (code, out, _) = run_out(c);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("nothing to break"), "{out}");
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn status_watch_and_break_on_a_lock_consul_lock_holds() {
    let addr = shared();
    let dir = scratch("real-ops-consul");
    let prefix = "real/ops-consul";
    let (log, go, term) = (dir.join("log"), dir.join("go"), dir.join("term"));
    let mut w = Watch::start(addr, &["--prefix", prefix]);
    assert_eq!(w.next().0, "free");
    let mut h = consul_lock_proc(
        addr,
        1,
        prefix,
        &held_until(&log, &go, &term),
        "real-ops-consul-holder",
        &dir,
    );
    wait_starts(&log, 1, std::slice::from_mut(&mut h));
    let (event, session) = w.next();
    assert_eq!(event, "acquired");
    let session = session.expect("the acquired event names the session");

    let (code, text) = status_text(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(0), "{text}");
    for want in ["held", "real-ops-consul-holder", "fencing token:", &session] {
        assert!(text.contains(want), "status lacks {want:?}:\n{text}");
    }
    let (code, j) = status_json(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(0), "{j}");
    assert_eq!(
        (j["kind"].as_str(), j["held"].as_bool()),
        (Some("lock"), Some(true))
    );
    assert_eq!(j["holder"]["name"], "real-ops-consul-holder", "{j}");

    let mut c = conlock_at(addr);
    c.args(["break", "--prefix", prefix, "--yes"]);
    let (code, out, err) = run_out(c);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        out.contains(&format!("destroyed session {session}")),
        "{out}"
    );
    // consul lock sees the loss and stops its command (it exits 0 then, see the README).
    assert!(
        wait_for(LONG, || !read(&term).is_empty()),
        "consul lock's command got no SIGTERM: {}",
        h.output()
    );
    assert_eq!(h.finish(), Some(0), "{}", h.output());
    assert_eq!(w.next(), ("lost".to_string(), Some(session)));
    // consul lock deleted the key on its way out (its Destroy), so it is free.
    let (code, text) = status_text(addr, &["--prefix", prefix]);
    assert_eq!(code, Some(1), "{text}");
    assert!(kv(addr, &format!("{prefix}/.lock")).is_none());
}

// ---------------------------------------------------------------------------------------
// 5. Faults a single real agent can show.

/// A command that ignores SIGTERM (noting when it came) and appends a ns timestamp to
/// `beats` every 20 ms until SIGKILL.
fn stubborn_heartbeat(beats: &Path, term: &Path) -> String {
    format!(
        "trap 'date +%s%N > {}' TERM; while :; do date +%s%N >> {}; sleep 0.02; done",
        term.display(),
        beats.display()
    )
}

fn last_beat(beats: &Path) -> u128 {
    read(beats)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .unwrap_or_else(|| panic!("no heartbeat in {}", beats.display()))
}

fn wait_beating(beats: &Path, p: &mut Proc) {
    let ok = wait_for(LONG, || read(beats).lines().count() >= 3 || p.exited());
    assert!(
        ok && read(beats).lines().count() >= 3,
        "{}'s command never ran: {}",
        p.what,
        p.output()
    );
}

fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn break_while_held_is_a_loss_and_the_waiter_starts_after_the_lock_delay() {
    let addr = shared();
    let dir = scratch("real-break");
    let key = "real/break/k";
    let (beats, term, start, events) = (
        dir.join("beats"),
        dir.join("term"),
        dir.join("start"),
        dir.join("events"),
    );
    let mut a = conlock_proc(
        addr,
        &[
            "run",
            "--key",
            key,
            "--lock-delay",
            "2s",
            "--kill-grace",
            "300ms",
        ],
        &stubborn_heartbeat(&beats, &term),
        "holder",
        &dir,
    );
    wait_beating(&beats, &mut a);
    let mut b = conlock_proc(
        addr,
        &["run", "--key", key, "--events", events.to_str().unwrap()],
        &format!("date +%s%N > {0}.tmp; mv {0}.tmp {0}", start.display()),
        "waiter",
        &dir,
    );
    wait_event(&events, "waiting", &mut b);
    let before = now_ns();
    let mut c = conlock_at(addr);
    c.args(["break", "--key", key, "--yes"]);
    let (code, out, err) = run_out(c);
    let after = now_ns();
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(a.finish(), Some(124), "{}", a.output());
    assert!(a.output().contains("lock lost"), "{}", a.output());
    assert_eq!(b.finish(), Some(0), "{}", b.output());
    let began: u128 = read(&start)
        .trim()
        .parse()
        .expect("the waiter's start stamp");
    let last = last_beat(&beats);
    let (from_break, from_last) = (
        ms(began as i128 - before as i128),
        ms(began as i128 - last as i128),
    );
    eprintln!(
        "break: waiter started {from_break:.0} ms after the break began ({:.0} ms after it returned), {from_last:.0} ms after the old command's last heartbeat",
        ms(began as i128 - after as i128)
    );
    assert!(
        !read(&term).is_empty(),
        "the holder's command got no SIGTERM"
    );
    assert!(
        began > last,
        "two holders: the old command ran after the new one started"
    );
    // Consul refuses the key for the destroyed session's 2 s lock-delay.
    assert!(
        from_break >= 2000.0,
        "the waiter started inside the lock-delay"
    );
    // A waiter that saw the holder sleeps until the delay ends (generous for a busy host).
    let late = ms(began as i128 - after as i128) - 2000.0;
    assert!(
        late < 3000.0,
        "the waiter started {late:.0} ms after the lock-delay"
    );
}

/// A holder whose agent is SIGKILLed or SIGSTOPped. Consul could hand the lock on no
/// earlier than an invalidation after the holder's last confirmation (sent before the
/// fault) plus the lock-delay, so the command must be dead within one lock-delay of the
/// fault: conlock's deadline (docs/safety.md) does that, though every request fails or
/// hangs, and long before the session's TTL (10 s, renewed every 5 s) could run out.
fn agent_fault_stops_the_command(fault: &str) {
    let mut agent = RealAgent::start(fault);
    let addr = agent.addr();
    let dir = scratch(&format!("real-{fault}"));
    let (beats, term) = (dir.join("beats"), dir.join("term"));
    let lock_delay_ms = 4000.0;
    let mut h = conlock_proc(
        addr,
        &[
            "run",
            "--key",
            "real/fault",
            "--ttl",
            "10s",
            "--lock-delay",
            "4s",
            "--kill-grace",
            "1s",
        ],
        &stubborn_heartbeat(&beats, &term),
        "holder",
        &dir,
    );
    wait_beating(&beats, &mut h);
    let at = now_ns();
    match fault {
        "kill" => agent.kill(),
        _ => agent.stop(),
    }
    let code = h.finish();
    let exited = now_ns();
    if fault == "stop" {
        agent.cont();
    }
    assert_eq!(code, Some(124), "{}", h.output());
    assert!(h.output().contains("lock lost"), "{}", h.output());
    let last = last_beat(&beats);
    let term_ms = read(&term)
        .trim()
        .parse::<u128>()
        .map(|t| ms(t as i128 - at as i128));
    let dead_ms = ms(last as i128 - at as i128);
    eprintln!(
        "agent {fault}: SIGTERM {term_ms:?} ms, last heartbeat {dead_ms:.0} ms, conlock exit {:.0} ms after the fault",
        ms(exited as i128 - at as i128)
    );
    assert!(
        dead_ms < lock_delay_ms,
        "the command still ran {dead_ms:.0} ms after the agent's {fault}, past its {lock_delay_ms} ms lock-delay"
    );
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn killed_agent_stops_the_command_in_time() {
    agent_fault_stops_the_command("kill");
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn stopped_agent_stops_the_command_in_time() {
    agent_fault_stops_the_command("stop");
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn timeout_bounds_the_wait_on_a_held_lock() {
    let agent = RealAgent::shared();
    let addr = agent.addr();
    let dir = scratch("real-timeout");
    let (log, go, term) = (dir.join("log"), dir.join("go"), dir.join("term"));
    let prefix = "real/timeout";
    let mut h = conlock_proc(
        addr,
        &["run", "--prefix", prefix],
        &held_until(&log, &go, &term),
        "holder",
        &dir,
    );
    wait_starts(&log, 1, std::slice::from_mut(&mut h));
    let ran = dir.join("ran");
    let try_for = |timeout: &str| {
        let mut c = conlock_at(addr);
        c.args([
            "run",
            "--prefix",
            prefix,
            "--timeout",
            timeout,
            "--",
            "touch",
        ])
        .arg(&ran);
        let t = Instant::now();
        let (code, out, err) = run_out(c);
        (code, t.elapsed(), format!("{out}{err}"))
    };
    let (code, took, said) = try_for("0s");
    assert_eq!(code, Some(75), "{said}");
    assert!(took < Duration::from_secs(20), "--timeout 0s took {took:?}");
    let (code, took, said) = try_for("2s");
    assert_eq!(code, Some(75), "{said}");
    assert!(took >= Duration::from_secs(2), "gave up after {took:?}");
    assert!(took < Duration::from_secs(30), "--timeout 2s took {took:?}");
    std::fs::write(&go, "").unwrap();
    assert_eq!(h.finish(), Some(0), "{}", h.output());

    // The same on a lock `consul lock` holds.
    let (log, go, term) = (dir.join("log-c"), dir.join("go-c"), dir.join("term-c"));
    let mut h = consul_lock_proc(
        addr,
        1,
        prefix,
        &held_until(&log, &go, &term),
        "consul-lock-holder",
        &dir,
    );
    wait_starts(&log, 1, std::slice::from_mut(&mut h));
    let (code, took, said) = try_for("1s");
    assert_eq!(code, Some(75), "{said}");
    assert!(took >= Duration::from_secs(1), "gave up after {took:?}");
    std::fs::write(&go, "").unwrap();
    assert_eq!(h.finish(), Some(0), "{}", h.output());
    assert!(!ran.exists(), "a timed-out run ran its command");
}

#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn datacenter_local_works_and_unknown_is_a_clear_error() {
    let addr = shared();
    let dir = scratch("real-dc");
    let dc = get_json(addr, "/v1/agent/self").expect("/v1/agent/self")["Config"]["Datacenter"]
        .as_str()
        .expect("the agent's datacenter")
        .to_string();
    let ran = dir.join("ran");
    let mut c = conlock_at(addr);
    c.args([
        "run",
        "--datacenter",
        &dc,
        "--key",
        "real/dc/k",
        "--",
        "sh",
        "-c",
    ])
    .arg(format!("echo $CONLOCK_KEY > {}", ran.display()));
    let (code, out, err) = run_out(c);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(read(&ran).trim(), "real/dc/k");
    let mut c = conlock_at(addr);
    c.args([
        "sem",
        "--datacenter",
        &dc,
        "--limit",
        "1",
        "--prefix",
        "real/dc/sem",
        "--",
        "sh",
        "-c",
    ])
    .arg(format!("echo $CONLOCK_LIMIT >> {}", ran.display()));
    let (code, out, err) = run_out(c);
    assert_eq!(code, Some(0), "{out}{err}");
    assert_eq!(read(&ran).lines().nth(1), Some("1"));
    let (code, text) = status_text(addr, &["--datacenter", &dc, "--key", "real/dc/k"]);
    assert_eq!(code, Some(1), "{text}");

    let bogus = "no-such-dc";
    let never = dir.join("never");
    for args in [
        vec![
            "run",
            "--key",
            "real/dc/k",
            "--",
            "touch",
            never.to_str().unwrap(),
        ],
        vec![
            "sem",
            "--limit",
            "1",
            "--prefix",
            "real/dc/sem",
            "--",
            "touch",
            never.to_str().unwrap(),
        ],
        vec!["status", "--key", "real/dc/k"],
        vec!["break", "--key", "real/dc/k", "--yes"],
    ] {
        let mut c = conlock_at(addr);
        // Before the subcommand, where conlock takes the connection flags too.
        c.args(["--datacenter", bogus]).args(&args);
        let (code, out, err) = run_out(c);
        assert_eq!(code, Some(125), "{args:?}: {out}{err}");
        // Lines before it may say that the session create is retried.
        let last = err.trim().lines().last().unwrap_or_default();
        assert!(
            last.starts_with("conlock: error:")
                && last.contains("No path to datacenter")
                && last.contains(&format!("{bogus:?}"))
                && last.contains("--datacenter"),
            "{args:?}: the error should give Consul's answer, the datacenter and where it came from: {err}"
        );
    }
    assert!(
        !never.exists(),
        "a command ran against an unknown datacenter"
    );
}
