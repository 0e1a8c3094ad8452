//! The guardian: a tiny process that outlives a conlock killed by SIGKILL or a crash, and
//! watches a conlock that is stuck. It is forked at the start of `main`, while conlock has
//! a single thread (so it runs ordinary Rust and costs no exec), or when the guardian is
//! started if conlock still has a single thread then. It learns over a pipe what conlock
//! holds:
//!
//! - The pipe closes without `Done` (conlock died): unless told `GroupGone`, it SIGKILLs
//!   the command's process group and waits until no member is alive (zombies are dead,
//!   members it may not signal are alive). Survivors: it keeps the session alive (renewing)
//!   until they are gone, so the lock does not pass to a new holder beside them. Then it
//!   releases the claim and destroys the session: the next holder starts at once.
//! - The deadline conlock sent (when the command must be dead) passes while the pipe is
//!   open and the command was not reported gone (conlock stopped or stuck): it SIGKILLs
//!   the group (unless reported gone) and every other descendant of conlock. It does not
//!   release: conlock is alive and does that itself.
//!
//! It never panics on output: messages go to stderr through one writer thread, written
//! with `libc::write` and errors ignored, so a closed or blocked stderr cannot stop it.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::procfs;
use crate::claim::{ClaimSpec, Store, StoreConfig};
use crate::clock::BootInstant;
use crate::ui;

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Conn(Box<StoreConfig>),
    /// The session ID and its TTL in milliseconds (for renewing it while survivors run).
    Session(String, u64),
    ProcessGroup(i32),
    Claim(ClaimSpec),
    /// conlock's children from before the command, as (pid, start time): not the
    /// command's, so the watchdog leaves them (and what they started) alone.
    Prior(Vec<(i32, u64)>),
    /// The moment (CLOCK_BOOTTIME, ns) by which the command's group must be dead.
    Deadline(u64),
    /// The command's group is gone: never signal that process group ID again.
    GroupGone,
    /// The whole command is gone (its group and what escaped from it): the watchdog has
    /// nothing left to stop, and the group's ID is never signalled again.
    CommandGone,
    Done,
}

/// The write end of a guardian forked at the start of `main`, or why it could not be.
static PREFORKED: Mutex<Option<std::result::Result<File, String>>> = Mutex::new(None);

/// Forks the guardian now if conlock has a single thread. Called first thing in `main`
/// for `run` and `sem`: then the copy is small and no lock can be held by another thread.
pub fn prefork() {
    *PREFORKED.lock().unwrap_or_else(|p| p.into_inner()) = Some(fork_guardian());
}

/// conlock's end of the pipe.
pub struct Guardian {
    pipe: Mutex<Option<File>>,
    /// The connection settings, until they go out with the first session: without a
    /// session the guardian has nothing to clean up, and one write wakes it once.
    conn: Mutex<Option<Vec<u8>>>,
    /// A deadline not written yet (0: none): sent with the next message.
    pending_deadline: AtomicU64,
    /// `GroupGone` (1) and `CommandGone` (2) not written yet: sent with the next message.
    pending_gone: AtomicU8,
    /// The claim was written: until then a deadline waits to go with it.
    claim_written: AtomicBool,
    /// The claim, to go with the first session (`claim_with_session`).
    early_claim: Mutex<Option<Vec<u8>>>,
}

const GROUP_GONE: u8 = 1;
const COMMAND_GONE: u8 = 2;

impl Guardian {
    /// Starts the guardian (or takes the one forked at start); `Err` says why that is
    /// impossible (the caller decides whether to run without it).
    pub fn start(conn: &StoreConfig) -> std::result::Result<Arc<Guardian>, String> {
        let preforked = PREFORKED.lock().unwrap_or_else(|p| p.into_inner()).take();
        let pipe = match preforked {
            Some(Ok(pipe)) => pipe,
            // Why the fork at start failed: forking now (with threads) would only hide it.
            Some(Err(why)) => return Err(why),
            None => fork_guardian()?,
        };
        // Never block a renewal on a guardian that does not read (it may be stopped).
        set_nonblocking(pipe.as_raw_fd());
        Ok(Arc::new(Guardian {
            pipe: Mutex::new(Some(pipe)),
            conn: Mutex::new(Some(line(&Msg::Conn(Box::new(conn.clone()))))),
            pending_deadline: AtomicU64::new(0),
            pending_gone: AtomicU8::new(0),
            claim_written: AtomicBool::new(false),
            early_claim: Mutex::new(None),
        }))
    }

