//! Command-line definitions (clap only; no behaviour here).

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

const EXIT_CODES: &str = "\
Exit codes:
  N        the command's own exit code
  128+N    the command died of signal N
  75       busy: not acquired within --timeout (see --busy-exit-code)
  123      the command ran longer than --max-time and was stopped
  124      the lock or slot was lost while the command ran
  125      conlock's own error: usage (also timings it cannot keep safe), Consul
           unreachable, ACL denied, key conflict
  126      the command is not executable
  127      the command was not found";

/// Only for the subcommands that write to stdout (run's stdout is the command's).
const CLOSED_STDOUT: &str =
    "  141      stdout was closed before all was written (status, watch, break,
           completions, man, --help into `| head -1`)";

const ENVIRONMENT: &str = "\
Environment (flags win over variables):
  CONSUL_HTTP_ADDR         agent address (--http-addr)
  CONSUL_HTTP_SSL          true: host:port without a scheme means https://
  CONSUL_HTTP_SSL_VERIFY   false: do not verify the agent's certificate (testing only)
  CONSUL_TLS_SERVER_NAME   name to expect in the agent's certificate (--tls-server-name)
  CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE, CONSUL_CACERT, CONSUL_CAPATH,
  CONSUL_CLIENT_CERT, CONSUL_CLIENT_KEY, CONSUL_DATACENTER, CONSUL_NAMESPACE
  CONLOCK_BACKEND          consul (default) or etcd (--backend)
  ETCDCTL_ENDPOINTS, ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER,
  ETCDCTL_PASSWORD         etcd (--endpoints, --etcd-cacert, --etcd-cert, --etcd-key,
                           --etcd-user, --etcd-password)";

const TOP_EXAMPLES: &str = "\
Examples:
  conlock run --key service/x/leader -- ./job      # one holder at a time
  conlock sem --limit 2 --prefix db -- ./worker    # at most 2 at once
  conlock status --prefix service/x                # who holds it
  conlock dev-server                               # a local Consul-compatible server for trying it";

const LEFTOVERS: &str = "When the command exits, processes it left running in the background \
(in its process group, or escaped with setsid) are stopped (--kill-signal, --kill-grace, \
SIGKILL) before the claim is released, and conlock says so; flock and consul lock leave \
them running.";

