//! The one integration test binary: shared helpers plus one module per area.

mod bench;
mod client;
mod common;
mod devserver;
mod devserver_faults;
mod edges;
mod etcd_client;
mod etcd_harness;
mod faults;
mod guardian;
mod harness;
mod liveness;
mod ops;
mod peers;
mod process;
mod prop;
mod real;
mod real_agent;
mod real_cluster;
mod review;
mod run;
mod safety;
mod schema;
mod sem;
mod tls;
mod wire;
