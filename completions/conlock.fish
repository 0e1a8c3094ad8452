# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_conlock_global_optspecs
    string join \n http-addr= token= token-file= ca-file= ca-path= client-cert= client-key= datacenter= namespace= tls-server-name= backend= endpoints= etcd-cacert= etcd-cert= etcd-key= etcd-user= etcd-password= v/verbose q/quiet h/help V/version
end

function __fish_conlock_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_conlock_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_conlock_using_subcommand
    set -l cmd (__fish_conlock_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l http-addr -d 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l token -d 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l token-file -d 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l ca-file -d 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l ca-path -d 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l client-cert -d 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l client-key -d 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l datacenter -d 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l namespace -d 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l tls-server-name -d 'Name expected in the agent\'s certificate and sent as SNI, when it differs from the address\'s host [env: CONSUL_TLS_SERVER_NAME]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l backend -d 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]' -r -f -a "consul\t''
etcd\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l endpoints -d 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l etcd-cacert -d 'CA certificate to verify etcd\'s certificate [env: ETCDCTL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l etcd-cert -d 'Client certificate for etcd [env: ETCDCTL_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l etcd-key -d 'Client key for etcd [env: ETCDCTL_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l etcd-user -d 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -l etcd-password -d 'Password of --etcd-user [env: ETCDCTL_PASSWORD]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "run" -d 'Run a command while holding a lock (one holder at a time)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "sem" -d 'Run a command while holding one of N semaphore slots'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "status" -d 'Show who holds a lock or semaphore (exit 0 held, 1 free, 2 maybe in lock-delay)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "watch" -d 'Print a line (or run a handler) each time the holder changes'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "break" -d 'Force-release a stuck lock or semaphore slot by destroying the holder\'s session (etcd: revoking its lease)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "dev-server" -d 'Serve an in-memory, Consul-compatible HTTP API for demos and tests (not for production)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "completions" -d 'Print a shell completion script'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "man" -d 'Print the man page (roff) of conlock or of one subcommand'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l key -d 'The lock key' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l prefix -d 'Use the key PREFIX/.lock, as `consul lock PREFIX` does' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l behavior -d 'Session behavior when it is invalidated (Consul only) [default: release]' -r -f -a "release\t''
delete\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l session-name -d 'Session name [default: "conlock: <cmd> on <host>"]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l ttl -d 'Session TTL, 10s to 24h; renewed every TTL/2 (etcd: the lease\'s TTL, 2s to 24h, renewed every TTL/3)' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l lock-delay -d 'Lock-delay Consul enforces after the session is invalidated (at most 60s; for a semaphore, the cushion conlock waiters give a vanished holder; on etcd, which has none, the cushion conlock waiters keep after a holder that did not let go). Must exceed --kill-grace by a margin: see /usr/share/doc/conlock/docs/safety.md' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l check -d 'Health check to tie the session to (repeatable) [default: serfHealth]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l timeout -d 'Give up waiting after this long (0s: try once) and exit 75 [default: wait forever]; bounds the wait for Consul too (a request gets 2s more to be answered)' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l busy-exit-code -d 'Exit code when not acquired within --timeout (0 makes "busy" a success)' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l value -d 'Value stored in the key [default: JSON with host, pid, command, started]; status shows "held since" only from that default' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l value-file -d 'Read the stored value from a file' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l kill-signal -d 'Signal sent to the command\'s process group when the lock is lost' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l kill-grace -d 'Time between that signal and SIGKILL' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l monitor-retry -d 'Failed reads of the key in a row before the lock counts as lost' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l monitor-retry-time -d 'Pause between those reads' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l min-hold -d 'Keep the lock at least this long after the command started, even if it ends sooner' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l max-time -d 'Stop the command (like a loss: --kill-signal, --kill-grace, SIGKILL) after this long; exit 123' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l events -d 'Write one JSON object per line (waiting, acquired, lost, released, exit) to FILE (appended), \'-\' (stderr) or fd:N; format in /usr/share/doc/conlock/docs/events.md' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l http-addr -d 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l token -d 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l token-file -d 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l ca-file -d 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l ca-path -d 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l client-cert -d 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l client-key -d 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l datacenter -d 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l namespace -d 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l tls-server-name -d 'Name expected in the agent\'s certificate and sent as SNI, when it differs from the address\'s host [env: CONSUL_TLS_SERVER_NAME]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l backend -d 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]' -r -f -a "consul\t''
etcd\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l endpoints -d 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l etcd-cacert -d 'CA certificate to verify etcd\'s certificate [env: ETCDCTL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l etcd-cert -d 'Client certificate for etcd [env: ETCDCTL_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l etcd-key -d 'Client key for etcd [env: ETCDCTL_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l etcd-user -d 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l etcd-password -d 'Password of --etcd-user [env: ETCDCTL_PASSWORD]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l no-checks -d 'Tie the session to its TTL only, no health checks'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l shell -d 'Run one string through $SHELL -c (falls back to /bin/sh)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -l unguarded -d 'Run the command even if the guardian process cannot start (then nothing stops the command if conlock is killed or stopped; see /usr/share/doc/conlock/docs/safety.md)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand run" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -s n -l limit -d 'Number of slots (1 to 1024)' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l prefix -d 'The semaphore prefix: contender keys PREFIX/<session> and PREFIX/.lock' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l session-name -d 'Session name [default: "conlock: <cmd> on <host>"]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l ttl -d 'Session TTL, 10s to 24h; renewed every TTL/2 (etcd: the lease\'s TTL, 2s to 24h, renewed every TTL/3)' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l lock-delay -d 'Lock-delay Consul enforces after the session is invalidated (at most 60s; for a semaphore, the cushion conlock waiters give a vanished holder; on etcd, which has none, the cushion conlock waiters keep after a holder that did not let go). Must exceed --kill-grace by a margin: see /usr/share/doc/conlock/docs/safety.md' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l check -d 'Health check to tie the session to (repeatable) [default: serfHealth]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l timeout -d 'Give up waiting after this long (0s: try once) and exit 75 [default: wait forever]; bounds the wait for Consul too (a request gets 2s more to be answered)' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l busy-exit-code -d 'Exit code when not acquired within --timeout (0 makes "busy" a success)' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l value -d 'Value stored in the key [default: JSON with host, pid, command, started]; status shows "held since" only from that default' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l value-file -d 'Read the stored value from a file' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l kill-signal -d 'Signal sent to the command\'s process group when the lock is lost' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l kill-grace -d 'Time between that signal and SIGKILL' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l monitor-retry -d 'Failed reads of the key in a row before the lock counts as lost' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l monitor-retry-time -d 'Pause between those reads' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l min-hold -d 'Keep the lock at least this long after the command started, even if it ends sooner' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l max-time -d 'Stop the command (like a loss: --kill-signal, --kill-grace, SIGKILL) after this long; exit 123' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l events -d 'Write one JSON object per line (waiting, acquired, lost, released, exit) to FILE (appended), \'-\' (stderr) or fd:N; format in /usr/share/doc/conlock/docs/events.md' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l http-addr -d 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l token -d 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l token-file -d 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l ca-file -d 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l ca-path -d 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l client-cert -d 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l client-key -d 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l datacenter -d 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l namespace -d 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l tls-server-name -d 'Name expected in the agent\'s certificate and sent as SNI, when it differs from the address\'s host [env: CONSUL_TLS_SERVER_NAME]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l backend -d 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]' -r -f -a "consul\t''
etcd\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l endpoints -d 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l etcd-cacert -d 'CA certificate to verify etcd\'s certificate [env: ETCDCTL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l etcd-cert -d 'Client certificate for etcd [env: ETCDCTL_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l etcd-key -d 'Client key for etcd [env: ETCDCTL_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l etcd-user -d 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l etcd-password -d 'Password of --etcd-user [env: ETCDCTL_PASSWORD]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l no-checks -d 'Tie the session to its TTL only, no health checks'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l shell -d 'Run one string through $SHELL -c (falls back to /bin/sh)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -l unguarded -d 'Run the command even if the guardian process cannot start (then nothing stops the command if conlock is killed or stopped; see /usr/share/doc/conlock/docs/safety.md)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand sem" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l key -d 'A lock key' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l prefix -d 'A lock (PREFIX/.lock) or a semaphore under PREFIX' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l kind -d 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock' -r -f -a "auto\t''
lock\t''
semaphore\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l http-addr -d 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l token -d 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l token-file -d 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l ca-file -d 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l ca-path -d 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l client-cert -d 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l client-key -d 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l datacenter -d 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l namespace -d 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l tls-server-name -d 'Name expected in the agent\'s certificate and sent as SNI, when it differs from the address\'s host [env: CONSUL_TLS_SERVER_NAME]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l backend -d 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]' -r -f -a "consul\t''
etcd\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l endpoints -d 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l etcd-cacert -d 'CA certificate to verify etcd\'s certificate [env: ETCDCTL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l etcd-cert -d 'Client certificate for etcd [env: ETCDCTL_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l etcd-key -d 'Client key for etcd [env: ETCDCTL_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l etcd-user -d 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l etcd-password -d 'Password of --etcd-user [env: ETCDCTL_PASSWORD]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -l json -d 'Machine-readable output (schema: status.schema.json, see JSON below)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -s h -l help -d 'Print help'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand status" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l key -d 'A lock key' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l prefix -d 'A lock (PREFIX/.lock) or a semaphore under PREFIX' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l kind -d 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock' -r -f -a "auto\t''
lock\t''
semaphore\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l http-addr -d 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l token -d 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l token-file -d 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l ca-file -d 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l ca-path -d 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l client-cert -d 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l client-key -d 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l datacenter -d 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l namespace -d 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l tls-server-name -d 'Name expected in the agent\'s certificate and sent as SNI, when it differs from the address\'s host [env: CONSUL_TLS_SERVER_NAME]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l backend -d 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]' -r -f -a "consul\t''
etcd\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l endpoints -d 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l etcd-cacert -d 'CA certificate to verify etcd\'s certificate [env: ETCDCTL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l etcd-cert -d 'Client certificate for etcd [env: ETCDCTL_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l etcd-key -d 'Client key for etcd [env: ETCDCTL_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l etcd-user -d 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l etcd-password -d 'Password of --etcd-user [env: ETCDCTL_PASSWORD]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -l json -d 'One JSON object per line'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -s h -l help -d 'Print help'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand watch" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l key -d 'A lock key' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l prefix -d 'A lock (PREFIX/.lock) or a semaphore under PREFIX' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l kind -d 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock' -r -f -a "auto\t''
lock\t''
semaphore\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l session -d 'Only this semaphore holder\'s session' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l http-addr -d 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l token -d 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l token-file -d 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l ca-file -d 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l ca-path -d 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l client-cert -d 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l client-key -d 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l datacenter -d 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l namespace -d 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l tls-server-name -d 'Name expected in the agent\'s certificate and sent as SNI, when it differs from the address\'s host [env: CONSUL_TLS_SERVER_NAME]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l backend -d 'The store: consul, or etcd (v3, through its JSON gateway) [env: CONLOCK_BACKEND] [default: consul]' -r -f -a "consul\t''
etcd\t''"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l endpoints -d 'etcd endpoints, comma-separated (http://host:port or https://host:port); tried in turn [env: ETCDCTL_ENDPOINTS] [default: http://127.0.0.1:2379]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l etcd-cacert -d 'CA certificate to verify etcd\'s certificate [env: ETCDCTL_CACERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l etcd-cert -d 'Client certificate for etcd [env: ETCDCTL_CERT]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l etcd-key -d 'Client key for etcd [env: ETCDCTL_KEY]' -r -F
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l etcd-user -d 'etcd user: NAME or NAME:PASSWORD [env: ETCDCTL_USER]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -l etcd-password -d 'Password of --etcd-user [env: ETCDCTL_PASSWORD]' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -s y -l yes -d 'Do not ask for confirmation (required on a non-terminal)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -s h -l help -d 'Print help'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand break" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -l addr -d 'Address to listen on: IP:PORT, HOST:PORT (the first address HOST resolves to) or :PORT (127.0.0.1); port 0 picks a free port' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -l session-ttl-min -d 'Lowest session TTL accepted, like Consul\'s session_ttl_min' -r -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -l acl-token -d 'Require this ACL token on every request' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -l node-name -d 'Node name the server reports' -r
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -s h -l help -d 'Print help'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand dev-server" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand completions" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand completions" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand completions" -s h -l help -d 'Print help'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand completions" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand man" -s v -l verbose -d 'Timestamped progress lines on stderr'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand man" -s q -l quiet -d 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand man" -s h -l help -d 'Print help'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand man" -s V -l version -d 'Print version'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "run" -d 'Run a command while holding a lock (one holder at a time)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "sem" -d 'Run a command while holding one of N semaphore slots'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "status" -d 'Show who holds a lock or semaphore (exit 0 held, 1 free, 2 maybe in lock-delay)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "watch" -d 'Print a line (or run a handler) each time the holder changes'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "break" -d 'Force-release a stuck lock or semaphore slot by destroying the holder\'s session (etcd: revoking its lease)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "dev-server" -d 'Serve an in-memory, Consul-compatible HTTP API for demos and tests (not for production)'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "completions" -d 'Print a shell completion script'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "man" -d 'Print the man page (roff) of conlock or of one subcommand'
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand help; and not __fish_seen_subcommand_from run sem status watch break dev-server completions man help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'

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
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand completions" -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand completions; and not __fish_seen_subcommand_from bash elvish fish powershell zsh" -f -a "bash elvish fish powershell zsh"
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand man" -f
complete -c conlock -n "not __fish_conlock_after_dashes; and __fish_conlock_using_subcommand man; and not __fish_seen_subcommand_from run sem status watch break dev-server" -f -a "run sem status watch break dev-server"
