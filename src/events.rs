//! `--events`: one JSON object per line for log shippers and tests (schema in
//! docs/events.md and docs/events.schema.json). Process-wide, like the -v output, so any
//! stage of a run can report without the sink being passed through every layer.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use serde_json::{Map, Value};

use crate::ui;

/// Where the events go, opened before any request so that a bad path is a usage error.
pub struct Sink(File);

impl Sink {
    /// `-` is stderr (stdout belongs to the command), `fd:N` an inherited descriptor,
    /// anything else a file opened for appending (created if missing).
    pub fn open(spec: &str) -> Result<Sink, String> {
        if spec == "-" {
            return dup_fd(2).map(Sink);
        }
        if let Some(n) = spec.strip_prefix("fd:") {
            let fd: i32 = n
                .parse()
                .ok()
                .filter(|&fd| fd >= 0)
                .ok_or_else(|| format!("--events {spec}: fd:N needs a descriptor number"))?;
            return dup_fd(fd)
                .map(Sink)
                .map_err(|e| format!("--events {spec}: {e}"));
        }
        if spec.is_empty() {
            return Err("--events needs a file, '-' (stderr) or fd:N".into());
        }
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(spec)
            .map(Sink)
            .map_err(|e| format!("cannot open --events file {spec}: {e}"))
    }
}

/// A private copy of `fd` (close-on-exec, so the command does not inherit it twice).
fn dup_fd(fd: i32) -> Result<File, String> {
    let new = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(format!(
            "descriptor {fd} is not open ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(unsafe { File::from_raw_fd(new) })
}

/// Who runs what, in every line: a shared events file then tells the runs apart.
#[derive(Debug, Clone, Default)]
pub struct About {
    pub host: String,
    /// As in conlock's default value (the arguments joined by spaces, cut at 4096 chars).
    pub command: String,
}

struct State {
    /// Lines go through a thread of their own, so a reader that stops reading never
    /// blocks the stop of the command.
    queue: ui::Queue,
    kind: &'static str,
    target: String,
    about: About,
    /// When the command started and when it ended, for `ran_ms` in `exit`.
    ran: (Option<Instant>, Option<Instant>),
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();

/// Starts writing events about `kind` (`lock` or `semaphore`) `target` (key or prefix).
pub fn install(sink: Option<Sink>, kind: &'static str, target: &str, about: &About) {
    if let Some(Sink(mut file)) = sink {
        // One write per line, so concurrent writers (several conlocks on one file opened
        // for appending) never interleave within a line. A failure ends the events,
        // never the run.
        let fd = file.as_raw_fd();
        let queue = ui::Queue::new("events", fd, move |line| match file.write_all(line) {
            Ok(()) => true,
            Err(e) => {
                ui::warn(format_args!("cannot write --events: {e}; no more events"));
                false
            }
        });
        let _ = STATE.set(Mutex::new(State {
            queue,
            kind,
            target: target.to_string(),
            about: about.clone(),
            ran: (None, None),
        }));
    }
}

pub fn enabled() -> bool {
    STATE.get().is_some()
}

/// Waits until the events sent are written (at most 2 s without progress).
pub fn flush() {
    if let Some(state) = STATE.get() {
        state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .queue
            .flush();
    }
}

/// The command started (its exec succeeded).
pub fn command_started() {
    if let Some(state) = STATE.get() {
        state.lock().unwrap_or_else(|p| p.into_inner()).ran.0 = Some(Instant::now());
    }
}

/// The command ended (and its group was stopped).
pub fn command_ended() {
    if let Some(state) = STATE.get() {
        let mut s = state.lock().unwrap_or_else(|p| p.into_inner());
        if s.ran.0.is_some() && s.ran.1.is_none() {
            s.ran.1 = Some(Instant::now());
        }
    }
}

/// Milliseconds from the command's start to its end (or to now if its end was not
/// recorded); None if it never started.
fn ran_ms() -> Option<u64> {
    let state = STATE.get()?;
    let (start, end) = state.lock().unwrap_or_else(|p| p.into_inner()).ran;
    let end = end.unwrap_or_else(Instant::now);
    start.map(|s| end.saturating_duration_since(s).as_millis() as u64)
}

/// Queues one event line: `time`, `event`, `kind`, `target`, `pid`, `host`, `command`,
/// then `fields`.
pub fn emit(event: &str, fields: Value) {
    let Some(state) = STATE.get() else { return };
    let s = state.lock().unwrap_or_else(|p| p.into_inner());
    // Common fields first, in a fixed order, for people reading the file; then the
    // event's own fields (in name order).
    let common = [
        ("time", Value::from(ui::timestamp(SystemTime::now()))),
        ("event", event.into()),
        ("kind", s.kind.into()),
        ("target", s.target.clone().into()),
        ("pid", std::process::id().into()),
        ("host", s.about.host.clone().into()),
        ("command", s.about.command.clone().into()),
    ];
    let extra = match fields {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    let mut line = Vec::with_capacity(256);
    line.push(b'{');
    for (i, (k, v)) in common
        .iter()
        .map(|(k, v)| (*k, v))
        .chain(extra.iter().map(|(k, v)| (k.as_str(), v)))
        .enumerate()
    {
        if i > 0 {
            line.push(b',');
        }
        serde_json::to_writer(&mut line, k).expect("event json");
        line.push(b':');
        serde_json::to_writer(&mut line, v).expect("event json");
    }
    line.extend_from_slice(b"}\n");
    // With `-` the line shares the terminal with the waiting status line.
    ui::clear_status();
    s.queue.send(line);
}

/// How a run ended, for the `exit` event.
pub fn exit(code: i32, how: &str, extra: Value) {
    let mut fields = serde_json::json!({ "code": code, "how": how, "ran_ms": ran_ms() });
    if let (Value::Object(f), Value::Object(e)) = (&mut fields, extra) {
        f.extend(e);
    }
    emit("exit", fields);
}
