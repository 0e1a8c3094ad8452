//! State shared by the accept loop, the connection threads and the reaper:
//! the store with its change condvar, injected faults, and the registry of
//! open connections (so they can be closed abruptly).

use std::collections::HashMap;
use std::net::{Shutdown, TcpStream};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::store::Store;
use super::{FaultMode, Options};

/// One open client connection.
#[derive(Debug)]
pub struct ConnHandle {
    pub stream: TcpStream,
    killed: AtomicBool,
}

impl ConnHandle {
    pub fn new(stream: TcpStream) -> ConnHandle {
        ConnHandle {
            stream,
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

#[derive(Debug)]
pub struct Shared {
    pub node_name: String,
    pub acl_token: Option<String>,
    pub session_ttl_min: Duration,
    store: Mutex<Store>,
    /// Signalled on every state change (and on kills/shutdown) to wake
    /// blocking queries.
    pub changed: Condvar,
    faults: Mutex<Fault>,
    fault_cv: Condvar,
    conns: Mutex<HashMap<u64, Arc<ConnHandle>>>,
    conns_cv: Condvar,
    next_conn: AtomicU64,
    shutdown: AtomicBool,
    pub requests: AtomicU64,
}

fn relock<T>(r: std::sync::LockResult<MutexGuard<'_, T>>) -> MutexGuard<'_, T> {
    r.unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    pub fn new(opts: &Options) -> Shared {
        Shared {
            node_name: opts.node_name.clone(),
            acl_token: opts.acl_token.clone(),
            session_ttl_min: opts.session_ttl_min,
            store: Mutex::new(Store::new(&opts.node_name)),
            changed: Condvar::new(),
            faults: Mutex::new(Fault {
                mode: FaultMode::None,
                until: None,
            }),
            fault_cv: Condvar::new(),
            conns: Mutex::new(HashMap::new()),
            conns_cv: Condvar::new(),
            next_conn: AtomicU64::new(1),
            shutdown: AtomicBool::new(false),
            requests: AtomicU64::new(0),
        }
    }

    pub fn lock_store(&self) -> MutexGuard<'_, Store> {
        relock(self.store.lock())
    }

    /// Waits on the change condvar (poison-tolerant).
    pub fn wait_changed<'a>(
        &self,
        guard: MutexGuard<'a, Store>,
        dur: Duration,
    ) -> MutexGuard<'a, Store> {
        match self.changed.wait_timeout(guard, dur) {
            Ok((g, _)) => g,
            Err(e) => e.into_inner().0,
        }
    }

    /// Wakes every blocking query so it re-checks its condition.
    pub fn notify_changed(&self) {
        // Taking the lock orders this wake-up after any waiter's check.
        drop(self.lock_store());
        self.changed.notify_all();
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
            self.notify_changed();
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

    /// Registers a new connection, unless the server is shutting down.
    pub fn register(&self, stream: TcpStream) -> Option<(u64, Arc<ConnHandle>)> {
        let mut conns = relock(self.conns.lock());
        if self.is_shutdown() {
            return None;
        }
        let id = self.next_conn.fetch_add(1, Ordering::SeqCst);
        let h = Arc::new(ConnHandle::new(stream));
        conns.insert(id, h.clone());
        Some((id, h))
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
        self.notify_changed();
        drop(relock(self.faults.lock()));
        self.fault_cv.notify_all();
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
        *self.lock_store() = Store::new(&self.node_name);
    }
}
