//! `conlock break`: operator intervention. Destroys the holder's session, as Consul's
//! session docs describe for a stuck lock. The lock then frees after the session's
//! lock-delay, which gives the old holder time to stop its command.

use std::io::{BufRead, IsTerminal, Write};

use super::{inspect, Holder, Snapshot, Target};
use crate::claim::inspect::{record_lock_delay_end, waiters_keep_cushion};
use crate::claim::Store;
use crate::error::{Error, Result};
use crate::ui;

pub fn run(store: &Store, target: &Target, session: Option<&str>, yes: bool) -> Result<i32> {
    let (snap, _) = inspect(store, target, 0)?;
    let chosen: Vec<Holder> = match (session, snap.holders()) {
        (_, hs) if hs.is_empty() => {
            ui::out(format!("nothing to break: {} has no holder\n", name(&snap)))?;
            return Ok(0);
        }
        (Some(s), hs) => {
            let found: Vec<Holder> = hs.into_iter().filter(|h| h.session == s).cloned().collect();
            if found.is_empty() {
                return Err(Error::Usage(format!(
                    "session {s} holds nothing in {}",
                    name(&snap)
                )));
            }
            found
        }
        (None, hs) => hs.into_iter().cloned().collect(),
    };
    let list = chosen
        .iter()
        .map(Holder::describe_session)
        .collect::<Vec<_>>()
        .join(", ");
    if !yes {
        if !std::io::stdin().is_terminal() {
            return Err(Error::Usage(
                "refusing to break without --yes: stdin is not a terminal to confirm on".into(),
            ));
        }
        // Not eprint!, which panics when stderr is closed.
        let _ = write!(
            std::io::stderr(),
            "Destroy {list}, holding {}? [y/N] ",
            name(&snap)
        );
        let mut answer = String::new();
        let _ = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            ui::out("nothing done\n")?;
            return Ok(1);
        }
    }
    // A closed stdout does not stop the breaking: it is reported once all is done.
    let mut unwritten = None;
    for h in &chosen {
        store.destroy_session(&h.session)?;
        let line = match &snap {
            // etcd: the lease is revoked and its key gone; the holder record stays
            // unreleased, so conlock waiters keep the holder's cushion.
            _ if waiters_keep_cushion(store) => {
                let cushion = h.lock_delay_ns.map(std::time::Duration::from_nanos);
                let wait = match cushion {
                    Some(d) => format!(
                        "{} (until about {} for those waiting now; one that comes later waits {} from when it looks)",
                        crate::duration::format(d),
                        ui::clock_time(std::time::SystemTime::now() + d),
                        crate::duration::format(d)
                    ),
                    None => "none recorded in its value (an etcdctl holder keeps none)".into(),
                };
                let what = match &snap {
                    Snapshot::Lock { key, .. } => format!("{key} is free for etcdctl at once"),
                    Snapshot::Semaphore { prefix, .. } => format!("its slot in {prefix} is kept"),
                };
                format!(
                    "revoked {}; {what}; conlock waiters wait its lock-delay first: {wait}\n",
                    h.describe_session().replacen("session", "lease", 1)
                )
            }
            Snapshot::Lock { key, .. } => {
                // The store keeps the lock-delay to itself: leave in the key until when it
                // runs, so that `status` can tell (conlock's default value only).
                let delay = h.lock_delay_ns.map(std::time::Duration::from_nanos);
                record_lock_delay_end(store, key, delay);
                let delay = applied_delay(store, h);
                format!(
                    "destroyed {}; {key} can be acquired again after {delay} (lock-delay)\n",
                    h.describe_session()
                )
            }
            Snapshot::Semaphore { prefix, .. } => {
                // The slot is not handed out here: the holder's command may still run.
                // The holder frees it once its command is gone; if it cannot, conlock
                // waiters take it back after its cushion (its lock-delay).
                let cushion = applied_delay(store, h);
                format!(
                    "destroyed {}; its slot in {prefix} frees once that holder has stopped its command, or after {cushion} if it cannot\n",
                    h.describe_session()
                )
            }
        };
        if unwritten.is_none() {
            unwritten = ui::out(line).err();
        }
    }
    match unwritten {
        Some(e) => Err(e.into()),
        None => Ok(0),
    }
}

/// The holder's lock-delay as the store applies it (Consul: at most 60 s), for messages.
fn applied_delay(store: &Store, h: &Holder) -> String {
    h.lock_delay_ns
        .map(|ns| {
            crate::duration::format(std::time::Duration::from_nanos(ns).min(store.max_lock_delay()))
        })
        .unwrap_or_else(|| "its lock-delay".into())
}

fn name(snap: &Snapshot) -> String {
    match snap {
        Snapshot::Lock { key, .. } => format!("lock {key}"),
        Snapshot::Semaphore { prefix, .. } => format!("semaphore {prefix}"),
    }
}
