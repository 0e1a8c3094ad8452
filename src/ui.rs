//! Messages on stderr: errors, warnings, losses and kills always; progress with -v;
//! retries and "busy" hidden by -q (as `flock -n` is silent when busy). And the
//! one way to stdout (`out`), which reports a closed or full stdout instead of panicking.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Errors only: for the guardian's release, which reports in its own words.
    Silent = 0,
    Quiet = 1,
    Normal = 2,
    Verbose = 3,
}

static LEVEL: AtomicU8 = AtomicU8::new(Level::Normal as u8);

pub fn set_level(level: Level) {
    LEVEL.store(level as u8, Ordering::Relaxed);
}

pub fn level() -> Level {
    match LEVEL.load(Ordering::Relaxed) {
        0 => Level::Silent,
        1 => Level::Quiet,
        2 => Level::Normal,
        _ => Level::Verbose,
    }
}

pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// Bytes written by a thread of their own: a reader that stops reading (a full pipe, a
/// hung-up terminal) blocks only that thread, never the ones that supervise the command
/// or renew the session. The thread starts with the first bytes, so a run that writes
/// nothing costs no thread.
pub struct Queue {
    name: String,
    /// Where `write` writes: polled before an exit-time write in place.
    fd: RawFd,
    state: Mutex<Writer>,
    /// Chunks sent and not yet written; the writer notifies after each one.
    pending: Arc<(Mutex<usize>, Condvar)>,
}

type WriteFn = Box<dyn FnMut(&[u8]) -> bool + Send>;

enum Writer {
    /// Nothing sent yet.
    Idle(WriteFn),
    Running(Sender<Vec<u8>>),
    /// The thread could not start (a process limit, which the command may be using up):
    /// what was sent is kept, the newest `KEPT_MAX` bytes, and the thread is tried again
    /// with the next message and at `flush`. Never written in place while conlock runs:
    /// a write that blocks (a full pipe nobody reads) would hold up supervision.
    Unstarted(WriteFn, VecDeque<Vec<u8>>),
}

/// What an unstarted writer keeps at most; the oldest messages go first.
const KEPT_MAX: usize = 64 * 1024;

impl Queue {
    /// `write` writes to `fd`; it returns false to stop writing (what follows is dropped).
    pub fn new(name: &str, fd: RawFd, write: impl FnMut(&[u8]) -> bool + Send + 'static) -> Queue {
        Queue {
            name: name.into(),
            fd,
            state: Mutex::new(Writer::Idle(Box::new(write))),
            pending: Arc::new((Mutex::new(0usize), Condvar::new())),
        }
    }

    pub fn send(&self, bytes: Vec<u8>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.try_start(&mut state);
        match &mut *state {
            Writer::Running(tx) => self.hand_over(tx, bytes),
            Writer::Unstarted(_, kept) => {
                kept.push_back(bytes);
                while kept.len() > 1 && kept.iter().map(Vec::len).sum::<usize>() > KEPT_MAX {
                    kept.pop_front();
                }
            }
            Writer::Idle(_) => {}
        }
    }

    fn hand_over(&self, tx: &Sender<Vec<u8>>, bytes: Vec<u8>) {
        let n = &self.pending.0;
        *n.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        if tx.send(bytes).is_err() {
            *n.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
        }
    }

    /// Starts the thread if it is not running, handing it what was kept.
    fn try_start(&self, state: &mut Writer) {
        let (write, kept) = match std::mem::replace(state, Writer::Idle(Box::new(|_| true))) {
            Writer::Idle(write) => (write, VecDeque::new()),
            Writer::Unstarted(write, kept) => (write, kept),
            running => {
                *state = running;
                return;
            }
        };
        *state = match self.start(write) {
            Ok(tx) => {
                for bytes in kept {
                    self.hand_over(&tx, bytes);
                }
                Writer::Running(tx)
            }
            Err(write) => Writer::Unstarted(write, kept),
        };
    }