const COMMAND_ENV: &str = "\
The command gets (besides conlock's own environment):
  CONSUL_LOCK_HELD=true     as `consul lock` sets it
  CONLOCK_KEY               the lock key (sem: this holder's contender key)
  CONLOCK_SESSION           the Consul session holding it
  CONLOCK_MODIFY_INDEX      the fencing token: grows strictly from holder to holder
  CONLOCK_FENCING_TOKEN     the same value, under a name that does not name Consul
  CONLOCK_LOCK_INDEX        Consul's LockIndex (not a safe fencing token)
  CONLOCK_PREFIX, CONLOCK_LIMIT   sem only: the semaphore's prefix and limit
On etcd (--backend etcd): CONLOCK_KEY (the lock's name), CONLOCK_SESSION (the lease, in
hex), CONLOCK_FENCING_TOKEN (the key's create revision), and as etcdctl lock sets them
ETCD_LOCK_KEY (NAME/<lease hex>) and ETCD_LOCK_REV; not the Consul variables above";

const RUN_EXAMPLES: &str = "\
Examples:
  conlock run --key service/x/leader -- ./job
  conlock run --prefix backup --timeout 0s -- ./backup.sh     # skip if busy (exit 75)
  conlock run --key k --shell -- 'pg_dump db | gzip > /backup/db.gz'";

const SEM_EXAMPLES: &str = "\
Examples:
  conlock sem --limit 2 --prefix db -- ./worker
  conlock sem --limit 4 --prefix batch --timeout 10m -- ./import.sh";

#[derive(Debug, Parser)]
#[command(
    name = "conlock",
    version,
    about = "Run a command while holding a Consul lock or semaphore slot",
    long_about = "Run a command while holding a Consul lock (leader election) or one of N semaphore \
slots. Wire-compatible with `consul lock`: both exclude each other on the same prefix.",
    after_help = format!("{TOP_EXAMPLES}\n\n{EXIT_CODES}\n{CLOSED_STDOUT}\n\n{ENVIRONMENT}"),
    propagate_version = true
)]
pub struct Cli {
    #[command(flatten)]
    pub conn: ConnArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
// Only the subcommand given is built: building all of them was most of clap's start-up.
#[command(defer = true)]
pub enum Command {
    /// Run a command while holding a lock (one holder at a time)
    #[command(
        long_about = format!("Run a command while holding a lock (one holder at a time).\n\n{LEFTOVERS}"),
        after_help = format!("{RUN_EXAMPLES}\n\n{COMMAND_ENV}\n\n{EXIT_CODES}\n\n{ENVIRONMENT}")
    )]
    Run(RunArgs),
    /// Run a command while holding one of N semaphore slots
    #[command(
        long_about = format!("Run a command while holding one of N semaphore slots.\n\n{LEFTOVERS}"),
        after_help = format!("{SEM_EXAMPLES}\n\n{COMMAND_ENV}\n\n{EXIT_CODES}\n\n{ENVIRONMENT}")
    )]
    Sem(SemArgs),
    /// Show who holds a lock or semaphore (exit 0 held, 1 free, 2 maybe in lock-delay)
    #[command(
        after_help = "Examples:\n  conlock status --prefix service/x\n  conlock status --prefix db --kind semaphore --json | jq .holders\n\n\
Exit codes:\n  0    held\n  1    free (no holder and no lock-delay that status can see; a `consul lock` holder\n       deletes its key when it loses it, so a lock-delay after that does not show)\n  2    free, but in a lock-delay: the last holder's session was invalidated (lost,\n       broken, expired), not released. After a loss or a `break`, a conlock holder's\n       key says until when (shown; exit 1 once it has passed); otherwise it may run up\n       to that session's lock-delay. `run --timeout 0s` is the authoritative test.\n       etcd: the last conlock holder did not release (its holder record says so):\n       etcdctl may take the lock, conlock waiters first wait its lock-delay. An etcd\n       semaphore: no holder runs, but a vanished holder's slot is kept for its\n       cushion (its command may still run)\n  125  usage error, Consul or etcd unreachable or denied, not a lock/semaphore\n  141  stdout was closed before all was written\n\n\
JSON: one object (kind \"lock\" or \"semaphore\"; both have state, held and holders);\nschema in /usr/share/doc/conlock/docs/status.schema.json (make install: under PREFIX)"
    )]
    Status(StatusArgs),
    /// Print a line (or run a handler) each time the holder changes
    #[command(
        after_help = "Examples:\n  conlock watch --prefix service/x\n  conlock watch --key k -- sh -c 'echo \"$CONLOCK_EVENT by $CONLOCK_HOLDER_SESSION\"'"
    )]
    Watch(WatchArgs),
    /// Force-release a stuck lock or semaphore slot by destroying the holder's session (etcd: revoking its lease)
    #[command(
        after_help = "Examples:\n  conlock break --prefix service/x --yes\n  conlock break --prefix db --session 3f1c… --yes\n\n\
Exit codes:\n  0    broken, or nothing to break\n  1    declined at the confirmation prompt (nothing done)\n  125  usage error (also: no --yes and stdin is not a terminal), Consul or etcd unreachable or denied\n  141  stdout was closed (the sessions were destroyed all the same)"
    )]
    Break(BreakArgs),
    /// Serve an in-memory, Consul-compatible HTTP API for demos and tests (not for production)
    DevServer(DevServerArgs),
    /// Print a shell completion script
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) of conlock or of one subcommand
    Man {
        /// A subcommand, for its own page (conlock-run.1, …)
        #[arg(value_parser = ["run", "sem", "status", "watch", "break", "dev-server"])]
        subcommand: Option<String>,
    },
}

