//! Which etcd servers have known lease bugs that matter to a lock (etcd-io/etcd
//! #15247, #20590, #17642), by the version `/version` reports.

/// `(major, minor, patch)` of a version like `3.4.23` (a suffix such as `-rc.0` ignored).
pub fn parse(v: &str) -> Option<(u32, u32, u32)> {
    let core = v.trim().trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let mut it = core.split('.').map(|p| p.parse::<u32>().ok());
    Some((it.next()??, it.next()??, it.next().flatten().unwrap_or(0)))
}

/// The first release of the server's line with every fix: 3.4.38 and 3.5.23; 3.6.0 had
/// them all.
fn fixed_in(major: u32, minor: u32) -> Option<(u32, u32, u32)> {
    match (major, minor) {
        (3, m) if m <= 4 => Some((3, 4, 38)),
        (3, 5) => Some((3, 5, 23)),
        _ => None,
    }
}

/// One line for a server older than the release that fixed its lease bugs (`None`: no
/// known bug, or a version conlock cannot read).
pub fn old_server_warning(server: &str) -> Option<String> {
    let (ma, mi, pa) = parse(server)?;
    let fixed = fixed_in(ma, mi)?;
    if (ma, mi, pa) >= fixed {
        return None;
    }
    Some(format!(
        "etcd {server} has known lease bugs, fixed in {}.{}.{}: a stuck old leader revoking leases that are kept alive (etcd #15247), a keepalive answering success right after a revoke (#20590), bogus time-to-live answers during a leader change (#17642); conlock confirms the lock with reads and never trusts time-to-live, but only fencing (CONLOCK_FENCING_TOKEN) guards against the first; upgrade etcd",
        fixed.0, fixed.1, fixed.2
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_servers_are_named() {
        assert_eq!(parse("3.4.23"), Some((3, 4, 23)));
        assert_eq!(parse("3.5.0-rc.1"), Some((3, 5, 0)));
        assert!(old_server_warning("3.4.23").unwrap().contains("3.4.38"));
        assert!(old_server_warning("3.4.37").is_some());
        assert!(old_server_warning("3.4.38").is_none());
        assert!(old_server_warning("3.5.22").unwrap().contains("3.5.23"));
        assert!(old_server_warning("3.5.23").is_none());
        assert!(old_server_warning("3.6.0").is_none());
        assert!(old_server_warning("garbage").is_none());
    }
}
