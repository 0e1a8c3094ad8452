//! An in-memory, Consul-compatible HTTP dev server (like `consul agent -dev`),
//! for demos and tests. It reproduces what Consul 1.0.8 answers on the KV,
//! session, agent and status endpoints (status codes, headers, JSON shapes,
//! error texts, how raft indexes relate, blocking queries, TTLs and
//! lock-delays), and adds a control endpoint for fault injection:
//!
//! - `PUT /v1/conlock-dev/fault?mode=error|hang|drop|none&for=<duration>`
//! - `PUT /v1/conlock-dev/session/expire/<id>`
//! - `GET /v1/conlock-dev/stats` → `{"requests": N, "sessions": N, "keys": N}`
//!
//! The control endpoint is exempt from faults, ACLs and the request counter.
//! Nothing is persisted; NOT for production.

mod api;
mod gojson;
mod http;
mod shared;
mod store;
mod util;

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use shared::Shared;

/// Dev server settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to listen; port 0 picks a free port.
    pub addr: SocketAddr,
    /// Smallest session TTL accepted (Consul's `session_ttl_min`).
    pub session_ttl_min: Duration,
    /// When set, every request must carry this token (`X-Consul-Token` or
    /// `?token=`), else it gets 403 `Permission denied`.
    pub acl_token: Option<String>,
    /// The agent's node name (sessions are registered on it).
    pub node_name: String,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            addr: SocketAddr::from(([127, 0, 0, 1], 8500)),
            session_ttl_min: Duration::from_secs(10),
            acl_token: None,
            node_name: "conlock-dev".to_string(),
        }
    }
}

/// Injectable faults (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultMode {
    /// No fault: serve normally.
    None,
    /// Every request answers 500 `No cluster leader`.
    Error,
    /// Requests are held unanswered, then served normally.
    Hang,
    /// Connections are closed abruptly without an answer, including every
    /// blocking query in flight.
    Drop,
}

impl FaultMode {
    /// Parses `error`, `hang`, `drop` or `none`.
    pub fn parse(s: &str) -> Option<FaultMode> {
        match s {
            "none" => Some(FaultMode::None),
            "error" => Some(FaultMode::Error),
            "hang" => Some(FaultMode::Hang),
            "drop" => Some(FaultMode::Drop),
            _ => None,
        }
    }
}

/// A running dev server. Dropping it shuts it down.
pub struct DevServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    listener_fd: i32,
    accept: Option<JoinHandle<()>>,
    reaper: Option<JoinHandle<()>>,
    reaper_stop: Option<mpsc::Sender<()>>,
}

impl std::fmt::Debug for DevServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevServer")
            .field("addr", &self.addr)
            .finish()
    }
}

impl DevServer {
    /// Binds `opts.addr` and serves on background threads; returns at once.
    pub fn start(opts: Options) -> std::io::Result<DevServer> {
        let listener = TcpListener::bind(opts.addr)?;
        let addr = listener.local_addr()?;
        let listener_fd = listener.as_raw_fd();
        let shared = Arc::new(Shared::new(&opts));

        let s = shared.clone();
        let accept = std::thread::Builder::new()
            .name("conlock-dev-accept".to_string())
            .spawn(move || accept_loop(listener, s))?;

        let (tx, rx) = mpsc::channel::<()>();
        let s = shared.clone();
        let reaper = std::thread::Builder::new()
            .name("conlock-dev-reaper".to_string())
            .spawn(move || reaper_loop(s, rx));
        let reaper = match reaper {
            Ok(r) => r,
            Err(e) => {
                let mut partial = DevServer {
                    shared,
                    addr,
                    listener_fd,
                    accept: Some(accept),
                    reaper: None,
                    reaper_stop: None,
                };
                partial.stop();
                return Err(e);
            }
        };
        Ok(DevServer {
            shared,
            addr,
            listener_fd,
            accept: Some(accept),
            reaper: Some(reaper),
            reaper_stop: Some(tx),
        })
    }

    /// The address actually bound.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// HTTP requests received, the control endpoint excluded.
    pub fn request_count(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Invalidates a session now, as a TTL expiry would (lock-delay
    /// applies). Returns false when there is no such session.
    pub fn expire_session(&self, id: &str) -> bool {
        let ok = self.shared.lock_store().session_expire(id, Instant::now());
        self.shared.changed.notify_all();
        ok
    }

    /// Injects a fault for `dur` (`FaultMode::None` clears any fault).
    pub fn fault(&self, mode: FaultMode, dur: Duration) {
        self.shared.set_fault(mode, Some(dur));
    }

    /// Clears any injected fault.
    pub fn clear_fault(&self) {
        self.shared.set_fault(FaultMode::None, None);
    }

    /// Stops listening, closes every open connection abruptly (including
    /// held blocking queries) and drops all state.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let accept = match self.accept.take() {
            Some(a) => a,
            None => return,
        };
        self.shared.begin_shutdown();
        // Wake the accept loop: shutting a listening socket down makes
        // accept(2) fail on Linux; a self-connect covers other systems.
        // SAFETY: the descriptor is owned by the accept thread, which only
        // drops it after noticing the shutdown flag (so it is still open).
        unsafe {
            libc::shutdown(self.listener_fd, libc::SHUT_RDWR);
        }
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => [127, 0, 0, 1].into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
        let _ = accept.join();
        // Anything accepted meanwhile was refused by the registry.
        self.shared.begin_shutdown();
        self.reaper_stop.take();
        if let Some(r) = self.reaper.take() {
            let _ = r.join();
        }
        self.shared.wait_connections_closed(Duration::from_secs(5));
        self.shared.clear_state();
    }
}

impl Drop for DevServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let accepted = listener.accept();
        if shared.is_shutdown() {
            break;
        }
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        let (id, h) = match shared.register(stream) {
            Some(x) => x,
            None => break,
        };
        let s = shared.clone();
        let h2 = h.clone();
        let spawned = std::thread::Builder::new()
            .name("conlock-dev-conn".to_string())
            .stack_size(256 * 1024)
            .spawn(move || http::serve_connection(s, id, h2));
        if spawned.is_err() {
            h.kill();
            shared.unregister(id);
        }
    }
}

fn reaper_loop(shared: Arc<Shared>, stop: mpsc::Receiver<()>) {
    loop {
        match stop.recv_timeout(Duration::from_millis(50)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let reaped = shared.lock_store().reap(Instant::now());
        if reaped > 0 {
            shared.changed.notify_all();
        }
    }
}

/// For the CLI `conlock dev-server`: starts the server, prints one line to
/// stdout, blocks until SIGINT or SIGTERM, then shuts down.
pub fn run_foreground(opts: Options) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    let server = DevServer::start(opts.clone())
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", opts.addr))?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "conlock dev-server listening on http://{} (in-memory, NOT for production)",
            server.addr()
        )?;
        out.flush()?;
    }
    let _ = signals.forever().next();
    signals.handle().close();
    server.shutdown();
    Ok(())
}