#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Consul connection")]
pub struct ConnArgs {
    /// Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]
    #[arg(long, value_name = "ADDR")]
    pub http_addr: Option<String>,
    /// ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]
    #[arg(long, value_name = "PATH")]
    pub token_file: Option<PathBuf>,
    /// CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]
    #[arg(long, value_name = "PATH")]
    pub ca_file: Option<PathBuf>,
    /// Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]
    #[arg(long, value_name = "DIR")]
    pub ca_path: Option<PathBuf>,
    /// Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]
    #[arg(long, value_name = "PATH")]
    pub client_cert: Option<PathBuf>,
    /// Client key for HTTPS [env: CONSUL_CLIENT_KEY]
    #[arg(long, value_name = "PATH")]
    pub client_key: Option<PathBuf>,
    /// Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]
    #[arg(long, value_name = "DC")]
    pub datacenter: Option<String>,
    /// Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]
    #[arg(long, value_name = "NS")]
    pub namespace: Option<String>,
    /// Name expected in the agent's certificate and sent as SNI, when it differs from the address's host [env: CONSUL_TLS_SERVER_NAME]
    #[arg(long, value_name = "NAME")]
    pub tls_server_name: Option<String>,
    /// The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]
    #[arg(long, value_enum, value_name = "BACKEND", help_heading = "Store")]
    pub backend: Option<Backend>,
    /// etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]
    #[arg(long, value_name = "URLS", help_heading = "etcd connection")]
    pub endpoints: Option<String>,
    /// CA certificate to verify etcd's certificate [env: ETCDCTL_CACERT]
    #[arg(long, value_name = "PATH", help_heading = "etcd connection")]
    pub etcd_cacert: Option<PathBuf>,
    /// Client certificate for etcd [env: ETCDCTL_CERT]
    #[arg(long, value_name = "PATH", help_heading = "etcd connection")]
    pub etcd_cert: Option<PathBuf>,
    /// Client key for etcd [env: ETCDCTL_KEY]
    #[arg(long, value_name = "PATH", help_heading = "etcd connection")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]
    #[arg(long, value_name = "USER", help_heading = "etcd connection")]
    pub etcd_user: Option<String>,
    /// Password of --etcd-user [env: ETCDCTL_PASSWORD]
    #[arg(long, value_name = "PASSWORD", help_heading = "etcd connection")]
    pub etcd_password: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Consul,
    Etcd,
}

impl ConnArgs {
    /// These options given after the subcommand win over those given before it.
    pub fn or(&self, outer: &ConnArgs) -> ConnArgs {
        let c = self.clone();
        ConnArgs {
            http_addr: c.http_addr.or_else(|| outer.http_addr.clone()),
            token: c.token.or_else(|| outer.token.clone()),
            token_file: c.token_file.or_else(|| outer.token_file.clone()),
            ca_file: c.ca_file.or_else(|| outer.ca_file.clone()),
            ca_path: c.ca_path.or_else(|| outer.ca_path.clone()),
            client_cert: c.client_cert.or_else(|| outer.client_cert.clone()),
            client_key: c.client_key.or_else(|| outer.client_key.clone()),
            datacenter: c.datacenter.or_else(|| outer.datacenter.clone()),
            namespace: c.namespace.or_else(|| outer.namespace.clone()),
            tls_server_name: c.tls_server_name.or_else(|| outer.tls_server_name.clone()),
            backend: c.backend.or(outer.backend),
            endpoints: c.endpoints.or_else(|| outer.endpoints.clone()),
            etcd_cacert: c.etcd_cacert.or_else(|| outer.etcd_cacert.clone()),
            etcd_cert: c.etcd_cert.or_else(|| outer.etcd_cert.clone()),
            etcd_key: c.etcd_key.or_else(|| outer.etcd_key.clone()),
            etcd_user: c.etcd_user.or_else(|| outer.etcd_user.clone()),
            etcd_password: c.etcd_password.or_else(|| outer.etcd_password.clone()),
        }
    }

    /// The first option given, for refusing them where they do not apply.
    pub fn first_given(&self) -> Option<&'static str> {
        self.first_consul_given()
            .or_else(|| self.first_etcd_given())
            .or_else(|| self.backend.is_some().then_some("--backend"))
    }

    /// The first etcd-only option given.
    pub fn first_etcd_given(&self) -> Option<&'static str> {
        [
            (self.endpoints.is_some(), "--endpoints"),
            (self.etcd_cacert.is_some(), "--etcd-cacert"),
            (self.etcd_cert.is_some(), "--etcd-cert"),
            (self.etcd_key.is_some(), "--etcd-key"),
            (self.etcd_user.is_some(), "--etcd-user"),
            (self.etcd_password.is_some(), "--etcd-password"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }

    /// The first Consul-only connection option given.
    pub fn first_consul_given(&self) -> Option<&'static str> {
        [
            (self.http_addr.is_some(), "--http-addr"),
            (self.token.is_some(), "--token"),
            (self.token_file.is_some(), "--token-file"),
            (self.ca_file.is_some(), "--ca-file"),
            (self.ca_path.is_some(), "--ca-path"),
            (self.client_cert.is_some(), "--client-cert"),
            (self.client_key.is_some(), "--client-key"),
            (self.datacenter.is_some(), "--datacenter"),
            (self.namespace.is_some(), "--namespace"),
            (self.tls_server_name.is_some(), "--tls-server-name"),
        ]
        .into_iter()
        .find_map(|(given, name)| given.then_some(name))
    }
}

