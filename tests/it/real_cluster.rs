//! Real-agent tier, cluster part: a real Consul cluster of 3 servers and 1 client agent on
//! loopback (`performance.raft_multiplier = 1`, as in
//! `tests/fixtures/consul-1.0.8/10-node-failure.json`), and conlock holders and waiters
//! through different agents while a leader is SIGKILLed, the client agent is SIGSTOPped
//! (its node is marked failed and its `serfHealth`-tied sessions invalidated), or a
//! holding conlock is SIGKILLed. Overlap is judged only from timestamps the commands
//! write. Run by `make test-real CONSUL_BIN=/path/to/consul` (ignored otherwise); the
//! consul binary comes from `CONLOCK_REAL_CONSUL`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::common::{try_http_timeout, Resp};
use crate::harness::{conlock_at, read, scratch, wait_exit, wait_for};

/// Generous: a 2-core machine shared with other builds.
const LONG: Duration = Duration::from_secs(180);
/// One HTTP probe of an agent: a stopped agent must not hang the test.
const PROBE: Duration = Duration::from_secs(3);

/// One cluster at a time: four Consul agents are already a load on two cores, and raft
/// with `raft_multiplier = 1` is sensitive to a starved scheduler.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The consul binary the tier runs.
fn consul_bin() -> PathBuf {
    let Some(path) = std::env::var_os("CONLOCK_REAL_CONSUL").filter(|p| !p.is_empty()) else {
        panic!(
            "CONLOCK_REAL_CONSUL is not set: set it to a consul binary (make test-real CONSUL_BIN=/path/to/consul)"
        );
    };
    let path = PathBuf::from(path);
    use std::os::unix::fs::PermissionsExt;
    let runnable =
        std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    assert!(
        runnable,
        "CONLOCK_REAL_CONSUL={} is not an executable file",
        path.display()
    );
    path
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

fn ms(from: u128, to: u128) -> f64 {
    (to as i128 - from as i128) as f64 / 1e6
}

// ---------------------------------------------------------------------------------------
// The cluster.

/// Free loopback ports, each free for TCP and UDP (serf uses both), distinct from each
/// other: all are held until all are chosen.
fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        let port = tcp.local_addr().unwrap().port();
        if let Ok(udp) = std::net::UdpSocket::bind(("127.0.0.1", port)) {
            ports.push(port);
            held.push((tcp, udp));
        }
    }
    ports
}

struct Agent {
    name: String,
    http: SocketAddr,
    /// The server RPC port: `/v1/status/leader` names the leader by it.
    rpc: u16,
    child: Option<Child>,
    log: PathBuf,
}

/// Agents 0, 1, 2 are servers (`srv1`..`srv3`), agent 3 the client agent `client1`. Every
/// agent still running is SIGKILLed by PID on drop (also a stopped one).
struct Cluster {
    agents: Vec<Agent>,
    /// Data dirs and logs, removed on drop unless the test failed.
    dir: PathBuf,
}

const CLIENT: usize = 3;

