//! The command to run: found and checked before anything is acquired, so that a typo
//! fails fast (127/126) instead of after waiting for the lock.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::Signal;

use crate::error::{Error, Result};
use crate::ui;

/// A command ready to spawn: the program was found and is executable.
#[derive(Debug, Clone)]
pub struct Program {
    pub path: PathBuf,
    pub argv: Vec<OsString>,
    /// For messages and the default session name.
    pub display: String,
}

/// Resolves the command before anything else happens, so that a typo fails fast (127/126)
/// instead of after waiting for the lock.
pub fn resolve(command: &[OsString], shell: bool) -> Result<Program> {
    let Some(first) = command.first() else {
        return Err(Error::Usage("no command given after --".into()));
    };
    if first.is_empty() {
        return Err(Error::Usage("the command is an empty string".into()));
    }
    let display = command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    if shell {
        let sh = std::env::var_os("SHELL")
            .filter(|s| !s.is_empty() && Path::new(s).is_absolute() && is_executable(Path::new(s)))
            .unwrap_or_else(|| OsString::from("/bin/sh"));
        let script = OsString::from(&display);
        return Ok(Program {
            path: PathBuf::from(&sh),
            argv: vec![sh, OsString::from("-c"), script],
            display,
        });
    }
    let path = find_program(first)?;
    Ok(Program {
        path,
        argv: command.to_vec(),
        display,
    })
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

fn find_program(name: &OsStr) -> Result<PathBuf> {
    let raw = name.to_string_lossy();
    // Quoted as typed, so that a whole shell line does not read as one.
    let shown = ui::shell_quote(&raw);
    // A whole shell line given as one word is the usual `consul lock` habit.
    let hint =
        if raw.contains(|c: char| c.is_whitespace() || "|&;<>()$`\\\"'*?[]#~=%{}!".contains(c)) {
            " (a whole shell line? use --shell)"
        } else {
            ""
        };
    let check = |p: &Path| -> Result<PathBuf> {
        let meta = std::fs::metadata(p)
            .map_err(|_| Error::NotFound(format!("command not found: {shown}{hint}")))?;
        if meta.is_dir() {
            return Err(Error::NotExecutable(format!(
                "{shown} is a directory, not a command"
            )));
        }
        if meta.permissions().mode() & 0o111 == 0 {
            return Err(Error::NotExecutable(format!(
                "{shown} is not executable (check its permissions)"
            )));
        }
        if let Some(interp) = missing_interpreter(p) {
            return Err(Error::NotFound(format!(
                "interpreter {} of script {} not found (check its #! line)",
                interp.display(),
                p.display()
            )));
        }
        Ok(p.to_path_buf())
    };
    if name.as_bytes().contains(&b'/') {
        return check(Path::new(name));
    }
    let path_var =
        std::env::var_os("PATH").unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    let mut first_err = None;
    for dir in std::env::split_paths(&path_var) {
        let candidate = dir.join(name);
        match check(&candidate) {
            Ok(p) => return Ok(p),
            Err(Error::NotExecutable(m)) if candidate.is_file() => {
                first_err.get_or_insert(Error::NotExecutable(m));
            }
            Err(_) => {}
        }
    }
    Err(first_err.unwrap_or_else(|| {
        Error::NotFound(format!("command not found: {shown} (searched PATH){hint}"))
    }))
}

/// The `#!` interpreter of script `p` when it does not exist (exec would fail with
/// ENOENT, which reads as if the script itself were missing).
fn missing_interpreter(p: &Path) -> Option<PathBuf> {
    use std::io::Read;
    let mut head = [0u8; 256];
    let n = std::fs::File::open(p).ok()?.read(&mut head).ok()?;
    let line = head[..n].strip_prefix(b"#!")?;
    let line = line.split(|&b| b == b'\n').next()?;
    let text = std::str::from_utf8(line).ok()?.trim();
    let interp = PathBuf::from(text.split_whitespace().next()?);
    (interp.is_absolute() && !interp.exists()).then_some(interp)
}

/// Parses `TERM`, `SIGTERM`, `sigterm` or `15`.
pub fn parse_signal(s: &str) -> std::result::Result<Signal, String> {
    let t = s.trim();
    if let Ok(n) = t.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| format!("unknown signal number {n}"));
    }
    let upper = t.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>()
        .map_err(|_| format!("unknown signal {s:?} (try TERM, INT, HUP or a number)"))
}
