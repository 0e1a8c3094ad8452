//! Failures that end conlock, and the exit codes they map to.

use crate::consul::{ConfigError, ConsulError};
use crate::etcd::EtcdError;

pub mod exit {
    pub const BUSY: i32 = 75;
    /// The command ran longer than --max-time and was stopped.
    pub const MAX_TIME: i32 = 123;
    pub const LOST: i32 = 124;
    pub const INTERNAL: i32 = 125;
    pub const NOT_EXECUTABLE: i32 = 126;
    pub const NOT_FOUND: i32 = 127;
    /// stdout was closed before all was written (`| head -1`): what a shell shows for a
    /// process that SIGPIPE killed (128 + 13), without the error line.
    pub const CLOSED_STDOUT: i32 = 141;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The key exists but is not a lock/semaphore of ours, or its limit differs.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    NotExecutable(String),
    #[error(transparent)]
    Stdout(#[from] crate::ui::StdoutError),
    #[error("{0:#}")]
    Other(#[from] anyhow::Error),
}

impl Error {
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::NotFound(_) => exit::NOT_FOUND,
            Error::NotExecutable(_) => exit::NOT_EXECUTABLE,
            Error::Stdout(e) if e.is_closed_pipe() => exit::CLOSED_STDOUT,
            _ => exit::INTERNAL,
        }
    }
}

impl Error {
    /// Whether conlock ends without an error line: the reader of stdout went away.
    pub fn is_quiet(&self) -> bool {
        matches!(self, Error::Stdout(e) if e.is_closed_pipe())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

impl From<ConsulError> for Error {
    fn from(e: ConsulError) -> Error {
        Error::Store(e.into())
    }
}

impl From<EtcdError> for Error {
    fn from(e: EtcdError) -> Error {
        Error::Store(e.into())
    }
}

/// A failure of the store (`crate::claim::store::Store`), as the layers above the claims
/// see it: what they branch on, without the backend's wire types. Shown as the
/// backend's own message.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Consul(#[from] ConsulError),
    #[error(transparent)]
    Etcd(#[from] EtcdError),
}

impl StoreError {
    /// A failure that may pass: the network, a timeout, a server error that is not about
    /// the request itself.
    pub fn is_retryable(&self) -> bool {
        match self {
            StoreError::Consul(e) => e.is_retryable(),
            StoreError::Etcd(e) => e.is_retryable(),
        }
    }

    /// The client's own deadline ended the request, not the store.
    pub fn cut_short(&self) -> bool {
        match self {
            StoreError::Consul(e) => e.cut_short(),
            StoreError::Etcd(e) => e.cut_short(),
        }
    }

    /// The store answered with a server error (5xx: a leader election, for instance).
    pub fn is_server_error(&self) -> bool {
        match self {
            StoreError::Consul(e) => matches!(e, ConsulError::Server { .. }),
            StoreError::Etcd(e) => matches!(
                e,
                EtcdError::Status {
                    http_status: 500..,
                    ..
                }
            ),
        }
    }

    /// The store says the session (etcd: the lease) does not exist (any more).
    pub fn is_session_not_found(&self) -> bool {
        match self {
            StoreError::Consul(e) => e.is_invalid_session(),
            StoreError::Etcd(e) => e.is_lease_not_found(),
        }
    }
}
