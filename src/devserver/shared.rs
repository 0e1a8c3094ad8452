//! State shared by the accept loops, the connection threads and the reaper:
//! the store with its change condvar, injected faults, the agents (one per
//! listener) and the registry of open connections (so they can be closed
//! abruptly).

use std::collections::HashMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::options::{FaultMode, Options};
use super::store::{Store, Watch};

/// The agent a listener acts as: the dev server's own (server) agent, or a
/// client agent on another node added for tests.
#[derive(Debug)]
pub struct Agent {
    pub node: String,
    pub server: bool,
    /// Requests through this agent are held unanswered (a SIGSTOPped agent).
    frozen: AtomicBool,
}

impl Agent {
    pub fn new(node: &str, server: bool) -> Agent {
        Agent {
            node: node.to_string(),
            server,
            frozen: AtomicBool::new(false),
        }
    }
}

/// A listening socket and its accept thread.
#[derive(Debug)]
pub struct Listener {
    pub fd: i32,
    pub addr: SocketAddr,
    pub accept: JoinHandle<()>,
}

/// One open client connection.
#[derive(Debug)]
pub struct ConnHandle {
    pub stream: TcpStream,
    pub agent: Arc<Agent>,
    killed: AtomicBool,
}

impl ConnHandle {
    pub fn new(stream: TcpStream, agent: Arc<Agent>) -> ConnHandle {
        ConnHandle {
            stream,
            agent,
            killed: AtomicBool::new(false),
        }
    }

    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }

    /// Closes the connection abruptly: no answer, and a reset once the last
    /// descriptor goes away.
    pub fn kill(&self) {
        self.killed.store(true, Ordering::SeqCst);
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        // SAFETY: a valid socket descriptor and a correctly sized option value.
        unsafe {
            libc::setsockopt(
                self.stream.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&linger as *const libc::linger).cast::<libc::c_void>(),
                std::mem::size_of::<libc::linger>() as libc::socklen_t,
            );
        }
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

#[derive(Debug, Clone, Copy)]
struct Fault {
    mode: FaultMode,
    until: Option<Instant>,
}

/// A blocking query waiting for what it watches to change.
#[derive(Debug)]
struct Parked {
    watch: Watch,
    /// The change stamp it last saw; written under the store lock.
    seen: AtomicU64,
    /// Waited on with the store lock; shared by the queries parked on the same watch.
    wake: Arc<Condvar>,
}

/// A parked blocking query; leaves the parked list when dropped.
pub struct Parking<'a> {
    shared: &'a Shared,
    parked: Arc<Parked>,
}

impl Parking<'_> {
    pub fn watch(&self) -> &Watch {
        &self.parked.watch
    }

    /// Waits (bounded) for a wake-up, with the store lock released meanwhile.
    pub fn wait<'g>(&self, st: MutexGuard<'g, Store>, dur: Duration) -> MutexGuard<'g, Store> {
        match self.parked.wake.wait_timeout(st, dur) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        }
    }

    /// Records a change it saw but did not answer (its index was not yet past).
    pub fn saw(&self, stamp: u64) {
        self.parked.seen.store(stamp, Ordering::SeqCst);
    }
}

impl Drop for Parking<'_> {
    fn drop(&mut self) {
        relock(self.shared.parked.lock()).retain(|p| !Arc::ptr_eq(p, &self.parked));
    }
}

#[derive(Debug)]
pub struct Shared {
    pub acl_token: Option<String>,
    pub session_ttl_min: Duration,
    store: Mutex<Store>,
    /// Blocking queries waiting now, each woken only when what it watches changes (and
    /// on kills, faults and shutdown): a write does not wake every parked query. Locked
    /// only while the store is locked (store first), except by a query leaving.
    parked: Mutex<Vec<Arc<Parked>>>,
    faults: Mutex<Fault>,
    fault_cv: Condvar,
    conns: Mutex<HashMap<u64, Arc<ConnHandle>>>,
    conns_cv: Condvar,
    /// The primary agent first.
    agents: Mutex<Vec<Arc<Agent>>>,
    pub listeners: Mutex<Vec<Listener>>,
    next_conn: AtomicU64,
    shutdown: AtomicBool,
    pub requests: AtomicU64,
    /// Blocking queries waiting now.
    pub blocking: AtomicU64,
    /// Blocking queries woken because what they watch changed, counted by the writers.
    pub wakeups: AtomicU64,
    /// Connection threads waiting for another connection, and what was handed to them.
    idle: Mutex<Idle>,
    idle_cv: Condvar,
    /// Connection threads started so far.
    pub conn_threads: AtomicU64,
    /// Serves one connection until it closes (http.rs): given by mod.rs, so that the
    /// listeners (listen.rs), which the control endpoint starts too, need not know it.
    serve_conn: ServeConnection,
}