    fn start(&self, write: WriteFn) -> std::result::Result<Sender<Vec<u8>>, WriteFn> {
        let (tx, rx) = mpsc::channel::<Vec<u8>>();
        let count = self.pending.clone();
        // Where the thread takes `write` from: if it cannot start, it is still there.
        let slot = Arc::new(Mutex::new(Some(write)));
        let theirs = slot.clone();
        let spawned = spawn_quiet(&self.name, move || {
            let Some(mut write) = theirs.lock().unwrap_or_else(|p| p.into_inner()).take() else {
                return;
            };
            let mut open = true;
            for chunk in rx {
                if open {
                    open = write(&chunk);
                }
                let (n, written) = &*count;
                *n.lock().unwrap_or_else(|p| p.into_inner()) -= 1;
                written.notify_all();
            }
        });
        match spawned {
            Ok(_) => Ok(tx),
            Err(_) => Err(slot
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_else(|| Box::new(|_| true))),
        }
    }

    /// Waits until everything sent is written, but never longer than 2 s without
    /// progress: nobody reads what stays blocked that long.
    pub fn flush(&self) {
        // Kept messages: one more try at the thread, else written in place, each once
        // `fd` takes it within 2 s (supervision is over; a pipe nobody reads is given up).
        {
            let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if matches!(&*state, Writer::Unstarted(..)) {
                self.try_start(&mut state);
            }
            if let Writer::Unstarted(_, kept) = &mut *state {
                let bytes: Vec<u8> = kept.drain(..).flatten().collect();
                write_waiting(self.fd, &bytes, Duration::from_secs(2));
            }
        }
        let (n, written) = &*self.pending;
        let mut pending = n.lock().unwrap_or_else(|p| p.into_inner());
        let mut last = *pending;
        let mut progress_at = Instant::now();
        while *pending != 0 {
            if *pending != last {
                last = *pending;
                progress_at = Instant::now();
            }
            let left = Duration::from_secs(2).saturating_sub(progress_at.elapsed());
            if left.is_zero() {
                return;
            }
            pending = written
                .wait_timeout(pending, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// Writes `bytes` to `fd` in pieces of at most PIPE_BUF, each once `fd` takes it (a pipe
/// with room for one takes it whole, without blocking); gives up after `patience`
/// without progress.
fn write_waiting(fd: RawFd, mut bytes: &[u8], patience: Duration) {
    while !bytes.is_empty() {
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        if unsafe { libc::poll(&mut pfd, 1, patience.as_millis() as i32) } != 1 {
            return;
        }
        let piece = bytes.len().min(libc::PIPE_BUF);
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), piece) };
        if n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
            continue;
        }
        if n <= 0 {
            return;
        }
        bytes = &bytes[n as usize..];
    }
}