impl Cluster {
    fn start(consul: &Path, name: &str) -> Cluster {
        let dir = scratch(&format!("cluster-{name}"));
        // Per agent: http, serf_lan, serf_wan, server.
        let ports = free_ports(16);
        let serf_lan = |i: usize| ports[i * 4 + 1];
        let mut agents = Vec::new();
        for i in 0..4 {
            let server = i < CLIENT;
            let name = if server {
                format!("srv{}", i + 1)
            } else {
                "client1".to_string()
            };
            let data = dir.join(&name);
            std::fs::create_dir_all(&data).unwrap();
            let join: Vec<String> = (0..CLIENT)
                .filter(|&j| j != i)
                .map(|j| format!("127.0.0.1:{}", serf_lan(j)))
                .collect();
            let mut cfg = serde_json::json!({
                "node_name": name,
                "datacenter": "dc1",
                "data_dir": data.join("data"),
                "server": server,
                "bind_addr": "127.0.0.1",
                "client_addr": "127.0.0.1",
                "advertise_addr": "127.0.0.1",
                "ports": {
                    "http": ports[i * 4],
                    "serf_lan": serf_lan(i),
                    "serf_wan": ports[i * 4 + 2],
                    "server": ports[i * 4 + 3],
                    "dns": -1,
                    "https": -1
                },
                "retry_join": join,
                "retry_interval": "1s",
                "performance": {"raft_multiplier": 1},
                "disable_update_check": true,
                "disable_host_node_id": true,
                "log_level": "INFO"
            });
            if server {
                cfg["bootstrap_expect"] = 3.into();
            }
            let cfg_path = data.join("config.json");
            std::fs::write(&cfg_path, cfg.to_string()).unwrap();
            let log = data.join("agent.log");
            let out = std::fs::File::create(&log).unwrap();
            let child = Command::new(consul)
                .args(["agent", "-config-file"])
                .arg(&cfg_path)
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", consul.display()));
            agents.push(Agent {
                name,
                http: SocketAddr::from(([127, 0, 0, 1], ports[i * 4])),
                rpc: ports[i * 4 + 3],
                child: Some(child),
                log,
            });
        }
        let mut cluster = Cluster { agents, dir };
        cluster.wait_ready();
        cluster
    }

    fn http(&self, i: usize) -> SocketAddr {
        self.agents[i].http
    }

    fn pid(&self, i: usize) -> i32 {
        self.agents[i].child.as_ref().expect("agent runs").id() as i32
    }

