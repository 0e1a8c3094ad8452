//! Every /proc read of a hold, and the one answer to "is it still running?": for a
//! process, a process group and the command's escaped descendants this module says
//! alive, gone, or cannot tell, and every caller treats "cannot tell" as alive. The rest
//! of `hold` (supervise, Ctrl-Z, the guardian) reads no /proc file itself.
//!
//! Three rules (docs/safety.md, *Which processes count as gone*):
//!
//! - A process is dead only when it is a zombie with no thread left. A process whose
//!   main thread ended (`pthread_exit`, `SYS_exit`) shows `Z` in its stat while its
//!   other threads run: its `Threads:` count is above 1 (a true zombie shows 1, itself).
//! - /proc that cannot be read answers "cannot tell", never "gone".
//! - /proc of another PID namespace (`unshare --pid` without a fresh /proc) shows other
//!   processes under conlock's numbers: every scan checks first that /proc is this
//!   namespace's, and answers "cannot tell" if not.

use std::collections::HashSet;

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// What /proc (with `kill(…, 0)`) says about a process, a group, or the escapees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    Alive,
    Gone,
    /// /proc is missing, unreadable, of another PID namespace, or hides what matters.
    /// Callers treat it as alive.
    CannotTell,
}

impl Liveness {
    /// Alive, or cannot tell: what every caller acts on.
    pub fn maybe_alive(self) -> bool {
        self != Liveness::Gone
    }
}

/// Whether conlock can see the processes it must account for: /proc is mounted,
/// readable and this PID namespace's. `Err` says why not and what to mount. Checked
/// before a hold starts anything: a command whose leftovers cannot be seen is not run.
pub fn check_view() -> Result<(), String> {
    const MOUNT: &str = "conlock must see every process the command leaves behind before it releases; mount this PID namespace's /proc (`mount -t proc proc /proc`; with `unshare --pid --fork`, add `--mount-proc`)";
    let me = std::process::id();
    let link = match std::fs::read_link("/proc/self") {
        Ok(l) => l,
        Err(e) => {
            return Err(format!(
                "cannot read /proc/self ({e}): /proc is not mounted or not readable; {MOUNT}"
            ))
        }
    };
    if link.to_str() != Some(me.to_string().as_str()) {
        return Err(format!(
            "/proc belongs to another PID namespace (/proc/self is {}, conlock is pid {me}); {MOUNT}",
            link.display()
        ));
    }
    // Its pid in each namespace from /proc's down to ours: one entry when they are the
    // same namespace (kernels before 4.1 have no NSpid line).
    if let Some(status) = read_proc("/proc/self/status") {
        let text = String::from_utf8_lossy(&status);
        if let Some(ns) = text.lines().find_map(|l| l.strip_prefix("NSpid:")) {
            if ns.split_whitespace().count() > 1 {
                return Err(format!(
                    "/proc belongs to an outer PID namespace (NSpid:{ns}); {MOUNT}"
                ));
            }
        }
    }
    if let Err(e) = std::fs::read_dir("/proc") {
        return Err(format!("cannot list /proc ({e}); {MOUNT}"));
    }
    if read_proc(&format!("/proc/{me}/stat")).is_none() {
        return Err(format!("cannot read /proc/{me}/stat; {MOUNT}"));
    }
    Ok(())
}

/// True when /proc is readable and this PID namespace's: checked before every scan
/// (one readlink), so that a /proc unmounted or replaced meanwhile answers nothing.
fn ours() -> bool {
    #[cfg(test)]
    if tests::blind() {
        return false;
    }
    std::fs::read_link("/proc/self")
        .is_ok_and(|l| l.to_str() == Some(std::process::id().to_string().as_str()))
}

/// Fields of /proc/<pid>/stat.
#[derive(Debug, Clone, Copy)]
pub(super) struct Stat {
    pub(super) state: u8,
    pub(super) ppid: i32,
    pub(super) pgrp: i32,
    pub(super) session: i32,
    pub(super) start: u64,
}

/// /proc/<pid>/stat; the command name may contain spaces, parentheses and bytes that
/// are not UTF-8 (it comes from a file name). None if it cannot be read.
pub(super) fn stat(pid: i32) -> Option<Stat> {
    #[cfg(test)]
    if tests::hidden(pid) {
        return None;
    }
    parse_stat(&read_proc(&format!("/proc/{pid}/stat"))?)
}

fn parse_stat(text: &[u8]) -> Option<Stat> {
    let after_name = text.iter().rposition(|&b| b == b')')? + 1;
    let rest = std::str::from_utf8(&text[after_name..]).ok()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) session(6) … starttime(22).
    Some(Stat {
        state: *f.first()?.as_bytes().first()?,
        ppid: f.get(1)?.parse().ok()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start: f.get(19)?.parse().ok()?,
    })
}

