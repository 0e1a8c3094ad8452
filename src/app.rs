//! Turns parsed arguments into a run: validation first (no request is made for bad
//! input), then the Consul client, then the command.

use std::sync::Arc;
use std::time::Duration;

use crate::claim::etcd_lock::EtcdLock;
use crate::claim::etcd_semaphore::EtcdSemaphore;
use crate::claim::lock::Lock;
use crate::claim::semaphore::Semaphore;
use crate::claim::{HolderValue, MonitorPolicy, Store};
use crate::cli::{
    Backend, Behavior, Cli, Command, ConnArgs, HoldArgs, Kind, RunArgs, SemArgs, TargetArgs,
};
use crate::consul::{Client, ConnConfig, ConnFlags, CONSUL_MAX_LOCK_DELAY};
use crate::error::{Error, Result};
use crate::hold::program;
use crate::hold::session::SessionSpec;
use crate::hold::supervise::StopPolicy;
use crate::hold::{self, HoldSpec};
use crate::ops;
use crate::ui;

pub mod man;

pub const TTL_MIN: Duration = Duration::from_secs(10);
/// etcd's least lease TTL with its default election timeout (it raises shorter ones).
pub const ETCD_TTL_MIN: Duration = Duration::from_secs(2);
pub const TTL_MAX: Duration = Duration::from_secs(24 * 3600);
/// Consul's limit on a KV value.
pub const MAX_VALUE_BYTES: usize = 512 * 1024;
/// How much of the command the default value records (at most 16 KiB of UTF-8).
pub const MAX_COMMAND_CHARS: usize = 4096;

/// Runs a parsed command line and returns the process exit code.
pub fn run(cli: Cli) -> Result<i32> {
    ui::set_level(if cli.output.quiet {
        ui::Level::Quiet
    } else if cli.output.verbose {
        ui::Level::Verbose
    } else {
        ui::Level::Normal
    });
    // Connection options may come before the subcommand (as in `conlock --http-addr X
    // run …`) or after it; after wins. Other subcommands do not talk to Consul.
    match &cli.command {
        Command::Run(_)
        | Command::Sem(_)
        | Command::Status(_)
        | Command::Watch(_)
        | Command::Break(_) => {}
        _ => {
            if let Some(flag) = cli.conn.first_given() {
                return Err(Error::Usage(format!(
                    "{flag} applies to run, sem, status, watch and break, not to this subcommand"
                )));
            }
        }
    }
    match cli.command {
        Command::Run(args) => run_lock(&args.conn.or(&cli.conn), args),
        Command::Sem(args) => run_sem(&args.conn.or(&cli.conn), args),
        Command::Status(args) => {
            let conn = args.conn.or(&cli.conn);
            let t = target_on(&conn, &args.target)?;
            ops::status::run(&client(&conn)?, &t, args.json)
        }
        Command::Watch(args) => {
            let conn = args.conn.or(&cli.conn);
            let t = target_on(&conn, &args.target)?;
            let c = client(&conn)?;
            ops::watch::run(&c, &t, args.json, &args.handler)
        }
        Command::Break(args) => {
            let conn = args.conn.or(&cli.conn);
            let t = target_on(&conn, &args.target)?;
            let c = client(&conn)?;
            ops::brk::run(&c, &t, args.session.as_deref(), args.yes)
        }
        Command::DevServer(a) => {
            crate::devserver::run_foreground(crate::devserver::Options {
                addr: a.addr,
                session_ttl_min: a.session_ttl_min,
                acl_token: a.acl_token,
                node_name: a.node_name,
            })
            .map_err(|e| match e.downcast::<ui::StdoutError>() {
                Ok(e) => Error::Stdout(e),
                Err(e) => Error::Other(e),
            })?;
            Ok(0)
        }
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            // Into memory first: clap_complete panics when its writer fails.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, "conlock", &mut script);
            match shell {
                // clap's bash script knows nothing after `--` (zsh's uses the value
                // hint): complete the command there, as for sudo and timeout.
                clap_complete::Shell::Bash => {
                    script.extend_from_slice(BASH_COMMAND_AFTER_DASHES.as_bytes());
                }
                // clap's fish script offers file names after `--` and for positionals
                // with fixed values (conlock man, completions).
                clap_complete::Shell::Fish => script = fish_script(&script, &cmd),
                _ => {}
            }
            ui::out(script)?;
            Ok(0)
        }
        Command::Man { subcommand } => {
            ui::out(man::page(subcommand.as_deref())?)?;
            Ok(0)
        }
    }
}

