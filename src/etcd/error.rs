//! What can go wrong talking to etcd, in the shapes the claim layer branches on.

/// gRPC status codes that the gateway reports (`code` / `grpc_code`).
pub mod grpc {
    pub const INVALID_ARGUMENT: i32 = 3;
    pub const NOT_FOUND: i32 = 5;
    pub const PERMISSION_DENIED: i32 = 7;
    pub const FAILED_PRECONDITION: i32 = 9;
    pub const OUT_OF_RANGE: i32 = 11;
    pub const RESOURCE_EXHAUSTED: i32 = 8;
    pub const UNAVAILABLE: i32 = 14;
    pub const UNAUTHENTICATED: i32 = 16;
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint answered (connection refused or reset, name not found, TLS failure,
    /// or "no leader"/"unavailable" from each).
    #[error("cannot reach etcd for {what}: tried {} (endpoints from {origin}); last error: {last}; check that etcd runs there and that the address is right", tried.join(", "))]
    Unreachable {
        what: String,
        tried: Vec<String>,
        origin: String,
        last: String,
    },
    /// Every endpoint tried timed out, or a watch was silent past its read timeout.
    #[error("no answer from etcd to {what} within {secs:.1}s from {}; check that the member is not frozen and has a leader", endpoints.join(", "))]
    Timeout {
        what: String,
        endpoints: Vec<String>,
        secs: f64,
    },
    /// etcd answered with an error status (the gateway's `{"error":..,"code":..}`).
    #[error(
        "etcd at {endpoint} refused {what}: {message} (HTTP {http_status}, gRPC code {grpc_code})"
    )]
    Status {
        what: String,
        endpoint: String,
        http_status: u16,
        grpc_code: i32,
        message: String,
    },
    /// "etcdserver: requested lease not found": the lease expired or was revoked.
    #[error("etcd no longer knows lease {lease:x} ({what}): it expired or was revoked")]
    LeaseNotFound { what: String, lease: i64 },
    /// A watch's start revision is older than etcd's compacted history.
    #[error("etcd compacted its history up to revision {compact_revision}, past the start of the watch {what}; read the keys again and watch from a newer revision")]
    Compacted { what: String, compact_revision: i64 },
    /// Authentication failed or is required.
    #[error("etcd at {endpoint} refused {what}: {message}; {hint}")]
    Auth {
        what: String,
        endpoint: String,
        message: String,
        /// Which flag or variable to check.
        hint: String,
    },
    /// An answer that is not what the gateway sends.
    #[error("unexpected answer from etcd at {endpoint} to {what}: {detail}; the answer began with {excerpt:?}; is this etcd's v3 gateway (etcd 3.4 or later)?")]
    BadAnswer {
        what: String,
        endpoint: String,
        detail: String,
        excerpt: String,
    },
    #[error("cannot set up TLS for etcd: {0}")]
    Tls(String),
    /// The client's own deadline (`EtcdClient::with_deadline`) ended the call.
    #[error("{what} not completed: {limit}")]
    CutShort { what: String, limit: String },
}

impl EtcdError {
    /// True for failures that may pass by themselves (network, timeouts, no leader).
    pub fn is_retryable(&self) -> bool {
        match self {
            EtcdError::Unreachable { .. } | EtcdError::Timeout { .. } => true,
            EtcdError::Status {
                grpc_code,
                http_status,
                ..
            } => {
                // Also "too many requests" (its apply backlog is full): ask again later.
                *grpc_code == grpc::UNAVAILABLE
                    || *grpc_code == grpc::RESOURCE_EXHAUSTED
                    || *http_status == 503
                    || *http_status == 429
            }
            _ => false,
        }
    }

    /// etcd answered that it cannot serve the request now (HTTP 503 / gRPC Unavailable:
    /// no leader, an election), from the last endpoint tried; not a silence or a refused
    /// connection.
    pub fn is_unavailable_answer(&self) -> bool {
        match self {
            EtcdError::Status { .. } => self.is_retryable(),
            // The last endpoint's reason is its `Status` message.
            EtcdError::Unreachable { last, .. } => {
                last.contains("(HTTP 503")
                    || last.contains(&format!("gRPC code {}", grpc::UNAVAILABLE))
            }
            _ => false,
        }
    }

    /// The client's deadline ended the call, not etcd.
    pub fn cut_short(&self) -> bool {
        matches!(self, EtcdError::CutShort { .. })
    }

    /// etcd says the lease does not exist (any more).
    pub fn is_lease_not_found(&self) -> bool {
        matches!(self, EtcdError::LeaseNotFound { .. })
    }
}

pub type Result<T> = std::result::Result<T, EtcdError>;

/// At most this many characters of an answer are shown in an error.
const EXCERPT: usize = 200;

/// The start of a body, on one line, for messages.
pub(crate) fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let one_line = text.trim().replace(['\n', '\r'], " ");
    match one_line.char_indices().nth(EXCERPT) {
        Some((cut, _)) => format!("{}…", &one_line[..cut]),
        None => one_line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(http_status: u16, grpc_code: i32, message: &str) -> EtcdError {
        EtcdError::Status {
            what: "transaction".into(),
            endpoint: "http://127.0.0.1:2379".into(),
            http_status,
            grpc_code,
            message: message.into(),
        }
    }

    #[test]
    fn too_many_requests_is_asked_again_and_a_refusal_is_not() {
        assert!(status(429, 8, "etcdserver: too many requests").is_retryable());
        assert!(status(503, 14, "etcdserver: no leader").is_retryable());
        assert!(!status(400, 3, "etcdserver: key is not provided").is_retryable());
        assert!(!status(404, 5, "etcdserver: requested lease not found").is_retryable());
    }
}
