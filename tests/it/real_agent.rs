//! A real `consul agent -dev` on loopback, for the real-agent tier (`make test-real`).
//!
//! The binary comes from `CONLOCK_REAL_CONSUL`. Every port is explicit and bound to
//! 127.0.0.1 only (HTTP, serf LAN/WAN, server RPC, gRPC where the version has it; DNS
//! and HTTPS off), and the update check, the one call it would make elsewhere, is off. The agent is killed by its PID and reaped when dropped, and through
//! `PR_SET_PDEATHSIG` if the test binary dies first.

#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::harness::scratch;

/// The variable that names the consul binary.
pub const ENV: &str = "CONLOCK_REAL_CONSUL";

/// The consul binary to test against; a missing or unusable one fails the test with
/// one line saying what to set (never a silent pass).
pub fn consul_bin() -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var(ENV).unwrap_or_default();
    if path.is_empty() {
        panic!("{ENV} is not set: run `make test-real CONSUL_BIN=/path/to/consul` (or set {ENV} to a consul binary)");
    }
    let runnable =
        std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    assert!(
        runnable,
        "{ENV}={path} is not an executable file: point it at a consul binary"
    );
    path
}

/// A `consul` command (for `consul lock`) with no Consul settings inherited.
pub fn consul() -> Command {
    let mut c = Command::new(consul_bin());
    for (k, _) in std::env::vars() {
        if k.starts_with("CONSUL_") || k.starts_with("CONLOCK_") {
            c.env_remove(k);
        }
    }
    c.stdin(Stdio::null());
    c
}