#[derive(Debug, Clone, Copy, Args)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// Timestamped progress lines on stderr
    #[arg(short, long, global = true, conflicts_with = "quiet")]
    pub verbose: bool,
    /// No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Behavior {
    Release,
    Delete,
}

// Options shared by `run` and `sem`: the session, the wait, and the child.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Session, wait and command")]
pub struct HoldArgs {
    /// Session name [default: "conlock: <cmd> on <host>"]
    #[arg(long, value_name = "NAME")]
    pub session_name: Option<String>,
    /// Session TTL, 10s to 24h; renewed every TTL/2 (etcd: the lease's TTL, 2s to 24h, renewed every TTL/3)
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration, value_hint = clap::ValueHint::Other, allow_hyphen_values = true)]
    pub ttl: Duration,
    /// Lock-delay Consul enforces after the session is invalidated (at most 60s; for a
    /// semaphore, the cushion conlock waiters give a vanished holder; on etcd, which has
    /// none, the cushion conlock waiters keep after a holder that did not let go). Must exceed
    /// --kill-grace by a margin: see /usr/share/doc/conlock/docs/safety.md
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = parse_duration, value_hint = clap::ValueHint::Other, allow_hyphen_values = true)]
    pub lock_delay: Duration,
    /// Health check to tie the session to (repeatable) [default: serfHealth]
    #[arg(long = "check", value_name = "ID", conflicts_with = "no_checks")]
    pub checks: Vec<String>,
    /// Tie the session to its TTL only, no health checks
    #[arg(long)]
    pub no_checks: bool,
    /// Give up waiting after this long (0s: try once) and exit 75 [default: wait forever]; bounds the wait for Consul too (a request gets 2s more to be answered)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, value_hint = clap::ValueHint::Other, allow_hyphen_values = true)]
    pub timeout: Option<Duration>,
    /// Exit code when not acquired within --timeout (0 makes "busy" a success)
    #[arg(long, value_name = "N", default_value_t = 75)]
    pub busy_exit_code: u8,
    /// Value stored in the key [default: JSON with host, pid, command, started]; status shows "held since" only from that default
    #[arg(long, value_name = "STR", conflicts_with = "value_file")]
    pub value: Option<String>,
    /// Read the stored value from a file
    #[arg(long, value_name = "PATH")]
    pub value_file: Option<PathBuf>,
    /// Run one string through $SHELL -c (falls back to /bin/sh)
    #[arg(long)]
    pub shell: bool,
    /// Signal sent to the command's process group when the lock is lost
    #[arg(long, value_name = "SIGNAL", default_value = "TERM")]
    pub kill_signal: String,
    /// Time between that signal and SIGKILL
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = parse_duration, value_hint = clap::ValueHint::Other, allow_hyphen_values = true)]
    pub kill_grace: Duration,
    /// Failed reads of the key in a row before the lock counts as lost
    #[arg(long, value_name = "N", default_value_t = 3)]
    pub monitor_retry: u32,
    /// Pause between those reads
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration, value_hint = clap::ValueHint::Other, allow_hyphen_values = true)]
    pub monitor_retry_time: Duration,
    /// Keep the lock at least this long after the command started, even if it ends sooner
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, value_hint = clap::ValueHint::Other)]
    pub min_hold: Option<Duration>,
    /// Stop the command (like a loss: --kill-signal, --kill-grace, SIGKILL) after this long; exit 123
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, value_hint = clap::ValueHint::Other)]
    pub max_time: Option<Duration>,
    /// Run the command even if the guardian process cannot start (then nothing stops the
    /// command if conlock is killed or stopped; see /usr/share/doc/conlock/docs/safety.md)
    #[arg(long)]
    pub unguarded: bool,
    /// Write one JSON object per line (waiting, acquired, lost, released, exit) to FILE (appended), '-' (stderr) or fd:N; format in /usr/share/doc/conlock/docs/events.md
    #[arg(long, value_name = "FILE|-|fd:N")]
    pub events: Option<String>,
    /// The command and its arguments
    #[arg(last = true, value_name = "CMD", required = true, num_args = 1.., value_hint = clap::ValueHint::CommandWithArguments)]
    pub command: Vec<OsString>,
}

