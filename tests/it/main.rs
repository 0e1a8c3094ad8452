//! The one integration test binary: shared helpers plus one module per area.

mod common;
mod harness;
mod run;
mod sem;