/// Whether process `pid`, whose stat read `st`, is dead: a zombie (or being reaped) with
/// no thread left. A `Z` whose thread count cannot be read is not proven dead.
fn dead(pid: i32, st: &Stat) -> bool {
    if !matches!(st.state, b'Z' | b'X') {
        return false;
    }
    #[cfg(test)]
    if let Some(n) = tests::threads_override(pid) {
        return n == 1;
    }
    // State and thread count from one read: a thread's exec between two reads shows the
    // old leader's Z beside the new image's single thread.
    let Some(status) = read_proc(&format!("/proc/{pid}/status")) else {
        return false;
    };
    let state = String::from_utf8_lossy(&status)
        .lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|s| s.trim().bytes().next());
    // 1, its leader: a true zombie. 0 is also read while an old leader is released
    // during an exec from another thread; a zombie being reaped is gone at the next look.
    matches!(state, Some(b'Z' | b'X')) && threads_in(&status) == Some(1)
}

/// The `Threads:` count of a /proc/<pid>/status: the thread-group leader counts until it
/// is reaped, so a true zombie shows 1 (0 while it is being reaped).
fn threads_in(status: &[u8]) -> Option<u32> {
    String::from_utf8_lossy(status)
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))?
        .trim()
        .parse()
        .ok()
}

/// A small /proc file, read whole in 1 KiB reads: a stat for a size hint (procfs reports
/// 0) and a buffer grown from 32 bytes, a read each, as `fs::read` does, cost more.
fn read_proc(path: &str) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).ok()?;
    let (mut buf, mut chunk) = (Vec::new(), [0u8; 1024]);
    loop {
        match file.read(&mut chunk) {
            Ok(0) => return Some(buf),
            Ok(n) => {
                #[cfg(test)]
                tests::between_reads(path, buf.len());
                buf.extend_from_slice(&chunk[..n])
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
}

/// True if this process has exactly one thread (then fork leaves no lock held).
pub(super) fn single_threaded() -> bool {
    // The link count of /proc/self/task is 2 plus the number of threads: one stat
    // instead of reading /proc/self/status.
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/task").is_ok_and(|m| m.nlink() == 3)
}

// ---- process groups

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

/// Is a process group gone? `kill(-pgid, 0)` alone is wrong both ways: it succeeds while
/// members are zombies nobody reaps (a container whose PID 1 never waits), and it fails
/// with EPERM for a live member we may not signal (a setuid program). So a group is gone
/// when `kill` says ESRCH, or when /proc lists members and every one is dead.
/// `members`: whether each member /proc shows is dead (`dead`), `None` when /proc cannot
/// be read or is not this PID namespace's.
pub fn group_given(probe: Probe, members: Option<&[bool]>) -> Liveness {
    match (probe, members) {
        (Probe::NoGroup, _) => Liveness::Gone,
        // An empty list while the kernel still knows the group means /proc does not
        // show it (hidden, or another namespace).
        (_, None) => Liveness::CannotTell,
        (_, Some([])) => Liveness::CannotTell,
        (_, Some(m)) if m.iter().all(|&d| d) => Liveness::Gone,
        (_, Some(_)) => Liveness::Alive,
    }
}

/// Whether any process of group `pgid` is alive.
pub fn group(pgid: i32) -> Liveness {
    if pgid <= 1 {
        return Liveness::CannotTell;
    }
    let probe = probe(pgid);
    if probe == Probe::NoGroup {
        return Liveness::Gone;
    }
    group_given(probe, members_dead(pgid).as_deref())
}

/// How many processes of group `pgid` are alive (by the same rule as `group`); `None`
/// when /proc cannot tell.
pub fn live_members(pgid: i32) -> Option<usize> {
    Some(members_dead(pgid)?.iter().filter(|&&d| !d).count())
}

/// True when no process, not even a zombie, has `pgid` as its group: from then on the ID
/// may be reused, and no process can join that group any more. Needs no /proc.
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

/// For every process in group `pgid` that /proc shows, whether it is dead.
fn members_dead(pgid: i32) -> Option<Vec<bool>> {
    let mut out = Vec::new();
    for (pid, st) in all_processes()? {
        if st.pgrp == pgid {
            out.push(dead(pid, &st));
        }
    }
    Some(out)
}

/// Every process /proc shows, with its stat; None if /proc is not ours or cannot be
/// listed. A process that ended between the listing and its stat is left out.
fn all_processes() -> Option<Vec<(i32, Stat)>> {
    if !ours() {
        return None;
    }
    let dir = std::fs::read_dir("/proc").ok()?;
    let mut pids: Vec<i32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .collect();
    pids.sort_unstable();
    Some(
        pids.into_iter()
            .filter_map(|pid| Some((pid, stat(pid)?)))
            .collect(),
    )
}

// ---- descendants

/// Every live descendant of `root`, leaving out the subtrees of `skip`; None: cannot
/// tell (/proc is not ours or cannot be read).
pub(super) fn descendants(root: i32, skip: &[i32]) -> Option<Vec<(i32, Stat)>> {
    let all = all_processes()?;
    let mut out = Vec::new();
    let mut parents = vec![root];
    while let Some(parent) = parents.pop() {
        for (pid, st) in &all {
            if st.ppid == parent && !skip.contains(pid) && *pid != root {
                parents.push(*pid);
                if !dead(*pid, st) {
                    out.push((*pid, *st));
                }
            }
        }
    }
    Some(out)
}

/// Whether `pid` is still the process that started at `start` (and /proc is ours).
pub(super) fn is_process(pid: i32, start: u64) -> bool {
    ours() && stat(pid).is_some_and(|st| st.start == start)
}

/// Signals `pid` only if it is still the process that started at `start` (a reused pid
/// is left alone; the window between the check and the signal is a few microseconds).
pub(super) fn signal_if_same(pid: i32, start: u64, sig: i32) {
    if is_process(pid, start) {
        unsafe { libc::kill(pid, sig) };
    }
}

// ---- conlock's adopted children (the escapees)

/// A process re-parented to conlock.
pub(super) struct Proc {
    pub(super) pid: i32,
    /// Start time in clock ticks since boot: with the pid, an identity that survives reuse.
    pub(super) start: u64,
}

/// The start time of a process whose stat cannot be read: matches no real one.
pub(super) const UNREADABLE: u64 = u64::MAX;

impl Proc {
    /// Signals the process only if it is still this process and still ours and alive:
    /// through a pidfd, so that a pid reaped and reused in between is never hit. One
    /// whose stat cannot be read (hidepid) is checked through the pidfd alone: still
    /// conlock's child, not exited. Returns whether the signal was sent.
    pub(super) fn signal(&self, sig: Signal) -> bool {
        if !ours() {
            return false;
        }
        let me = std::process::id() as i32;
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, self.pid, 0) } as i32;
        let still_ours = || {
            if self.start == UNREADABLE {
                return fd >= 0 && unexited_child(fd);
            }
            stat(self.pid)
                .is_some_and(|st| st.ppid == me && st.start == self.start && !dead(self.pid, &st))
        };
        if fd < 0 {
            // Kernels before 5.3: a narrow race with the signal thread's reaping remains.
            return still_ours() && kill(Pid::from_raw(self.pid), sig).is_ok();
        }
        let sent = still_ours()
            && unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd,
                    sig as i32,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                )
            } == 0;
        unsafe { libc::close(fd) };
        sent
    }
}

