//! Real etcd members on loopback for the etcd client tests.
//!
//! The binary comes from `CONLOCK_ETCD_BIN`, else `etcd` on PATH (Debian's
//! `etcd-server`; `.ci/run` installs it). Where there is none the tests skip through
//! [`harness::skip`](crate::harness::skip), which fails a CI run (CI=true). Every port is
//! explicit on 127.0.0.1, data dirs are on /dev/shm (etcd preallocates 64 MB WAL files)
//! and removed on drop, and members are killed by PID on drop and through
//! `PR_SET_PDEATHSIG` when the thread that started them ends.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use conlock::etcd::types::{KeyValue, PutRequest, RangeRequest, RequestOp, TxnRequest};
use conlock::etcd::{EtcdClient, EtcdConfig, EtcdFlags};

use crate::harness::{bytes_contain, fault_proxy, Fault, BIN};

/// The variable that names the etcd binary.
pub const ENV: &str = "CONLOCK_ETCD_BIN";
/// Generous: a member is healthy in about 1.5 s on an idle 2-core machine.
pub const READY_WITHIN: Duration = Duration::from_secs(60);
/// Starts that failed on a port taken meanwhile are retried this often.
const STARTS: usize = 3;

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| is_executable(p))
    })
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The etcd binary, or `None` after recording a skip that says what to install.
pub fn etcd_bin() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(ENV).filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            is_executable(&p),
            "{ENV}={} is not an executable file: point it at an etcd binary",
            p.display()
        );
        return Some(p);
    }
    let found = on_path("etcd");
    if found.is_none() {
        crate::harness::skip(&format!(
            "no etcd: install Debian's etcd-server and etcd-client (.ci/run does) or set {ENV}"
        ));
    }
    found
}

/// etcdctl beside the etcd binary, else on PATH, or `None` after recording a skip.
pub fn etcdctl_bin(etcd: &Path) -> Option<PathBuf> {
    let beside = etcd.with_file_name("etcdctl");
    if is_executable(&beside) {
        return Some(beside);
    }
    let found = on_path("etcdctl");
    if found.is_none() {
        crate::harness::skip("no etcdctl: install Debian's etcd-client (.ci/run does)");
    }
    found
}

/// Runs etcdctl (v3 API) against `endpoints`; panics with its output on failure.
pub fn etcdctl(etcd: &Path, endpoints: &str, args: &[&str]) -> String {
    etcdctl_with_input(etcd, endpoints, args, "")
}

/// [`etcdctl`] with `input` on its stdin.
pub fn etcdctl_with_input(etcd: &Path, endpoints: &str, args: &[&str], input: &str) -> String {
    use std::io::Write;
    let bin = etcdctl_bin(etcd).expect("etcdctl (the caller checked etcd_bin)");
    let mut child = Command::new(&bin)
        .env_clear()
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={endpoints}"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "etcdctl {args:?}: {}: {text}",
        out.status
    );
    text
}

/// Options of the members started.
#[derive(Debug, Clone, Default)]
pub struct EtcdOptions {
    /// `--heartbeat-interval` in ms (etcd's default 100).
    pub heartbeat_ms: Option<u32>,
    /// `--election-timeout` in ms (etcd's default 1000).
    pub election_ms: Option<u32>,
    /// Serve clients over TLS with this certificate and key (PEM files).
    pub tls: Option<(PathBuf, PathBuf)>,
    pub extra_args: Vec<String>,
}