/// clap's fish script, with every completion off after `--`, where the command line that
/// follows is completed as fish completes it (as for sudo); and the fixed values of
/// positionals (`conlock man run`, `conlock completions fish`) without file names.
fn fish_script(generated: &[u8], cmd: &clap::Command) -> Vec<u8> {
    let text = String::from_utf8_lossy(generated)
        .replace(" -n \"", " -n \"not __fish_conlock_after_dashes; and ");
    let mut out = text;
    out.push_str(FISH_COMMAND_AFTER_DASHES);
    for sub in cmd.get_subcommands() {
        for arg in sub.get_positionals() {
            let values: Vec<String> = arg
                .get_possible_values()
                .iter()
                .filter(|v| !v.is_hide_set())
                .map(|v| v.get_name().to_string())
                .collect();
            if values.is_empty() {
                continue;
            }
            let list = values.join(" ");
            // No file names for it (its only argument is one of these values).
            out.push_str(&format!(
                "complete -c conlock -n \"not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand {}\" -f\n",
                sub.get_name()
            ));
            out.push_str(&format!(
                "complete -c conlock -n \"not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand {}; and not __fish_seen_subcommand_from {list}\" -f -a \"{list}\"\n",
                sub.get_name()
            ));
        }
    }
    out.into_bytes()
}

/// Appended to clap's fish completion: after `--` (run, sem, watch), a command line.
const FISH_COMMAND_AFTER_DASHES: &str = r#"
# After `--` (run, sem, watch): the command and its arguments, as fish completes them.
function __fish_conlock_after_dashes
    contains -- -- (commandline -opc)
end

function __fish_conlock_command_after_dashes
    set -l tokens (commandline -opc)
    set -l i (contains -i -- -- $tokens)
    set -l rest $tokens[(math $i + 1)..-1]
    complete -C (string join ' ' -- (string escape -- $rest) (commandline -ct))
end

complete -c conlock -n __fish_conlock_after_dashes -f -a '(__fish_conlock_command_after_dashes)'
"#;