#[derive(Debug, Clone, Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["key", "prefix"]))]
pub struct RunArgs {
    /// The lock key
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// Use the key PREFIX/.lock, as `consul lock PREFIX` does
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// Session behavior when it is invalidated (Consul only) [default: release]
    #[arg(long, value_enum)]
    pub behavior: Option<Behavior>,
    #[command(flatten)]
    pub hold: HoldArgs,
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Debug, Clone, Args)]
pub struct SemArgs {
    /// Number of slots (1 to 1024)
    #[arg(long, short = 'n', value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub limit: u32,
    /// The semaphore prefix: contender keys PREFIX/<session> and PREFIX/.lock
    #[arg(long, value_name = "PREFIX")]
    pub prefix: String,
    #[command(flatten)]
    pub hold: HoldArgs,
    #[command(flatten)]
    pub conn: ConnArgs,
}

// A lock key or a prefix (lock `P/.lock`, or a semaphore under `P`).
#[derive(Debug, Clone, Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["key", "prefix"]))]
pub struct TargetArgs {
    /// A lock key
    #[arg(long, value_name = "KEY")]
    pub key: Option<String>,
    /// A lock (PREFIX/.lock) or a semaphore under PREFIX
    #[arg(long, value_name = "PREFIX")]
    pub prefix: Option<String>,
    /// What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock
    #[arg(long, value_enum, default_value = "auto")]
    pub kind: Kind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    Auto,
    Lock,
    Semaphore,
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Machine-readable output (schema: status.schema.json, see JSON below)
    #[arg(long)]
    pub json: bool,
    // Last: its heading applies to every option after it.
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// One JSON object per line
    #[arg(long)]
    pub json: bool,
    /// Command run on each change, with CONLOCK_* variables describing it
    #[arg(last = true, value_name = "HANDLER", value_hint = clap::ValueHint::CommandWithArguments)]
    pub handler: Vec<OsString>,
    // Last: its heading applies to every option after it.
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Debug, Clone, Args)]
pub struct BreakArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    /// Only this semaphore holder's session
    #[arg(long, value_name = "SESSION")]
    pub session: Option<String>,
    /// Do not ask for confirmation (required on a non-terminal)
    #[arg(long, short = 'y')]
    pub yes: bool,
    // Last: its heading applies to every option after it.
    #[command(flatten)]
    pub conn: ConnArgs,
}

#[derive(Debug, Clone, Args)]
pub struct DevServerArgs {
    /// Address to listen on: IP:PORT, HOST:PORT (the first address HOST resolves to) or :PORT (127.0.0.1); port 0 picks a free port
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:8500", value_parser = parse_listen_addr)]
    pub addr: std::net::SocketAddr,
    /// Lowest session TTL accepted, like Consul's session_ttl_min
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration, value_hint = clap::ValueHint::Other, allow_hyphen_values = true)]
    pub session_ttl_min: Duration,
    /// Require this ACL token on every request
    #[arg(long, value_name = "TOKEN")]
    pub acl_token: Option<String>,
    /// Node name the server reports
    #[arg(long, default_value = "conlock-dev")]
    pub node_name: String,
}

/// `:PORT` listens on loopback only: the dev server is not for other machines (Go's
/// `:PORT` would mean every interface).
fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::{SocketAddr, ToSocketAddrs};
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let spec = match s.strip_prefix(':') {
        Some(port) => format!("127.0.0.1:{port}"),
        None => s.to_string(),
    };
    let (host, port) = spec
        .rsplit_once(':')
        .ok_or("expected HOST:PORT, IP:PORT or :PORT")?;
    port.parse::<u16>()
        .map_err(|_| format!("{port:?} is not a port number (0 to 65535)"))?;
    // IPv4 first: `localhost` often resolves to ::1 as well, and clients try 127.0.0.1.
    let mut addrs: Vec<SocketAddr> = spec
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host:?}: {e}"))?
        .collect();
    addrs.sort_by_key(|a| !a.is_ipv4());
    addrs
        .into_iter()
        .next()
        .ok_or_else(|| format!("{host:?} resolves to no address"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    // Hyphen values reach us (allow_hyphen_values) so that `-5s` gets this answer rather
    // than clap's advice to write `-- -5s`, which would make it part of the command.
    if let Some(rest) = s.trim_start().strip_prefix('-') {
        return Err(
            if rest.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
                "durations cannot be negative".into()
            } else {
                "expected a duration such as 30s (the value is missing)".into()
            },
        );
    }
    crate::duration::parse(s).map_err(|e| e.trim_start_matches("time: ").to_string())
}