/// True if the process behind `pidfd` is conlock's child and has not exited: `waitid`
/// answers ECHILD for another's process, and reports an exit without reaping it.
fn unexited_child(pidfd: i32) -> bool {
    const P_PIDFD: libc::idtype_t = 3;
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let r = unsafe {
        libc::waitid(
            P_PIDFD,
            pidfd as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    r == 0 && unsafe { info.si_pid() } == 0
}

/// True unless no process has this pid (a zombie exists; EPERM means it exists).
fn exists(pid: i32) -> bool {
    !matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH))
}

/// The pids in /proc/self/task/<tid>/children. The kernel resumes each step of a listing
/// from a position (or from the child shown last, if that is still a child): a child
/// reaped meanwhile shifts the rest, and the live child after it is not shown. So a
/// listing counts once two in a row are the same: the reaped child, shown in the first,
/// is missing from the second. If they never settle (children come and go as fast as
/// they are listed), every pid that any of the listings showed, and false: a live child
/// is missed by a listing only if an entry before it is reaped during that listing, and
/// each entry is reaped once, but that is not proof; the caller reads again.
fn children_of(tid: u32) -> Option<(Vec<i32>, bool)> {
    let path = format!("/proc/self/task/{tid}/children");
    let pids = |text: &[u8]| -> Vec<i32> {
        String::from_utf8_lossy(text)
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
            .collect()
    };
    let mut last = read_proc(&path)?;
    let mut seen: HashSet<i32> = HashSet::new();
    for _ in 0..16 {
        let again = read_proc(&path)?;
        if again == last {
            return Some((pids(&again), true));
        }
        seen.extend(pids(&last));
        last = again;
    }
    seen.extend(pids(&last));
    Some((seen.into_iter().collect(), false))
}