/// A write to stdout that failed: a closed pipe (the reader, such as `head`, stopped
/// reading) or another error (a full disk).
#[derive(Debug, thiserror::Error)]
#[error("cannot write to stdout: {0}")]
pub struct StdoutError(#[source] pub std::io::Error);

impl StdoutError {
    /// The reader went away: Unix tools end quietly then.
    pub fn is_closed_pipe(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` to stdout and flushes it. Every write to stdout goes through here:
/// std's `print!` panics (and conlock aborts) when stdout is closed or full.
pub fn out(text: impl AsRef<[u8]>) -> Result<(), StdoutError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_ref())
        .and_then(|()| stdout.flush())
        .map_err(StdoutError)
}

/// Starts a helper thread that takes no asynchronous signal, whatever the caller's mask.
/// A hold's signal thread must get every SIGCHLD: a thread that does not block it takes
/// it and discards it (its default action), and the command's end is never seen. The
/// mask is inherited at creation, so it is blocked around the spawn: no window.
pub fn spawn_quiet<F>(name: &str, f: F) -> std::io::Result<std::thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // SAFETY: sigset_t is plain data; the calls only read and write the masks given.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        // Faults stay deliverable: blocking them would not stop them, only confuse them.
        for sig in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGTRAP,
        ] {
            libc::sigdelset(&mut all, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let spawned = std::thread::Builder::new().name(name.into()).spawn(f);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        spawned
    }
}

static WRITER: Mutex<Option<Arc<Queue>>> = Mutex::new(None);
static DETACHED: AtomicBool = AtomicBool::new(false);

/// From now on, messages are written by a thread of their own (see `Queue`). `flush`
/// before exiting.
pub fn detach() {
    let mut w = WRITER.lock().unwrap_or_else(|p| p.into_inner());
    if w.is_some() {
        return;
    }
    *w = Some(Arc::new(Queue::new("stderr", libc::STDERR_FILENO, |b| {
        let _ = std::io::stderr().write_all(b);
        true
    })));
    DETACHED.store(true, Ordering::SeqCst);
}

/// Waits until detached messages are written (see `Queue::flush`).
pub fn flush() {
    let queue = WRITER.lock().unwrap_or_else(|p| p.into_inner()).clone();
    if let Some(q) = queue {
        q.flush();
    }
}

/// Writes `text` to stderr, or hands it to the writer thread once detached.
fn emit(text: String) {
    if DETACHED.load(Ordering::SeqCst) {
        if let Some(w) = &*WRITER.lock().unwrap_or_else(|p| p.into_inner()) {
            w.send(text.into_bytes());
            return;
        }
    }
    let _ = std::io::stderr().write_all(text.as_bytes());
}

/// An error line; always shown.
pub fn error(msg: impl std::fmt::Display) {
    clear_status();
    emit(format!("{}conlock: error: {msg}\n", stamp()));
}

/// A warning: something went wrong that the caller may have to act on; always shown.
pub fn warn(msg: impl std::fmt::Display) {
    if level() >= Level::Quiet {
        clear_status();
        emit(format!("{}conlock: warning: {msg}\n", stamp()));
    }
}

/// What happened to the command: a loss, a kill (--max-time). Always shown: `-q` in a
/// cron line must not hide why a job was stopped.
pub fn alert(msg: impl std::fmt::Display) {
    if level() >= Level::Quiet {
        clear_status();
        emit(format!("{}conlock: {msg}\n", stamp()));
    }
}

/// A passing event (retries, busy); hidden by -q.
pub fn notice(msg: impl std::fmt::Display) {
    if level() >= Level::Normal {
        clear_status();
        emit(format!("{}conlock: {msg}\n", stamp()));
    }
}

/// With -v every line carries the timestamp, so that errors and warnings sort in
/// with the progress lines.
fn stamp() -> String {
    if level() >= Level::Verbose {
        format!("{} ", timestamp_micros(SystemTime::now()))
    } else {
        String::new()
    }
}

/// A timestamped progress line; only with -v.
pub fn verbose(msg: impl std::fmt::Display) {
    if level() >= Level::Verbose {
        clear_status();
        emit(format!(
            "{} conlock: {msg}\n",
            timestamp_micros(SystemTime::now())
        ));
    }
}

static STATUS_SHOWN: AtomicU8 = AtomicU8::new(0);

/// Rewrites the single waiting-status line on a terminal.
pub fn status_line(msg: &str) {
    if level() >= Level::Normal && stderr_is_terminal() {
        emit(format!("\r\x1b[2K{msg}"));
        STATUS_SHOWN.store(1, Ordering::Relaxed);
    }
}

pub fn clear_status() {
    if STATUS_SHOWN.swap(0, Ordering::Relaxed) == 1 {
        emit("\r\x1b[2K".to_string());
    }
}

/// `w` as a shell would need it typed, for command lines in messages.
pub fn shell_quote(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        w.to_string()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// RFC 3339 UTC with milliseconds, e.g. `2026-11-21T13:52:49.123Z`.
pub fn timestamp(t: SystemTime) -> String {
    let mut s = timestamp_micros(t);
    s.replace_range(23..26, "");
    s
}

/// An RFC 3339 UTC timestamp as `timestamp` writes it (`YYYY-MM-DDTHH:MM:SS(.fff)Z`).
pub fn parse_timestamp(s: &str) -> Option<SystemTime> {
    // YYYY-MM-DDTHH:MM:SS(.fff)Z
    let b = s.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[10] != b'T' || !s.ends_with('Z') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    // Days from civil, after Howard Hinnant.
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    // A fraction (`.123`), if any, to the nanosecond.
    let frac = s[19..s.len() - 1]
        .strip_prefix('.')
        .filter(|f| !f.is_empty() && f.len() <= 9 && f.bytes().all(|c| c.is_ascii_digit()))
        .map_or(0, |f| {
            f.parse::<u32>().unwrap_or(0) * 10u32.pow(9 - f.len() as u32)
        });
    (secs >= 0).then(|| UNIX_EPOCH + std::time::Duration::new(secs as u64, frac))
}

/// `HH:MM:SS UTC`, for "until about" in messages.
pub fn clock_time(t: SystemTime) -> String {
    format!("{} UTC", &timestamp_micros(t)[11..19])
}

/// RFC 3339 UTC with microseconds, for -v progress lines.
pub fn timestamp_micros(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, dd) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{dd:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// Days since 1970-01-01 to (year, month, day), after Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The signal mask of this process's thread named `name`, from /proc.
    fn blocked_of_thread(name: &str) -> Option<u64> {
        for t in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if comm.trim_end() != name {
                continue;
            }
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let line = status.lines().find(|l| l.starts_with("SigBlk:"))?;
            return u64::from_str_radix(line["SigBlk:".len()..].trim(), 16).ok();
        }
        None
    }

    /// A writer thread started by a thread that blocks nothing (the etcd version look,
    /// started before the hold blocks its signals) still takes no SIGCHLD: one it took
    /// would be discarded, and the hold would never see its command end.
    #[test]
    fn a_writer_started_from_an_unmasked_thread_blocks_sigchld() {
        let q = Arc::new(Queue::new("quiet-test", libc::STDERR_FILENO, |_| true));
        let theirs = q.clone();
        std::thread::spawn(move || {
            unsafe {
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            }
            theirs.send(b"".to_vec());
        })
        .join()
        .unwrap();
        // Written: the thread has run, so it carries its name (it sets it itself).
        q.flush();
        let mask = blocked_of_thread("quiet-test").expect("the writer thread is running");
        let bit = 1u64 << (libc::SIGCHLD - 1);
        assert_ne!(mask & bit, 0, "SIGCHLD is not blocked: SigBlk {mask:016x}");
        drop(q);
    }

    /// At exit, kept messages go to a pipe nobody reads: what fits is written, then the
    /// write gives up instead of blocking for good (a poll for room, then one big write,
    /// blocked once the room was smaller than the write).
    #[test]
    fn an_exit_write_to_a_full_pipe_gives_up() {
        let mut fds = [0; 2];
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        let (r, w) = (fds[0], fds[1]);
        unsafe { libc::fcntl(w, libc::F_SETFL, libc::O_NONBLOCK) };
        let page = [b'x'; 4096];
        while unsafe { libc::write(w, page.as_ptr().cast(), page.len()) } > 0 {}
        unsafe { libc::fcntl(w, libc::F_SETFL, 0) };
        // Room for one page: poll says writable.
        let mut buf = [0u8; 4096];
        assert_eq!(
            unsafe { libc::read(r, buf.as_mut_ptr().cast(), buf.len()) },
            4096
        );
        let t0 = Instant::now();
        write_waiting(w, &[b'y'; 10 * 1024], Duration::from_millis(300));
        assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
        unsafe {
            libc::close(r);
            libc::close(w);
        }
    }

    #[test]
    fn formats_utc_timestamps() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_268_726_123);
        assert_eq!(timestamp(t), "2026-11-21T13:45:26.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert_eq!(timestamp(leap), "2000-02-29T00:00:00.000Z");
        assert_eq!(timestamp_micros(t), "2026-11-21T13:45:26.123000Z");
    }
}
