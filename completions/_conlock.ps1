
using namespace System.Management.Automation
using namespace System.Management.Automation.Language

Register-ArgumentCompleter -Native -CommandName 'conlock' -ScriptBlock {
    param($wordToComplete, $commandAst, $cursorPosition)

    $commandElements = $commandAst.CommandElements
    $command = @(
        'conlock'
        for ($i = 1; $i -lt $commandElements.Count; $i++) {
            $element = $commandElements[$i]
            if ($element -isnot [StringConstantExpressionAst] -or
                $element.StringConstantType -ne [StringConstantType]::BareWord -or
                $element.Value.StartsWith('-') -or
                $element.Value -eq $wordToComplete) {
                break
        }
        $element.Value
    }) -join ';'

    $completions = @(switch ($command) {
        'conlock' {
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]')
            [CompletionResult]::new('--endpoints', '--endpoints', [CompletionResultType]::ParameterName, 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]')
            [CompletionResult]::new('--etcd-cacert', '--etcd-cacert', [CompletionResultType]::ParameterName, 'CA certificate to verify etcd''s certificate [env: ETCDCTL_CACERT]')
            [CompletionResult]::new('--etcd-cert', '--etcd-cert', [CompletionResultType]::ParameterName, 'Client certificate for etcd [env: ETCDCTL_CERT]')
            [CompletionResult]::new('--etcd-key', '--etcd-key', [CompletionResultType]::ParameterName, 'Client key for etcd [env: ETCDCTL_KEY]')
            [CompletionResult]::new('--etcd-user', '--etcd-user', [CompletionResultType]::ParameterName, 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]')
            [CompletionResult]::new('--etcd-password', '--etcd-password', [CompletionResultType]::ParameterName, 'Password of --etcd-user [env: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a command while holding a lock (one holder at a time)')
            [CompletionResult]::new('sem', 'sem', [CompletionResultType]::ParameterValue, 'Run a command while holding one of N semaphore slots')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show who holds a lock or semaphore (exit 0 held, 1 free, 2 maybe in lock-delay)')
            [CompletionResult]::new('watch', 'watch', [CompletionResultType]::ParameterValue, 'Print a line (or run a handler) each time the holder changes')
            [CompletionResult]::new('break', 'break', [CompletionResultType]::ParameterValue, 'Force-release a stuck lock or semaphore slot by destroying the holder''s session (etcd: revoking its lease)')
            [CompletionResult]::new('dev-server', 'dev-server', [CompletionResultType]::ParameterValue, 'Serve an in-memory, Consul-compatible HTTP API for demos and tests (not for production)')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('man', 'man', [CompletionResultType]::ParameterValue, 'Print the man page (roff) of conlock or of one subcommand')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'conlock;run' {
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'The lock key')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'Use the key PREFIX/.lock, as `consul lock PREFIX` does')
            [CompletionResult]::new('--behavior', '--behavior', [CompletionResultType]::ParameterName, 'Session behavior when it is invalidated (Consul only) [default: release]')
            [CompletionResult]::new('--session-name', '--session-name', [CompletionResultType]::ParameterName, 'Session name [default: "conlock: <cmd> on <host>"]')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Session TTL, 10s to 24h; renewed every TTL/2 (etcd: the lease''s TTL, 2s to 24h, renewed every TTL/3)')
            [CompletionResult]::new('--lock-delay', '--lock-delay', [CompletionResultType]::ParameterName, 'Lock-delay Consul enforces after the session is invalidated (at most 60s; for a semaphore, the cushion conlock waiters give a vanished holder; on etcd, which has none, the cushion conlock waiters keep after a holder that did not let go). Must exceed --kill-grace by a margin: see /usr/share/doc/conlock/docs/safety.md')
            [CompletionResult]::new('--check', '--check', [CompletionResultType]::ParameterName, 'Health check to tie the session to (repeatable) [default: serfHealth]')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Give up waiting after this long (0s: try once) and exit 75 [default: wait forever]; bounds the wait for Consul too (a request gets 2s more to be answered)')
            [CompletionResult]::new('--busy-exit-code', '--busy-exit-code', [CompletionResultType]::ParameterName, 'Exit code when not acquired within --timeout (0 makes "busy" a success)')
            [CompletionResult]::new('--value', '--value', [CompletionResultType]::ParameterName, 'Value stored in the key [default: JSON with host, pid, command, started]; status shows "held since" only from that default')
            [CompletionResult]::new('--value-file', '--value-file', [CompletionResultType]::ParameterName, 'Read the stored value from a file')
            [CompletionResult]::new('--kill-signal', '--kill-signal', [CompletionResultType]::ParameterName, 'Signal sent to the command''s process group when the lock is lost')
            [CompletionResult]::new('--kill-grace', '--kill-grace', [CompletionResultType]::ParameterName, 'Time between that signal and SIGKILL')
            [CompletionResult]::new('--monitor-retry', '--monitor-retry', [CompletionResultType]::ParameterName, 'Failed reads of the key in a row before the lock counts as lost')
            [CompletionResult]::new('--monitor-retry-time', '--monitor-retry-time', [CompletionResultType]::ParameterName, 'Pause between those reads')
            [CompletionResult]::new('--min-hold', '--min-hold', [CompletionResultType]::ParameterName, 'Keep the lock at least this long after the command started, even if it ends sooner')
            [CompletionResult]::new('--max-time', '--max-time', [CompletionResultType]::ParameterName, 'Stop the command (like a loss: --kill-signal, --kill-grace, SIGKILL) after this long; exit 123')
            [CompletionResult]::new('--events', '--events', [CompletionResultType]::ParameterName, 'Write one JSON object per line (waiting, acquired, lost, released, exit) to FILE (appended), ''-'' (stderr) or fd:N; format in /usr/share/doc/conlock/docs/events.md')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]')
            [CompletionResult]::new('--endpoints', '--endpoints', [CompletionResultType]::ParameterName, 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]')
            [CompletionResult]::new('--etcd-cacert', '--etcd-cacert', [CompletionResultType]::ParameterName, 'CA certificate to verify etcd''s certificate [env: ETCDCTL_CACERT]')
            [CompletionResult]::new('--etcd-cert', '--etcd-cert', [CompletionResultType]::ParameterName, 'Client certificate for etcd [env: ETCDCTL_CERT]')
            [CompletionResult]::new('--etcd-key', '--etcd-key', [CompletionResultType]::ParameterName, 'Client key for etcd [env: ETCDCTL_KEY]')
            [CompletionResult]::new('--etcd-user', '--etcd-user', [CompletionResultType]::ParameterName, 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]')
            [CompletionResult]::new('--etcd-password', '--etcd-password', [CompletionResultType]::ParameterName, 'Password of --etcd-user [env: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--no-checks', '--no-checks', [CompletionResultType]::ParameterName, 'Tie the session to its TTL only, no health checks')
            [CompletionResult]::new('--shell', '--shell', [CompletionResultType]::ParameterName, 'Run one string through $SHELL -c (falls back to /bin/sh)')
            [CompletionResult]::new('--unguarded', '--unguarded', [CompletionResultType]::ParameterName, 'Run the command even if the guardian process cannot start (then nothing stops the command if conlock is killed or stopped; see /usr/share/doc/conlock/docs/safety.md)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;sem' {
            [CompletionResult]::new('-n', '-n', [CompletionResultType]::ParameterName, 'Number of slots (1 to 1024)')
            [CompletionResult]::new('--limit', '--limit', [CompletionResultType]::ParameterName, 'Number of slots (1 to 1024)')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'The semaphore prefix: contender keys PREFIX/<session> and PREFIX/.lock')
            [CompletionResult]::new('--session-name', '--session-name', [CompletionResultType]::ParameterName, 'Session name [default: "conlock: <cmd> on <host>"]')
            [CompletionResult]::new('--ttl', '--ttl', [CompletionResultType]::ParameterName, 'Session TTL, 10s to 24h; renewed every TTL/2 (etcd: the lease''s TTL, 2s to 24h, renewed every TTL/3)')
            [CompletionResult]::new('--lock-delay', '--lock-delay', [CompletionResultType]::ParameterName, 'Lock-delay Consul enforces after the session is invalidated (at most 60s; for a semaphore, the cushion conlock waiters give a vanished holder; on etcd, which has none, the cushion conlock waiters keep after a holder that did not let go). Must exceed --kill-grace by a margin: see /usr/share/doc/conlock/docs/safety.md')
            [CompletionResult]::new('--check', '--check', [CompletionResultType]::ParameterName, 'Health check to tie the session to (repeatable) [default: serfHealth]')
            [CompletionResult]::new('--timeout', '--timeout', [CompletionResultType]::ParameterName, 'Give up waiting after this long (0s: try once) and exit 75 [default: wait forever]; bounds the wait for Consul too (a request gets 2s more to be answered)')
            [CompletionResult]::new('--busy-exit-code', '--busy-exit-code', [CompletionResultType]::ParameterName, 'Exit code when not acquired within --timeout (0 makes "busy" a success)')
            [CompletionResult]::new('--value', '--value', [CompletionResultType]::ParameterName, 'Value stored in the key [default: JSON with host, pid, command, started]; status shows "held since" only from that default')
            [CompletionResult]::new('--value-file', '--value-file', [CompletionResultType]::ParameterName, 'Read the stored value from a file')
            [CompletionResult]::new('--kill-signal', '--kill-signal', [CompletionResultType]::ParameterName, 'Signal sent to the command''s process group when the lock is lost')
            [CompletionResult]::new('--kill-grace', '--kill-grace', [CompletionResultType]::ParameterName, 'Time between that signal and SIGKILL')
            [CompletionResult]::new('--monitor-retry', '--monitor-retry', [CompletionResultType]::ParameterName, 'Failed reads of the key in a row before the lock counts as lost')
            [CompletionResult]::new('--monitor-retry-time', '--monitor-retry-time', [CompletionResultType]::ParameterName, 'Pause between those reads')
            [CompletionResult]::new('--min-hold', '--min-hold', [CompletionResultType]::ParameterName, 'Keep the lock at least this long after the command started, even if it ends sooner')
            [CompletionResult]::new('--max-time', '--max-time', [CompletionResultType]::ParameterName, 'Stop the command (like a loss: --kill-signal, --kill-grace, SIGKILL) after this long; exit 123')
            [CompletionResult]::new('--events', '--events', [CompletionResultType]::ParameterName, 'Write one JSON object per line (waiting, acquired, lost, released, exit) to FILE (appended), ''-'' (stderr) or fd:N; format in /usr/share/doc/conlock/docs/events.md')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]')
            [CompletionResult]::new('--endpoints', '--endpoints', [CompletionResultType]::ParameterName, 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]')
            [CompletionResult]::new('--etcd-cacert', '--etcd-cacert', [CompletionResultType]::ParameterName, 'CA certificate to verify etcd''s certificate [env: ETCDCTL_CACERT]')
            [CompletionResult]::new('--etcd-cert', '--etcd-cert', [CompletionResultType]::ParameterName, 'Client certificate for etcd [env: ETCDCTL_CERT]')
            [CompletionResult]::new('--etcd-key', '--etcd-key', [CompletionResultType]::ParameterName, 'Client key for etcd [env: ETCDCTL_KEY]')
            [CompletionResult]::new('--etcd-user', '--etcd-user', [CompletionResultType]::ParameterName, 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]')
            [CompletionResult]::new('--etcd-password', '--etcd-password', [CompletionResultType]::ParameterName, 'Password of --etcd-user [env: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--no-checks', '--no-checks', [CompletionResultType]::ParameterName, 'Tie the session to its TTL only, no health checks')
            [CompletionResult]::new('--shell', '--shell', [CompletionResultType]::ParameterName, 'Run one string through $SHELL -c (falls back to /bin/sh)')
            [CompletionResult]::new('--unguarded', '--unguarded', [CompletionResultType]::ParameterName, 'Run the command even if the guardian process cannot start (then nothing stops the command if conlock is killed or stopped; see /usr/share/doc/conlock/docs/safety.md)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help (see more with ''--help'')')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;status' {
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'A lock key')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'A lock (PREFIX/.lock) or a semaphore under PREFIX')
            [CompletionResult]::new('--kind', '--kind', [CompletionResultType]::ParameterName, 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]')
            [CompletionResult]::new('--endpoints', '--endpoints', [CompletionResultType]::ParameterName, 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]')
            [CompletionResult]::new('--etcd-cacert', '--etcd-cacert', [CompletionResultType]::ParameterName, 'CA certificate to verify etcd''s certificate [env: ETCDCTL_CACERT]')
            [CompletionResult]::new('--etcd-cert', '--etcd-cert', [CompletionResultType]::ParameterName, 'Client certificate for etcd [env: ETCDCTL_CERT]')
            [CompletionResult]::new('--etcd-key', '--etcd-key', [CompletionResultType]::ParameterName, 'Client key for etcd [env: ETCDCTL_KEY]')
            [CompletionResult]::new('--etcd-user', '--etcd-user', [CompletionResultType]::ParameterName, 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]')
            [CompletionResult]::new('--etcd-password', '--etcd-password', [CompletionResultType]::ParameterName, 'Password of --etcd-user [env: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'Machine-readable output (schema: status.schema.json, see JSON below)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;watch' {
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'A lock key')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'A lock (PREFIX/.lock) or a semaphore under PREFIX')
            [CompletionResult]::new('--kind', '--kind', [CompletionResultType]::ParameterName, 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]')
            [CompletionResult]::new('--endpoints', '--endpoints', [CompletionResultType]::ParameterName, 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]')
            [CompletionResult]::new('--etcd-cacert', '--etcd-cacert', [CompletionResultType]::ParameterName, 'CA certificate to verify etcd''s certificate [env: ETCDCTL_CACERT]')
            [CompletionResult]::new('--etcd-cert', '--etcd-cert', [CompletionResultType]::ParameterName, 'Client certificate for etcd [env: ETCDCTL_CERT]')
            [CompletionResult]::new('--etcd-key', '--etcd-key', [CompletionResultType]::ParameterName, 'Client key for etcd [env: ETCDCTL_KEY]')
            [CompletionResult]::new('--etcd-user', '--etcd-user', [CompletionResultType]::ParameterName, 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]')
            [CompletionResult]::new('--etcd-password', '--etcd-password', [CompletionResultType]::ParameterName, 'Password of --etcd-user [env: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--json', '--json', [CompletionResultType]::ParameterName, 'One JSON object per line')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;break' {
            [CompletionResult]::new('--key', '--key', [CompletionResultType]::ParameterName, 'A lock key')
            [CompletionResult]::new('--prefix', '--prefix', [CompletionResultType]::ParameterName, 'A lock (PREFIX/.lock) or a semaphore under PREFIX')
            [CompletionResult]::new('--kind', '--kind', [CompletionResultType]::ParameterName, 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock')
            [CompletionResult]::new('--session', '--session', [CompletionResultType]::ParameterName, 'Only this semaphore holder''s session')
            [CompletionResult]::new('--http-addr', '--http-addr', [CompletionResultType]::ParameterName, 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]')
            [CompletionResult]::new('--token', '--token', [CompletionResultType]::ParameterName, 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]')
            [CompletionResult]::new('--token-file', '--token-file', [CompletionResultType]::ParameterName, 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]')
            [CompletionResult]::new('--ca-file', '--ca-file', [CompletionResultType]::ParameterName, 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]')
            [CompletionResult]::new('--ca-path', '--ca-path', [CompletionResultType]::ParameterName, 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]')
            [CompletionResult]::new('--client-cert', '--client-cert', [CompletionResultType]::ParameterName, 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]')
            [CompletionResult]::new('--client-key', '--client-key', [CompletionResultType]::ParameterName, 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]')
            [CompletionResult]::new('--datacenter', '--datacenter', [CompletionResultType]::ParameterName, 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]')
            [CompletionResult]::new('--namespace', '--namespace', [CompletionResultType]::ParameterName, 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]')
            [CompletionResult]::new('--tls-server-name', '--tls-server-name', [CompletionResultType]::ParameterName, 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]')
            [CompletionResult]::new('--backend', '--backend', [CompletionResultType]::ParameterName, 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]')
            [CompletionResult]::new('--endpoints', '--endpoints', [CompletionResultType]::ParameterName, 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]')
            [CompletionResult]::new('--etcd-cacert', '--etcd-cacert', [CompletionResultType]::ParameterName, 'CA certificate to verify etcd''s certificate [env: ETCDCTL_CACERT]')
            [CompletionResult]::new('--etcd-cert', '--etcd-cert', [CompletionResultType]::ParameterName, 'Client certificate for etcd [env: ETCDCTL_CERT]')
            [CompletionResult]::new('--etcd-key', '--etcd-key', [CompletionResultType]::ParameterName, 'Client key for etcd [env: ETCDCTL_KEY]')
            [CompletionResult]::new('--etcd-user', '--etcd-user', [CompletionResultType]::ParameterName, 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]')
            [CompletionResult]::new('--etcd-password', '--etcd-password', [CompletionResultType]::ParameterName, 'Password of --etcd-user [env: ETCDCTL_PASSWORD]')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('-y', '-y', [CompletionResultType]::ParameterName, 'Do not ask for confirmation (required on a non-terminal)')
            [CompletionResult]::new('--yes', '--yes', [CompletionResultType]::ParameterName, 'Do not ask for confirmation (required on a non-terminal)')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;dev-server' {
            [CompletionResult]::new('--addr', '--addr', [CompletionResultType]::ParameterName, 'Address to listen on: IP:PORT, HOST:PORT (the first address HOST resolves to) or :PORT (127.0.0.1); port 0 picks a free port')
            [CompletionResult]::new('--session-ttl-min', '--session-ttl-min', [CompletionResultType]::ParameterName, 'Lowest session TTL accepted, like Consul''s session_ttl_min')
            [CompletionResult]::new('--acl-token', '--acl-token', [CompletionResultType]::ParameterName, 'Require this ACL token on every request')
            [CompletionResult]::new('--node-name', '--node-name', [CompletionResultType]::ParameterName, 'Node name the server reports')
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;completions' {
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;man' {
            [CompletionResult]::new('-v', '-v', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('--verbose', '--verbose', [CompletionResultType]::ParameterName, 'Timestamped progress lines on stderr')
            [CompletionResult]::new('-q', '-q', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('--quiet', '--quiet', [CompletionResultType]::ParameterName, 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown')
            [CompletionResult]::new('-h', '-h', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('--help', '--help', [CompletionResultType]::ParameterName, 'Print help')
            [CompletionResult]::new('-V', '-V ', [CompletionResultType]::ParameterName, 'Print version')
            [CompletionResult]::new('--version', '--version', [CompletionResultType]::ParameterName, 'Print version')
            break
        }
        'conlock;help' {
            [CompletionResult]::new('run', 'run', [CompletionResultType]::ParameterValue, 'Run a command while holding a lock (one holder at a time)')
            [CompletionResult]::new('sem', 'sem', [CompletionResultType]::ParameterValue, 'Run a command while holding one of N semaphore slots')
            [CompletionResult]::new('status', 'status', [CompletionResultType]::ParameterValue, 'Show who holds a lock or semaphore (exit 0 held, 1 free, 2 maybe in lock-delay)')
            [CompletionResult]::new('watch', 'watch', [CompletionResultType]::ParameterValue, 'Print a line (or run a handler) each time the holder changes')
            [CompletionResult]::new('break', 'break', [CompletionResultType]::ParameterValue, 'Force-release a stuck lock or semaphore slot by destroying the holder''s session (etcd: revoking its lease)')
            [CompletionResult]::new('dev-server', 'dev-server', [CompletionResultType]::ParameterValue, 'Serve an in-memory, Consul-compatible HTTP API for demos and tests (not for production)')
            [CompletionResult]::new('completions', 'completions', [CompletionResultType]::ParameterValue, 'Print a shell completion script')
            [CompletionResult]::new('man', 'man', [CompletionResultType]::ParameterValue, 'Print the man page (roff) of conlock or of one subcommand')
            [CompletionResult]::new('help', 'help', [CompletionResultType]::ParameterValue, 'Print this message or the help of the given subcommand(s)')
            break
        }
        'conlock;help;run' {
            break
        }
        'conlock;help;sem' {
            break
        }
        'conlock;help;status' {
            break
        }
        'conlock;help;watch' {
            break
        }
        'conlock;help;break' {
            break
        }
        'conlock;help;dev-server' {
            break
        }
        'conlock;help;completions' {
            break
        }
        'conlock;help;man' {
            break
        }
        'conlock;help;help' {
            break
        }
    })

    $completions.Where{ $_.CompletionText -like "$wordToComplete*" } |
        Sort-Object -Property ListItemText
}