/// conlock's live children outside process group `pgid` and not in `prior`; None:
/// cannot tell (/proc is not ours or cannot be read). /proc lists only thread-group
/// leaders, so conlock's own threads never show up.
pub(super) fn adopted_children(prior: &[(i32, u64)], pgid: i32) -> Option<Vec<Proc>> {
    if !ours() {
        return None;
    }
    let me = std::process::id() as i32;
    // A child that dies between the read of the children lists and the read of its stat
    // hands its own children to us in that gap, and they are in neither read: so while a
    // pass finds a child newly dead (zombie or gone), read the lists again. Once it shows
    // dead, its children are already on our lists.
    let mut dead_seen: Vec<i32> = Vec::new();
    let mut found = Vec::new();
    for _ in 0..64 {
        let Some((candidates, settled)) = own_children() else {
            return adopted_from_proc_scan(prior, pgid);
        };
        // Listings that never settled are read again, as after a death.
        let mut newly_dead = !settled;
        found.clear();
        for pid in candidates {
            match stat(pid) {
                Some(st) if !dead(pid, &st) => {
                    let ours = st.ppid == me && st.pgrp != pgid;
                    if ours && !prior.contains(&(pid, st.start)) {
                        found.push(Proc {
                            pid,
                            start: st.start,
                        });
                    }
                }
                // Listed but unreadable: /proc hides it (mounted with hidepid, and it runs
                // as another user or is not dumpable, as ssh-agent), or the read failed.
                // Alive, it counts. `Proc::signal` checks it through a pidfd alone; where
                // that cannot be done, it survives, and conlock keeps the claim until it
                // is gone.
                None if exists(pid) => {
                    // getpgid needs no /proc: a member of the command's group is the
                    // group's (and keeps it alive), not an escapee.
                    let escaped = unsafe { libc::getpgid(pid) } != pgid;
                    if escaped && !prior.iter().any(|&(p, _)| p == pid) {
                        found.push(Proc {
                            pid,
                            start: UNREADABLE,
                        });
                    }
                }
                _ if !dead_seen.contains(&pid) => {
                    dead_seen.push(pid);
                    newly_dead = true;
                }
                _ => {}
            }
        }
        if !newly_dead {
            return Some(found);
        }
    }
    // Children die faster than they are read: what the last pass found, and what a scan
    // of every process finds (it cannot see one that /proc hides).
    for p in adopted_from_proc_scan(prior, pgid)? {
        if !found.iter().any(|f| (f.pid, f.start) == (p.pid, p.start)) {
            found.push(p);
        }
    }
    Some(found)
}

/// `adopted_children` where /proc/self/task/*/children is missing: every process is read.
/// A grandchild read before its parent dies (pids wrap, so it may come first) is
/// re-parented to conlock after it was read: the scan is repeated until two in a row
/// find the same.
fn adopted_from_proc_scan(prior: &[(i32, u64)], pgid: i32) -> Option<Vec<Proc>> {
    let key =
        |procs: &[Proc]| -> Vec<(i32, u64)> { procs.iter().map(|p| (p.pid, p.start)).collect() };
    let mut last = proc_scan_once(prior, pgid)?;
    for _ in 0..8 {
        let again = proc_scan_once(prior, pgid)?;
        if key(&again) == key(&last) {
            break;
        }
        last = again;
    }
    Some(last)
}

fn proc_scan_once(prior: &[(i32, u64)], pgid: i32) -> Option<Vec<Proc>> {
    let me = std::process::id() as i32;
    Some(
        all_processes()?
            .into_iter()
            .filter_map(|(pid, st)| {
                let ours = st.ppid == me && !dead(pid, &st) && st.pgrp != pgid;
                (ours && !prior.contains(&(pid, st.start))).then_some(Proc {
                    pid,
                    start: st.start,
                })
            })
            .collect(),
    )
}

/// conlock's children from before the command, as (pid, start time), from the same
/// lists as `own_children`.
pub(super) fn prior_children() -> Vec<(i32, u64)> {
    match own_children() {
        // One that cannot be read is known by its pid alone (see `adopted_children`).
        Some((pids, _)) => pids
            .into_iter()
            .map(|pid| (pid, stat(pid).map_or(UNREADABLE, |st| st.start)))
            .collect(),
        None => adopted_children(&[], 0)
            .unwrap_or_default()
            .into_iter()
            .map(|p| (p.pid, p.start))
            .collect(),
    }
}

