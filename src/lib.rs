//! conlock: run a command while holding a Consul lock or semaphore slot.
//!
//! Layers, each using only those below it (`scripts/check-layers.py` enforces it):
//! `cli` (clap) → `app` (validation and wiring) → `ops` (status, watch, break) and
//! `hold` (session, supervision, guardian: the life cycle of a held claim) → `claim`
//! (the store seam `claim::Store`; lock, semaphore, waiting, describing holders) →
//! `consul` (client, wire types); `etcd` (the etcd v3 client) stands beside `consul` in
//! the same layer. Only `claim`, `app` and `error` name `consul` or `etcd`.
//! `devserver` stands apart; `ui`, `events`, `error`, `clock`, `duration`, `gostd` and
//! `readfile` are leaves. See docs/architecture.md.

pub mod app;
pub mod claim;
pub mod cli;
pub mod clock;
pub mod consul;
pub mod devserver;
pub mod duration;
pub mod error;
pub mod etcd;
pub mod events;
pub mod gostd;
pub mod hold;
pub mod ops;
pub mod readfile;
pub mod resolve;
pub mod ui;
