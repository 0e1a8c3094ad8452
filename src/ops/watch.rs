//! `conlock watch`: one line per change of holder, and an optional handler run on each
//! change (never two at once; changes that arrive meanwhile are coalesced into one run).

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::{json, Value};

use super::{inspect, Holder, Snapshot, Target};
use crate::claim::inspect::{invalidated_at, next_since};
use crate::claim::Store;
use crate::error::Result;
use crate::hold::event;
use crate::hold::program::{self, Program};
use crate::hold::supervise;
use crate::ui;

/// One change of holder.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// `held`/`free` for the first look, then `acquired`, `released` or `lost`.
    pub event: &'static str,
    /// `lock` or `semaphore`.
    pub kind: &'static str,
    /// The lock's key or the semaphore's prefix.
    pub target: String,
    pub holder: Option<Holder>,
    pub fencing_token: u64,
    /// Sessions holding after this change.
    pub holders_now: Vec<String>,
}

pub fn run(
    store: &Store,
    target: &Target,
    json: bool,
    handler: &[std::ffi::OsString],
) -> Result<i32> {
    let handler = if handler.is_empty() {
        None
    } else {
        Some(HandlerRunner::start(program::resolve(handler, false)?)?)
    };
    let mut index = 0;
    let mut prev: Option<Snapshot> = None;
    let mut backoff = Duration::from_millis(500);
    let mut failing = false;
    loop {
        match inspect(store, target, index) {
            Ok((snap, at_index)) => {
                if failing {
                    ui::notice(match store.backend() {
                        "etcd" => "reconnected to etcd",
                        _ => "reconnected to Consul",
                    });
                    failing = false;
                }
                backoff = Duration::from_millis(500);
                index = next_since(index, at_index);
                for change in diff(store, target, prev.as_ref(), &snap, at_index) {
                    let line = if json {
                        to_json(&change).to_string()
                    } else {
                        to_line(&change)
                    };
                    if let Err(e) = ui::out(line + "\n") {
                        // Nobody reads the lines any more: end as on SIGTERM.
                        if let Some(h) = &handler {
                            h.close(libc::SIGTERM);
                        }
                        return Err(e.into());
                    }
                    if let Some(h) = &handler {
                        h.submit(env_for(&change));
                    }
                }
                prev = Some(snap);
            }
            Err(crate::error::Error::Store(e)) if e.is_retryable() => {
                ui::notice(format_args!(
                    "{e}; retrying in {}",
                    crate::duration::format(backoff)
                ));
                failing = true;
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(30));
                index = 0;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The lock's key or the semaphore's prefix, as `status` names them.
fn target_name(snap: &Snapshot) -> (&'static str, String) {
    match snap {
        Snapshot::Lock { key, .. } => ("lock", key.clone()),
        Snapshot::Semaphore { prefix, .. } => ("semaphore", prefix.clone()),
    }
}

/// The changes from `prev` to `now` (read at the store's index `at_index`); a first
/// look reports the current state.
///
/// A holder that vanished was *lost* when its session was invalidated at `at_index`
/// (`claim::inspect::invalidated_at`). Otherwise it *released* (conlock and `consul lock`
/// release first and destroy their session a few requests later).
pub fn diff(
    store: &Store,
    _target: &Target,
    prev: Option<&Snapshot>,
    now: &Snapshot,
    at_index: u64,
) -> Vec<Change> {
    let (kind, name) = target_name(now);
    let fencing_token = match now {
        Snapshot::Lock { fencing_token, .. } | Snapshot::Semaphore { fencing_token, .. } => {
            *fencing_token
        }
    };
    let holders_now = now.holder_sessions();
    let change = |event, holder: Option<Holder>| Change {
        event,
        kind,
        target: name.clone(),
        holder,
        fencing_token,
        holders_now: holders_now.clone(),
    };
    let Some(prev) = prev else {
        if now.holders().is_empty() {
            return vec![change("free", None)];
        }
        return now
            .holders()
            .into_iter()
            .map(|h| change("held", Some(h.clone())))
            .collect();
    };
    let mut out = Vec::new();
    for old in prev.holders() {
        if !holders_now.contains(&old.session) {
            // etcd: a holder that ended without releasing leaves a cushion (its record).
            let lost = now.cushion_sessions().contains(&old.session)
                || invalidated_at(store, &old.session, at_index);
            out.push(change(
                if lost { "lost" } else { "released" },
                Some(old.clone()),
            ));
        }
    }
    let before = prev.holder_sessions();
    for new in now.holders() {
        if !before.contains(&new.session) {
            out.push(change("acquired", Some(new.clone())));
        }
    }
    out
}

pub fn to_line(c: &Change) -> String {
    let when = ui::timestamp(SystemTime::now());
    match &c.holder {
        Some(h) => format!(
            "{when} {:<8} {} {} by {} [{}]",
            c.event,
            c.kind,
            c.target,
            h.describe(),
            h.session
        ),
        None => format!("{when} {:<8} {} {}", c.event, c.kind, c.target),
    }
}

pub fn to_json(c: &Change) -> Value {
    json!({
        "time": ui::timestamp(SystemTime::now()),
        "event": c.event,
        "kind": c.kind,
        "target": c.target,
        "holder": c.holder.as_ref().map(Holder::to_json),
        "modify_index": c.fencing_token,
        "holders": c.holders_now,
    })
}

/// The handler's environment for one change.
pub fn env_for(c: &Change) -> Vec<(String, String)> {
    let mut env = vec![
        ("CONLOCK_EVENT".to_string(), c.event.to_string()),
        ("CONLOCK_TARGET".to_string(), c.target.clone()),
        (
            "CONLOCK_MODIFY_INDEX".to_string(),
            c.fencing_token.to_string(),
        ),
        ("CONLOCK_HOLDERS".to_string(), c.holders_now.join(",")),
    ];
    if let Some(h) = &c.holder {
        let value = match &h.value {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            v => v.to_string(),
        };
        env.push(("CONLOCK_HOLDER_SESSION".to_string(), h.session.clone()));
        env.push(("CONLOCK_HOLDER_KEY".to_string(), h.key.clone()));
        env.push((
            "CONLOCK_HOLDER_NAME".to_string(),
            h.name.clone().unwrap_or_default(),
        ));
        env.push(("CONLOCK_HOLDER_VALUE".to_string(), value));
    }
    env
}

type Env = Vec<(String, String)>;

/// The grace a handler gets after the signal that ends watch, as `run --kill-grace`.
const HANDLER_GRACE: Duration = Duration::from_secs(5);

/// The running handler's process group, and whether watch is ending.
#[derive(Default)]
struct Running {
    pgid: Option<i32>,
    closing: bool,
}

/// Runs the handler on its own thread, one run at a time, latest change wins. Each run
/// gets its own process group, stopped like `run` stops its command when watch ends on
/// SIGINT, SIGTERM, SIGHUP or SIGQUIT: that signal and SIGCONT, a grace, then SIGKILL.
struct HandlerRunner {
    pending: Arc<(Mutex<Option<Env>>, Condvar)>,
    running: Arc<Mutex<Running>>,
}

impl HandlerRunner {
    fn start(program: Program) -> Result<HandlerRunner> {
        let running: Arc<Mutex<Running>> = Arc::default();
        stop_handler_on_signals(running.clone())?;
        let pending: Arc<(Mutex<Option<Env>>, Condvar)> = Arc::default();
        let shared = pending.clone();
        let ours = running.clone();
        let shown = program
            .argv
            .iter()
            .map(|a| ui::shell_quote(&a.to_string_lossy()))
            .collect::<Vec<_>>()
            .join(" ");
        std::thread::spawn(move || loop {
            let env = {
                let (lock, cv) = &*shared;
                let mut p = lock.lock().unwrap_or_else(|e| e.into_inner());
                loop {
                    if let Some(env) = p.take() {
                        break env;
                    }
                    p = cv.wait(p).unwrap_or_else(|e| e.into_inner());
                }
            };
            let spawned = {
                let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
                if r.closing {
                    return;
                }
                let mut cmd = Command::new(&program.path);
                cmd.arg0(&program.argv[0])
                    .args(&program.argv[1..])
                    .envs(env)
                    // Its own group cannot read the terminal (SIGTTIN would stop it).
                    .stdin(Stdio::null())
                    .process_group(0);
                unsafe {
                    cmd.pre_exec(|| {
                        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
                        Ok(())
                    });
                }
                let spawned = cmd.spawn();
                if let Ok(c) = &spawned {
                    r.pgid = Some(c.id() as i32);
                }
                spawned
            };
            let status = spawned.and_then(|mut c| c.wait());
            running.lock().unwrap_or_else(|e| e.into_inner()).pgid = None;
            match status {
                Ok(st) if !st.success() => {
                    ui::warn(format_args!("the handler ({shown}) {}", describe_exit(st)))
                }
                Ok(_) => {}
                Err(e) => ui::warn(format_args!("cannot run the handler ({shown}): {e}")),
            }
        });
        Ok(HandlerRunner {
            pending,
            running: ours,
        })
    }

    /// No new handler run; the running one is stopped with `sig`, a grace, then SIGKILL.
    fn close(&self, sig: i32) {
        close_handler(&self.running, sig);
    }

    fn submit(&self, env: Env) {
        let (lock, cv) = &*self.pending;
        *lock.lock().unwrap_or_else(|e| e.into_inner()) = Some(env);
        cv.notify_one();
    }
}

fn close_handler(running: &Mutex<Running>, sig: i32) {
    let pgid = {
        let mut r = running.lock().unwrap_or_else(|e| e.into_inner());
        r.closing = true;
        r.pgid
    };
    if let Some(pgid) = pgid {
        let first =
            nix::sys::signal::Signal::try_from(sig).unwrap_or(nix::sys::signal::Signal::SIGTERM);
        if !supervise::stop_group(pgid, first, HANDLER_GRACE) {
            ui::error(format_args!(
                "the handler's process group {pgid} survives SIGKILL"
            ));
        }
    }
}

/// "exited with 9", "was killed by signal 9 (SIGKILL)".
fn describe_exit(st: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (st.code(), st.signal()) {
        (Some(code), _) => format!("exited with {code}"),
        (None, Some(n)) => match nix::sys::signal::Signal::try_from(n) {
            Ok(sig) => format!("was killed by signal {n} ({})", sig.as_str()),
            Err(_) => format!("was killed by signal {n}"),
        },
        (None, None) => format!("ended: {st}"),
    }
}

/// On a terminating signal (not ignored at start): no new handler run, the running
/// one's group is stopped, then watch exits 128 + the signal.
fn stop_handler_on_signals(running: Arc<Mutex<Running>>) -> Result<()> {
    let caught: Vec<i32> = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT]
        .into_iter()
        .filter(|&sig| !event::ignored(sig))
        .collect();
    let mut signals = signal_hook::iterator::Signals::new(caught).map_err(|e| {
        crate::error::Error::Other(anyhow::anyhow!("cannot install signal handlers: {e}"))
    })?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Some(sig) = signals.forever().next() {
                close_handler(&running, sig);
                ui::flush();
                std::process::exit(128 + sig);
            }
        })
        .map_err(|e| crate::error::Error::Other(e.into()))?;
    Ok(())
}
