//! Name resolution for the store clients' HTTP agents. ureq's default resolver starts a
//! thread for every request once a timeout is set, even for an IP literal and on a
//! pooled connection: several short threads per run, each unmapping its stack as it
//! ends (a TLB flush of the CPU running conlock). Addresses are nearly always literals
//! or `localhost`: those need no lookup; other names are looked up (bounded by the
//! timeout) and reused for `NAME_CACHE`, so DNS changes are still followed.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How long a looked-up host name is trusted before it is looked up again.
const NAME_CACHE: Duration = Duration::from_secs(30);

/// The looked-up names (`scheme://authority`) and their addresses, shared by the clones
/// of one client (its agents): one lookup serves them all.
#[derive(Debug, Default, Clone)]
pub struct NameCache {
    cached: Arc<Mutex<Vec<(String, Instant, ResolvedSocketAddrs)>>>,
}

impl NameCache {
    /// Whether `other` is a clone of this cache (one lookup serves both).
    pub fn is_shared_with(&self, other: &NameCache) -> bool {
        Arc::ptr_eq(&self.cached, &other.cached)
    }

    /// The addresses of `uri`'s host: without a lookup for a literal or `localhost`,
    /// else from the cache or a lookup.
    pub fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let lookup = DefaultResolver::default();
        let (Some(authority), Some(scheme)) = (uri.authority(), uri.scheme_str()) else {
            return lookup.resolve(uri, config, timeout);
        };
        let port = match (authority.port_u16(), scheme) {
            (Some(p), _) => p,
            (None, "https") => 443,
            (None, _) => 80,
        };
        if let Some(ips) = ips_without_lookup(authority.host()) {
            let mut out = lookup.empty();
            let family = config.ip_family();
            for addr in family.keep_wanted(ips.into_iter().map(|ip| SocketAddr::new(ip, port))) {
                out.push(addr);
            }
            return if out.is_empty() {
                Err(ureq::Error::HostNotFound)
            } else {
                Ok(out)
            };
        }
        let key = format!("{scheme}://{authority}");
        {
            let cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
            if let Some((_, _, addrs)) = cached
                .iter()
                .find(|(k, at, _)| *k == key && at.elapsed() < NAME_CACHE)
            {
                return Ok(addrs.clone());
            }
        }
        let addrs = lookup.resolve(uri, config, timeout)?;
        let mut cached = self.cached.lock().unwrap_or_else(|p| p.into_inner());
        cached.retain(|(k, _, _)| *k != key);
        cached.push((key, Instant::now(), addrs.clone()));
        Ok(addrs)
    }
}

/// The addresses of an IP literal (`[::1]` bracketed) or of `localhost` (RFC 6761: always
/// loopback); `None` for a name that needs a lookup.
fn ips_without_lookup(host: &str) -> Option<Vec<IpAddr>> {
    if host.eq_ignore_ascii_case("localhost") {
        return Some(vec![
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(Ipv6Addr::LOCALHOST),
        ]);
    }
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    bare.parse::<IpAddr>().ok().map(|ip| vec![ip])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_and_localhost_need_no_lookup() {
        let v4: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(ips_without_lookup("10.1.2.3"), Some(vec![v4]));
        assert_eq!(
            ips_without_lookup("[::1]"),
            Some(vec![IpAddr::V6(Ipv6Addr::LOCALHOST)])
        );
        assert_eq!(
            ips_without_lookup("LocalHost").unwrap()[0],
            IpAddr::V4(Ipv4Addr::LOCALHOST)
        );
        assert_eq!(ips_without_lookup("consul.service.consul"), None);
    }
}
