//! The dev server's settings and injectable faults: used by its files and
//! offered by mod.rs, so that no file needs mod.rs.

use std::net::SocketAddr;
use std::time::Duration;

/// How long real Consul took to mark a stopped agent's node failed (6.0 to
/// 6.5 s in the recordings); the default `detect` of a freeze.
pub const DEFAULT_DETECT: Duration = Duration::from_secs(6);

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

/// Injectable faults (see the `devserver` module docs).
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
