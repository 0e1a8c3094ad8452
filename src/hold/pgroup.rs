//! Is a process group gone? `kill(-pgid, 0)` alone is wrong both ways: it succeeds while
//! members are zombies nobody reaps (a container whose PID 1 never waits), and it fails
//! with EPERM for a live member we may not signal (a setuid program). So a group counts
//! as gone when `kill` says ESRCH, or when /proc lists members and every one is a zombie.

use std::io::Read;

/// What `kill(-pgid, 0)` answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// Some member could be signalled.
    Signalled,
    /// No such group (ESRCH).
    NoGroup,
    /// Members exist, but none we may signal (EPERM), or another error: unknown.
    Denied,
}

/// The decision, separated from the system calls so that it can be tested.
/// `members`: the states (the `stat` letter) of the processes /proc shows in the group,
/// `None` when /proc cannot be read or is not our PID namespace's.
pub fn gone_given(probe: Probe, members: Option<&[u8]>) -> bool {
    match probe {
        Probe::NoGroup => true,
        // Only a non-empty list of zombies proves death: an empty list while the kernel
        // still knows the group means /proc does not show it (another namespace).
        Probe::Signalled | Probe::Denied => {
            members.is_some_and(|m| !m.is_empty() && m.iter().all(|&s| s == b'Z' || s == b'X'))
        }
    }
}

/// True when no process of group `pgid` is alive (zombies are dead).
pub fn gone(pgid: i32) -> bool {
    if pgid <= 1 {
        return false;
    }
    let probe = probe(pgid);
    if probe == Probe::NoGroup {
        return true;
    }
    gone_given(probe, member_states(pgid).as_deref())
}

/// How many processes of group `pgid` are alive (zombies are dead); `None` when /proc
/// cannot tell (see `member_states`).
pub fn live_members(pgid: i32) -> Option<usize> {
    let states = member_states(pgid)?;
    Some(states.iter().filter(|&&s| s != b'Z' && s != b'X').count())
}

/// True when no process, not even a zombie, has `pgid` as its group: from then on the ID
/// may be reused, and no process can join that group any more.
pub fn no_such_group(pgid: i32) -> bool {
    pgid > 1 && probe(pgid) == Probe::NoGroup
}

fn probe(pgid: i32) -> Probe {
    if unsafe { libc::kill(-pgid, 0) } == 0 {
        return Probe::Signalled;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => Probe::NoGroup,
        _ => Probe::Denied,
    }
}

/// The state letters of every process in group `pgid`, from /proc.
fn member_states(pgid: i32) -> Option<Vec<u8>> {
    // /proc must be our PID namespace's, or its PIDs (and pgids) are not ours.
    let me = std::fs::read_link("/proc/self").ok()?;
    if me.to_str()? != std::process::id().to_string() {
        return None;
    }
    let mut states = Vec::new();
    let mut buf = Vec::with_capacity(512);
    for entry in std::fs::read_dir("/proc").ok()? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        buf.clear();
        // A process that ended meanwhile has no stat: it is not a member any more.
        let Ok(mut f) = std::fs::File::open(format!("/proc/{name}/stat")) else {
            continue;
        };
        if f.read_to_end(&mut buf).is_err() {
            continue;
        }
        if let Some((state, group)) = parse_stat(&buf) {
            if group == pgid {
                states.push(state);
            }
        }
    }
    Some(states)
}

/// State letter and process group from a `/proc/<pid>/stat` line. The command name may
/// contain spaces and parentheses, so fields are counted after the last `)`.
fn parse_stat(stat: &[u8]) -> Option<(u8, i32)> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&stat[close + 1..]).ok()?;
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let _ppid = fields.next()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((state, pgrp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eperm_is_alive_unless_proc_shows_only_zombies() {
        // A setuid member we may not signal: alive, whatever /proc could not tell.
        assert!(!gone_given(Probe::Denied, None));
        assert!(!gone_given(Probe::Denied, Some(b"S")));
        assert!(!gone_given(Probe::Denied, Some(b"ZR")));
        assert!(!gone_given(Probe::Denied, Some(b"")));
        assert!(gone_given(Probe::Denied, Some(b"Z")));
    }

    #[test]
    fn zombies_are_dead_and_esrch_is_gone() {
        assert!(gone_given(Probe::NoGroup, None));
        assert!(gone_given(Probe::Signalled, Some(b"ZZX")));
        assert!(!gone_given(Probe::Signalled, Some(b"ZD")));
        assert!(!gone_given(Probe::Signalled, Some(b"T")));
        // The kernel knows the group but /proc shows none of it: not proven dead.
        assert!(!gone_given(Probe::Signalled, Some(b"")));
        assert!(!gone_given(Probe::Signalled, None));
    }

    #[test]
    fn stat_lines_with_odd_command_names() {
        assert_eq!(
            parse_stat(b"42 (a) b (c)) Z 1 40 40 0 -1"),
            Some((b'Z', 40))
        );
        assert_eq!(parse_stat(b"7 (sh) S 1 7 7 34816"), Some((b'S', 7)));
        assert_eq!(parse_stat(b"garbage"), None);
    }

    #[test]
    fn a_zombie_group_is_gone_and_a_live_one_is_not() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        assert!(!gone(pgid));
        unsafe { libc::kill(pgid, libc::SIGKILL) };
        // Not reaped yet: a zombie still in the group, which kill(-pgid, 0) sees.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !gone(pgid) {
            assert!(
                std::time::Instant::now() < until,
                "zombie group not seen as gone"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(unsafe { libc::kill(-pgid, 0) }, 0, "reaped too early");
        child.wait().unwrap();
        assert!(gone(pgid));
    }
}
