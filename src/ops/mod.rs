//! Operator commands: `status`, `watch` and `break`. They share
//! `claim::inspect::inspect`, which reads a lock or a semaphore and describes its
//! holders, as neutral data.

pub mod brk;
pub mod status;
pub mod watch;

pub use crate::claim::describe::Holder;
pub use crate::claim::inspect::{inspect, LockDelayHint, Snapshot, Target};
