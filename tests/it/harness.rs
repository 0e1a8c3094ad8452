//! Helpers to drive the real conlock binary against an in-process dev server.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use std::time::{Duration, Instant};

use conlock::consul::{Client, ConnConfig, ConnFlags, QueryOptions};
use conlock::devserver::DevServer;

/// The conlock binary the tests run: the build cargo made for this test run, or the one
/// `CONLOCK_TEST_BIN` names (`make test` also runs the suite against the release build,
/// which is what gets installed and may be a static musl binary).
pub const BIN: Bin = Bin;

#[derive(Clone, Copy)]
pub struct Bin;

impl Bin {
    pub fn path(self) -> &'static str {
        static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        PATH.get_or_init(|| match std::env::var("CONLOCK_TEST_BIN") {
            Ok(path) => {
                use std::os::unix::fs::PermissionsExt;
                let runnable = std::fs::metadata(&path)
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
                assert!(
                    runnable,
                    "CONLOCK_TEST_BIN={path} is not an executable file"
                );
                path
            }
            Err(_) => env!("CARGO_BIN_EXE_conlock").to_string(),
        })
    }
}

impl AsRef<std::ffi::OsStr> for Bin {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path().as_ref()
    }
}

impl std::fmt::Display for Bin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.path())
    }
}

/// A conlock command aimed at `server`, with no Consul settings inherited from the caller.
pub fn conlock(server: &DevServer) -> Command {
    conlock_at(server.addr())
}

/// Like [`conlock`], aimed at any agent address (an added agent, a proxy).
pub fn conlock_at(addr: std::net::SocketAddr) -> Command {
    conlock_with(BIN.as_ref(), addr)
}

/// Like [`conlock_at`], running the binary at `bin` (a copy another user can reach).
fn conlock_with(bin: &std::ffi::OsStr, addr: std::net::SocketAddr) -> Command {
    let mut c = Command::new(bin);
    for (k, _) in std::env::vars() {
        if k.starts_with("CONSUL_") || k.starts_with("CONLOCK_") {
            c.env_remove(k);
        }
    }
    c.env("CONSUL_HTTP_ADDR", addr.to_string());
    c.stdin(Stdio::null());
    c
}

pub fn client(server: &DevServer) -> Client {
    let flags = ConnFlags {
        http_addr: Some(server.addr().to_string()),
        ..Default::default()
    };
    let cfg = ConnConfig::resolve(&flags, &|_| None).unwrap();
    Client::new(cfg).unwrap()
}

