
use builtin;
use str;

set edit:completion:arg-completer[conlock] = {|@words|
    fn spaces {|n|
        builtin:repeat $n ' ' | str:join ''
    }
    fn cand {|text desc|
        edit:complex-candidate $text &display=$text' '(spaces (- 14 (wcswidth $text)))$desc
    }
    var command = 'conlock'
    for word $words[1..-1] {
        if (str:has-prefix $word '-') {
            break
        }
        set command = $command';'$word
    }
    var completions = [
        &'conlock'= {
            cand --http-addr 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]'
            cand --token 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]'
            cand --token-file 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]'
            cand --ca-file 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]'
            cand --ca-path 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]'
            cand --client-cert 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]'
            cand --client-key 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]'
            cand --datacenter 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]'
            cand --namespace 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]'
            cand --tls-server-name 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]'
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
            cand run 'Run a command while holding a lock (one holder at a time)'
            cand sem 'Run a command while holding one of N semaphore slots'
            cand status 'Show who holds a lock or semaphore (exit 0 held, 1 free, 2 maybe in lock-delay)'
            cand watch 'Print a line (or run a handler) each time the holder changes'
            cand break 'Force-release a stuck lock or semaphore slot by destroying the holder''s session'
            cand dev-server 'Serve an in-memory, Consul-compatible HTTP API for demos and tests (not for production)'
            cand completions 'Print a shell completion script'
            cand man 'Print the man page (roff) of conlock or of one subcommand'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'conlock;run'= {
            cand --key 'The lock key'
            cand --prefix 'Use the key PREFIX/.lock, as `consul lock PREFIX` does'
            cand --behavior 'Session behavior when it is invalidated'
            cand --session-name 'Session name [default: "conlock: <cmd> on <host>"]'
            cand --ttl 'Session TTL, 10s to 24h; renewed every TTL/2'
            cand --lock-delay 'Lock-delay Consul enforces after the session is invalidated (at most 60s; for a semaphore, the cushion conlock waiters give a vanished holder). Must exceed --kill-grace by a margin: see /usr/share/doc/conlock/docs/safety.md'
            cand --check 'Health check to tie the session to (repeatable) [default: serfHealth]'
            cand --timeout 'Give up waiting after this long (0s: try once) and exit 75 [default: wait forever]; bounds the wait for Consul too (a request gets 2s more to be answered)'
            cand --busy-exit-code 'Exit code when not acquired within --timeout (0 makes "busy" a success)'
            cand --value 'Value stored in the key [default: JSON with host, pid, command, started]; status shows "held since" only from that default'
            cand --value-file 'Read the stored value from a file'
            cand --kill-signal 'Signal sent to the command''s process group when the lock is lost'
            cand --kill-grace 'Time between that signal and SIGKILL'
            cand --monitor-retry 'Failed reads of the key in a row before the lock counts as lost'
            cand --monitor-retry-time 'Pause between those reads'
            cand --min-hold 'Keep the lock at least this long after the command started, even if it ends sooner'
            cand --max-time 'Stop the command (like a loss: --kill-signal, --kill-grace, SIGKILL) after this long; exit 123'
            cand --events 'Write one JSON object per line (waiting, acquired, lost, released, exit) to FILE (appended), ''-'' (stderr) or fd:N; format in /usr/share/doc/conlock/docs/events.md'
            cand --http-addr 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]'
            cand --token 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]'
            cand --token-file 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]'
            cand --ca-file 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]'
            cand --ca-path 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]'
            cand --client-cert 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]'
            cand --client-key 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]'
            cand --datacenter 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]'
            cand --namespace 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]'
            cand --tls-server-name 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]'
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --no-checks 'Tie the session to its TTL only, no health checks'
            cand --shell 'Run one string through $SHELL -c (falls back to /bin/sh)'
            cand --unguarded 'Run the command even if the guardian process cannot start (then nothing stops the command if conlock is killed or stopped; see /usr/share/doc/conlock/docs/safety.md)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;sem'= {
            cand -n 'Number of slots (1 to 1024)'
            cand --limit 'Number of slots (1 to 1024)'
            cand --prefix 'The semaphore prefix: contender keys PREFIX/<session> and PREFIX/.lock'
            cand --session-name 'Session name [default: "conlock: <cmd> on <host>"]'
            cand --ttl 'Session TTL, 10s to 24h; renewed every TTL/2'
            cand --lock-delay 'Lock-delay Consul enforces after the session is invalidated (at most 60s; for a semaphore, the cushion conlock waiters give a vanished holder). Must exceed --kill-grace by a margin: see /usr/share/doc/conlock/docs/safety.md'
            cand --check 'Health check to tie the session to (repeatable) [default: serfHealth]'
            cand --timeout 'Give up waiting after this long (0s: try once) and exit 75 [default: wait forever]; bounds the wait for Consul too (a request gets 2s more to be answered)'
            cand --busy-exit-code 'Exit code when not acquired within --timeout (0 makes "busy" a success)'
            cand --value 'Value stored in the key [default: JSON with host, pid, command, started]; status shows "held since" only from that default'
            cand --value-file 'Read the stored value from a file'
            cand --kill-signal 'Signal sent to the command''s process group when the lock is lost'
            cand --kill-grace 'Time between that signal and SIGKILL'
            cand --monitor-retry 'Failed reads of the key in a row before the lock counts as lost'
            cand --monitor-retry-time 'Pause between those reads'
            cand --min-hold 'Keep the lock at least this long after the command started, even if it ends sooner'
            cand --max-time 'Stop the command (like a loss: --kill-signal, --kill-grace, SIGKILL) after this long; exit 123'
            cand --events 'Write one JSON object per line (waiting, acquired, lost, released, exit) to FILE (appended), ''-'' (stderr) or fd:N; format in /usr/share/doc/conlock/docs/events.md'
            cand --http-addr 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]'
            cand --token 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]'
            cand --token-file 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]'
            cand --ca-file 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]'
            cand --ca-path 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]'
            cand --client-cert 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]'
            cand --client-key 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]'
            cand --datacenter 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]'
            cand --namespace 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]'
            cand --tls-server-name 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]'
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --no-checks 'Tie the session to its TTL only, no health checks'
            cand --shell 'Run one string through $SHELL -c (falls back to /bin/sh)'
            cand --unguarded 'Run the command even if the guardian process cannot start (then nothing stops the command if conlock is killed or stopped; see /usr/share/doc/conlock/docs/safety.md)'
            cand -h 'Print help (see more with ''--help'')'
            cand --help 'Print help (see more with ''--help'')'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;status'= {
            cand --key 'A lock key'
            cand --prefix 'A lock (PREFIX/.lock) or a semaphore under PREFIX'
            cand --kind 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock'
            cand --http-addr 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]'
            cand --token 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]'
            cand --token-file 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]'
            cand --ca-file 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]'
            cand --ca-path 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]'
            cand --client-cert 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]'
            cand --client-key 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]'
            cand --datacenter 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]'
            cand --namespace 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]'
            cand --tls-server-name 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]'
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --json 'Machine-readable output (schema: status.schema.json, see JSON below)'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;watch'= {
            cand --key 'A lock key'
            cand --prefix 'A lock (PREFIX/.lock) or a semaphore under PREFIX'
            cand --kind 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock'
            cand --http-addr 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]'
            cand --token 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]'
            cand --token-file 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]'
            cand --ca-file 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]'
            cand --ca-path 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]'
            cand --client-cert 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]'
            cand --client-key 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]'
            cand --datacenter 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]'
            cand --namespace 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]'
            cand --tls-server-name 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]'
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --json 'One JSON object per line'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;break'= {
            cand --key 'A lock key'
            cand --prefix 'A lock (PREFIX/.lock) or a semaphore under PREFIX'
            cand --kind 'What --prefix names: auto reads it from Consul, which cannot tell an idle semaphore (nothing left under PREFIX) from a free lock and then reports a lock'
            cand --session 'Only this semaphore holder''s session'
            cand --http-addr 'Consul HTTP address: host:port, http://host:port or https://host:port; host:port means https when CONSUL_HTTP_SSL=true [env: CONSUL_HTTP_ADDR] [default: 127.0.0.1:8500]'
            cand --token 'ACL token sent as X-Consul-Token [env: CONSUL_HTTP_TOKEN]'
            cand --token-file 'File holding the ACL token [env: CONSUL_HTTP_TOKEN_FILE]'
            cand --ca-file 'CA certificate file for HTTPS; CONSUL_HTTP_SSL_VERIFY=false skips verification (testing only) [env: CONSUL_CACERT]'
            cand --ca-path 'Directory of CA certificates for HTTPS [env: CONSUL_CAPATH]'
            cand --client-cert 'Client certificate for HTTPS [env: CONSUL_CLIENT_CERT]'
            cand --client-key 'Client key for HTTPS [env: CONSUL_CLIENT_KEY]'
            cand --datacenter 'Datacenter to use, sent as ?dc= [env: CONSUL_DATACENTER]'
            cand --namespace 'Namespace (Consul Enterprise), sent as ?ns= [env: CONSUL_NAMESPACE]'
            cand --tls-server-name 'Name expected in the agent''s certificate and sent as SNI, when it differs from the address''s host [env: CONSUL_TLS_SERVER_NAME]'
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand -y 'Do not ask for confirmation (required on a non-terminal)'
            cand --yes 'Do not ask for confirmation (required on a non-terminal)'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;dev-server'= {
            cand --addr 'Address to listen on: IP:PORT, HOST:PORT (the first address HOST resolves to) or :PORT (127.0.0.1); port 0 picks a free port'
            cand --session-ttl-min 'Lowest session TTL accepted, like Consul''s session_ttl_min'
            cand --acl-token 'Require this ACL token on every request'
            cand --node-name 'Node name the server reports'
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;completions'= {
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;man'= {
            cand -v 'Timestamped progress lines on stderr'
            cand --verbose 'Timestamped progress lines on stderr'
            cand -q 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand --quiet 'No progress and no "busy" message on stderr; errors, warnings, a loss and a kill (--max-time) are still shown'
            cand -h 'Print help'
            cand --help 'Print help'
            cand -V 'Print version'
            cand --version 'Print version'
        }
        &'conlock;help'= {
            cand run 'Run a command while holding a lock (one holder at a time)'
            cand sem 'Run a command while holding one of N semaphore slots'
            cand status 'Show who holds a lock or semaphore (exit 0 held, 1 free, 2 maybe in lock-delay)'
            cand watch 'Print a line (or run a handler) each time the holder changes'
            cand break 'Force-release a stuck lock or semaphore slot by destroying the holder''s session'
            cand dev-server 'Serve an in-memory, Consul-compatible HTTP API for demos and tests (not for production)'
            cand completions 'Print a shell completion script'
            cand man 'Print the man page (roff) of conlock or of one subcommand'
            cand help 'Print this message or the help of the given subcommand(s)'
        }
        &'conlock;help;run'= {
        }
        &'conlock;help;sem'= {
        }
        &'conlock;help;status'= {
        }
        &'conlock;help;watch'= {
        }
        &'conlock;help;break'= {
        }
        &'conlock;help;dev-server'= {
        }
        &'conlock;help;completions'= {
        }
        &'conlock;help;man'= {
        }
        &'conlock;help;help'= {
        }
    ]
    $completions[$command]
}
