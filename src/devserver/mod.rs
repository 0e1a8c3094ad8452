// Temporary stand-in with the agreed API; replaced by the real dev server at merge.
use std::net::SocketAddr;
use std::time::Duration;
pub struct Options {
    pub addr: SocketAddr,
    pub session_ttl_min: Duration,
    pub acl_token: Option<String>,
    pub node_name: String,
}
pub fn run_foreground(_opts: Options) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