impl EtcdOptions {
    /// Faster elections (failover in well under a second; minimum lease TTL 1 s).
    pub fn fast() -> Self {
        EtcdOptions {
            heartbeat_ms: Some(50),
            election_ms: Some(500),
            tls: None,
            extra_args: Vec::new(),
        }
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// A base directory for data dirs: /dev/shm where it exists (tmpfs), else the target's.
fn base_dir(name: &str) -> PathBuf {
    let root = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
    };
    let dir = root.join(format!(
        "conlock-etcd-{name}-{}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A port free on 127.0.0.1 now, not in `taken` (another test may take it before etcd
/// binds it: starts that fail on it are retried with new ports).
fn free_port(taken: &[u16]) -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a TCP port on 127.0.0.1");
        let port = l.local_addr().unwrap().port();
        if !taken.contains(&port) {
            return port;
        }
    }
}

/// One etcd member process.
pub struct Etcd {
    bin: PathBuf,
    pub name: String,
    pub client_port: u16,
    pub peer_port: u16,
    /// `http` or `https`.
    scheme: &'static str,
    /// The command line, for restarts (the --initial-* flags are ignored then).
    args: Vec<String>,
    /// Holds the data dir and the log.
    base: PathBuf,
    child: Option<Child>,
    owns_base: bool,
}

impl Etcd {
    /// A single-member cluster, healthy; `None` (a recorded skip) without etcd.
    pub fn start(name: &str, opts: &EtcdOptions) -> Option<Etcd> {
        let bin = etcd_bin()?;
        let mut last = String::new();
        for _ in 0..STARTS {
            let base = base_dir(name);
            let mut taken = Vec::new();
            let client = free_port(&taken);
            taken.push(client);
            let peer = free_port(&taken);
            let cluster = format!("{name}=http://127.0.0.1:{peer}");
            let mut m = Etcd::spawn(&bin, name, client, peer, &cluster, "new", opts, &base, true);
            match m.wait_healthy(READY_WITHIN) {
                Ok(()) => return Some(m),
                Err(log) => {
                    last = log;
                    drop(m);
                    if !last.contains("address already in use") {
                        break;
                    }
                }
            }
        }
        panic!("etcd did not become healthy within {READY_WITHIN:?}; its log:\n{last}");
    }

    /// One member shared by the tests that neither fault nor compact it (each uses its
    /// own keys). Started from a thread that never ends, so `PR_SET_PDEATHSIG` kills it
    /// if the test binary dies; at a normal exit an `atexit` handler kills it and removes
    /// its data dir.
    pub fn shared() -> Option<&'static Etcd> {
        use std::sync::OnceLock;
        static SHARED: OnceLock<Etcd> = OnceLock::new();
        // A missing binary is recorded as a skip of the calling test.
        etcd_bin()?;
        Some(SHARED.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("etcd-keeper".into())
                .spawn(move || {
                    let started = std::panic::catch_unwind(|| {
                        Etcd::start("shared", &EtcdOptions::default()).expect("etcd_bin found it")
                    });
                    let _ = tx.send(started);
                    loop {
                        std::thread::park();
                    }
                })
                .unwrap();
            match rx.recv().unwrap() {
                Ok(m) => {
                    *SHARED_CLEANUP.lock().unwrap() = Some((m.pid(), m.base.clone()));
                    // SAFETY: registers a plain function once.
                    unsafe { libc::atexit(shared_cleanup) };
                    m
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }))
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        bin: &Path,
        name: &str,
        client: u16,
        peer: u16,
        initial_cluster: &str,
        state: &str,
        opts: &EtcdOptions,
        base: &Path,
        owns_base: bool,
    ) -> Etcd {
        let scheme = if opts.tls.is_some() { "https" } else { "http" };
        let curl = format!("{scheme}://127.0.0.1:{client}");
        let purl = format!("http://127.0.0.1:{peer}");
        let mut args: Vec<String> = vec![
            "--name".into(),
            name.into(),
            "--data-dir".into(),
            base.join(format!("{name}.etcd")).display().to_string(),
            "--listen-client-urls".into(),
            curl.clone(),
            "--advertise-client-urls".into(),
            curl,
            "--listen-peer-urls".into(),
            purl.clone(),
            "--initial-advertise-peer-urls".into(),
            purl,
            "--initial-cluster".into(),
            initial_cluster.into(),
            "--initial-cluster-state".into(),
            state.into(),
            "--initial-cluster-token".into(),
            format!("conlock-test-{}", base.display()),
            // Millisecond timestamps in the log, for failure messages.
            "--logger=zap".into(),
            "--log-outputs=stderr".into(),
        ];
        if let Some((cert, key)) = &opts.tls {
            args.push(format!("--cert-file={}", cert.display()));
            args.push(format!("--key-file={}", key.display()));
        }
        if let Some(h) = opts.heartbeat_ms {
            args.push(format!("--heartbeat-interval={h}"));
        }
        if let Some(e) = opts.election_ms {
            args.push(format!("--election-timeout={e}"));
        }
        args.extend(opts.extra_args.iter().cloned());
        let mut m = Etcd {
            bin: bin.to_path_buf(),
            name: name.into(),
            client_port: client,
            peer_port: peer,
            scheme,
            args,
            base: base.to_path_buf(),
            child: None,
            owns_base,
        };
        m.launch();
        m
    }

    fn log_path(&self) -> PathBuf {
        self.base.join(format!("{}.log", self.name))
    }

    fn launch(&mut self) {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let mut cmd = Command::new(&self.bin);
        cmd.args(&self.args)
            // etcd reads ETCD_* variables as flags: none may leak in.
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .current_dir(&self.base)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log);
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
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.bin.display()));
        self.child = Some(child);
    }

    /// `http://127.0.0.1:<client port>` (https with [`EtcdOptions::tls`]).
    pub fn endpoint(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.client_port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the member runs").id()
    }

    pub fn log(&self) -> String {
        crate::harness::read(&self.log_path())
    }

    /// Waits for `/health` to say true (it needs a leader); the log on failure.
    pub fn wait_healthy(&mut self, within: Duration) -> Result<(), String> {
        let until = Instant::now() + within;
        while Instant::now() < until {
            if let Some(st) = self.child.as_mut().and_then(|c| c.try_wait().unwrap()) {
                self.child = None;
                return Err(format!("etcd exited ({st}):\n{}", self.log()));
            }
            if get(&self.endpoint(), "/health").is_some_and(|b| b.contains("\"true\"")) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(self.log())
    }

    /// A client of this member only, with the given per-request timeout.
    pub fn client(&self, timeout: Duration) -> EtcdClient {
        client_for(&self.endpoint(), timeout)
    }

    /// SIGSTOP: a frozen member (its connections stay open, requests hang).
    pub fn stop(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT after [`stop`](Self::stop).
    pub fn cont(&self) {
        self.signal(libc::SIGCONT);
    }

    /// SIGKILL and reap; the data dir stays for [`restart`](Self::restart).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the member again on its data dir and ports (after [`kill`](Self::kill)).
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    fn signal(&self, sig: i32) {
        let pid = self.pid();
        // Only while the child is unreaped: its PID cannot have been reused.
        assert_eq!(
            unsafe { libc::kill(pid as i32, sig) },
            0,
            "signal {sig} to etcd {} (pid {pid})",
            self.name
        );
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        // SIGKILL takes a stopped process too.
        self.kill();
        if self.owns_base {
            let _ = std::fs::remove_dir_all(&self.base);
        } else {
            let _ = std::fs::remove_dir_all(self.base.join(format!("{}.etcd", self.name)));
        }
    }
}

static SHARED_CLEANUP: std::sync::Mutex<Option<(u32, PathBuf)>> = std::sync::Mutex::new(None);

extern "C" fn shared_cleanup() {
    if let Some((pid, base)) = SHARED_CLEANUP.lock().ok().and_then(|mut g| g.take()) {
        // The keeper thread never reaps it, so the PID is still this child's.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let mut status = 0;
        unsafe { libc::waitpid(pid as i32, &mut status, 0) };
        let _ = std::fs::remove_dir_all(base);
    }
}

/// A client of `endpoints` (comma-separated) with the given per-request timeout.
pub fn client_for(endpoints: &str, timeout: Duration) -> EtcdClient {
    let flags = EtcdFlags {
        endpoints: Some(endpoints.into()),
        ..Default::default()
    };
    let mut c = EtcdClient::new(EtcdConfig::resolve(&flags, &|_| None).unwrap()).unwrap();
    c.request_timeout = timeout;
    c
}

/// A plain GET (for /health), or `None` without a 200 answer. TLS without verification:
/// the test certificates name another host.
pub fn get(base: &str, path: &str) -> Option<String> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .tls_config(
            ureq::tls::TlsConfig::builder()
                .disable_verification(true)
                .build(),
        )
        .proxy(None)
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(2)))
        .build()
        .into();
    let mut resp = agent.get(format!("{base}{path}")).call().ok()?;
    if resp.status() != 200 {
        return None;
    }
    resp.body_mut().read_to_string().ok()
}

