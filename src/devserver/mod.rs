//! An in-memory, Consul-compatible HTTP dev server (like `consul agent -dev`),
//! for demos and tests. It reproduces what Consul 1.0.8 answers on the KV,
//! session, agent and status endpoints (status codes, headers, JSON shapes,
//! error texts, how raft indexes relate, blocking queries, TTLs and
//! lock-delays), and adds a control endpoint for fault injection:
//!
//! - `PUT /v1/conlock-dev/fault?mode=error|hang|drop|none&for=<duration>`
//! - `PUT /v1/conlock-dev/session/expire/<id>`
//! - `GET /v1/conlock-dev/stats` → `{"requests": N, "sessions": N, "keys": N}`
//! - `PUT /v1/conlock-dev/agent?node=NAME` → `{"Addr": "127.0.0.1:PORT"}`: a
//!   second listener acting as a client agent on node NAME
//! - `PUT /v1/conlock-dev/agent/freeze?node=NAME[&detect=D]` and
//!   `PUT /v1/conlock-dev/agent/thaw?node=NAME`: that agent stops answering
//!   (a SIGSTOPped agent) and its node fails `detect` later (default 6s)
//! - `PUT /v1/conlock-dev/restart?state=lose`: a restart that lost all state
//!
//! The control endpoint is exempt from faults, freezes, ACLs and the request
//! counter. Nothing is persisted; NOT for production.

mod api;
mod gojson;
mod http;
mod listen;
mod message;
mod options;
mod shared;
mod store;
mod util;

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use options::{FaultMode, Options, DEFAULT_DETECT};
use shared::Shared;

/// A running dev server. Dropping it shuts it down.
pub struct DevServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    stopped: bool,
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
        let shared = Arc::new(Shared::new(&opts, http::serve_connection));
        let addr = listen::spawn_listener(&shared, opts.addr, shared.primary_agent())?;

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
                    stopped: false,
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
            stopped: false,
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

    /// Connection threads started, and those waiting for a connection now (a connection
    /// thread serves one connection after another).
    pub fn connection_threads(&self) -> (u64, usize) {
        (
            self.shared.conn_threads.load(Ordering::SeqCst),
            self.shared.idle_threads(),
        )
    }

    /// Blocking queries waiting for a change now.
    pub fn blocking_count(&self) -> u64 {
        self.shared.blocking.load(Ordering::SeqCst)
    }

    /// Waiting blocking queries woken by writes so far: a write wakes only the queries
    /// on what it changed (kills, faults and shutdown wake all; not counted).
    pub fn blocking_wakeups(&self) -> u64 {
        self.shared.wakeups.load(Ordering::SeqCst)
    }

    /// TCP connections accepted (a client that reuses its connections opens few).
    pub fn connection_count(&self) -> u64 {
        self.shared.connections_accepted()
    }

    /// Invalidates a session now, as a TTL expiry would (lock-delay
    /// applies). Returns false when there is no such session.
    pub fn expire_session(&self, id: &str) -> bool {
        let ok = self.shared.lock_store().session_expire(id, Instant::now());
        self.shared.notify_changed();
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

    /// Starts another listener on 127.0.0.1 (free port) that serves the same
    /// store as a client agent on node `node_name`: sessions created through
    /// it default to that node (and its `serfHealth`), `/v1/agent/self`
    /// names it. Fails with `AlreadyExists` when the node name is taken.
    pub fn add_agent(&self, node_name: &str) -> std::io::Result<SocketAddr> {
        listen::add_agent(&self.shared, node_name)
    }

    /// Freezes the agent of `node` (a SIGSTOPped agent, or one cut off from
    /// the servers): requests through its listener, and those in flight
    /// there, get no answer until [`DevServer::thaw_agent`]. `detect` later
    /// the node's `serfHealth` turns critical and, in one raft index, every
    /// session tied to it is invalidated (behavior and lock-delay apply).
    /// Real Consul took 6.0–6.5 s ([`DEFAULT_DETECT`]). False when no agent
    /// runs on that node.
    pub fn freeze_agent(&self, node: &str, detect: Duration) -> bool {
        self.shared.set_frozen(node, true, detect)
    }

    /// Thaws the agent of `node`: requests held there are handled now, and a
    /// critical `serfHealth` turns passing (one raft index). False when no
    /// agent runs on that node.
    pub fn thaw_agent(&self, node: &str) -> bool {
        self.shared.set_frozen(node, false, Duration::ZERO)
    }

    /// A restart that lost all state (a `consul agent -dev` restart, or a
    /// cluster that lost its raft data): every open connection is closed
    /// abruptly, including held blocking queries; sessions, keys and
    /// lock-delays are dropped; the raft index starts again from 5, below
    /// what clients saw. The same ports keep listening.
    pub fn restart_losing_state(&self) {
        self.shared.restart_losing_state(None);
    }

    /// Stops listening, closes every open connection abruptly (including
    /// held blocking queries) and drops all state.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let listeners = {
            let mut l = self
                .shared
                .listeners
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            // Under the lock: no listener is added after this.
            self.shared.begin_shutdown();
            std::mem::take(&mut *l)
        };
        for l in listeners {
            // Wake the accept loop: shutting a listening socket down makes
            // accept(2) fail on Linux; a self-connect covers other systems.
            // SAFETY: the descriptor is owned by the accept thread, which
            // only drops it after noticing the shutdown flag (so it is still
            // open).
            unsafe {
                libc::shutdown(l.fd, libc::SHUT_RDWR);
            }
            let mut wake = l.addr;
            if wake.ip().is_unspecified() {
                wake.set_ip(match wake {
                    SocketAddr::V4(_) => [127, 0, 0, 1].into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            let _ = TcpStream::connect_timeout(&wake, Duration::from_millis(200));
            let _ = l.accept.join();
        }
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

fn reaper_loop(shared: Arc<Shared>, stop: mpsc::Receiver<()>) {
    loop {
        match stop.recv_timeout(Duration::from_millis(50)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
        let reaped = shared.lock_store().reap(Instant::now());
        if reaped > 0 {
            shared.notify_changed();
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
    crate::ui::out(format!(
        "conlock dev-server listening on http://{} (in-memory, NOT for production)\n",
        server.addr()
    ))?;
    let _ = signals.forever().next();
    signals.handle().close();
    server.shutdown();
    Ok(())
}