/// Serves connection `id` until it closes, then unregisters it.
pub type ServeConnection = fn(Arc<Shared>, u64, Arc<ConnHandle>);

/// Connection threads between connections: a new connection goes to one of them instead
/// of a new thread (a thread start was on the path of every client's first request).
#[derive(Debug, Default)]
struct Idle {
    /// Threads waiting; never fewer than `handed.len()`.
    waiting: usize,
    handed: std::collections::VecDeque<(u64, Arc<ConnHandle>)>,
}

/// How long a connection thread waits for another connection before it ends.
const IDLE_THREAD_WAIT: Duration = Duration::from_secs(30);

fn relock<T>(r: std::sync::LockResult<MutexGuard<'_, T>>) -> MutexGuard<'_, T> {
    r.unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(opts: &Options, serve_conn: ServeConnection) -> Shared {
        Shared {
            acl_token: opts.acl_token.clone(),
            session_ttl_min: opts.session_ttl_min,
            store: Mutex::new(Store::new(&opts.node_name)),
            parked: Mutex::new(Vec::new()),
            faults: Mutex::new(Fault {
                mode: FaultMode::None,
                until: None,
            }),
            fault_cv: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            conns_cv: Condvar::new(),
            agents: Mutex::new(vec![Arc::new(Agent::new(&opts.node_name, true))]),
            listeners: Mutex::new(Vec::new()),
            next_conn: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            blocking: AtomicU64::new(0),
            wakeups: AtomicU64::new(0),
            idle: Mutex::new(Idle::default()),
            idle_cv: Condvar::new(),
            conn_threads: AtomicU64::new(0),
            serve_conn,
        }
    }

    /// Serves connection `id` until it closes, then unregisters it.
    pub fn serve_connection(self: &Arc<Shared>, id: u64, h: Arc<ConnHandle>) {
        (self.serve_conn)(self.clone(), id, h);
    }

    pub fn lock_store(&self) -> MutexGuard<'_, Store> {
        relock(self.store.lock())
    }

    /// Parks a blocking query that saw `stamp` for `watch`. The caller holds the store
    /// lock (`_st`), so no change slips in between its check and its parking.
    pub fn park(&self, _st: &MutexGuard<'_, Store>, watch: Watch, stamp: u64) -> Parking<'_> {
        let mut parked = relock(self.parked.lock());
        // Queries on the same thing share one condvar: a change wakes them with one call.
        let wake = parked
            .iter()
            .find(|p| p.watch == watch)
            .map_or_else(|| Arc::new(Condvar::new()), |p| p.wake.clone());
        let p = Arc::new(Parked {
            watch,
            seen: AtomicU64::new(stamp),
            wake,
        });
        parked.push(p.clone());
        Parking {
            shared: self,
            parked: p,
        }
    }

    /// Wakes the blocking queries whose watched state changed.
    pub fn notify_changed(&self) {
        let mut due: Vec<Arc<Condvar>> = Vec::new();
        {
            let st = self.lock_store();
            let parked = relock(self.parked.lock());
            for p in parked.iter() {
                // One probe per condvar: the queries sharing it watch the same thing.
                if !due.iter().any(|w| Arc::ptr_eq(w, &p.wake))
                    && st.probe(&p.watch).1 != p.seen.load(Ordering::SeqCst)
                {
                    due.push(p.wake.clone());
                }
            }
            let woken = parked
                .iter()
                .filter(|p| due.iter().any(|w| Arc::ptr_eq(w, &p.wake)))
                .count();
            self.wakeups.fetch_add(woken as u64, Ordering::SeqCst);
        }
        // After the lock, so that a woken query does not wait for it at once. A query
        // cannot miss the change meanwhile: it probes under the lock before it waits.
        for wake in due {
            wake.notify_all();
        }
    }

    /// Wakes every blocking query, so it re-checks kills, faults and shutdown.
    pub fn wake_all(&self) {
        let all: Vec<Arc<Parked>> = {
            // Taking the store lock orders this after any query's check.
            let _st = self.lock_store();
            relock(self.parked.lock()).clone()
        };
        for p in all {
            p.wake.notify_all();
        }
    }

    pub fn is_shutdown(&self) -> bool {
        self.shutdown.load(Ordering::SeqCst)
    }

    pub fn aborted(&self, h: &ConnHandle) -> bool {
        self.is_shutdown() || h.is_killed()
    }

    /// The fault in force now.
    pub fn current_fault(&self, now: Instant) -> FaultMode {
        let f = relock(self.faults.lock());
        match f.until {
            Some(t) if t <= now => FaultMode::None,
            _ => f.mode,
        }
    }

    /// Sets the fault for `dur` (forever when `None`); `FaultMode::None`
    /// clears. Drop mode also closes every blocking query in flight, and error
    /// mode answers them with the 500.
    pub fn set_fault(&self, mode: FaultMode, dur: Option<Duration>) {
        {
            let mut f = relock(self.faults.lock());
            f.mode = mode;
            f.until = match mode {
                FaultMode::None => None,
                _ => dur.map(|d| Instant::now() + d),
            };
        }
        self.fault_cv.notify_all();
        if matches!(mode, FaultMode::Drop | FaultMode::Error) {
            self.wake_all();
        }
    }

    /// Holds the request while a hang fault is in force. Returns true when the
    /// connection was killed (or the server shut down) meanwhile.
    pub fn hold_while_hanging(&self, h: &ConnHandle) -> bool {
        let mut f = relock(self.faults.lock());
        loop {
            if self.aborted(h) {
                return true;
            }
            let now = Instant::now();
            if f.mode != FaultMode::Hang {
                return false;
            }
            let wait = match f.until {
                Some(t) if t <= now => return false,
                Some(t) => t - now,
                None => Duration::from_secs(3600),
            };
            f = match self.fault_cv.wait_timeout(f, wait) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Holds the request while its agent is frozen. Returns true when the
    /// connection was killed (or the server shut down) meanwhile.
    pub fn hold_while_frozen(&self, h: &ConnHandle) -> bool {
        let mut f = relock(self.faults.lock());
        loop {
            if self.aborted(h) {
                return true;
            }
            if !h.agent.frozen.load(Ordering::SeqCst) {
                return false;
            }
            f = match self.fault_cv.wait_timeout(f, Duration::from_secs(3600)) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    pub fn primary_agent(&self) -> Arc<Agent> {
        relock(self.agents.lock())[0].clone()
    }

    pub fn find_agent(&self, node: &str) -> Option<Arc<Agent>> {
        relock(self.agents.lock())
            .iter()
            .find(|a| a.node.eq_ignore_ascii_case(node))
            .cloned()
    }

    /// Adds a client agent on a new node and registers that node (passing
    /// `serfHealth`). `None` when the node name is taken.
    pub fn add_agent(&self, node: &str) -> Option<Arc<Agent>> {
        let agent = {
            let mut agents = relock(self.agents.lock());
            if agents.iter().any(|a| a.node.eq_ignore_ascii_case(node)) {
                return None;
            }
            let a = Arc::new(Agent::new(node, false));
            agents.push(a.clone());
            a
        };
        self.lock_store().node_register(node, false, None);
        self.notify_changed();
        Some(agent)
    }

    /// Freezes or thaws the agent of `node`; false when there is none. A
    /// freeze schedules the node's failure `detect` from now; a thaw cancels
    /// it, or turns a critical `serfHealth` passing again.
    pub fn set_frozen(&self, node: &str, frozen: bool, detect: Duration) -> bool {
        let agent = match self.find_agent(node) {
            Some(a) => a,
            None => return false,
        };
        {
            let mut st = self.lock_store();
            if frozen {
                st.node_fail_at(&agent.node, Instant::now() + detect);
            } else {
                st.node_alive(&agent.node);
            }
        }
        self.notify_changed();
        {
            let _f = relock(self.faults.lock());
            agent.frozen.store(frozen, Ordering::SeqCst);
        }
        self.fault_cv.notify_all();
        // A node that fails right away (`detect` 0) is failed by the reaper.
        true
    }

    /// A restart that lost all state: every open connection is closed
    /// abruptly (held blocking queries included), sessions, keys and
    /// lock-delays are gone, and the raft index starts low again. Nodes
    /// rejoin: each agent's node is registered again, keeping its health
    /// (a frozen agent still fails when its detection time comes). `keep`:
    /// the connection that asked for it (through the control endpoint).
    pub fn restart_losing_state(&self, keep: Option<&ConnHandle>) {
        {
            let mut st = self.lock_store();
            {
                let conns = relock(self.conns.lock());
                for h in conns.values() {
                    if !keep.is_some_and(|k| std::ptr::eq(k, &**h)) {
                        h.kill();
                    }
                }
            }
            let agents: Vec<Arc<Agent>> = relock(self.agents.lock()).clone();
            let mut fresh = Store::new(&agents[0].node);
            let old: Vec<(String, bool, Option<Instant>)> = st
                .nodes()
                .map(|n| (n.name.clone(), n.critical, n.fail_at))
                .collect();
            for a in &agents {
                let (critical, fail_at) = old
                    .iter()
                    .find(|(n, _, _)| n.eq_ignore_ascii_case(&a.node))
                    .map(|(_, c, f)| (*c, *f))
                    .unwrap_or((false, None));
                if a.server {
                    if critical {
                        fresh.node_fail_at(&a.node, Instant::now());
                    } else if let Some(t) = fail_at {
                        fresh.node_fail_at(&a.node, t);
                    }
                } else {
                    fresh.node_register(&a.node, critical, fail_at);
                }
            }
            *st = fresh;
        }
        self.wake_all();
        drop(relock(self.faults.lock()));
        self.fault_cv.notify_all();
    }

    /// Registers a new connection, unless the server is shutting down.
    pub fn register(&self, stream: TcpStream, agent: Arc<Agent>) -> Option<(u64, Arc<ConnHandle>)> {
        let mut conns = relock(self.conns.lock());
        if self.is_shutdown() {
            return None;
        }
        let id = self.next_conn.fetch_add(1, Ordering::SeqCst);
        let h = Arc::new(ConnHandle::new(stream, agent));
        conns.insert(id, h.clone());
        Some((id, h))
    }

    /// Gives a registered connection to a waiting connection thread; false if none waits.
    pub fn hand_to_idle_thread(&self, id: u64, h: Arc<ConnHandle>) -> bool {
        let mut idle = relock(self.idle.lock());
        if idle.waiting <= idle.handed.len() {
            return false;
        }
        idle.handed.push_back((id, h));
        drop(idle);
        self.idle_cv.notify_one();
        true
    }

    /// Connection threads waiting for a connection now.
    pub fn idle_threads(&self) -> usize {
        let idle = relock(self.idle.lock());
        idle.waiting - idle.handed.len()
    }

    /// Called by a connection thread after its connection: the next one handed to it, or
    /// `None` once it waited `IDLE_THREAD_WAIT` for nothing or the server shuts down.
    pub fn next_connection(&self) -> Option<(u64, Arc<ConnHandle>)> {
        let mut idle = relock(self.idle.lock());
        idle.waiting += 1;
        let until = Instant::now() + IDLE_THREAD_WAIT;
        loop {
            // Even while shutting down: a connection handed over is served (it is closed
            // at once) so that it leaves the registry.
            if let Some(next) = idle.handed.pop_front() {
                idle.waiting -= 1;
                return Some(next);
            }
            let now = Instant::now();
            if self.is_shutdown() || now >= until {
                idle.waiting -= 1;
                return None;
            }
            idle = match self.idle_cv.wait_timeout(idle, until - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// TCP connections accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.next_conn.load(Ordering::SeqCst) - 1
    }

    pub fn unregister(&self, id: u64) {
        relock(self.conns.lock()).remove(&id);
        self.conns_cv.notify_all();
    }

    /// Marks the server as shutting down and abruptly closes every open
    /// connection, waking anything that waits.
    pub fn begin_shutdown(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        {
            let conns = relock(self.conns.lock());
            for h in conns.values() {
                h.kill();
            }
        }
        self.wake_all();
        drop(relock(self.faults.lock()));
        self.fault_cv.notify_all();
        drop(relock(self.idle.lock()));
        self.idle_cv.notify_all();
    }

    /// Waits (bounded) until every connection thread has finished.
    pub fn wait_connections_closed(&self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut conns = relock(self.conns.lock());
        while !conns.is_empty() {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            conns = match self.conns_cv.wait_timeout(conns, deadline - now) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Drops all state (after shutdown).
    pub fn clear_state(&self) {
        *self.lock_store() = Store::new(&self.primary_agent().node);
    }
}