/// Polls `cond` every 10 ms until it holds or `within` passes.
pub fn wait_for(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let until = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a child process with a generous deadline; kills it if it overstays.
pub fn wait_exit(child: &mut Child, within: Duration) -> ExitStatus {
    let until = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return st;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            panic!("process {} did not exit within {within:?}", child.id());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A fresh scratch directory under the target dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        unique()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// True where the tests run as root (the tests that need it skip elsewhere, through [`skip`]).
pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// Says that the running test did not run here, and why: on stderr (which the test runner
/// shows only with --nocapture) and, where `CONLOCK_SKIP_LOG` names a file (`make test`
/// sets it), as a line `name<TAB>why` appended to that file, which `make test` lists at
/// its end. The name is that of the test's thread, which the test runner names after the
/// test (`process::some_test`). Only root-only tests and the etcd tests where etcd is
/// not installed may skip at run time: CI runs as root with etcd installed (`.ci/run`),
/// and there (CI=true) `make test` fails on any such skip.
pub fn skip(why: &str) {
    use std::io::Write;
    let thread = std::thread::current();
    let name = thread.name().unwrap_or("(a test thread without a name)");
    eprintln!("skipped {name}: {why}");
    let Some(log) = std::env::var_os("CONLOCK_SKIP_LOG").filter(|l| !l.is_empty()) else {
        return;
    };
    // One write per line, appended: the tests of a run skip from several threads.
    let line = format!("{name}\t{}\n", why.replace(['\t', '\n'], " "));
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .unwrap_or_else(|e| {
            panic!(
                "cannot record the skip of {name} in CONLOCK_SKIP_LOG={}: {e}",
                Path::new(&log).display()
            )
        });
}

/// A scratch directory (mode 0777) and the conlock binary where another user can reach
/// them, for the tests that run conlock under another user ID. A clone may sit under a
/// directory only its owner can enter (`mktemp -d` makes mode 0700): then both go to a
/// fresh directory under the temp dir (a copy of the binary), removed when this is dropped.
pub struct Reachable {
    pub dir: PathBuf,
    pub bin: PathBuf,
    remove: bool,
}

impl Reachable {
    /// A conlock command like [`conlock`], of the binary at [`Reachable::bin`], started in
    /// [`Reachable::dir`] (a working directory the other user can enter).
    pub fn conlock(&self, server: &DevServer) -> Command {
        let mut c = conlock_with(self.bin.as_os_str(), server.addr());
        c.current_dir(&self.dir);
        c
    }
}

impl Drop for Reachable {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A fresh [`Reachable`] named after `name`.
pub fn reachable_scratch(name: &str) -> Reachable {
    use std::os::unix::fs::PermissionsExt;
    let mode = |m| std::fs::Permissions::from_mode(m);
    let target_tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (dir, remove) = if others_can_enter(target_tmp) {
        (scratch(name), false)
    } else {
        let dir = std::env::temp_dir().join(format!(
            "conlock-test-{name}-{}-{}",
            std::process::id(),
            unique()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
        (dir, true)
    };
    // Made before the checks below so that a failing one still removes it.
    let mut r = Reachable {
        bin: PathBuf::from(BIN.path()),
        dir,
        remove,
    };
    std::fs::set_permissions(&r.dir, mode(0o777)).unwrap();
    assert!(
        others_can_enter(&r.dir),
        "other users cannot enter {} (a directory above it denies them): point TMPDIR to one they can",
        r.dir.display()
    );
    let bin_mode = std::fs::metadata(&r.bin).map_or(0, |m| m.permissions().mode());
    let bin_dir = r.bin.parent().unwrap_or(Path::new("/"));
    if bin_mode & 0o001 == 0 || !others_can_enter(bin_dir) {
        let bins = r.dir.join("bin");
        std::fs::create_dir(&bins).unwrap();
        std::fs::set_permissions(&bins, mode(0o755)).unwrap();
        let copy = bins.join("conlock");
        std::fs::copy(&r.bin, &copy).unwrap_or_else(|e| {
            panic!("cannot copy {} to {}: {e}", r.bin.display(), copy.display())
        });
        std::fs::set_permissions(&copy, mode(0o755)).unwrap();
        r.bin = copy;
        // A copy per test: not one to keep.
        r.remove = true;
    }
    r
}

/// True if a user who owns none of them and is in none of their groups may search `dir`
/// and every directory above it.
fn others_can_enter(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    dir.ancestors()
        .all(|d| std::fs::metadata(d).is_ok_and(|m| m.permissions().mode() & 0o001 != 0))
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The current holder session of a key, if any.
pub fn holder(c: &Client, key: &str) -> Option<String> {
    c.kv_get(key, QueryOptions::default())
        .unwrap()
        .0
        .and_then(|p| p.holder().map(str::to_string))
}

/// True while some process of group `pgid` exists.
pub fn group_alive(pgid: i32) -> bool {
    unsafe { libc::kill(-pgid, 0) == 0 }
}

pub fn process_alive(pid: i32) -> bool {
    // A zombie counts as gone.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

pub fn signal(pid: u32, sig: i32) {
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

/// Sets a dev-server fault through its control endpoint (`dur` empty: until cleared).
pub fn fault(server: &DevServer, mode: &str, dur: &str) {
    let mut url = format!("http://{}/v1/conlock-dev/fault?mode={mode}", server.addr());
    if !dur.is_empty() {
        url.push_str(&format!("&for={dur}"));
    }
    let agent: ureq::Agent = ureq::Agent::config_builder().proxy(None).build().into();
    agent
        .put(&url)
        .send_empty()
        .expect("fault endpoint answers");
}

/// Intervals `[start, end]` (ns) written by children as `S <ns>` / `E <ns>` lines in order.
pub fn intervals(log: &str) -> Vec<(u128, u128)> {
    let mut out = Vec::new();
    let mut open: std::collections::HashMap<String, u128> = Default::default();
    for line in log.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() != 3 {
            continue;
        }
        let t: u128 = parts[2].parse().unwrap();
        match parts[0] {
            "S" => {
                open.insert(parts[1].to_string(), t);
            }
            "E" => {
                if let Some(s) = open.remove(parts[1]) {
                    out.push((s, t));
                }
            }
            _ => {}
        }
    }
    out
}

/// The largest number of intervals that overlap at one instant.
pub fn max_overlap(intervals: &[(u128, u128)]) -> usize {
    let mut events: Vec<(u128, i32)> = Vec::new();
    for &(s, e) in intervals {
        events.push((s, 1));
        events.push((e, -1));
    }
    // Ends sort before starts at the same instant.
    events.sort();
    let (mut cur, mut max) = (0i32, 0i32);
    for (_, d) in events {
        cur += d;
        max = max.max(cur);
    }
    max as usize
}

/// A shell snippet that logs start and end (ns timestamps) to `log`, with `body` between.
pub fn logged_job(log: &Path, body: &str) -> String {
    let log = log.display();
    format!(
        "id=$$; echo \"S $id $(date +%s%N)\" >> {log}; {body}; echo \"E $id $(date +%s%N)\" >> {log}"
    )
}

/// A shell snippet that runs until `go` exists (the test creates it to end the job).
pub fn until_exists(go: &Path) -> String {
    format!("while [ ! -e {} ]; do sleep 0.01; done", go.display())
}

/// Kills (and reaps) a child when dropped, so a failing test leaves no process behind.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `conlock run --key KEY EXTRA -- sh -c CMD` and waits until CMD runs. (Waiting
/// only for the key to show a holder is not enough before invalidating it: conlock has
/// not finished acquiring until it read the key back, and a session lost before that is
/// just replaced.)
pub fn start_holder(server: &DevServer, key: &str, extra: &[&str], cmd: &str) -> Child {
    let marker = scratch("holder").join("running");
    let child = conlock(server)
        .args(["run", "--key", key])
        .args(extra)
        .args(["--", "sh", "-c"])
        .arg(format!("touch {}; {cmd}", marker.display()))
        .spawn()
        .unwrap();
    assert!(
        wait_for(Duration::from_secs(60), || marker.exists()),
        "holder of {key} never started its command"
    );
    child
}

/// `sh -c` arguments for a command that first creates `marker`, then runs `cmd`.
pub fn marked(marker: &Path, cmd: &str) -> [String; 3] {
    [
        "sh".into(),
        "-c".into(),
        format!("touch {}; {cmd}", marker.display()),
    ]
}

/// Waits (generously) until the server has exactly `n` sessions.
pub fn wait_sessions(server: &DevServer, n: usize) -> bool {
    let c = client(server);
    wait_for(Duration::from_secs(60), || {
        c.session_list(QueryOptions::default())
            .map(|l| l.0.len() == n)
            .unwrap_or(false)
    })
}

/// Runs `cmd` under a process limit (RLIMIT_NPROC, which counts threads too) of `n`.
pub fn limit_processes(cmd: &mut Command, n: libc::rlim_t) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            if libc::setrlimit(libc::RLIMIT_NPROC, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Fills the pipe behind descriptor `fd` of process `pid` with `byte`, through a second,
/// non-blocking write end: from then on a blocking write to it blocks. Returns how many
/// bytes went in.
pub fn fill_pipe(pid: u32, fd: &str, byte: u8) -> usize {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let filler = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .expect("open the pipe through /proc");
    let mut filled = 0;
    // Pages, then single bytes: a partly filled last page still takes small writes.
    for size in [4096, 1] {
        while let Ok(n) = (&filler).write(&vec![byte; size]) {
            filled += n;
        }
    }
    filled
}

/// A relay to `upstream` that shows `look` each chunk a client sends before passing it
/// on (`look` may act first, or hold it).
pub fn inspecting_relay(
    upstream: std::net::SocketAddr,
    look: impl Fn(&str) + Send + Sync + 'static,
) -> std::net::SocketAddr {
    inspecting_relay_with(upstream, move |chunk| {
        look(&String::from_utf8_lossy(chunk));
        chunk.to_vec()
    })
}

/// A relay to `upstream` that rewrites every occurrence of each `(from, to)` (same
/// length) in what clients send, as an agent that stores something else than it was sent
/// would; counts the requests it passes on.
pub fn rewriting_relay(
    upstream: std::net::SocketAddr,
    rewrites: &[(&str, &str)],
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let rewrites: Vec<(String, String)> = rewrites
        .iter()
        .map(|(f, t)| {
            assert_eq!(f.len(), t.len(), "a rewrite keeps the length");
            (f.to_string(), t.to_string())
        })
        .collect();
    let requests = std::sync::Arc::new(AtomicUsize::new(0));
    let counted = requests.clone();
    let addr = inspecting_relay_with(upstream, move |chunk| {
        let text = String::from_utf8_lossy(chunk);
        counted.fetch_add(text.matches(" HTTP/1.1\r\n").count(), Ordering::SeqCst);
        let mut out = chunk.to_vec();
        for (f, t) in &rewrites {
            let (f, t) = (f.as_bytes(), t.as_bytes());
            let mut i = 0;
            while i + f.len() <= out.len() {
                if &out[i..i + f.len()] == f {
                    out[i..i + f.len()].copy_from_slice(t);
                    i += f.len();
                } else {
                    i += 1;
                }
            }
        }
        out
    });
    (addr, requests)
}

/// Like [`inspecting_relay`], passing on what `edit` makes of each chunk.
pub fn inspecting_relay_with(
    upstream: std::net::SocketAddr,
    edit: impl Fn(&[u8]) -> Vec<u8> + Send + Sync + 'static,
) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let edit = std::sync::Arc::new(edit);
    std::thread::spawn(move || {
        for down in listener.incoming().flatten() {
            let up = std::net::TcpStream::connect(upstream).unwrap();
            let edit = edit.clone();
            let (mut d_read, mut u_write) = (down.try_clone().unwrap(), up.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut buf = [0u8; 16384];
                while let Ok(n) = d_read.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if u_write.write_all(&edit(&buf[..n])).is_err() {
                        break;
                    }
                }
            });
            let (mut u_read, mut d_write) = (up, down);
            std::thread::spawn(move || std::io::copy(&mut u_read, &mut d_write));
        }
    });
    addr
}

/// `CONLOCK_FENCING_TOKEN` (the store-neutral name) is set, and is the same positive
/// number as `CONLOCK_MODIFY_INDEX`.
pub fn same_fencing_token(env: &str) {
    let var = |name: &str| {
        env.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} missing in:\n{env}"))
            .parse::<u64>()
            .unwrap_or_else(|e| panic!("{name} is not a number ({e}) in:\n{env}"))
    };
    let token = var("CONLOCK_FENCING_TOKEN");
    assert!(token > 0, "{env}");
    assert_eq!(token, var("CONLOCK_MODIFY_INDEX"), "{env}");
}

/// The JSON lines a child prints on stdout, one per call, each waited for at most
/// `within`: a watch that stops printing fails the test instead of hanging it.
pub fn json_lines(
    stdout: std::process::ChildStdout,
    within: Duration,
) -> impl FnMut() -> serde_json::Value {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel::<String>();
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
    move || {
        let l = rx
            .recv_timeout(within)
            .unwrap_or_else(|e| panic!("no JSON line within {within:?} ({e})"));
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    }
}

/// What a [`fault_proxy`] does with a request (the bytes of one read from the client).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forward it and its answers.
    Forward,
    /// Answer etcd's "no leader" (HTTP 503, gRPC Unavailable) and close the connection,
    /// as a member does during an election.
    NoLeader,
    /// Answer with this HTTP status and text body and close the connection (Consul's
    /// 500 "No cluster leader" during an election, say).
    Answer(u16, &'static str),
    /// Answer etcd's "no leader" (503) and keep the connection open for the next
    /// request, as a member without a leader does on a kept-alive connection.
    NoLeaderKeepOpen,
    /// Forward it, drop its answer, and answer etcd's "no leader" instead: a member that
    /// passed the request on to the leader, which applied it, and then lost it.
    ForwardThenNoLeader,
    /// Forward it; from now on the connection's answers are dropped (it stays open), as
    /// when a member applied a request and then froze.
    MuteAnswers,
    /// Forward it; once an answer with `"created"` (a watch's first) has passed, the
    /// connection's answers are dropped (it stays open), as a watch on a frozen member.
    MuteAfterCreated,
    /// Forward neither it nor anything after it on this connection, either way (it
    /// stays open): a request that hangs, as on a member forwarding to a frozen leader.
    Hang,
}

/// A TCP proxy to `upstream` (`host:port`) that asks `decide` about every request and
/// acts as it says. Returns its endpoint (`http://...`).
pub fn fault_proxy(
    upstream: String,
    decide: impl Fn(&[u8]) -> Fault + Send + Sync + 'static,
) -> String {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU8, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let ep = format!("http://{}", listener.local_addr().unwrap());
    let decide = Arc::new(decide);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut down) = conn else { return };
            let Ok(mut up) = std::net::TcpStream::connect(&upstream) else {
                continue;
            };
            let (mut down2, mut up2) = (down.try_clone().unwrap(), up.try_clone().unwrap());
            // The connection's answers: 0 forwarded, 1 dropped, 2 dropped after "created".
            let answers = Arc::new(AtomicU8::new(0));
            let (decide, answers2) = (decide.clone(), answers.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                let mut hung = false;
                while let Ok(n) = down.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if hung {
                        continue;
                    }
                    match decide(&buf[..n]) {
                        Fault::Forward => {}
                        Fault::Hang => {
                            answers.store(1, Ordering::SeqCst);
                            hung = true;
                            continue;
                        }
                        Fault::NoLeaderKeepOpen => {
                            let body = r#"{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}"#;
                            let _ = write!(
                                down,
                                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            continue;
                        }
                        Fault::ForwardThenNoLeader => {
                            answers.store(1, Ordering::SeqCst);
                            let _ = up.write_all(&buf[..n]);
                            // Let etcd apply it before the client hears anything.
                            std::thread::sleep(std::time::Duration::from_millis(300));
                            let body = r#"{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}"#;
                            let _ = write!(
                                down,
                                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = down.shutdown(std::net::Shutdown::Both);
                            let _ = up.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        Fault::NoLeader => {
                            let body = r#"{"error":"etcdserver: no leader","message":"etcdserver: no leader","code":14}"#;
                            let _ = up.shutdown(std::net::Shutdown::Both);
                            let _ = write!(
                                down,
                                "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = down.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        Fault::Answer(status, body) => {
                            let _ = up.shutdown(std::net::Shutdown::Both);
                            let _ = write!(
                                down,
                                "HTTP/1.1 {status} Error\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                                body.len()
                            );
                            let _ = down.shutdown(std::net::Shutdown::Both);
                            return;
                        }
                        Fault::MuteAnswers => answers.store(1, Ordering::SeqCst),
                        Fault::MuteAfterCreated => {
                            let _ =
                                answers.compare_exchange(0, 2, Ordering::SeqCst, Ordering::SeqCst);
                        }
                    }
                    if up.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = up.shutdown(std::net::Shutdown::Write);
            });
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                let mut created = false;
                while let Ok(n) = up2.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    match answers2.load(Ordering::SeqCst) {
                        1 => continue,
                        2 if created => continue,
                        _ => {}
                    }
                    created = buf[..n].windows(9).any(|w| w == b"\"created\"");
                    if down2.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = down2.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    ep
}

/// Whether `bytes` contain `pattern`.
pub fn bytes_contain(bytes: &[u8], pattern: &[u8]) -> bool {
    bytes.windows(pattern.len()).any(|w| w == pattern)
}

/// A command for waiters in line for one lock: writes its `CONLOCK_FENCING_TOKEN` and
/// `CONLOCK_MODIFY_INDEX` to `dir/tok.PID`, then runs until `dir/go.PID` exists (at most
/// about 5 minutes, should the test die without saying so).
pub fn token_then_wait(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "echo \"$CONLOCK_FENCING_TOKEN $CONLOCK_MODIFY_INDEX\" > {d}/tok.tmp.$$; mv {d}/tok.tmp.$$ {d}/tok.$$; \
         i=0; while [ ! -e {d}/go.$$ ] && [ $i -lt 30000 ]; do sleep 0.01; i=$((i+1)); done"
    )
}

/// Lets `n` waiters running `token_then_wait(dir)` take the lock in turn, the first once
/// `release` let the holder go. While each holds, `held()` reads the key's ModifyIndex:
/// each waiter's token is that index (exact, not merely increasing). Returns the tokens
/// in the order the waiters held.
pub fn tokens_in_turn(
    dir: &Path,
    n: usize,
    release: impl FnOnce(),
    mut held: impl FnMut() -> Option<u64>,
) -> Vec<u64> {
    release();
    let mut seen = std::collections::HashSet::new();
    let mut tokens = Vec::new();
    for turn in 0..n {
        let mut next = None;
        assert!(
            wait_for(Duration::from_secs(120), || {
                next = std::fs::read_dir(dir).unwrap().flatten().find_map(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    let pid = name.strip_prefix("tok.")?.to_string();
                    (!pid.starts_with("tmp") && !seen.contains(&pid)).then_some(pid)
                });
                next.is_some()
            }),
            "waiter {turn} of {n} never started its command"
        );
        let pid = next.unwrap();
        let text = read(&dir.join(format!("tok.{pid}")));
        let got: Vec<u64> = text
            .split_whitespace()
            .map(|t| t.parse().unwrap())
            .collect();
        assert_eq!(got.len(), 2, "waiter {pid} wrote {text:?}");
        assert_eq!(
            got[0], got[1],
            "fencing token and ModifyIndex differ: {text:?}"
        );
        assert_eq!(
            held(),
            Some(got[0]),
            "waiter {pid}'s fencing token is not the key's ModifyIndex while it holds"
        );
        tokens.push(got[0]);
        seen.insert(pid.clone());
        std::fs::write(dir.join(format!("go.{pid}")), "").unwrap();
    }
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
    tokens
}
