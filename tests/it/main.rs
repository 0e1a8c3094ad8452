//! conlock's integration tests (one test binary).

mod common;
mod devserver;
