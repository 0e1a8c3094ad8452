//! The guardian: a tiny process (conlock re-executed as `conlock __guardian`) that outlives
//! a conlock killed by SIGKILL or a crash. It learns over a pipe what conlock holds; when
//! the pipe closes without `done`, it SIGKILLs the child's process group, waits until the
//! group is gone, and only then releases the claim and destroys the session. The next
//! holder then starts at once instead of after TTL expiry plus lock-delay.

use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::consul::{Client, ConnConfig};
use crate::holder::Claim;
use crate::ui;

pub const GUARDIAN_ARG: &str = "__guardian";

/// What the guardian must give back if conlock dies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum ClaimInfo {
    Lock { key: String },
    Semaphore { prefix: String, limit: u32 },
}

#[derive(Debug, Serialize, Deserialize)]
enum Msg {
    Conn(Box<ConnConfig>),
    Session(String),
    ProcessGroup(i32),
    Claim(ClaimInfo),
    Done,
}

/// conlock's end of the pipe.
pub struct Guardian {
    pipe: Mutex<Option<ChildStdin>>,
}

impl Guardian {
    /// Starts the guardian; `None` (with a warning) if that is impossible.
    pub fn start(conn: &ConnConfig) -> Option<Arc<Guardian>> {
        let spawned = Command::new("/proc/self/exe")
            .arg(GUARDIAN_ARG)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            // Its own group: a signal to conlock's group must not take the guardian along.
            .process_group(0)
            .spawn();
        match spawned {
            Ok(mut child) => {
                let g = Arc::new(Guardian {
                    pipe: Mutex::new(child.stdin.take()),
                });
                g.send(&Msg::Conn(Box::new(conn.clone())));
                Some(g)
            }
            Err(e) => {
                ui::warn(format_args!(
                    "cannot start the guardian process ({e}); if conlock is killed, its command may outlive it"
                ));
                None
            }
        }
    }

    pub fn session(&self, id: &str) {
        self.send(&Msg::Session(id.to_string()));
    }

    pub fn process_group(&self, pgid: i32) {
        self.send(&Msg::ProcessGroup(pgid));
    }

    pub fn claim(&self, claim: ClaimInfo) {
        self.send(&Msg::Claim(claim));
    }

    /// Everything ended normally: the guardian exits without doing anything.
    pub fn done(&self) {
        self.send(&Msg::Done);
        self.pipe.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn send(&self, msg: &Msg) {
        let mut pipe = self.pipe.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = pipe.as_mut() {
            let mut line = serde_json::to_vec(msg).expect("guardian message");
            line.push(b'\n');
            if p.write_all(&line).and_then(|_| p.flush()).is_err() {
                ui::warn("the guardian process is gone; if conlock is killed, its command may outlive it");
                pipe.take();
            }
        }
    }
}

/// Entry point of `conlock __guardian`.
pub fn main() -> i32 {
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGHUP,
        libc::SIGQUIT,
        libc::SIGTSTP,
        libc::SIGTTIN,
        libc::SIGTTOU,
        libc::SIGPIPE,
    ] {
        unsafe {
            libc::signal(sig, libc::SIG_IGN);
        }
    }
    let (mut conn, mut session, mut pgid, mut claim) = (None, None, None, None);
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        match serde_json::from_str::<Msg>(&line) {
            Ok(Msg::Done) => return 0,
            Ok(Msg::Conn(c)) => conn = Some(c),
            Ok(Msg::Session(s)) => session = Some(s),
            Ok(Msg::ProcessGroup(p)) => pgid = Some(p),
            Ok(Msg::Claim(c)) => claim = Some(c),
            Err(_) => {}
        }
    }
    // The pipe closed without `done`: conlock died.
    if let Some(p) = pgid.filter(|&p| p > 1) {
        let group = Pid::from_raw(-p);
        let _ = kill(group, Signal::SIGKILL);
        let until = Instant::now() + Duration::from_secs(10);
        while kill(group, None).is_ok() {
            if Instant::now() >= until {
                eprintln!("conlock guardian: process group {p} survived SIGKILL; leaving the session to expire");
                return 1;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        eprintln!("conlock guardian: conlock died; killed its command's process group {p}");
    }
    let (Some(conn), Some(session)) = (conn, session) else {
        return 0;
    };
    let Ok(client) = Client::new(*conn) else {
        return 1;
    };
    if let Some(c) = claim {
        let claim: Box<dyn Claim> = match c {
            ClaimInfo::Lock { key } => Box::new(crate::lock::Lock::new(
                key,
                crate::holder::HolderValue::Given(Vec::new()),
            )),
            ClaimInfo::Semaphore { prefix, limit } => Box::new(crate::semaphore::Semaphore {
                prefix,
                limit,
                value: crate::holder::HolderValue::Given(Vec::new()),
            }),
        };
        ui::set_level(ui::Level::Quiet);
        claim.release(&client, &session);
    }
    if client.session_destroy(&session).is_ok() && pgid.is_some() {
        eprintln!("conlock guardian: released the lock and destroyed session {session}");
    }
    0
}
