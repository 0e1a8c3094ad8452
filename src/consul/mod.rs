//! Consul HTTP client and wire types.

pub mod client;
pub mod config;
pub mod types;

pub use client::{next_index, retry_transient, Client, ConsulError, PutOptions, QueryOptions};
pub use config::{ConfigError, ConnConfig, ConnFlags};
pub use types::{KvPair, QueryMeta, SessionEntry, SessionRequest};

/// Consul applies at most 60 s of a session's lock-delay, whatever the session asked for
/// (recorded: `tests/fixtures/consul-1.0.8/11-lock-delay-cap.json`).
pub const CONSUL_MAX_LOCK_DELAY: std::time::Duration = std::time::Duration::from_secs(60);

/// Flags of a `consul lock` / api.Lock key.
pub const LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;
/// Flags of `consul lock -n` / api.Semaphore keys.
pub const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;