    /// The last lines of every agent's log, for a failure message.
    fn logs(&self) -> String {
        let mut s = String::new();
        for a in &self.agents {
            let text = read(&a.log);
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(15)..];
            s.push_str(&format!(
                "\n--- {} ({}):\n{}",
                a.name,
                a.log.display(),
                tail.join("\n")
            ));
        }
        s
    }

    fn request(&self, i: usize, method: &str, path: &str, body: Option<&[u8]>) -> Option<Resp> {
        try_http_timeout(self.http(i), method, path, body, &[], PROBE).ok()
    }

    /// The leader's index as agent `via` sees it (None: no leader known, or no answer).
    fn leader_via(&self, via: usize) -> Option<usize> {
        let r = self.request(via, "GET", "/v1/status/leader", None)?;
        let addr: String = serde_json::from_slice(&r.body).ok()?;
        let port: u16 = addr.rsplit(':').next()?.parse().ok()?;
        (0..CLIENT).find(|&i| self.agents[i].rpc == port)
    }

    /// The current leader, as the client agent and every live server agree.
    fn leader(&self) -> Option<usize> {
        let l = self.leader_via(CLIENT)?;
        let servers_agree = (0..CLIENT)
            .filter(|&i| self.agents[i].child.is_some())
            .all(|i| self.leader_via(i) == Some(l));
        (servers_agree && self.agents[l].child.is_some()).then_some(l)
    }

    /// A KV write through agent `i` is applied (a raft write through the leader).
    fn kv_write_ok(&self, i: usize) -> bool {
        self.request(i, "PUT", "/v1/kv/real-cluster/probe", Some(b"x"))
            .is_some_and(|r| r.status == 200 && r.body == b"true")
    }

    /// Every node of the cluster is in the catalog with `serfHealth` passing.
    fn all_nodes_healthy(&self) -> bool {
        let Some(r) = self.request(0, "GET", "/v1/health/state/passing", None) else {
            return false;
        };
        let Ok(Value::Array(checks)) = serde_json::from_slice::<Value>(&r.body) else {
            return false;
        };
        self.agents.iter().all(|a| {
            checks
                .iter()
                .any(|c| c["Node"] == a.name.as_str() && c["CheckID"] == "serfHealth")
        })
    }

    /// A session can be created through the client agent (its node is registered).
    fn client_session_ok(&self) -> bool {
        let Some(r) = self.request(CLIENT, "PUT", "/v1/session/create", Some(b"{}")) else {
            return false;
        };
        let Ok(v) = serde_json::from_slice::<Value>(&r.body) else {
            return false;
        };
        let Some(id) = v["ID"].as_str() else {
            return false;
        };
        self.request(
            CLIENT,
            "PUT",
            &format!("/v1/session/destroy/{id}"),
            Some(b""),
        );
        true
    }

    fn wait_ready(&mut self) {
        let t0 = Instant::now();
        let ready = wait_for(LONG, || {
            self.agents.iter_mut().all(|a| {
                let child = a.child.as_mut().unwrap();
                matches!(child.try_wait(), Ok(None))
            }) && self.leader().is_some()
                && self.kv_write_ok(CLIENT)
                && self.all_nodes_healthy()
                && self.client_session_ok()
        });
        assert!(
            ready,
            "the Consul cluster (3 servers, 1 client agent) did not get a leader, a KV write through the client agent and 4 healthy nodes within {LONG:?}; agent logs:{}",
            self.logs()
        );
        // Leadership can still move right after the first election on a busy machine;
        // the scenarios pick agents by who leads, so wait until it stays put for 2 s.
        let mut seen = (self.leader(), Instant::now());
        let stable = wait_for(LONG, || {
            let now = self.leader();
            if now != seen.0 || now.is_none() {
                seen = (now, Instant::now());
            }
            seen.1.elapsed() >= Duration::from_secs(2)
        });
        assert!(
            stable,
            "the cluster's leader did not stay the same for 2 s within {LONG:?}; agent logs:{}",
            self.logs()
        );
        eprintln!(
            "real_cluster: cluster ready after {:.1} s",
            t0.elapsed().as_secs_f64()
        );
    }

    /// SIGKILLs agent `i` and reaps it.
    fn kill(&mut self, i: usize) {
        let mut child = self.agents[i].child.take().expect("agent runs");
        let _ = child.kill();
        let _ = child.wait();
    }

    fn signal(&self, i: usize, sig: i32) {
        // SAFETY: kill(2) on the PID of a child we have not reaped.
        assert_eq!(unsafe { libc::kill(self.pid(i), sig) }, 0, "kill {sig}");
    }

    /// Waits until a new leader, other than `old`, is agreed on and takes writes
    /// through agent `via`; returns when that was seen (ns).
    fn wait_new_leader(&self, old: usize, via: usize) -> u128 {
        assert!(
            wait_for(LONG, || self
                .leader()
                .is_some_and(|l| l != old && self.kv_write_ok(via))),
            "no new leader took writes within {LONG:?} after the old one was killed; agent logs:{}",
            self.logs()
        );
        now_ns()
    }

    /// The session IDs agent `via` lists.
    fn sessions(&self, via: usize) -> Vec<Value> {
        self.request(via, "GET", "/v1/session/list", None)
            .and_then(|r| serde_json::from_slice::<Vec<Value>>(&r.body).ok())
            .unwrap_or_default()
    }

    /// The session holding `key`, read through agent `via` (None: free, or no answer).
    fn key_session(&self, via: usize, key: &str) -> Option<Option<String>> {
        let r = self.request(via, "GET", &format!("/v1/kv/{key}"), None)?;
        if r.status == 404 {
            return Some(None);
        }
        let v: Value = serde_json::from_slice(&r.body).ok()?;
        Some(v[0]["Session"].as_str().map(str::to_string))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for a in &mut self.agents {
            if let Some(mut c) = a.child.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Commands and their timestamps.

/// A job that appends `S <tag> <ns>`, then `B <tag> <ns>` every 20 ms while `until` (a
/// shell condition) is false, then `E <tag> <ns>` to `log`. A killed job's last beat is
/// the last moment it is known to have run.
fn job(log: &Path, tag: &str, until: &str, ignore_term: bool) -> String {
    let log = log.display();
    let trap = if ignore_term { "trap '' TERM; " } else { "" };
    format!(
        "{trap}echo \"S {tag} $(date +%s%N)\" >> {log}; \
         until {until}; do echo \"B {tag} $(date +%s%N)\" >> {log}; sleep 0.02; done; \
         echo \"E {tag} $(date +%s%N)\" >> {log}"
    )
}

/// A shell condition that turns true `ms` after it is first evaluated.
fn after_ms(ms: u64) -> String {
    format!(
        "[ $(date +%s%N) -ge ${{end:=$(( $(date +%s%N) + {} ))}} ]",
        ms * 1_000_000
    )
}

fn file_exists(p: &Path) -> String {
    format!("[ -e {} ]", p.display())
}

/// Per tag: (start, last moment seen running: `E` or the last beat).
fn runs(log: &Path) -> std::collections::BTreeMap<String, (u128, u128)> {
    let mut out = std::collections::BTreeMap::new();
    for line in read(log).lines() {
        let p: Vec<&str> = line.split_whitespace().collect();
        let [kind, tag, t] = p[..] else { continue };
        let Ok(t) = t.parse::<u128>() else { continue };
        match kind {
            "S" => {
                out.insert(tag.to_string(), (t, t));
            }
            "B" | "E" => {
                if let Some(r) = out.get_mut(tag) {
                    r.1 = r.1.max(t);
                }
            }
            _ => {}
        }
    }
    out
}

fn started(log: &Path, tag: &str) -> bool {
    runs(log).contains_key(tag)
}

/// The conlocks of a scenario, each with its name and stderr file; kills those left
/// behind by a failing test.
struct Procs(Vec<(String, Child, PathBuf)>);

impl Procs {
    /// `conlock <args> -- sh -c <cmd>` through `addr`, as `name`, stderr (with `-v`
    /// timestamps) to `dir/<name>.err`, `--events` to `dir/<name>.events`.
    fn spawn(&mut self, name: &str, addr: SocketAddr, args: &[&str], cmd: &str, dir: &Path) {
        let err = dir.join(format!("{name}.err"));
        let child = conlock_at(addr)
            .args(args)
            .arg("-v")
            .arg("--events")
            .arg(dir.join(format!("{name}.events")))
            .args(["--", "sh", "-c", cmd])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        self.0.push((name.to_string(), child, err));
    }

    /// conlock `i` found the claim busy and waits (its `waiting` event; for ordering
    /// only, never as evidence of who ran when).
    fn waiting(&self, i: usize) -> bool {
        read(&self.0[i].2.with_extension("events")).contains(r#""event":"waiting""#)
    }

    fn stderr(&self, i: usize) -> String {
        format!("{}'s stderr:\n{}", self.0[i].0, read(&self.0[i].2))
    }

    /// Waits until `cond` holds; fails at once, with its stderr, if a conlock fails
    /// meanwhile (a waiter that refuses the key exits 125 at once).
    fn wait(&mut self, what: &str, mut cond: impl FnMut(&Self) -> bool) {
        let mut exited = None;
        let ok = wait_for(LONG, || {
            if cond(self) {
                return true;
            }
            for (i, (_, c, _)) in self.0.iter_mut().enumerate() {
                match c.try_wait().unwrap() {
                    Some(st) if !st.success() => {
                        exited = Some((i, st));
                        return true;
                    }
                    _ => {}
                }
            }
            false
        });
        if let Some((i, st)) = exited {
            panic!(
                "{} exited ({st:?}) while waiting until {what}\n{}",
                self.0[i].0,
                self.stderr(i)
            );
        }
        assert!(ok, "not within {LONG:?}: {what}");
    }

    /// Waits for conlock `i` to exit; returns its status and a text for failures.
    fn exit(&mut self, i: usize) -> (ExitStatus, String) {
        let st = wait_exit(&mut self.0[i].1, LONG);
        eprintln!("real_cluster: {} exited {st:?}", self.0[i].0);
        (
            st,
            format!("{} exited {st:?}; {}", self.0[i].0, self.stderr(i)),
        )
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c, _) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Scenarios.

/// A holder through the client agent, a waiter through a follower; the leader is
/// SIGKILLed while the holder's command runs. The holder keeps its lock (exit 0) or stops
/// its command (exit 124); the waiter never runs beside it, and runs after it.
#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn leader_kill_keeps_one_holder() {
    let consul = consul_bin();
    let _one = serial();
    let mut cl = Cluster::start(&consul, "leader-kill");
    let dir = scratch("real-leader-kill");
    let (log, go) = (dir.join("log"), dir.join("go"));
    let args = ["run", "--key", "lk/k"];
    let mut p = Procs(Vec::new());
    let hold = job(&log, "h", &file_exists(&go), false);
    p.spawn("holder", cl.http(CLIENT), &args, &hold, &dir);
    p.wait("the holder's command runs", |_p| started(&log, "h"));
    let leader = cl.leader().expect("a leader");
    let follower = (0..CLIENT).find(|&i| i != leader).unwrap();
    let wait = job(&log, "w", &after_ms(300), false);
    p.spawn("waiter", cl.http(follower), &args, &wait, &dir);
    p.wait("the waiter waits", |p| p.waiting(1));
    let victim = cl.leader().expect("a leader");
    assert_ne!(
        victim, follower,
        "leadership moved to the waiter's agent before the kill; rerun"
    );
    let t_kill = now_ns();
    cl.kill(victim);
    let t_new = cl.wait_new_leader(victim, CLIENT);
    eprintln!(
        "real_cluster: leader {} killed; a new leader took writes {:.0} ms later",
        cl.agents[victim].name,
        ms(t_kill, t_new)
    );
    // The holder's command runs on through a few confirmations under the new leader
    // (one every 3.1 s with the defaults), unless it lost the lock meanwhile.
    wait_for(Duration::from_secs(7), || {
        p.0[0].1.try_wait().unwrap().is_some()
    });
    std::fs::write(&go, "").unwrap();
    let (h, h_text) = p.exit(0);
    assert!(matches!(h.code(), Some(0 | 124)), "{h_text}");
    let (w, w_text) = p.exit(1);
    assert!(w.success(), "{w_text}\n{h_text}");
    let r = runs(&log);
    let (_, he) = r["h"];
    let (ws, _) = *r.get("w").expect("the waiter's command ran");
    eprintln!(
        "real_cluster: the holder's command ran until {:.0} ms after the kill; the waiter's started {:.1} ms after the holder's last stamp",
        ms(t_kill, he),
        ms(he, ws)
    );
    assert!(
        ws > he,
        "two holders: the waiter started {:.1} ms before the holder's command ended\n{h_text}\n{w_text}",
        ms(ws, he)
    );
}

/// The holder's session, created through the client agent, carries `serfHealth` of the
/// client's node. The client agent is SIGSTOPped: the holder can neither renew nor
/// confirm. The servers invalidate the session when they mark the node failed (about 6 s
/// later), and the lock-delay (5 s) after that lets a waiter on a server in; the holder's
/// command must be dead by then, and the holder exits 124 (a loss).
#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn stopped_client_agent_holder_stops_before_the_waiter_starts() {
    let consul = consul_bin();
    let _one = serial();
    let cl = Cluster::start(&consul, "sigstop");
    let dir = scratch("real-sigstop");
    let log = dir.join("log");
    let key = "ss/k";
    let args = [
        "run",
        "--key",
        key,
        "--lock-delay",
        "5s",
        "--kill-grace",
        "1s",
    ];
    let mut p = Procs(Vec::new());
    // The holder's command ignores SIGTERM: only the SIGKILL after the grace ends it.
    p.spawn(
        "holder",
        cl.http(CLIENT),
        &args,
        &job(&log, "h", "false", true),
        &dir,
    );
    p.wait("the holder's command runs", |_p| started(&log, "h"));
    let wait = job(&log, "w", &after_ms(300), false);
    p.spawn("waiter", cl.http(0), &args, &wait, &dir);
    p.wait("the waiter waits", |p| p.waiting(1));
    let holder = cl.key_session(0, key).flatten().expect("the key is held");
    let info = cl
        .sessions(0)
        .into_iter()
        .find(|s| s["ID"] == holder.as_str())
        .expect("the holder's session is listed");
    assert_eq!(info["Node"], "client1", "{info}");
    assert_eq!(info["Checks"], serde_json::json!(["serfHealth"]), "{info}");

    let t_stop = now_ns();
    cl.signal(CLIENT, libc::SIGSTOP);
    // When the servers freed the key, polled through a server.
    let mut t_freed = None;
    let done = wait_for(LONG, || {
        if t_freed.is_none()
            && cl
                .key_session(0, key)
                .is_some_and(|s| s.as_ref() != Some(&holder))
        {
            t_freed = Some(now_ns());
        }
        std::thread::sleep(Duration::from_millis(40));
        p.0[1].1.try_wait().unwrap().is_some()
    });
    assert!(done, "the waiter did not finish within {LONG:?}");
    let (w, w_text) = p.exit(1);
    let (h, h_text) = p.exit(0);
    cl.signal(CLIENT, libc::SIGCONT);
    assert!(w.success(), "{w_text}\n{h_text}");
    let r = runs(&log);
    let (_, he) = r["h"];
    let (ws, _) = *r.get("w").expect("the waiter's command ran");
    let t_freed = t_freed.expect("the key was never seen freed before the waiter ended");
    eprintln!(
        "real_cluster: after SIGSTOP: the holder's last stamp {:.0} ms, key seen freed {:.0} ms, the waiter's command started {:.0} ms ({:.0} ms after the key was seen freed, {:.0} ms after the holder's last stamp)",
        ms(t_stop, he),
        ms(t_stop, t_freed),
        ms(t_stop, ws),
        ms(t_freed, ws),
        ms(he, ws)
    );
    assert!(
        ws > he,
        "two holders: the waiter started {:.1} ms before the stopped holder's command ended\n{h_text}\n{w_text}",
        ms(ws, he)
    );
    assert_eq!(h.code(), Some(124), "{h_text}");
}

/// The holding conlock is SIGKILLed: its guardian kills the command's group and releases,
/// so the waiter starts long before the session could have expired.
#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn killed_conlock_is_released_by_its_guardian() {
    let consul = consul_bin();
    let _one = serial();
    let cl = Cluster::start(&consul, "conlock-kill");
    let dir = scratch("real-conlock-kill");
    let log = dir.join("log");
    let (ttl, lock_delay) = (Duration::from_secs(60), Duration::from_secs(15));
    let args = [
        "run",
        "--key",
        "ck/k",
        "--ttl",
        "60s",
        "--lock-delay",
        "15s",
    ];
    let mut p = Procs(Vec::new());
    p.spawn(
        "holder",
        cl.http(CLIENT),
        &args,
        &job(&log, "h", "false", true),
        &dir,
    );
    p.wait("the holder's command runs", |_p| started(&log, "h"));
    let wait = job(&log, "w", &after_ms(300), false);
    p.spawn("waiter", cl.http(0), &args, &wait, &dir);
    p.wait("the waiter waits", |p| p.waiting(1));
    let t_kill = now_ns();
    p.0[0].1.kill().unwrap();
    p.0[0].1.wait().unwrap();
    let (w, w_text) = p.exit(1);
    assert!(w.success(), "{w_text}\n{}", p.stderr(0));
    let r = runs(&log);
    let (_, he) = r["h"];
    let (ws, _) = *r.get("w").expect("the waiter's command ran");
    eprintln!(
        "real_cluster: after SIGKILL of conlock: the holder's last stamp {:.0} ms, the waiter's command started {:.0} ms ({:.0} ms after the holder's last stamp)",
        ms(t_kill, he),
        ms(t_kill, ws),
        ms(he, ws)
    );
    assert!(
        ws > he,
        "two holders: the waiter started {:.1} ms before the killed conlock's command ended",
        ms(ws, he)
    );
    // Without the guardian's release the session would expire no earlier than TTL after
    // its last renewal (at most TTL/2 before the kill), and then the lock-delay applies.
    let earliest_without_release = ttl / 2 + lock_delay;
    assert!(
        ms(t_kill, ws) < earliest_without_release.as_millis() as f64,
        "the waiter started {:.0} ms after the kill: the guardian did not release (by expiry it could start {earliest_without_release:?} after the kill at the earliest)",
        ms(t_kill, ws)
    );
}

/// Six `sem --limit 2` contenders through the client agent and the two followers; the
/// leader is SIGKILLed once two commands run. Never more than two commands at once, and
/// every command runs.
#[test]
#[ignore = "real-agent tier: make test-real CONSUL_BIN=/path/to/consul"]
fn semaphore_under_leader_kill_keeps_the_limit() {
    let consul = consul_bin();
    let _one = serial();
    let mut cl = Cluster::start(&consul, "sem-leader-kill");
    let dir = scratch("real-sem-leader-kill");
    let log = dir.join("log");
    let leader = cl.leader().expect("a leader");
    let via: Vec<usize> = (0..=CLIENT).filter(|&i| i != leader).collect();
    let args = ["sem", "--limit", "2", "--prefix", "sm"];
    let tags: Vec<String> = (0..6).map(|i| format!("c{i}")).collect();
    let mut p = Procs(Vec::new());
    for (i, tag) in tags.iter().enumerate() {
        let cmd = job(&log, tag, &after_ms(1500), false);
        p.spawn(tag, cl.http(via[i % via.len()]), &args, &cmd, &dir);
    }
    p.wait("two contenders' commands run", |_p| runs(&log).len() >= 2);
    let victim = cl.leader().expect("a leader");
    assert!(
        !via.contains(&victim),
        "leadership moved to a contender's agent before the kill; rerun"
    );
    let t_kill = now_ns();
    cl.kill(victim);
    let t_new = cl.wait_new_leader(victim, CLIENT);
    eprintln!(
        "real_cluster: leader {} killed; a new leader took writes {:.0} ms later",
        cl.agents[victim].name,
        ms(t_kill, t_new)
    );
    let mut codes = Vec::new();
    let mut texts = String::new();
    for i in 0..tags.len() {
        let (st, text) = p.exit(i);
        codes.push(st.code());
        texts.push_str(&text);
        texts.push('\n');
    }
    let r = runs(&log);
    let intervals: Vec<(u128, u128)> = r.values().copied().collect();
    let overlap = crate::harness::max_overlap(&intervals);
    let mut order: Vec<(&String, &(u128, u128))> = r.iter().collect();
    order.sort_by_key(|(_, (s, _))| *s);
    for (tag, (s, e)) in &order {
        eprintln!(
            "real_cluster: {tag}: ran from {:+.0} to {:+.0} ms of the kill",
            ms(t_kill, *s),
            ms(t_kill, *e)
        );
    }
    assert!(
        overlap <= 2,
        "{overlap} commands at once: {order:?}\n{texts}"
    );
    for (tag, code) in tags.iter().zip(&codes) {
        assert!(r.contains_key(tag), "{tag}'s command never ran\n{texts}");
        assert!(
            matches!(code, Some(0 | 124)),
            "{tag} exited {code:?}\n{texts}"
        );
    }
}