    pub fn session(&self, id: &str, ttl: Duration) {
        let conn = self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
        let mut lines = conn.unwrap_or_default();
        lines.extend(line(&Msg::Session(id.to_string(), ttl.as_millis() as u64)));
        if let Some(claim) = self
            .early_claim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            lines.extend(claim);
        }
        self.send_lines(&lines);
    }

    /// The guardian learns the claim with the first session, in the same write, before
    /// anything is acquired: a take that lands while conlock is killed waiting for its
    /// answer is still released (etcd: its record would outlive the lease and cost
    /// conlock waiters a cushion). Its release is guarded: what is not ours stays.
    pub fn claim_with_session(&self, claim: ClaimSpec) {
        *self.early_claim.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(line(&Msg::Claim(claim)));
    }

    pub fn process_group(&self, pgid: i32) {
        self.send(&Msg::ProcessGroup(pgid));
    }

    /// What conlock holds, the children it had before the command and the deadline set
    /// so far, if any (one write, waiting for room).
    pub fn claim(&self, claim: ClaimSpec, prior: &[(i32, u64)]) {
        let mut lines = line(&Msg::Claim(claim));
        if !prior.is_empty() {
            lines.extend(line(&Msg::Prior(prior.to_vec())));
        }
        // Under the pipe's lock, so that no newer deadline the renew thread writes can go
        // before this one. From here on deadlines go out at once; one set meanwhile is
        // flushed after this write.
        let mut pipe = self.pipe.lock().unwrap_or_else(|p| p.into_inner());
        self.claim_written.store(true, Ordering::SeqCst);
        let ns = self.pending_deadline.swap(0, Ordering::SeqCst);
        if ns != 0 {
            lines.extend(line(&Msg::Deadline(ns)));
        }
        self.write_locked(&mut pipe, &lines);
    }

    /// The command must be dead by `at`. Never blocks: called by the renew thread. If the
    /// pipe is busy, the newest deadline goes out with the next message; before the claim
    /// is written, it goes with the claim.
    pub fn deadline(&self, at: BootInstant) {
        self.pending_deadline
            .store(at.as_nanos().max(1), Ordering::SeqCst);
        if !self.claim_written.load(Ordering::SeqCst) {
            return;
        }
        if let Ok(mut pipe) = self.pipe.try_lock() {
            self.flush_pending(&mut pipe);
        }
    }

    /// A copy of the pipe's write end (close-on-exec), for a writer of whole lines under
    /// PIPE_BUF that must not hold the pipe's lock (which would hold up the deadlines
    /// the renew thread sends). `None` if the guardian is gone.
    pub fn pipe_copy(&self) -> Option<std::os::fd::OwnedFd> {
        let pipe = self.pipe.lock().unwrap_or_else(|p| p.into_inner());
        pipe.as_ref()?.as_fd().try_clone_to_owned().ok()
    }

    /// Sends what is pending (a deadline the renew thread could not send, the group or
    /// command gone), if the pipe has room.
    pub fn flush(&self) {
        self.flush_pending(&mut self.pipe.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// The command's group is gone; from now on the guardian never signals its ID.
    /// Never blocks (it is sent while escaped processes are being stopped): if the pipe
    /// is full, it goes out with the next message.
    pub fn group_gone(&self) {
        self.gone(GROUP_GONE);
    }

    /// The whole command is gone (its group too); the watchdog is disarmed. Never
    /// blocks, like `group_gone`.
    pub fn command_gone(&self) {
        self.gone(COMMAND_GONE);
    }

    fn gone(&self, what: u8) {
        self.pending_gone.fetch_or(what, Ordering::SeqCst);
        self.flush_pending(&mut self.pipe.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Everything ended normally: the guardian exits without doing anything.
    pub fn done(&self) {
        // A pending deadline no longer matters; a pending `GroupGone`/`CommandGone` goes
        // before `Done` (see `send_lines`), or a guardian continued meanwhile could act
        // on its last deadline first.
        self.pending_deadline.store(0, Ordering::SeqCst);
        self.send(&Msg::Done);
        self.pipe.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn send(&self, msg: &Msg) {
        self.send_lines(&line(msg));
    }

    fn send_lines(&self, lines: &[u8]) {
        self.write_locked(
            &mut self.pipe.lock().unwrap_or_else(|p| p.into_inner()),
            lines,
        );
    }

    fn write_locked(&self, pipe: &mut Option<File>, lines: &[u8]) {
        // What is pending first, in the same (waiting) write.
        let mut all = self.take_pending_gone();
        all.extend_from_slice(lines);
        if let Some(p) = pipe.as_mut() {
            if write_all_waiting(p, &all).is_err() {
                gone_warning(pipe);
                return;
            }
        }
        self.flush_pending(pipe);
    }

    /// The pending `GroupGone`/`CommandGone` line, taken (empty if none).
    fn take_pending_gone(&self) -> Vec<u8> {
        gone_line(self.pending_gone.swap(0, Ordering::SeqCst))
    }

    /// Waits up to `within` for room for a pending `GroupGone`/`CommandGone` (a stopped
    /// guardian with a full pipe), so that it goes before the release.
    pub fn settle(&self, within: Duration) {
        let until = Instant::now() + within;
        loop {
            self.flush();
            if self.pending_gone.load(Ordering::SeqCst) == 0 || Instant::now() >= until {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Writes what is pending (the group or command gone, a deadline), without blocking:
    /// in one write of two short lines, under PIPE_BUF, so whole or not at all. What the
    /// pipe cannot take now stays pending.
    fn flush_pending(&self, pipe: &mut Option<File>) {
        let Some(p) = pipe.as_mut() else { return };
        let gone = self.pending_gone.swap(0, Ordering::SeqCst);
        let ns = self.pending_deadline.swap(0, Ordering::SeqCst);
        let mut lines = gone_line(gone);
        if ns != 0 {
            lines.extend(line(&Msg::Deadline(ns)));
        }
        if lines.is_empty() {
            return;
        }
        match p.write(&lines) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                self.pending_gone.fetch_or(gone, Ordering::SeqCst);
                // A newer deadline set meanwhile wins.
                let _ = self.pending_deadline.compare_exchange(
                    0,
                    ns,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
            Err(_) => gone_warning(pipe),
        }
    }
}

/// The line for pending `gone` bits (`CommandGone` says all `GroupGone` does).
fn gone_line(gone: u8) -> Vec<u8> {
    match gone {
        0 => Vec::new(),
        g if g & COMMAND_GONE != 0 => line(&Msg::CommandGone),
        _ => line(&Msg::GroupGone),
    }
}

fn line(msg: &Msg) -> Vec<u8> {
    let mut line = serde_json::to_vec(msg).unwrap_or_default();
    line.push(b'\n');
    line
}

fn gone_warning(pipe: &mut Option<File>) {
    ui::warn("the guardian process is gone; if conlock is killed, its command may outlive it");
    pipe.take();
}

/// Writes everything to a non-blocking pipe, waiting while it is full.
fn write_all_waiting(p: &mut File, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match p.write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let mut pfd = libc::pollfd {
                    fd: p.as_raw_fd(),
                    events: libc::POLLOUT,
                    revents: 0,
                };
                unsafe { libc::poll(&mut pfd, 1, -1) };
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn set_nonblocking(fd: RawFd) {
    unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
    }
}

/// Forks the guardian if this process has a single thread; returns conlock's end, or
/// why it could not.
fn fork_guardian() -> std::result::Result<File, String> {
    if !procfs::single_threaded() {
        return Err("conlock already runs threads, or /proc/self/task cannot be read".into());
    }
    let mut fds = [0 as RawFd; 2];
    // CLOEXEC: the command must not inherit the write end, or the guardian would not
    // see the pipe close when conlock dies.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    match unsafe { libc::fork() } {
        -1 => {
            let e = std::io::Error::last_os_error();
            unsafe {
                libc::close(read_end);
                libc::close(write_end);
            }
            Err(format!("fork: {e}"))
        }
        0 => {
            // The guardian: a single-threaded copy, so ordinary Rust is safe here.
            unsafe {
                libc::close(write_end);
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
                if null >= 0 {
                    // Not conlock's stdin and stdout: a reader of those must see EOF when
                    // conlock ends. stderr stays, for its messages.
                    libc::dup2(null, 0);
                    libc::dup2(null, 1);
                    if null > 2 {
                        libc::close(null);
                    }
                }
                libc::setpgid(0, 0);
                // Its own name (in ps, top): `killall conlock` and `pkill -x conlock`, which
                // match names exactly, then leave it to clean up after conlock.
                libc::prctl(libc::PR_SET_NAME, c"conlock-guard".as_ptr(), 0, 0, 0);
            }
            let code = serve(read_end);
            // No destructors or atexit handlers of conlock's copy.
            unsafe { libc::_exit(code) }
        }
        _ => {
            unsafe { libc::close(read_end) };
            Ok(unsafe { File::from_raw_fd(write_end) })
        }
    }
}

/// What the guardian knows.
#[derive(Default)]
struct Known {
    conn: Option<Box<StoreConfig>>,
    session: Option<(String, Duration)>,
    pgid: Option<i32>,
    claim: Option<ClaimSpec>,
    prior: Vec<(i32, u64)>,
    deadline: Option<BootInstant>,
    group_gone: bool,
    command_gone: bool,
    /// When the watchdog SIGKILLed the group (it then waits to see it gone).
    fired: Option<Instant>,
    /// `Conn`, `Session`, `Claim` and `Prior` lines not decoded yet, in order (see
    /// `Known::read`).
    undecoded: Vec<Vec<u8>>,
}

/// The lines the guardian needs only when it acts (conlock died, or its deadline
/// passed), by how they start.
const DECODED_LATER: [&[u8]; 4] = [
    b"{\"Conn\":",
    b"{\"Session\":",
    b"{\"Claim\":",
    b"{\"Prior\":",
];

impl Known {
    /// Takes one line. The guardian runs beside conlock at its busiest moments (the
    /// acquisition, the spawn, the release), so a line costs it as little as it can: the
    /// ones the watchdog needs at once are read by hand, and the rest are decoded only
    /// when the guardian acts on them. On a 2-core machine serde's code, faulted in
    /// for the first lines, took CPU time from conlock and its Consul agent. `Done` is
    /// returned, not applied.
    fn read(&mut self, line: Vec<u8>) -> Option<Msg> {
        if let Some(msg) = decode_at_once(&line) {
            return match msg {
                Msg::Done => Some(Msg::Done),
                m => {
                    self.apply(m);
                    None
                }
            };
        }
        if DECODED_LATER.iter().any(|head| line.starts_with(head)) {
            self.undecoded.push(line);
            // Bounded: a session recreated again and again adds a line each time.
            if self.undecoded.len() > 16 {
                self.decode();
            }
            return None;
        }
        match serde_json::from_slice::<Msg>(&line) {
            Ok(Msg::Done) => Some(Msg::Done),
            Ok(m) => {
                self.apply(m);
                None
            }
            Err(_) => None,
        }
    }

    /// Decodes the kept lines, in the order they came.
    fn decode(&mut self) {
        for line in std::mem::take(&mut self.undecoded) {
            if let Ok(m) = serde_json::from_slice::<Msg>(&line) {
                self.apply(m);
            }
        }
    }

    fn apply(&mut self, msg: Msg) {
        match msg {
            Msg::Conn(c) => self.conn = Some(c),
            Msg::Session(id, ttl_ms) => self.session = Some((id, Duration::from_millis(ttl_ms))),
            Msg::ProcessGroup(p) => self.pgid = Some(p),
            Msg::Claim(c) => self.claim = Some(c),
            Msg::Prior(p) => self.prior = p,
            Msg::Deadline(ns) => self.deadline = Some(BootInstant::from_nanos(ns)),
            Msg::GroupGone => self.group_gone = true,
            Msg::CommandGone => (self.group_gone, self.command_gone) = (true, true),
            Msg::Done => {}
        }
    }

    /// The group the guardian may still signal.
    fn live_group(&self) -> Option<i32> {
        self.pgid.filter(|&p| p > 1 && !self.group_gone)
    }

    /// When the watchdog must fire, if it is armed: from the command's start until
    /// conlock reports the whole command gone. Its group may be gone before escaped
    /// processes are.
    fn watchdog(&self) -> Option<BootInstant> {
        self.pgid
            .filter(|&p| p > 1 && !self.command_gone && self.fired.is_none())
            .and(self.deadline)
    }
}

/// Reads messages from `fd` until `Done` (exit 0) or the pipe closes (conlock died).
fn serve(fd: RawFd) -> i32 {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
        libc::SIGUSR1,
        libc::SIGUSR2,
    ] {
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let conlock_pid = unsafe { libc::getppid() };
    let mut out = Say::default();
    let mut known = Known::default();
    let timer = Timer::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let watchdog = known.watchdog();
        if let Some(at) = watchdog {
            // A newer deadline may wait unread in the pipe: read it first.
            if at.has_passed() && !readable(fd) {
                let what = match known.live_group() {
                    Some(p) => {
                        unsafe { libc::kill(-p, libc::SIGKILL) };
                        format!("its command's process group {p}")
                    }
                    None => "what was left of its command".to_string(),
                };
                known.decode();
                kill_descendants(conlock_pid, &known.prior);
                known.fired = Some(Instant::now());
                out.say(format!(
                    "conlock (pid {conlock_pid}) is stopped or stuck past its deadline; SIGKILLed {what}"
                ));
                continue;
            }
        }
        let mut timeout = timer.arm(watchdog);
        if let Some(at) = known.fired.filter(|_| !known.command_gone) {
            let group = known.live_group();
            let early = at.elapsed() < Duration::from_secs(1);
            if group.is_some() || early {
                // Processes that left the group are re-parented to conlock as their
                // parents die: they get SIGKILL too.
                known.decode();
                kill_descendants(conlock_pid, &known.prior);
                // Once the killed group is gone its ID may be reused: never signal it again.
                if group.is_some_and(|p| super::procfs::group(p) == super::procfs::Liveness::Gone) {
                    known.group_gone = true;
                    continue;
                }
                timeout = if early { 10 } else { 500 };
            }
        }
        let mut pfds = [
            libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: timer.fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        let n = if watchdog.is_some() && timer.fd >= 0 {
            2
        } else {
            1
        };
        let r = unsafe { libc::poll(pfds.as_mut_ptr(), n, timeout) };
        if r < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if n == 2 && pfds[1].revents != 0 {
            timer.clear();
        }
        if pfds[0].revents == 0 {
            continue;
        }
        let got = unsafe { libc::read(fd, chunk.as_mut_ptr().cast(), chunk.len()) };
        if got < 0 {
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock => continue,
                _ => break,
            }
        }
        if got == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..got as usize]);
        while let Some(nl) = buf.iter().position(|&b| b == b'\n') {
            let mut line: Vec<u8> = buf.drain(..=nl).collect();
            line.pop();
            if let Some(Msg::Done) = known.read(line) {
                out.finish();
                return 0;
            }
        }
    }
    // The pipe closed without `Done`: conlock died.
    let code = take_over(known, conlock_pid, &mut out);
    out.finish();
    code
}

/// The lines the watchdog acts on, as serde writes them (and src/hold/spawn.rs writes
/// `ProcessGroup`), read without serde. Anything else: None.
fn decode_at_once(line: &[u8]) -> Option<Msg> {
    fn number<T: std::str::FromStr>(line: &[u8], head: &[u8]) -> Option<T> {
        let digits = line.strip_prefix(head)?.strip_suffix(b"}")?;
        // JSON's form only (no leading zero), as serde reads it.
        if digits.is_empty()
            || !digits.iter().all(u8::is_ascii_digit)
            || (digits[0] == b'0' && digits.len() > 1)
        {
            return None;
        }
        std::str::from_utf8(digits).ok()?.parse().ok()
    }
    match line {
        b"\"Done\"" => Some(Msg::Done),
        b"\"GroupGone\"" => Some(Msg::GroupGone),
        b"\"CommandGone\"" => Some(Msg::CommandGone),
        _ => number(line, b"{\"Deadline\":")
            .map(Msg::Deadline)
            .or_else(|| number(line, b"{\"ProcessGroup\":").map(Msg::ProcessGroup)),
    }
}

fn readable(fd: RawFd) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    unsafe { libc::poll(&mut pfd, 1, 0) > 0 }
}

/// conlock died: make sure its command is dead, then give the claim back.
fn take_over(mut known: Known, conlock_pid: i32, out: &mut Say) -> i32 {
    let group = known.live_group();
    if let Some(p) = group {
        unsafe { libc::kill(-p, libc::SIGKILL) };
    }
    // After the kill: it needs only what was read at once.
    known.decode();
    let client = known.conn.clone().and_then(|c| Store::from_config(*c).ok());
    if let Some(p) = group {
        if !wait_group_gone(p, &known, client.as_ref(), out) {
            return 1;
        }
        out.say(format!(
            "conlock (pid {conlock_pid}) died; killed its command's process group {p}"
        ));
    }
    let (Some(client), Some((session, _))) = (client, known.session) else {
        return 0;
    };
    let what = known
        .claim
        .as_ref()
        .map_or_else(|| "nothing".to_string(), ClaimSpec::describe);
    let released = known.claim.map(|c| {
        let claim = c.build();
        ui::set_level(ui::Level::Silent);
        claim.release(&client, &session)
    });
    let destroyed = client.destroy_session(&session);
    if known.pgid.is_some() {
        out.say(take_over_said(
            &client, &what, released, &session, &destroyed,
        ));
    }
    0
}

/// What the guardian says it did after conlock died: only what really happened.
fn take_over_said(
    client: &Store,
    what: &str,
    released: Option<bool>,
    session: &str,
    destroyed: &std::result::Result<(), crate::error::StoreError>,
) -> String {
    let claim = match released {
        Some(true) => format!("released {what}"),
        Some(false) => format!("did not release {what} (no longer ours, or no answer)"),
        None => "held nothing".to_string(),
    };
    let (noun, done) = match client.backend() {
        "etcd" => ("lease", "revoked"),
        _ => ("session", "destroyed"),
    };
    match destroyed {
        // The store answers the same for one that was already gone.
        Ok(()) => format!("{claim}; {noun} {session} {done} (or already gone)"),
        Err(e) => format!("{claim}; could not end {noun} {session}: {e}; it expires by its TTL"),
    }
}

/// How long survivors are waited for before they are reported and the session renewed.
const SURVIVOR_NOTICE: Duration = Duration::from_secs(1);

/// Waits until group `p` is gone. While survivors run (SIGKILL cannot reach them, or has
/// not yet), keeps the session alive so that no new holder starts beside them. False if
/// the session was lost meanwhile (nothing left to give back).
fn wait_group_gone(p: i32, known: &Known, client: Option<&Store>, out: &mut Say) -> bool {
    let started = Instant::now();
    let mut surviving = false;
    let mut next_renew = started + SURVIVOR_NOTICE;
    loop {
        let state = super::procfs::group(p);
        if state != super::procfs::Liveness::Gone {
            // Again on every look: a process that stepped out of the group at the first
            // SIGKILL and back in since must not survive it.
            unsafe { libc::kill(-p, libc::SIGKILL) };
        }
        if state == super::procfs::Liveness::Gone {
            if surviving {
                out.say(format!(
                    "the surviving processes of group {p} are gone; releasing"
                ));
            }
            return true;
        }
        let waited = started.elapsed();
        if waited >= SURVIVOR_NOTICE && !surviving {
            surviving = true;
            let keep = match &known.session {
                Some((id, _)) if client.is_some() => {
                    format!("keeping session {id} alive (renewing it) until they are gone, so that no other holder starts beside them")
                }
                _ => "no session to keep".to_string(),
            };
            out.say(format!(
                "conlock died; processes of its command's group {p} survive SIGKILL (or may not be signalled); {keep}"
            ));
        }
        if let (Some(c), Some((id, ttl))) = (client, &known.session) {
            if surviving && Instant::now() >= next_renew {
                let ttl = *ttl;
                next_renew = match c.renew_session(id, (ttl / 3).min(Duration::from_secs(5))) {
                    Ok(Some(_)) => Instant::now() + ttl / 3,
                    Ok(None) => {
                        out.say(format!(
                            "session {id} is gone: the lock is no longer held, although processes of group {p} still run"
                        ));
                        return false;
                    }
                    Err(_) => Instant::now() + Duration::from_secs(1),
                };
            }
        }
        // Fast at first: failover waits on this.
        std::thread::sleep(if waited < Duration::from_millis(200) {
            Duration::from_millis(1)
        } else if waited < SURVIVOR_NOTICE {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(100)
        });
    }
}

/// A timerfd on CLOCK_BOOTTIME, so that a deadline passed during a suspend is noticed.
struct Timer {
    fd: RawFd,
}

impl Timer {
    fn new() -> Timer {
        let fd = unsafe {
            libc::timerfd_create(libc::CLOCK_BOOTTIME, libc::TFD_CLOEXEC | libc::TFD_NONBLOCK)
        };
        Timer { fd }
    }

    /// Consumes an expiry, so that the timer is not readable any more.
    fn clear(&self) {
        let mut ticks = [0u8; 8];
        unsafe { libc::read(self.fd, ticks.as_mut_ptr().cast(), ticks.len()) };
    }

    /// Arms the timer for `at`; returns the poll timeout to use.
    fn arm(&self, at: Option<BootInstant>) -> libc::c_int {
        let Some(at) = at else {
            return -1;
        };
        if self.fd < 0 {
            // No timerfd: wake up every 100 ms to check.
            return at.remaining().as_millis().min(100) as libc::c_int;
        }
        let ns = at.as_nanos();
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: (ns / 1_000_000_000) as _,
                // Zero would disarm it.
                tv_nsec: ((ns % 1_000_000_000).max(1)) as libc::c_long,
            },
        };
        unsafe {
            libc::timerfd_settime(
                self.fd,
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        -1
    }
}

/// The guardian's messages: one writer thread, started on the first message, so that
/// a stderr that blocks cannot hold up a kill or a release, and one that fails is ignored.
#[derive(Default)]
struct Say {
    tx: Option<std::sync::mpsc::Sender<String>>,
    writer: Option<std::thread::JoinHandle<()>>,
}

impl Say {
    fn say(&mut self, msg: String) {
        if self.tx.is_none() {
            let (tx, rx) = std::sync::mpsc::channel::<String>();
            self.writer = std::thread::Builder::new()
                .name("say".into())
                .spawn(move || {
                    for m in rx {
                        write_stderr(format!("conlock guardian: {m}\n").as_bytes());
                    }
                })
                .ok();
            self.tx = Some(tx);
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(msg);
        }
    }

    /// Gives the messages a moment to get out, without waiting on a blocked stderr.
    fn finish(&mut self) {
        self.tx.take();
        if let Some(w) = self.writer.take() {
            let until = Instant::now() + Duration::from_secs(1);
            while !w.is_finished() && Instant::now() < until {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

/// Writes to fd 2, ignoring every failure.
fn write_stderr(mut bytes: &[u8]) {
    while !bytes.is_empty() {
        let n = unsafe { libc::write(2, bytes.as_ptr().cast(), bytes.len()) };
        if n > 0 {
            bytes = &bytes[n as usize..];
        } else if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
        {
            continue;
        } else {
            return;
        }
    }
}

/// SIGKILLs every live descendant of a stopped or stuck conlock but the guardian and the
/// children conlock had before the command (with what they started): the command's
/// group and whatever left it (`setsid`), re-parented to conlock or not.
fn kill_descendants(conlock_pid: i32, prior: &[(i32, u64)]) {
    let mut skip = vec![std::process::id() as i32];
    skip.extend(
        prior
            .iter()
            .filter(|&&(pid, start)| procfs::is_process(pid, start))
            .map(|&(pid, _)| pid),
    );
    // A /proc that cannot answer (another namespace's) must not have us kill by its pids.
    for (pid, st) in procfs::descendants(conlock_pid, &skip).unwrap_or_default() {
        procfs::signal_if_same(pid, st.start, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::{line, procfs::single_threaded, BootInstant, Duration, Known, Msg};

    /// `GroupGone` (escaped processes may still run) keeps the watchdog armed but stops
    /// signals to the group; `CommandGone` (sent also when a spawn fails) disarms it.
    #[test]
    fn the_watchdog_is_armed_until_the_whole_command_is_gone() {
        let mut k = Known::default();
        k.apply(Msg::ProcessGroup(4242));
        k.apply(Msg::Deadline(BootInstant::now().as_nanos()));
        assert!(k.watchdog().is_some() && k.live_group() == Some(4242));
        k.apply(Msg::GroupGone);
        assert!(
            k.watchdog().is_some(),
            "disarmed while escaped processes may run"
        );
        assert_eq!(k.live_group(), None);
        k.apply(Msg::CommandGone);
        assert!(k.watchdog().is_none());
        let mut k = Known::default();
        k.apply(Msg::ProcessGroup(4242));
        k.apply(Msg::Deadline(BootInstant::now().as_nanos()));
        k.apply(Msg::CommandGone);
        assert!(k.watchdog().is_none() && k.live_group().is_none());
    }

    /// What the guardian knows, as comparable text.
    fn known_text(k: &Known) -> String {
        format!(
            "{:?} {:?} {:?} {:?} {:?} {:?} {} {}",
            k.conn,
            k.session,
            k.pgid,
            k.claim,
            k.prior,
            k.deadline.map(|d| d.as_nanos()),
            k.group_gone,
            k.command_gone
        )
    }

    /// A line read by hand is what serde reads from the same bytes, and one it does not
    /// take is left to serde; lines kept for later, once decoded, leave the guardian
    /// knowing what decoding every line at once in order did.
    #[test]
    fn lines_read_by_hand_or_later_mean_what_serde_reads() {
        use crate::claim::ClaimSpec;
        let flags = crate::consul::ConnFlags {
            token: Some("t".into()),
            ..Default::default()
        };
        let conn = crate::consul::ConnConfig::resolve(&flags, &|_| None).unwrap();
        let written = [
            Msg::Conn(Box::new(crate::claim::StoreConfig::Consul(conn))),
            Msg::Session("s1".into(), 10_000),
            Msg::Claim(ClaimSpec::Semaphore {
                prefix: "p".into(),
                limit: 3,
            }),
            Msg::Prior(vec![(7, 99)]),
            Msg::Deadline(u64::MAX),
            Msg::ProcessGroup(4242),
            Msg::Deadline(1),
            Msg::Session("s2".into(), 20_000),
            Msg::GroupGone,
            Msg::ProcessGroup(i32::MAX),
            Msg::CommandGone,
        ];
        let mut lines: Vec<Vec<u8>> = written
            .iter()
            .map(|m| {
                let mut l = line(m);
                l.pop();
                l
            })
            .collect();
        // Forms conlock does not write: serde's reading decides.
        for odd in [
            &b"{\"Deadline\": 5}"[..],
            b"{\"Deadline\":007}",
            b"{\"Deadline\":0}",
            b"{\"Deadline\":-5}",
            b"{\"Deadline\":}",
            b"{\"Deadline\":18446744073709551616}",
            b"{\"ProcessGroup\":-5}",
            b"{\"ProcessGroup\":00}",
            b"{\"ProcessGroup\":2147483648}",
            b"{\"Done\":null}",
            b"\"GroupGone\" ",
            b"garbage",
        ] {
            lines.push(odd.to_vec());
        }
        let (mut by_serde, mut read) = (Known::default(), Known::default());
        for l in &lines {
            let serde = serde_json::from_slice::<Msg>(l).ok();
            if let Some(hand) = super::decode_at_once(l) {
                let text = String::from_utf8_lossy(l);
                assert_eq!(format!("{:?}", Some(hand)), format!("{serde:?}"), "{text}");
            }
            let done = matches!(serde, Some(Msg::Done));
            if let Some(m) = serde {
                by_serde.apply(m);
            }
            assert_eq!(matches!(read.read(l.clone()), Some(Msg::Done)), done);
        }
        assert!(read.conn.is_none() && read.session.is_none() && read.claim.is_none());
        assert_eq!(
            read.undecoded.len(),
            5,
            "Conn, Session, Claim, Prior, Session"
        );
        read.decode();
        assert!(read.undecoded.is_empty());
        assert_eq!(known_text(&read), known_text(&by_serde));
        assert_eq!(read.session, Some(("s2".into(), Duration::from_secs(20))));
        let mut done = line(&Msg::Done);
        done.pop();
        assert!(matches!(read.read(done), Some(Msg::Done)));
        // A session recreated again and again does not pile up lines.
        for i in 0..100 {
            let mut l = line(&Msg::Session(format!("s{i}"), 10_000));
            l.pop();
            read.read(l);
        }
        assert!(read.undecoded.len() <= 16);
        read.decode();
        assert_eq!(read.session.as_ref().map(|s| s.0.as_str()), Some("s99"));
    }

    /// The first deadline waits for the claim and goes in its write (one wake-up of the
    /// guardian fewer); later ones go at once.
    #[test]
    fn the_first_deadline_goes_with_the_claim() {
        use std::io::Read;
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        super::set_nonblocking(fds[0]);
        let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
        let g = super::Guardian {
            pipe: std::sync::Mutex::new(Some(unsafe {
                <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[1])
            })),
            conn: std::sync::Mutex::new(None),
            pending_deadline: std::sync::atomic::AtomicU64::new(0),
            pending_gone: std::sync::atomic::AtomicU8::new(0),
            claim_written: std::sync::atomic::AtomicBool::new(false),
            early_claim: std::sync::Mutex::new(None),
        };
        let mut read = || {
            let mut buf = vec![0u8; 4096];
            match reader.read(&mut buf) {
                Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => String::new(),
                Err(e) => panic!("{e}"),
            }
        };
        g.deadline(BootInstant::from_nanos(5));
        g.deadline(BootInstant::from_nanos(7));
        assert_eq!(read(), "", "a deadline went before the claim");
        g.claim(crate::claim::ClaimSpec::Lock { key: "k".into() }, &[(3, 4)]);
        assert_eq!(
            read(),
            "{\"Claim\":{\"Lock\":{\"key\":\"k\"}}}\n{\"Prior\":[[3,4]]}\n{\"Deadline\":7}\n"
        );
        g.deadline(BootInstant::from_nanos(9));
        assert_eq!(read(), "{\"Deadline\":9}\n");
    }

    #[test]
    fn a_process_group_line_is_what_the_spawned_child_writes() {
        // src/hold/spawn.rs writes this line without serde, between clone and exec.
        assert_eq!(line(&Msg::ProcessGroup(1234)), b"{\"ProcessGroup\":1234}\n");
    }

    #[test]
    fn single_threaded_counts_the_threads_of_this_process() {
        // The test harness runs this on a thread of its own: never single-threaded.
        assert!(!single_threaded());
        // A forked child has just the thread that forked.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            unsafe { libc::_exit(if single_threaded() { 0 } else { 1 }) };
        }
        let mut status = 0;
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0);
    }
}