/// A plain POST of JSON: the status and body, or `None` without an answer.
pub fn post(base: &str, path: &str, body: &str, timeout: Duration) -> Option<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .proxy(None)
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into();
    let mut resp = agent.post(format!("{base}{path}")).send(body).ok()?;
    let status = resp.status().as_u16();
    Some((status, resp.body_mut().read_to_string().ok()?))
}

/// Three members on loopback.
pub struct EtcdCluster {
    pub members: Vec<Etcd>,
    base: PathBuf,
}

impl EtcdCluster {
    /// Three members, all healthy (a leader elected); `None` (a recorded skip) without etcd.
    pub fn start(name: &str, opts: &EtcdOptions) -> Option<EtcdCluster> {
        let bin = etcd_bin()?;
        let mut last = String::new();
        for _ in 0..STARTS {
            let base = base_dir(name);
            let mut taken = Vec::new();
            let mut ports = Vec::new();
            for _ in 0..3 {
                let c = free_port(&taken);
                taken.push(c);
                let p = free_port(&taken);
                taken.push(p);
                ports.push((c, p));
            }
            let initial: Vec<String> = ports
                .iter()
                .enumerate()
                .map(|(i, (_, p))| format!("{name}{}=http://127.0.0.1:{p}", i + 1))
                .collect();
            let initial = initial.join(",");
            let mut members: Vec<Etcd> = ports
                .iter()
                .enumerate()
                .map(|(i, &(c, p))| {
                    let member = format!("{name}{}", i + 1);
                    Etcd::spawn(&bin, &member, c, p, &initial, "new", opts, &base, false)
                })
                .collect();
            let mut failed = None;
            for m in members.iter_mut() {
                if let Err(log) = m.wait_healthy(READY_WITHIN) {
                    failed = Some(format!("{}: {log}", m.name));
                    break;
                }
            }
            match failed {
                None => return Some(EtcdCluster { members, base }),
                Some(log) => {
                    last = log;
                    let all_logs: String = members.iter().map(|m| m.log()).collect();
                    drop(members);
                    let _ = std::fs::remove_dir_all(&base);
                    if !all_logs.contains("address already in use") {
                        break;
                    }
                }
            }
        }
        panic!("a 3-member etcd cluster did not become healthy within {READY_WITHIN:?}: {last}");
    }