/// A port free for both TCP and UDP on 127.0.0.1 (serf needs both), not in `taken`.
fn free_port(taken: &[u16]) -> u16 {
    loop {
        let tcp = TcpListener::bind("127.0.0.1:0").expect("bind a TCP port on 127.0.0.1");
        let port = tcp.local_addr().unwrap().port();
        if !taken.contains(&port) && UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

pub struct RealAgent {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    stopped: bool,
}

/// Runs of the agent that failed on a port taken meanwhile are retried this often.
const STARTS: usize = 3;
/// Generous: a 1.x dev agent is ready in about a second, a busy 2-core machine is slower.
const READY_WITHIN: Duration = Duration::from_secs(90);

impl RealAgent {
    /// Starts a private agent (for tests that stop or kill it).
    pub fn start(name: &str) -> RealAgent {
        let bin = consul_bin();
        let grpc = agent_has_grpc(&bin);
        let mut last_log = String::new();
        for attempt in 1..=STARTS {
            let dir = scratch(&format!("consul-{name}"));
            match Self::try_start(&bin, grpc, name, &dir) {
                Ok(agent) => return agent,
                Err((log, port_taken)) => {
                    last_log = log;
                    if !port_taken || attempt == STARTS {
                        break;
                    }
                }
            }
        }
        panic!("{ENV}: `consul agent -dev` did not become ready (no leader, or no KV write or session) within {READY_WITHIN:?}; its log:\n{last_log}");
    }

    /// One agent shared by the tests that do not fault it (each uses its own keys). It
    /// lives as long as the test binary: it is started from a thread that never ends, so
    /// `PR_SET_PDEATHSIG` kills it when the test binary exits.
    pub fn shared() -> &'static RealAgent {
        static SHARED: OnceLock<RealAgent> = OnceLock::new();
        SHARED.get_or_init(|| {
            // A missing binary fails here, in the test's own thread.
            consul_bin();
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("real-agent-keeper".into())
                .spawn(move || {
                    let started = std::panic::catch_unwind(|| RealAgent::start("shared"));
                    let _ = tx.send(started);
                    loop {
                        std::thread::park();
                    }
                })
                .unwrap();
            match rx.recv().unwrap() {
                Ok(agent) => agent,
                Err(panic) => std::panic::resume_unwind(panic),
            }
        })
    }

    fn try_start(
        bin: &str,
        grpc: bool,
        name: &str,
        dir: &Path,
    ) -> Result<RealAgent, (String, bool)> {
        let mut taken = Vec::new();
        let mut port = || {
            let p = free_port(&taken);
            taken.push(p);
            p
        };
        let (http, serf_lan, serf_wan, server) = (port(), port(), port(), port());
        let mut hcl = format!(
            "ports {{ http = {http} https = -1 dns = -1 serf_lan = {serf_lan} serf_wan = {serf_wan} server = {server}"
        );
        if grpc {
            hcl.push_str(&format!(" grpc = {}", port()));
        }
        // No update check either: it would look up and call checkpoint-api.hashicorp.com.
        hcl.push_str(" } disable_update_check = true disable_anonymous_signature = true");
        let log = dir.join("agent.log");
        let mut cmd = Command::new(bin);
        cmd.args([
            "agent",
            "-dev",
            "-bind",
            "127.0.0.1",
            "-client",
            "127.0.0.1",
        ])
        .args(["-node", &format!("conlock-real-{name}")])
        // The tests read the HTTP requests it logs at this level.
        .args(["-log-level", "debug"])
        .args(["-hcl", &hcl])
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("agent.stderr")).unwrap());
        die_with_parent(&mut cmd);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("{ENV}={bin}: cannot start `consul agent -dev`: {e}"));
        let mut agent = RealAgent {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], http)),
            log,
            stopped: false,
        };
        if agent.wait_ready() {
            return Ok(agent);
        }
        let text = format!(
            "{}{}",
            agent.log(),
            crate::harness::read(&dir.join("agent.stderr"))
        );
        drop(agent);
        let port_taken = text.contains("address already in use");
        Err((text, port_taken))
    }

    /// A leader, then a KV write and a session (which needs the node registered).
    fn wait_ready(&mut self) -> bool {
        let until = Instant::now() + READY_WITHIN;
        let mut step = 0;
        while Instant::now() < until {
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            let ok = match step {
                0 => self
                    .try_request("GET", "/v1/status/leader", None)
                    .is_some_and(|(s, b)| s == 200 && b.trim().trim_matches('"').contains(':')),
                1 => self
                    .try_request("PUT", "/v1/kv/conlock-real/ready", Some("1"))
                    .is_some_and(|(s, b)| s == 200 && b.trim() == "true"),
                _ => self.session_roundtrip(),
            };
            if ok {
                step += 1;
                if step == 3 {
                    return true;
                }
                continue;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    fn session_roundtrip(&self) -> bool {
        let Some((200, body)) =
            self.try_request("PUT", "/v1/session/create", Some(r#"{"TTL":"10s"}"#))
        else {
            return false;
        };
        let id = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .and_then(|j| j["ID"].as_str().map(str::to_string));
        match id {
            Some(id) => self
                .try_request("PUT", &format!("/v1/session/destroy/{id}"), None)
                .is_some_and(|(s, _)| s == 200),
            None => false,
        }
    }

    fn try_request(&self, method: &str, path: &str, body: Option<&str>) -> Option<(u16, String)> {
        http(self.addr, method, path, body)
    }

    /// The agent's HTTP address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The agent's log so far (for failure messages).
    pub fn log(&self) -> String {
        crate::harness::read(&self.log)
    }

    /// SIGSTOP: the agent stops answering (requests hang), as a frozen host would.
    pub fn stop(&mut self) {
        self.signal(libc::SIGSTOP);
        self.stopped = true;
    }

    /// SIGCONT after [`stop`](Self::stop).
    pub fn cont(&mut self) {
        self.signal(libc::SIGCONT);
        self.stopped = false;
    }

    /// SIGKILL and reap: the agent and everything it stored are gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, sig: i32) {
        // Only while the child is unreaped: its PID cannot have been reused.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as i32, sig) },
            0,
            "signal {sig} to the consul agent (pid {})",
            self.child.id()
        );
    }
}

impl Drop for RealAgent {
    fn drop(&mut self) {
        // SIGKILL takes a stopped process too; reaping makes the PID reusable only now.
        self.kill();
    }
}

/// One request to a real agent: its status and body, or None without an answer. (A real
/// agent sends larger bodies chunked, which `common`'s raw client does not decode.)
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
) -> Option<(u16, String)> {
    static AGENT: OnceLock<ureq::Agent> = OnceLock::new();
    let agent = AGENT.get_or_init(|| {
        ureq::Agent::config_builder()
            .proxy(None)
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(30)))
            .build()
            .into()
    });
    let url = format!("http://{addr}{path}");
    let answer = match (method, body) {
        ("GET", _) => agent.get(&url).call(),
        ("PUT", Some(b)) => agent.put(&url).send(b),
        ("PUT", None) => agent.put(&url).send_empty(),
        _ => panic!("no {method} in this helper"),
    };
    let mut resp = answer.ok()?;
    let status = resp.status().as_u16();
    let text = resp.body_mut().read_to_string().ok()?;
    Some((status, text))
}

/// Whether this consul's agent has a gRPC port (1.3 and later): its flag is in the help.
fn agent_has_grpc(bin: &str) -> bool {
    static GRPC: OnceLock<bool> = OnceLock::new();
    *GRPC.get_or_init(|| {
        let out = Command::new(bin)
            .args(["agent", "-h"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("{ENV}={bin}: cannot run `consul agent -h`: {e}"));
        let help = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        help.contains("-grpc-port")
    })
}

/// The agent gets SIGKILL when the thread that started it ends (a test binary that
/// dies, or the test thread of a private agent), so none outlives its test run.
fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: prctl and getppid are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent {
                return Err(std::io::Error::other("the test binary exited"));
            }
            Ok(())
        });
    }
}
