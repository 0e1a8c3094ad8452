//! etcd v3 store client over etcd's JSON gRPC gateway (`POST /v3/...`): the second
//! store beside `consul`, for the etcd backend.

pub mod client;
pub mod config;
pub mod error;
pub mod types;
pub mod version;

pub use client::{EtcdClient, WatchStream};
pub use config::{EtcdConfig, EtcdConfigError, EtcdFlags};
pub use error::EtcdError;
pub use types::prefix_range_end;