/// Appended to clap's bash completion: after `--` (run, sem, watch), a command line.
/// bash-completion's `_command_offset` completes it as `sudo` does; without it, command
/// names, then file names.
const BASH_COMMAND_AFTER_DASHES: &str = r#"
_conlock_command() {
    local i
    for ((i = 1; i < COMP_CWORD; i++)); do
        if [[ ${COMP_WORDS[i]} == -- ]]; then
            if declare -F _command_offset >/dev/null; then
                _command_offset $((i + 1))
            elif ((COMP_CWORD == i + 1)); then
                COMPREPLY=($(compgen -c -- "${COMP_WORDS[COMP_CWORD]}" | sort -u))
            else
                COMPREPLY=($(compgen -f -- "${COMP_WORDS[COMP_CWORD]}"))
            fi
            return 0
        fi
    done
    _conlock "$@"
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _conlock_command -o nosort -o bashdefault -o default conlock
else
    complete -F _conlock_command -o bashdefault -o default conlock
fi
"#;

fn run_lock(conn: &ConnArgs, args: RunArgs) -> Result<i32> {
    let backend = backend(conn)?;
    if backend == Backend::Etcd {
        return run_etcd_lock(conn, args);
    }
    let key = match (&args.key, &args.prefix) {
        (Some(k), _) => normalize_key(k, "--key")?,
        (None, Some(p)) => format!("{}/.lock", normalize_key(p, "--prefix")?),
        (None, None) => return Err(Error::Usage("give --key or --prefix".into())),
    };
    let behavior = match args.behavior.unwrap_or(Behavior::Release) {
        Behavior::Release => "release",
        Behavior::Delete => "delete",
    };
    let mut prepared = prepare(conn, &args.hold, behavior)?;
    crate::events::install(prepared.events.take(), "lock", &key, &prepared.about);
    let value = prepared.value.clone();
    let lock = Lock::new(key, value);
    hold::hold(&prepared.client, prepared.spec, Arc::new(lock))
}

/// `run --backend etcd`: the lock `NAME` of `etcdctl lock NAME`.
/// How long a run that ends waits for its look at the server's version (a request
/// normally answered in a millisecond, bounded by the request timeout).
const SERVER_CHECK_WAIT: Duration = Duration::from_secs(1);

fn run_etcd_lock(conn: &ConnArgs, args: RunArgs) -> Result<i32> {
    if args.prefix.is_some() {
        return Err(Error::Usage(
            "--prefix names a `consul lock` prefix; on etcd name the lock with --key NAME (the NAME of `etcdctl lock NAME`)".into(),
        ));
    }
    if args.behavior.is_some() {
        return Err(not_on_etcd("--behavior"));
    }
    let Some(raw) = &args.key else {
        return Err(Error::Usage("give --key NAME".into()));
    };
    let name = etcd_name(raw)?;
    let mut prepared = prepare(conn, &args.hold, "delete")?;
    crate::events::install(prepared.events.take(), "lock", &name, &prepared.about);
    // Once per run, off the critical path: what the server's version is known to get wrong.
    let check = prepared.client.warn_known_server_bugs();
    let lock = EtcdLock::new(name, prepared.value.clone());
    let code = hold::hold(&prepared.client, prepared.spec, Arc::new(lock));
    check.finish(SERVER_CHECK_WAIT);
    code
}

/// The store `--backend` (or CONLOCK_BACKEND) names, and its options checked: another
/// store's options are refused, naming the first one given.
pub fn backend(conn: &ConnArgs) -> Result<Backend> {
    let backend = match conn.backend {
        Some(b) => b,
        None => match std::env::var("CONLOCK_BACKEND") {
            Ok(v) if v.trim().is_empty() => Backend::Consul,
            Ok(v) => match v.trim() {
                "consul" => Backend::Consul,
                "etcd" => Backend::Etcd,
                other => {
                    return Err(Error::Usage(format!(
                        "CONLOCK_BACKEND={other:?} is not a backend: use consul or etcd"
                    )))
                }
            },
            Err(_) => Backend::Consul,
        },
    };
    match backend {
        Backend::Etcd => {
            if let Some(flag) = conn.first_consul_given() {
                return Err(not_on_etcd(flag));
            }
        }
        Backend::Consul => {
            if let Some(flag) = conn.first_etcd_given() {
                return Err(Error::Usage(format!(
                    "{flag} is an etcd option; give --backend etcd (or CONLOCK_BACKEND=etcd) to use etcd"
                )));
            }
        }
    }
    Ok(backend)
}

fn not_on_etcd(flag: &str) -> Error {
    Error::Usage(format!(
        "{flag} is a Consul option and does not apply with --backend etcd (etcd's connection options: --endpoints, --etcd-cacert, --etcd-cert, --etcd-key, --etcd-user, --etcd-password)"
    ))
}

/// The target of an operator command on the backend the flags name. On etcd names are
/// kept as given (as etcdctl does) and a lock is `NAME` itself: `--key NAME` or
/// `--prefix NAME --kind lock`.
fn target_on(conn: &ConnArgs, a: &TargetArgs) -> Result<ops::Target> {
    if backend(conn)? != Backend::Etcd {
        return target(a);
    }
    match (&a.key, &a.prefix, a.kind) {
        (Some(_), _, Kind::Semaphore) => Err(Error::Usage(
            "--kind semaphore needs --prefix: a semaphore is a prefix, not a key".into(),
        )),
        (Some(k), _, _) => Ok(ops::Target::Key(etcd_name(k)?)),
        (None, Some(p), kind) => {
            let p = p.trim_end_matches('/');
            if p.is_empty() {
                return Err(Error::Usage(
                    "--prefix names no lock or semaphore: give a name such as jobs/backup".into(),
                ));
            }
            let p = etcd_name(p)?;
            Ok(match kind {
                Kind::Auto => ops::Target::Prefix(p),
                Kind::Lock => ops::Target::Key(p),
                Kind::Semaphore => ops::Target::Semaphore(p),
            })
        }
        (None, None, _) => Err(Error::Usage("give --key or --prefix".into())),
    }
}

fn run_sem(conn: &ConnArgs, args: SemArgs) -> Result<i32> {
    if backend(conn)? == Backend::Etcd {
        return run_etcd_sem(conn, args);
    }
    let prefix = normalize_key(&args.prefix, "--prefix")?;
    let mut prepared = prepare(conn, &args.hold, "delete")?;
    crate::events::install(
        prepared.events.take(),
        "semaphore",
        &prefix,
        &prepared.about,
    );
    let sem = Semaphore {
        prefix,
        limit: args.limit,
        value: prepared.value.clone(),
    };
    hold::hold(&prepared.client, prepared.spec, Arc::new(sem))
}

/// `sem --backend etcd`: conlock's own semaphore layout under `P/` (docs/safety.md).
fn run_etcd_sem(conn: &ConnArgs, args: SemArgs) -> Result<i32> {
    // `P/` names the same semaphore as `P` (its keys are `P/<lease hex>` either way).
    let prefix = args.prefix.trim_end_matches('/');
    if prefix.is_empty() {
        return Err(Error::Usage(format!(
            "--prefix {:?} names no semaphore: give a name such as jobs/backup",
            args.prefix
        )));
    }
    if prefix.chars().any(|c| c.is_control()) {
        return Err(Error::Usage(format!(
            "--prefix {prefix:?} contains control characters"
        )));
    }
    let prefix = prefix.to_string();
    let mut prepared = prepare(conn, &args.hold, "delete")?;
    crate::events::install(
        prepared.events.take(),
        "semaphore",
        &prefix,
        &prepared.about,
    );
    let check = prepared.client.warn_known_server_bugs();
    let sem = EtcdSemaphore::new(prefix, args.limit, prepared.value.clone());
    let code = hold::hold(&prepared.client, prepared.spec, Arc::new(sem));
    check.finish(SERVER_CHECK_WAIT);
    code
}

/// The lock or semaphore an operator command names.
fn target(a: &TargetArgs) -> Result<ops::Target> {
    match (&a.key, &a.prefix, a.kind) {
        (Some(_), _, Kind::Semaphore) => Err(Error::Usage(
            "--kind semaphore needs --prefix: a semaphore is a prefix, not a key".into(),
        )),
        (Some(k), _, _) => Ok(ops::Target::Key(normalize_key(k, "--key")?)),
        (None, Some(p), kind) => {
            let p = normalize_key(p, "--prefix")?;
            Ok(match kind {
                Kind::Auto => ops::Target::Prefix(p),
                Kind::Lock => ops::Target::Key(format!("{p}/.lock")),
                Kind::Semaphore => ops::Target::Semaphore(p),
            })
        }
        (None, None, _) => Err(Error::Usage("give --key or --prefix".into())),
    }
}

/// The validated parts of `run` and `sem` that do not depend on the claim.
pub struct Prepared {
    pub client: Store,
    pub spec: HoldSpec,
    pub value: HolderValue,
    /// `--events`, opened; installed once the target is known.
    pub events: Option<crate::events::Sink>,
    /// The host and the command, for every `--events` line.
    pub about: crate::events::About,
}

/// Validates the shared options and builds the client; makes no request.
/// etcd's default lease checkpoint interval: with checkpointing on, only leases with a
/// longer TTL are checkpointed (and can get a stale TTL back after a leader change).
const ETCD_CHECKPOINT_INTERVAL: Duration = Duration::from_secs(300);

pub fn prepare(conn: &ConnArgs, hold: &HoldArgs, behavior: &'static str) -> Result<Prepared> {
    let etcd = backend(conn)? == Backend::Etcd;
    if etcd {
        let consul_only = [
            (hold.session_name.is_some(), "--session-name"),
            (!hold.checks.is_empty(), "--check"),
            (hold.no_checks, "--no-checks"),
        ];
        if let Some((_, flag)) = consul_only.iter().find(|(given, _)| *given) {
            return Err(not_on_etcd(flag));
        }
        if hold.ttl < ETCD_TTL_MIN || hold.ttl > TTL_MAX {
            return Err(Error::Usage(format!(
                "--ttl {} is out of range: on etcd conlock accepts 2s to 24h",
                crate::duration::format(hold.ttl)
            )));
        }
        if hold.ttl > ETCD_CHECKPOINT_INTERVAL {
            ui::warn(format_args!(
                "--ttl {} is over {}: if etcd runs with --experimental-enable-lease-checkpoint, a leader change can restore a stale remaining TTL and end the lease before conlock's deadline (docs/safety.md, E1); keep --ttl at {} or less there",
                crate::duration::format(hold.ttl),
                crate::duration::format(ETCD_CHECKPOINT_INTERVAL),
                crate::duration::format(ETCD_CHECKPOINT_INTERVAL)
            ));
        }
    } else if hold.ttl < TTL_MIN || hold.ttl > TTL_MAX {
        return Err(Error::Usage(format!(
            "--ttl {} is out of range: Consul accepts 10s to 24h",
            crate::duration::format(hold.ttl)
        )));
    }
    if hold.max_time == Some(Duration::ZERO) {
        return Err(Error::Usage(
            "--max-time must be longer than 0s (leave it out for no limit)".into(),
        ));
    }
    let kill_signal = program::parse_signal(&hold.kill_signal)
        .map_err(|e| Error::Usage(format!("--kill-signal: {e}")))?;
    let program = program::resolve(&hold.command, hold.shell)?;
    let host = hostname();
    // Consul applies at most 60 s of lock-delay: promising more would be a lie that
    // the kill-grace check below would then rely on. On etcd the cushion is conlock's
    // own (kept by conlock waiters), without a cap.
    let lock_delay = if !etcd && hold.lock_delay > CONSUL_MAX_LOCK_DELAY {
        ui::warn(format_args!(
            "--lock-delay {} is more than Consul applies (it caps lock-delays at {}); using {}",
            crate::duration::format(hold.lock_delay),
            crate::duration::format(CONSUL_MAX_LOCK_DELAY),
            crate::duration::format(CONSUL_MAX_LOCK_DELAY)
        ));
        CONSUL_MAX_LOCK_DELAY
    } else {
        hold.lock_delay
    };
    let value = match (&hold.value, &hold.value_file) {
        (Some(v), _) => HolderValue::Given(v.clone().into_bytes()),
        (None, Some(path)) => HolderValue::Given(
            crate::readfile::read_bounded(
                path,
                MAX_VALUE_BYTES as u64,
                "512 KiB, Consul's value limit",
            )
            .map_err(|e| Error::Usage(format!("--value-file {}: {e}", path.display())))?,
        ),
        // The command is cut so that a huge command line still fits Consul's value limit.
        (None, None) => HolderValue::Default {
            host: host.clone(),
            command: truncate(&program.display, MAX_COMMAND_CHARS),
            lock_delay: crate::duration::format(lock_delay),
        },
    };
    let size = value.bytes().len();
    if size > MAX_VALUE_BYTES {
        return Err(Error::Usage(format!(
            "the value is {size} bytes; Consul's limit is {MAX_VALUE_BYTES} bytes (512 KiB)"
        )));
    }
    // Builds the client (no request yet): the store sets the renewal rhythm.
    let client = client(conn)?;
    let checks = if hold.no_checks {
        Some(Vec::new())
    } else if hold.checks.is_empty() {
        None
    } else {
        Some(hold.checks.clone())
    };
    let session = SessionSpec {
        name: hold
            .session_name
            .clone()
            .unwrap_or_else(|| format!("conlock: {} on {host}", truncate(&program.display, 200))),
        ttl: hold.ttl,
        lock_delay,
        behavior,
        checks,
        kill_grace: hold.kill_grace,
        renew_every: client.renew_every(hold.ttl),
        expiry_delay: client.expiry_delay(lock_delay),
    };
    session.check_timing().map_err(Error::Usage)?;
    let events = match &hold.events {
        Some(spec) => Some(crate::events::Sink::open(spec).map_err(Error::Usage)?),
        None => None,
    };
    let about = crate::events::About {
        host: host.clone(),
        command: truncate(&program.display, MAX_COMMAND_CHARS),
    };
    Ok(Prepared {
        client,
        value,
        events,
        about,
        spec: HoldSpec {
            program,
            session,
            timeout: hold.timeout,
            busy_exit_code: i32::from(hold.busy_exit_code),
            stop: StopPolicy {
                kill_signal,
                grace: hold.kill_grace,
            },
            monitor: MonitorPolicy {
                retries: hold.monitor_retry,
                retry_time: hold.monitor_retry_time,
                min_gap: Duration::ZERO,
            },
            min_hold: hold.min_hold.filter(|d| !d.is_zero()),
            max_time: hold.max_time,
            unguarded: hold.unguarded,
        },
    })
}

/// The store the flags name; makes no request.
pub fn client(conn: &ConnArgs) -> Result<Store> {
    if backend(conn)? == Backend::Etcd {
        let flags = crate::etcd::EtcdFlags {
            endpoints: conn.endpoints.clone(),
            cacert: conn.etcd_cacert.clone(),
            cert: conn.etcd_cert.clone(),
            key: conn.etcd_key.clone(),
            user: conn.etcd_user.clone(),
            password: conn.etcd_password.clone(),
            insecure_skip_tls_verify: None,
        };
        let cfg =
            crate::etcd::EtcdConfig::from_env(&flags).map_err(|e| Error::Usage(e.to_string()))?;
        let c = crate::etcd::EtcdClient::new(cfg).map_err(|e| Error::Usage(e.to_string()))?;
        return Ok(Store::Etcd(c));
    }
    let flags = ConnFlags {
        http_addr: conn.http_addr.clone(),
        token: conn.token.clone(),
        token_file: conn.token_file.clone(),
        ca_file: conn.ca_file.clone(),
        ca_path: conn.ca_path.clone(),
        client_cert: conn.client_cert.clone(),
        client_key: conn.client_key.clone(),
        datacenter: conn.datacenter.clone(),
        namespace: conn.namespace.clone(),
        tls_server_name: conn.tls_server_name.clone(),
    };
    let cfg = ConnConfig::from_env(&flags)?;
    Ok(Store::Consul(Client::new(cfg)?))
}

/// An etcd lock name, kept as given: etcd keys are plain bytes, and `etcdctl lock /a`
/// and `etcdctl lock a` are different locks.
pub fn etcd_name(raw: &str) -> Result<String> {
    if raw.is_empty() {
        return Err(Error::Usage("--key must not be empty".into()));
    }
    if raw.chars().any(|c| c.is_control()) {
        return Err(Error::Usage(format!(
            "--key {raw:?} contains control characters"
        )));
    }
    Ok(raw.to_string())
}

/// Strips leading slashes as `consul lock` does; rejects keys that name nothing.
pub fn normalize_key(raw: &str, flag: &str) -> Result<String> {
    let k = raw.trim_start_matches('/');
    let k = if flag == "--prefix" {
        k.trim_end_matches('/')
    } else {
        k
    };
    if k.is_empty() {
        return Err(Error::Usage(format!("{flag} must not be empty")));
    }
    if k.chars().any(|c| c.is_control()) {
        return Err(Error::Usage(format!(
            "{flag} {raw:?} contains control characters"
        )));
    }
    // Consul's HTTP server (Go's ServeMux) answers a path with `//`, `.` or `..` segments
    // with a redirect to the cleaned path, so such a key can never be locked. A trailing
    // `/` on --key is kept: Consul stores such keys as given.
    let inner = k.strip_suffix('/').unwrap_or(k);
    if let Some(seg) = inner
        .split('/')
        .find(|s| s.is_empty() || *s == "." || *s == "..")
    {
        let what = if seg.is_empty() {
            "an empty segment (//)".to_string()
        } else {
            format!("a {seg:?} segment")
        };
        return Err(Error::Usage(format!(
            "{flag} {raw:?} has {what}: Consul cannot store such a key"
        )));
    }
    Ok(k.to_string())
}

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

pub fn hostname() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown-host".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_names_are_kept_as_given() {
        assert_eq!(etcd_name("/jobs/x").unwrap(), "/jobs/x");
        assert_eq!(etcd_name("a//b").unwrap(), "a//b");
        assert!(etcd_name("").is_err());
        assert!(etcd_name("a\nb").is_err());
    }

    #[test]
    fn keys_are_normalized() {
        assert_eq!(normalize_key("/a/b", "--key").unwrap(), "a/b");
        assert_eq!(normalize_key("//p/", "--prefix").unwrap(), "p");
        assert!(normalize_key("", "--key").is_err());
        assert!(normalize_key("///", "--prefix").is_err());
        assert_eq!(
            normalize_key("with space/ü", "--key").unwrap(),
            "with space/ü"
        );
        assert_eq!(normalize_key("a/b/", "--key").unwrap(), "a/b/");
        for bad in ["a/../b", "a/./b", "a//b", "..", ".", "a/..", "./a"] {
            assert!(normalize_key(bad, "--key").is_err(), "{bad}");
            assert!(normalize_key(bad, "--prefix").is_err(), "{bad}");
        }
        assert!(normalize_key("a//", "--key").is_err());
        assert_eq!(normalize_key("a//", "--prefix").unwrap(), "a");
    }
}