    /// The members' endpoints, comma-separated, in member order.
    pub fn endpoints(&self) -> String {
        let eps: Vec<String> = self.members.iter().map(Etcd::endpoint).collect();
        eps.join(",")
    }

    /// The member that is leader now according to the members in `among` that answer
    /// `/v3/maintenance/status` (a member is leader when `leader == header.member_id`).
    pub fn leader_among(&self, among: &[usize]) -> Option<usize> {
        among.iter().copied().find(|&i| {
            let m = &self.members[i];
            let Some((200, body)) = post(
                &m.endpoint(),
                "/v3/maintenance/status",
                "{}",
                Duration::from_secs(2),
            ) else {
                return false;
            };
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let leader = v["leader"].as_str().unwrap_or("");
            !leader.is_empty() && leader == v["header"]["member_id"].as_str().unwrap_or("-")
        })
    }

    /// Waits until one of `among` leads; its index.
    pub fn wait_leader_among(&self, among: &[usize], within: Duration) -> usize {
        let until = Instant::now() + within;
        loop {
            if let Some(i) = self.leader_among(among) {
                return i;
            }
            assert!(
                Instant::now() < until,
                "no leader among members {among:?} within {within:?}; logs:\n{}",
                among
                    .iter()
                    .map(|&i| self.members[i].log())
                    .collect::<String>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn wait_leader(&self, within: Duration) -> usize {
        self.wait_leader_among(&[0, 1, 2], within)
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for m in self.members.iter_mut() {
            m.kill();
        }
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

/// A [`fault_proxy`] that answers "no leader" to the requests `fail` picks.
pub fn proxy_answering_503(
    upstream: String,
    fail: impl Fn(&[u8]) -> bool + Send + Sync + 'static,
) -> String {
    fault_proxy(upstream, move |req| {
        if fail(req) {
            Fault::NoLeader
        } else {
            Fault::Forward
        }
    })
}

/// A [`fault_proxy`] that runs `hook` once, before it forwards the first request that
/// contains `path`.
pub fn proxy_with_hook(
    upstream: String,
    path: &'static [u8],
    hook: impl FnOnce() + Send + 'static,
) -> String {
    type Hook = Option<Box<dyn FnOnce() + Send>>;
    let hook: std::sync::Mutex<Hook> = std::sync::Mutex::new(Some(Box::new(hook)));
    fault_proxy(upstream, move |req| {
        if bytes_contain(req, path) {
            if let Some(f) = hook.lock().unwrap().take() {
                f();
            }
        }
        Fault::Forward
    })
}

// Shared by the lock, semaphore and operator-command tests.

/// Short timings that pass conlock's checks: 3 s TTL (renewed every 1 s), 2 s cushion,
/// 0.5 s grace, 0.2 s margin.
pub const FAST: [&str; 6] = ["--ttl", "3s", "--lock-delay", "2s", "--kill-grace", "500ms"];

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// `FAST` with the timings `extra` gives replaced, then the rest of `extra`.
pub fn with_timings(extra: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for pair in FAST.chunks(2) {
        let over = extra.iter().position(|a| *a == pair[0]);
        let value = over.map_or(pair[1], |i| extra[i + 1]);
        out.extend([pair[0].to_string(), value.to_string()]);
    }
    let mut i = 0;
    while i < extra.len() {
        if FAST.contains(&extra[i]) && extra[i].starts_with("--") {
            i += 2;
            continue;
        }
        out.push(extra[i].to_string());
        i += 1;
    }
    out
}

/// A job that writes `S`, then `A <ns>` every 50 ms while `go` does not exist, then `E`.
/// A job killed from outside leaves its last `A` as its end.
pub fn heartbeat_job(log: &Path, go: &Path) -> String {
    let l = log.display();
    format!(
        "id=$$; echo \"S $id $(date +%s%N)\" >> {l}; while [ ! -e {go} ]; do echo \"A $id $(date +%s%N)\" >> {l}; sleep 0.05; done; echo \"E $id $(date +%s%N)\" >> {l}",
        go = go.display()
    )
}

/// Per job id: (first timestamp, last timestamp), in order of start.
pub fn spans(log: &str) -> Vec<(String, u128, u128)> {
    let mut out: Vec<(String, u128, u128)> = Vec::new();
    for line in log.lines() {
        let p: Vec<&str> = line.split_whitespace().collect();
        if p.len() != 3 {
            continue;
        }
        let t: u128 = p[2].parse().unwrap();
        match out.iter_mut().find(|(id, _, _)| id == p[1]) {
            Some(e) => e.2 = e.2.max(t),
            None => out.push((p[1].to_string(), t, t)),
        }
    }
    out.sort_by_key(|e| e.1);
    out
}

pub fn keys_under(c: &EtcdClient, prefix: &str) -> Vec<KeyValue> {
    c.range(&RangeRequest::prefix(prefix)).unwrap().kvs
}

/// conlock with the etcd backend chosen through the environment (CONLOCK_BACKEND,
/// ETCDCTL_ENDPOINTS), nothing else inherited that could steer it.
pub fn conlock_etcd(etcd: &Etcd) -> Command {
    conlock_etcd_at(&etcd.endpoint())
}

/// [`conlock_etcd`] for a comma-separated list of endpoints.
pub fn conlock_etcd_at(endpoints: &str) -> Command {
    let mut c = Command::new(BIN.path());
    for (k, _) in std::env::vars() {
        if k.starts_with("CONSUL_") || k.starts_with("CONLOCK_") || k.starts_with("ETCDCTL_") {
            c.env_remove(k);
        }
    }
    c.env("CONLOCK_BACKEND", "etcd");
    c.env("ETCDCTL_ENDPOINTS", endpoints);
    c.stdin(Stdio::null());
    c
}

/// How a txn that puts a key starting with `key` begins on the wire (`key` a multiple
/// of 3 bytes long, or whole: its base64 is then a prefix of the full key's).
pub fn put_pattern(key: &str) -> Vec<u8> {
    let op = RequestOp::Put(PutRequest::new(key.to_string(), vec![]));
    let json = serde_json::to_string(&op).unwrap();
    let end = json.find("\",").expect("the key comes first");
    json[..end].trim_end_matches('=').as_bytes().to_vec()
}

/// Keys `P/<hex>` with no lease, named after the next lease IDs a private member grants
/// (it hands them out from its request counter), all created in one txn: older than any
/// key conlock makes next.
pub fn put_foreign_keys(c: &EtcdClient, prefix: &str) {
    let base = c.lease_grant(60).unwrap().id;
    let success: Vec<RequestOp> = (2..40)
        .map(|i| RequestOp::Put(PutRequest::new(format!("{prefix}/{:x}", base + i), "")))
        .collect();
    let r = c
        .txn(&TxnRequest {
            compare: vec![],
            success,
            failure: vec![],
        })
        .unwrap();
    assert!(r.succeeded);
}

/// A run among [`put_foreign_keys`] ended as one that adopted none: it waited behind them
/// until its --timeout (exit 75), its command never ran, and its lease was in the range.
pub fn assert_not_adopted(out: &std::process::Output, ran: &Path) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!ran.exists(), "ran holding a foreign key: {err}");
    assert_eq!(out.status.code(), Some(75), "{err}");
    assert!(
        err.contains("exists on lease 0, not on ours"),
        "conlock's lease was not in the range the test covered: {err}"
    );
}

/// `etcdctl lock NAME -- sh -c CMD`, started (stderr piped); `None` without etcdctl.
pub fn etcdctl_lock(etcd: &Etcd, name: &str, cmd: &str) -> Option<Child> {
    let bin = etcdctl_bin(Path::new("etcd"))?;
    Some(
        Command::new(bin)
            .env_clear()
            .env("ETCDCTL_API", "3")
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .arg(format!("--endpoints={}", etcd.endpoint()))
            .args(["lock", name, "--", "sh", "-c", cmd])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    )
}

/// A [`fault_proxy`] to `etcd` that leaves unanswered every txn that puts a key starting
/// with `key` (see [`put_pattern`]) after the first `skip` of them, which it passes on;
/// counts them all.
pub fn proxy_muting_puts(
    etcd: &Etcd,
    key: &str,
    skip: usize,
) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let upstream = etcd.endpoint().trim_start_matches("http://").to_string();
    let pattern = put_pattern(key);
    let seen = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = seen.clone();
    let proxy = fault_proxy(upstream, move |req| {
        if bytes_contain(req, &pattern) && counted.fetch_add(1, Ordering::SeqCst) >= skip {
            Fault::MuteAnswers
        } else {
            Fault::Forward
        }
    });
    (proxy, seen)
}

/// Runs `next` (a `run` or `sem` with `--timeout 20s` after a run that never started its
/// command): it must hold and be done well within the 30 s cushion such a run would
/// otherwise have left.
pub fn assert_runs_without_a_cushion(next: &mut Command) {
    let started = Instant::now();
    let out = next.output().unwrap();
    assert!(
        out.status.success(),
        "the next run did not hold: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the next run kept the cushion of a run that never started its command: {:?}",
        started.elapsed()
    );
}

/// Runs conlock (`args`, `--timeout 20s -v`, the fast timings, `-- true`) on a member of
/// its own, through a proxy that revokes every lease right before the first txn reaches
/// the member: the lease dies before conlock's first write lands.
pub fn leases_revoked_before_the_first_txn(
    tag: &str,
    args: &[&str],
) -> Option<std::process::Output> {
    let etcd = Etcd::start(tag, &EtcdOptions::default())?;
    let ep = etcd.endpoint();
    let direct = etcd.client(Duration::from_secs(5));
    let upstream = ep.trim_start_matches("http://").to_string();
    let proxy = proxy_with_hook(upstream, b"/v3/kv/txn", move || {
        let (status, body) =
            post(&ep, "/v3/lease/leases", "{}", Duration::from_secs(5)).expect("leases");
        assert_eq!(status, 200, "{body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        for l in v["leases"].as_array().unwrap() {
            let id: i64 = l["ID"].as_str().unwrap().parse().unwrap();
            direct.lease_revoke(id).unwrap();
        }
    });
    let out = conlock_etcd_at(&proxy)
        .args(args)
        .args(["--timeout", "20s", "-v"])
        .args(with_timings(&[]))
        .args(["--", "true"])
        .output()
        .unwrap();
    Some(out)
}