/// conlock's children that can matter here, from /proc/self/task/<tid>/children: those of
/// the calling thread (the one that spawned the command) and those of the leader (the
/// first live thread, which gets every orphan re-parented to conlock, and the children of
/// an exiting thread). No other thread forks, so two lists at most (one in conlock, where
/// the leader supervises) instead of one per thread. None where the kernel lacks the file
/// (CONFIG_PROC_CHILDREN); the caller then scans /proc.
/// With it, whether the listings settled (see `children_of`).
fn own_children() -> Option<(Vec<i32>, bool)> {
    let leader = std::process::id();
    let me = unsafe { libc::gettid() } as u32;
    let (mut pids, mut settled) = (Vec::new(), true);
    if me != leader {
        let (mine, ok) = children_of(me)?;
        pids.extend(mine);
        settled &= ok;
    }
    // The leader last, so that a child handed to it by an exiting thread meanwhile is read.
    let (leaders, ok) = children_of(leader)?;
    pids.extend(leaders);
    Some((pids, settled && ok))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::CommandExt;
    use std::path::PathBuf;
    use std::process::Command;
    use std::time::Duration;

    /// `adopted_children` where /proc can be read.
    fn adopted(prior: &[(i32, u64)], pgid: i32) -> Vec<Proc> {
        adopted_children(prior, pgid).expect("/proc is readable here")
    }

    /// `group_given` as the old yes/no: gone or not.
    fn given(probe: Probe, states: Option<&[u8]>) -> bool {
        // Letters as /proc shows them; a `Z` here has no thread left.
        let dead: Option<Vec<bool>> =
            states.map(|s| s.iter().map(|&c| c == b'Z' || c == b'X').collect());
        group_given(probe, dead.as_deref()) == Liveness::Gone
    }

    thread_local! {
        /// Makes /proc read as another namespace's (`ours` false), on the thread that set it.
        static BLIND: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
        /// A pid whose `Threads:` count reads as this, on the thread that set it.
        static THREADS: std::cell::Cell<(i32, u32)> = const { std::cell::Cell::new((0, 0)) };
    }

    pub(super) fn blind() -> bool {
        BLIND.with(|b| b.get())
    }

    pub(super) fn threads_override(pid: i32) -> Option<u32> {
        THREADS.with(|t| {
            let (p, n) = t.get();
            (p == pid).then_some(n)
        })
    }

    /// `sleep 30` in a process group of its own.
    fn sleeper() -> std::process::Child {
        Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap()
    }

    /// `sleeper()` run through a symlink called `name` (the process's name), and the
    /// folder to remove after.
    fn sleeper_named(tag: &str, name: &std::ffi::OsStr) -> (std::process::Child, PathBuf) {
        let dir = std::env::temp_dir().join(format!("conlock-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let link = dir.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink("/bin/sleep", &link).unwrap();
        // argv[0] "sleep", for a multi-call sleep (busybox); the name comes from the file.
        let child = Command::new(&link)
            .arg0("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        (child, dir)
    }

    type ReadHook = Box<dyn FnMut(&str, usize)>;

    thread_local! {
        /// Runs after each read of a /proc file (its path, the bytes read before it), on
        /// the thread that set it.
        static BETWEEN_READS: std::cell::RefCell<Option<ReadHook>> =
            const { std::cell::RefCell::new(None) };
    }

    thread_local! {
        /// A pid whose stat reads as hidden (as /proc mounted with hidepid shows another
        /// user's process), on the thread that set it.
        static HIDDEN: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
    }

    pub(super) fn hidden(pid: i32) -> bool {
        HIDDEN.with(|h| h.get() == pid)
    }

    /// A child conlock cannot read (hidepid, another user's) read as gone: released while
    /// it ran. Found by review. It counts as alive now (see the pidfd test for its signal).
    #[test]
    fn a_child_whose_stat_is_hidden_counts_as_alive() {
        let mut c = sleeper();
        let pid = c.id() as i32;
        HIDDEN.with(|h| h.set(pid));
        let found: Vec<(i32, u64)> = adopted(&[], 0).iter().map(|p| (p.pid, p.start)).collect();
        // Known from before the command: not counted.
        let prior = prior_children();
        let after_prior = adopted(&prior, 0).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        let gone = adopted(&[], 0).iter().any(|p| p.pid == pid);
        HIDDEN.with(|h| h.set(0));
        assert!(found.contains(&(pid, UNREADABLE)), "{found:?}");
        assert!(!after_prior);
        assert!(!gone, "a reaped child still counted");
    }

    pub(super) fn between_reads(path: &str, before: usize) {
        BETWEEN_READS.with(|hook| {
            if let Some(run) = hook.borrow_mut().as_mut() {
                run(path, before)
            }
        });
    }

    /// The kernel resumes a children list from a position: a child reaped between two
    /// reads shifted the rest, and the live child after the gap was never shown. A zombie
    /// already seen in an earlier pass and reaped in the middle of the next listing was
    /// not a new death, so nothing read the list again. Found by review: conlock could
    /// release while that child ran.
    #[test]
    fn a_child_reaped_during_a_listing_does_not_hide_another() {
        let zombie = Command::new("true").spawn().unwrap().id() as i32;
        // Enough children after it that a listing takes more than one read.
        let mut live: Vec<_> = (0..250)
            .map(|_| Command::new("sleep").arg("30").spawn().unwrap())
            .collect();
        let exited = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            stat(zombie).is_some_and(|st| st.state == b'Z')
        });
        // The zombie is seen in the first listing of this thread's children; it is reaped
        // after the first read of the second.
        let ours = format!("/proc/self/task/{}/children", unsafe { libc::gettid() });
        let reaped = std::rc::Rc::new(std::cell::Cell::new(false));
        let (mut listings, flag) = (0, reaped.clone());
        BETWEEN_READS.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move |path: &str, before: usize| {
                if path == ours && before == 0 {
                    listings += 1;
                    if listings == 2 && !flag.get() {
                        let r = unsafe { libc::waitpid(zombie, std::ptr::null_mut(), 0) };
                        flag.set(r == zombie);
                    }
                }
            }))
        });
        let found: Vec<i32> = adopted(&[], -1).iter().map(|p| p.pid).collect();
        BETWEEN_READS.with(|hook| *hook.borrow_mut() = None);
        let missing: Vec<i32> = live
            .iter()
            .map(|c| c.id() as i32)
            .filter(|pid| !found.contains(pid))
            .collect();
        for c in &mut live {
            let _ = c.kill();
            let _ = c.wait();
        }
        assert!(exited, "true never exited");
        assert!(reaped.get(), "the zombie was not reaped during a listing");
        assert_eq!(missing, Vec::<i32>::new(), "live children not listed");
    }

    /// Listings that never settle (a child added during each one) give every pid they
    /// showed; before, conlock fell back to a scan of /proc, which cannot see a process
    /// that /proc hides. Found by review.
    #[test]
    fn listings_that_never_settle_still_show_every_child() {
        let mut c = sleeper();
        let pid = c.id() as i32;
        HIDDEN.with(|h| h.set(pid));
        let ours = format!("/proc/self/task/{}/children", unsafe { libc::gettid() });
        let added = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let adding = added.clone();
        BETWEEN_READS.with(|hook| {
            *hook.borrow_mut() = Some(Box::new(move |path: &str, before: usize| {
                if path == ours && before == 0 {
                    adding.borrow_mut().push(sleeper());
                }
            }))
        });
        let (listed, settled) = children_of(unsafe { libc::gettid() } as u32).unwrap();
        let found = adopted(&[], -1).iter().any(|p| p.pid == pid);
        BETWEEN_READS.with(|hook| *hook.borrow_mut() = None);
        HIDDEN.with(|h| h.set(0));
        for k in added.borrow_mut().iter_mut().chain([&mut c]) {
            let _ = k.kill();
            let _ = k.wait();
        }
        assert!(listed.contains(&pid), "{pid} not in {listed:?}");
        assert!(!settled);
        assert!(found, "the hidden child {pid} was missed");
    }

    /// A child whose stat /proc hides (ssh-agent is not dumpable, so hidepid hides it even
    /// from its own user) was never signalled: conlock held the claim until something else
    /// ended it. Found by review. It is signalled through a pidfd now.
    #[test]
    fn a_child_whose_stat_is_hidden_is_signalled_through_a_pidfd() {
        let mut c = sleeper();
        let pid = c.id() as i32;
        HIDDEN.with(|h| h.set(pid));
        let hidden = Proc {
            pid,
            start: UNREADABLE,
        };
        let sent = hidden.signal(Signal::SIGKILL);
        let status = c.wait().unwrap();
        // Reaped: no longer a child of ours, so nothing is sent.
        let again = hidden.signal(Signal::SIGKILL);
        HIDDEN.with(|h| h.set(0));
        assert!(sent, "not sent");
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(libc::SIGKILL)
        );
        assert!(!again, "sent to a pid that is no longer ours");
    }

    #[test]
    fn reads_own_stat_and_finds_spawned_children() {
        let me = stat(std::process::id() as i32).expect("own stat");
        assert_eq!(me.pgrp, unsafe { libc::getpgrp() });
        assert_eq!(me.session, unsafe { libc::getsid(0) });
        assert!(me.start > 0);
        let before: Vec<(i32, u64)> = adopted(&[], 0)
            .into_iter()
            .map(|p| (p.pid, p.start))
            .collect();
        // A name with spaces and parentheses must not shift the fields.
        let (mut c, dir) = sleeper_named("stat", "a) b (c".as_ref());
        let pid = c.id() as i32;
        let found = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            adopted(&before, 0).iter().any(|p| p.pid == pid)
        });
        // Excluded as part of its own group, or as known before.
        let in_group = adopted(&before, pid).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(found, "child {pid} not listed");
        assert!(!in_group);
        assert!(!adopted(&before, 0).iter().any(|p| p.pid == pid));
    }

    /// A command may be named by any bytes, and its escapees too: one whose name is not
    /// UTF-8 read as "gone", so it was neither stopped nor waited for.
    #[test]
    fn a_child_named_with_bytes_that_are_not_utf8_is_listed() {
        use std::os::unix::ffi::OsStrExt;
        let (mut c, dir) = sleeper_named("utf8", std::ffi::OsStr::from_bytes(b"sl\xffe) p"));
        let pid = c.id() as i32;
        // Listed once its exec has set the name.
        let name_set = (0..500).any(|_| {
            std::thread::sleep(Duration::from_millis(10));
            std::fs::read(format!("/proc/{pid}/stat")).is_ok_and(|t| t.contains(&0xff))
        });
        let st = stat(pid);
        let adopted = adopted(&[], 0).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(name_set, "the exec never set the name");
        assert_eq!(
            st.map(|s| (s.ppid, s.pgrp)),
            Some((std::process::id() as i32, pid))
        );
        assert!(adopted, "child {pid} not listed");
    }

    /// A child that exits while we list our children hands its own child to us (we are a
    /// subreaper, as conlock is): every listing must show one or the other. Found by
    /// review: the grandchild slipped through the gap between the children lists and the
    /// child's stat, and conlock released while it ran.
    #[test]
    fn a_dying_childs_child_is_never_missed() {
        use std::io::Read;
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        let mut misses = 0;
        for _ in 0..150 {
            let mut p = Command::new("sh")
                .args(["-c", "sleep 30 & echo $!; exec sleep 0.002"])
                .process_group(0)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            let mut line = String::new();
            let mut out = p.stdout.take().unwrap();
            let mut byte = [0u8; 1];
            while out.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
                line.push(byte[0] as char);
            }
            let (pp, e) = (p.id() as i32, line.trim().parse::<i32>().unwrap());
            loop {
                let listed = adopted(&[], -1);
                let has = |x: i32| listed.iter().any(|c| c.pid == x);
                if has(e) {
                    break;
                }
                if !has(pp) {
                    misses += 1;
                    break;
                }
            }
            unsafe { libc::kill(e, libc::SIGKILL) };
            let _ = p.wait();
            unsafe { libc::waitpid(e, std::ptr::null_mut(), 0) };
        }
        assert_eq!(
            misses, 0,
            "listings that showed neither the child nor its child"
        );
    }

    #[test]
    fn own_children_lists_children_of_threads_that_exited() {
        // A child forked by a thread that then exits moves to another thread of ours.
        let mut c = std::thread::spawn(|| Command::new("sleep").arg("30").spawn().unwrap())
            .join()
            .unwrap();
        let pid = c.id() as i32;
        let listed = own_children().map(|(pids, _)| pids.contains(&pid));
        let adopted = adopted(&[], -1).iter().any(|p| p.pid == pid);
        let _ = c.kill();
        let _ = c.wait();
        assert_eq!(
            listed,
            Some(true),
            "/proc/self/task/*/children misses {pid}"
        );
        assert!(adopted);
    }

    #[test]
    fn eperm_is_alive_unless_proc_shows_only_zombies() {
        // A setuid member we may not signal: alive, whatever /proc could not tell.
        assert!(!given(Probe::Denied, None));
        assert!(!given(Probe::Denied, Some(b"S")));
        assert!(!given(Probe::Denied, Some(b"ZR")));
        assert!(!given(Probe::Denied, Some(b"")));
        assert!(given(Probe::Denied, Some(b"Z")));
    }

    #[test]
    fn zombies_are_dead_and_esrch_is_gone() {
        assert!(given(Probe::NoGroup, None));
        assert!(given(Probe::Signalled, Some(b"ZZX")));
        assert!(!given(Probe::Signalled, Some(b"ZD")));
        assert!(!given(Probe::Signalled, Some(b"T")));
        // The kernel knows the group but /proc shows none of it: not proven dead.
        assert!(!given(Probe::Signalled, Some(b"")));
        assert!(!given(Probe::Signalled, None));
    }

    #[test]
    fn stat_lines_with_odd_command_names() {
        let tail = "0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 987";
        let fields = |line: String| {
            parse_stat(line.as_bytes()).map(|s| (s.state, s.ppid, s.pgrp, s.session, s.start))
        };
        assert_eq!(
            fields(format!("42 (a) b (c)) Z 1 40 41 {tail}")),
            Some((b'Z', 1, 40, 41, 987))
        );
        assert_eq!(
            fields(format!("7 (sh) S 1 7 7 {tail}")),
            Some((b'S', 1, 7, 7, 987))
        );
        assert!(parse_stat(b"7 (sh) S 1 7 7 34816").is_none());
        assert!(parse_stat(b"garbage").is_none());
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
        assert_eq!(group(pgid), Liveness::Alive);
        unsafe { libc::kill(pgid, libc::SIGKILL) };
        // Not reaped yet: a zombie still in the group, which kill(-pgid, 0) sees.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while group(pgid) != Liveness::Gone {
            assert!(
                std::time::Instant::now() < until,
                "zombie group not seen as gone"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        assert_eq!(unsafe { libc::kill(-pgid, 0) }, 0, "reaped too early");
        child.wait().unwrap();
        assert_eq!(group(pgid), Liveness::Gone);
    }

    /// Blocks every signal in the calling thread and ends it with SYS_exit: in a process
    /// with another thread, its main thread then shows `Z` while that thread runs.
    extern "C" fn park(_: *mut libc::c_void) -> libc::c_int {
        loop {
            unsafe { libc::pause() };
        }
    }

    /// A process in a group of its own whose main thread ended (SYS_exit) while another
    /// thread runs. Returns its pid once /proc shows the main thread as `Z`.
    fn headless() -> i32 {
        let mut stack = vec![0u8; 64 * 1024];
        let top = unsafe { stack.as_mut_ptr().add(stack.len()) };
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe {
                libc::setpgid(0, 0);
                let flags = libc::CLONE_VM
                    | libc::CLONE_FS
                    | libc::CLONE_FILES
                    | libc::CLONE_SIGHAND
                    | libc::CLONE_THREAD
                    | libc::CLONE_SYSVSEM;
                if libc::clone(park, top.cast(), flags, std::ptr::null_mut()) < 0 {
                    libc::_exit(3);
                }
                libc::syscall(libc::SYS_exit, 0);
            }
            unreachable!();
        }
        unsafe { libc::setpgid(pid, pid) };
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !stat(pid).is_some_and(|st| st.state == b'Z') {
            assert!(std::time::Instant::now() < until, "main thread never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(stack);
        pid
    }

    fn threads(pid: i32) -> Option<u32> {
        threads_in(&read_proc(&format!("/proc/{pid}/status"))?)
    }

    /// A process whose main thread ended but whose other thread runs showed `Z` and was
    /// taken for dead: its group counted as gone, and conlock released while it ran. It is
    /// alive until its last thread is gone, and a true zombie (not yet reaped) is dead.
    #[test]
    fn a_zombie_main_thread_with_a_live_thread_is_alive() {
        let pid = headless();
        let st = stat(pid).unwrap();
        let alive = (
            threads(pid),
            dead(pid, &st),
            group(pid),
            descendants(std::process::id() as i32, &[])
                .unwrap()
                .iter()
                .any(|(p, _)| *p == pid),
        );
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while group(pid) != Liveness::Gone {
            assert!(
                std::time::Instant::now() < until,
                "a true zombie not seen as dead"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let zombie = (threads(pid), stat(pid).map(|st| dead(pid, &st)));
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
        assert_eq!(alive, (Some(2), false, Liveness::Alive, true));
        assert_eq!(zombie, (Some(1), Some(true)));
    }

    /// A `Z` whose thread count says other threads run is alive, wherever it is looked at.
    #[test]
    fn a_z_with_threads_left_keeps_its_group_and_its_escape_alive() {
        let mut c = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = c.id() as i32;
        let st = Stat {
            state: b'Z',
            ..stat(pid).unwrap()
        };
        THREADS.with(|t| t.set((pid, 3)));
        let with_threads = dead(pid, &st);
        THREADS.with(|t| t.set((pid, 1)));
        let without = dead(pid, &st);
        THREADS.with(|t| t.set((0, 0)));
        let _ = c.kill();
        let _ = c.wait();
        assert!(!with_threads);
        assert!(without);
        assert_eq!(threads_in(b"Name:\tx\nThreads:\t7\nX: 1\n"), Some(7));
        assert_eq!(threads_in(b"Name:\tx\n"), None);
    }

    /// /proc that is not this namespace's (or cannot be read) answers "cannot tell"
    /// everywhere, never "gone": before, an unreadable /proc meant no escapees, and a
    /// foreign one had conlock signal processes of its own namespace by the wrong pids.
    #[test]
    fn a_proc_that_is_not_ours_cannot_tell() {
        let mut c = Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = c.id() as i32;
        BLIND.with(|b| b.set(true));
        let seen = (
            group(pid),
            adopted_children(&[], 0).is_none(),
            descendants(std::process::id() as i32, &[]).is_none(),
            is_process(pid, 0),
            Proc {
                pid,
                start: UNREADABLE,
            }
            .signal(Signal::SIGKILL),
        );
        BLIND.with(|b| b.set(false));
        let alive = group(pid);
        let _ = c.kill();
        let _ = c.wait();
        assert_eq!(seen, (Liveness::CannotTell, true, true, false, false));
        assert_eq!(alive, Liveness::Alive);
        assert!(check_view().is_ok(), "{:?}", check_view());
    }
}
