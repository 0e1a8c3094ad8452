//! The listening sockets: one accept thread per listener (the server agent's and
//! each client agent's), handing each connection to a connection thread. The
//! HTTP layer above is reached through `Shared::serve_connection`, so that the
//! control endpoint (api.rs) can start an agent's listener here.

use std::net::{SocketAddr, TcpListener};
use std::os::unix::io::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::shared::{Agent, Listener, Shared};

/// Binds `addr` and serves it on a new accept thread as `agent`.
pub fn spawn_listener(
    shared: &Arc<Shared>,
    addr: SocketAddr,
    agent: Arc<Agent>,
) -> std::io::Result<SocketAddr> {
    serve_listener(shared, TcpListener::bind(addr)?, agent)
}

/// Serves a bound listener on a new accept thread as `agent`.
fn serve_listener(
    shared: &Arc<Shared>,
    listener: TcpListener,
    agent: Arc<Agent>,
) -> std::io::Result<SocketAddr> {
    // Go (and so Consul) listens with the kernel's somaxconn; Rust's std with 128, which
    // a burst of connections overflows, each dropped one then waiting for a SYN retry.
    // A second listen() only changes the backlog (capped at somaxconn by the kernel).
    // SAFETY: a valid listening socket descriptor.
    unsafe {
        libc::listen(listener.as_raw_fd(), libc::c_int::MAX);
    }
    let mut listeners = shared.listeners.lock().unwrap_or_else(|e| e.into_inner());
    if shared.is_shutdown() {
        return Err(std::io::Error::other("dev server is shutting down"));
    }
    let bound = listener.local_addr()?;
    let fd = listener.as_raw_fd();
    let s = shared.clone();
    let accept = std::thread::Builder::new()
        .name("conlock-dev-accept".to_string())
        .spawn(move || accept_loop(listener, s, agent))?;
    listeners.push(Listener {
        fd,
        addr: bound,
        accept,
    });
    Ok(bound)
}

/// Registers a client agent on `node` and starts its listener.
pub fn add_agent(shared: &Arc<Shared>, node: &str) -> std::io::Result<SocketAddr> {
    if node.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "agent node name is empty",
        ));
    }
    // Bound first, so that a failure leaves no agent without a listener.
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let agent = shared.add_agent(node).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!("an agent already runs on node '{node}'"),
        )
    })?;
    serve_listener(shared, listener, agent)
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, agent: Arc<Agent>) {
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
        let (id, h) = match shared.register(stream, agent.clone()) {
            Some(x) => x,
            None => break,
        };
        if shared.hand_to_idle_thread(id, h.clone()) {
            continue;
        }
        let s = shared.clone();
        let h2 = h.clone();
        // Counted before it starts, so that it is counted by the time it serves.
        shared.conn_threads.fetch_add(1, Ordering::SeqCst);
        let spawned = std::thread::Builder::new()
            .name("conlock-dev-conn".to_string())
            .stack_size(256 * 1024)
            .spawn(move || {
                let mut next = Some((id, h2));
                while let Some((id, h)) = next {
                    s.serve_connection(id, h);
                    next = s.next_connection();
                }
            });
        if spawned.is_err() {
            shared.conn_threads.fetch_sub(1, Ordering::SeqCst);
            h.kill();
            shared.unregister(id);
        }
    }
}
