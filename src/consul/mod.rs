//! Consul HTTP client and wire types.

pub mod client;
pub mod config;
pub mod types;

pub use client::{next_index, Client, ConsulError, PutOptions, QueryOptions};
pub use config::{ConfigError, ConnConfig, ConnFlags};
pub use types::{KvPair, QueryMeta, SessionEntry, SessionRequest};

/// Flags of a `consul lock` / api.Lock key.
pub const LOCK_FLAGS: u64 = 0x2ddc_cbc0_58a5_0c18;
/// Flags of `consul lock -n` / api.Semaphore keys.
pub const SEMAPHORE_FLAGS: u64 = 0xe0f6_9a2b_aa41_4de0;
