#!/usr/bin/env python3
"""conlock benchmark harness (`make bench`).

Starts its own `conlock dev-server` (or, with --consul-bin, a real `consul agent -dev` on
loopback; or uses --consul-addr), measures the performance targets, prints a table with a
verdict per target (PASS or MISS) and writes bench/results.json (or --out). It exits 1 if
any target was missed. A row whose runs failed (a job that should succeed exited nonzero,
a timestamp is missing, two holders overlapped, a killed holder's command outlived the
handoff) is a MISS whatever its numbers.

With --compare-consul-lock PATH (implied by --consul-bin) it runs the same work with
HashiCorp's `consul lock` on the same server, interleaved (A B A B) so that machine noise
falls on both tools alike, with the same lock-delay and TTL where the flags allow it
(`consul lock` has a fixed 15 s each; the values actually used are read back from the
sessions and recorded). Against a real agent the targets are those set for one (some are
ratios to `consul lock`); against the dev server those set for it.

Every measurement is a median over repeated runs after warm-up runs; p99 is given where
there are enough samples. Request counts come from a counting TCP proxy in this harness
(TCP_NODELAY on both sides), so they work against any Consul; timed runs do not go
through it.
"""
import argparse
import base64
import json
import os
import re
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def release_binary():
    """The release build `make` made last (static musl where that target is installed, else
    glibc), as its stamp file names it; without one, target/release/conlock."""
    target = os.path.join(HERE, "..", "target")
    try:
        with open(os.path.join(target, "release-target")) as f:
            triple = f.read().strip()
    except OSError:
        triple = ""
    return os.path.join(target, triple, "release", "conlock")


class RowFailed(Exception):
    """A row could not be measured: it is a MISS, whatever numbers it has."""


class Server:
    """A dev server we started, or an external Consul."""

    def __init__(self, binary, external=None):
        self.proc = None
        self.kind = "conlock dev-server"
        if external:
            self.addr = external if external.startswith("http") else "http://" + external
            self.kind = "external Consul " + self.addr
            return
        self.proc = subprocess.Popen(
            [binary, "dev-server", "--addr", "127.0.0.1:0", "--session-ttl-min", "1s"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        m = re.search(r"(http://[0-9.]+:[0-9]+)", line)
        if not m:
            raise SystemExit(f"bench: the dev server did not start: {line!r}")
        self.addr = m.group(1)

    @property
    def hostport(self):
        return self.addr.split("://", 1)[1]

    def call(self, method, path, body=None, timeout=30):
        req = urllib.request.Request(self.addr + path, data=body, method=method)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(req, timeout=timeout) as r:
            data = r.read()
        return json.loads(data) if data else None

    def rss_kib(self, peak=True):
        if not self.proc:
            return None
        return proc_status_kib(self.proc.pid, "VmHWM" if peak else "VmRSS")

    def holder(self, key):
        try:
            pairs = self.call("GET", "/v1/kv/" + key)
        except (urllib.error.URLError, OSError):
            return None
        return pairs[0].get("Session") if pairs else None

    def sessions(self):
        return self.call("GET", "/v1/session/list") or []

    def session_ids(self):
        return {s["ID"] for s in self.sessions()}

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


def free_ports(n):
    """n distinct loopback ports free for both TCP and UDP (Serf uses both)."""
    ports, held = [], []
    while len(ports) < n:
        t = socket.socket()
        t.bind(("127.0.0.1", 0))
        port = t.getsockname()[1]
        u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            u.bind(("127.0.0.1", port))
        except OSError:
            t.close()
            u.close()
            continue
        held += [t, u]
        ports.append(port)
    for s in held:
        s.close()
    return ports


class ConsulAgent(Server):
    """A real `consul agent -dev` from CONSUL, on 127.0.0.1 only, every port explicit
    (DNS off), no update check: no traffic leaves loopback. Stopped by its PID."""

    def __init__(self, consul):
        self.consul = consul
        self.dir = tempfile.mkdtemp(prefix="bench-consul-")
        self.version = consul_version(consul)
        http, serf_lan, serf_wan, server, grpc = free_ports(5)
        helptext = subprocess.run([consul, "agent", "-h"], capture_output=True, text=True).stdout
        ports = f"serf_lan = {serf_lan} serf_wan = {serf_wan} server = {server}"
        if "-grpc-port" in helptext:  # 1.3 and later open gRPC on 8502 in dev mode otherwise
            ports += f" grpc = {grpc}"
        # 1.0.8 has no -serf-lan-port/-server-port flags: HCL works in every version.
        argv = [consul, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
                "-http-port", str(http), "-dns-port", "-1",
                "-hcl", f"ports {{ {ports} }}", "-hcl", "disable_update_check = true"]
        self.logpath = os.path.join(self.dir, "agent.log")
        with open(self.logpath, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, cwd=self.dir)
        self.addr = f"http://127.0.0.1:{http}"
        self.kind = f"real Consul agent -dev ({self.version}, {consul}, pid {self.proc.pid})"
        if not wait_for(self._ready, 60) or self.proc.poll() is not None:
            tail = read_text(self.logpath)[-2000:]
            self.stop()
            raise SystemExit(f"bench: the Consul agent ({' '.join(argv)}) did not become ready within 60 s "
                             f"(a leader and a session it accepts); its log:\n{tail}")

    def _ready(self):
        """A leader, and a session it accepts (right after the election the node may not
        be registered yet: 'Missing node registration')."""
        if self.proc.poll() is not None:
            return True
        try:
            if not self.call("GET", "/v1/status/leader", timeout=2):
                return False
            sid = self.call("PUT", "/v1/session/create", b"{}", timeout=5)["ID"]
            self.call("PUT", f"/v1/session/destroy/{sid}", timeout=5)
            return True
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
            time.sleep(0.1)
            return False

    def stalls(self):
        """The agent's own log (dev mode logs every request and how long its handler took):
        how many answers came later than asked for (a blocking query more than 1 s past
        its wait plus Consul's wait/16 jitter, any other request after more than 1 s),
        and the worst lateness in seconds: the agent itself was stalled (its runtime
        starved of CPU), not the tool it served."""
        late = []
        units = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}
        for line in read_text(self.logpath).splitlines():
            m = re.search(r"\[DEBUG\] http: Request \S+ (\S+) \(([0-9.]+)(ns|µs|us|ms|s|m)\)", line)
            if not m:
                continue
            took = float(m.group(2)) * units[m.group(3)]
            allowed = 1.0
            if re.search(r"[?&]index=[1-9]", m.group(1)):  # blocking: wait, or Consul's 5 min
                w = re.search(r"[?&]wait=([0-9]+)ms", m.group(1))
                allowed += (int(w.group(1)) / 1000 if w else 300) * 17 / 16
            if took > allowed:
                late.append(took - allowed + 1)
        return {"late_answers": len(late), "worst_late_s": max(late) if late else None}

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def consul_version(consul):
    try:
        out = subprocess.run([consul, "version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"bench: cannot run {consul} version: {e}")
    m = re.search(r"Consul (v\S+)", out)
    if not m:
        raise SystemExit(f"bench: {consul} is not a consul binary (`consul version` said {out.strip()!r})")
    return m.group(1)


class CountingProxy:
    """A TCP proxy in front of the server that counts the HTTP requests passing through.
    TCP_NODELAY on both sides: without it, Nagle's algorithm and delayed ACKs would add
    tens of milliseconds to small writes and distort the timings of whoever uses it."""

    def __init__(self, upstream):
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.count = 0
        self.errors = 0
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.hostport = "127.0.0.1:%d" % self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def requests(self):
        with self.lock:
            return self.count

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pipe, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, False), daemon=True).start()

    def _pipe(self, src, dst, count):
        parser = RequestCounter() if count else None
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if parser:
                    n = parser.feed(data)
                    if n:
                        with self.lock:
                            self.count += n
                dst.sendall(data)
        except OSError:
            pass
        except Exception:  # a request it cannot parse: close both sides all the same, or
            with self.lock:  # the client would wait on a connection nobody serves
                self.errors += 1
        for s in (dst, src):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.sock.close()


class RequestCounter:
    """Counts HTTP/1.1 requests in a client's byte stream (Content-Length or chunked)."""

    def __init__(self):
        self.buf = b""
        self.body_left = 0
        self.chunked = False

    def feed(self, data):
        self.buf += data
        n = 0
        while True:
            if self.body_left:
                take = min(self.body_left, len(self.buf))
                self.buf, self.body_left = self.buf[take:], self.body_left - take
                if self.body_left:
                    return n
            if self.chunked:
                end = self.buf.find(b"\r\n")
                if end < 0:
                    return n
                size = int(self.buf[:end].split(b";")[0] or b"0", 16)
                if size == 0:
                    trailer = self.buf.find(b"\r\n\r\n", end)
                    if trailer < 0:
                        return n
                    self.buf, self.chunked = self.buf[trailer + 4:], False
                    continue
                self.buf, self.body_left = self.buf[end + 2:], size + 2
                continue
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return n
            head, self.buf = self.buf[:end].decode("latin-1").lower(), self.buf[end + 4:]
            n += 1
            m = re.search(r"^content-length:\s*(\d+)", head, re.M)
            self.body_left = int(m.group(1)) if m else 0
            self.chunked = bool(re.search(r"^transfer-encoding:.*chunked", head, re.M))


class Tool:
    """How to run 'CMD under a lock' with conlock or consul lock."""

    def __init__(self, name, binary, server):
        self.name, self.binary, self.server = name, binary, server

    def env(self, addr=None):
        e = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
        e["CONSUL_HTTP_ADDR"] = addr or self.server.hostport
        return e

    def lock_cmd(self, prefix, cmd, extra=()):
        if self.name == "conlock":
            return [self.binary, "run", "--prefix", prefix, *extra, "--", *cmd]
        # -shell=false: else `consul lock` joins the command into one `sh -c` string;
        # -child-exit-code: else it exits 0 whatever its command did.
        return [self.binary, "lock", "-shell=false", "-child-exit-code", *extra, prefix, *cmd]

    def sem_cmd(self, prefix, limit, cmd):
        if self.name == "conlock":
            return [self.binary, "sem", "--limit", str(limit), "--prefix", prefix, "--", *cmd]
        return [self.binary, "lock", "-shell=false", "-child-exit-code", "-n", str(limit), prefix, *cmd]

    def timeout_flag(self, seconds):
        return ["--timeout", f"{seconds}s"] if self.name == "conlock" else [f"-timeout={seconds}s"]

    def holder(self, prefix):
        """Who holds the lock `lock_cmd(prefix, ...)` takes, or None."""
        return self.server.holder(prefix + "/.lock")

    def run(self, argv, addr=None, **kw):
        kw.setdefault("stdin", subprocess.DEVNULL)
        return subprocess.Popen(argv, env=self.env(addr), **kw)


class ErrLog:
    """One file that collects the stderr of a row's processes, so that a failure can be
    reported with what the tool said."""

    def __init__(self, name):
        fd, self.path = tempfile.mkstemp(prefix=f"bench-{name}-", suffix=".err")
        self.f = os.fdopen(fd, "a")

    def last(self):
        self.f.flush()
        lines = [l for l in read_text(self.path).splitlines() if l.strip()]
        return f" (stderr: {lines[-1].strip()[:300]})" if lines else ""


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def median(values):
    return statistics.median(values) if values else None


def wait_for(cond, within=60.0):
    until = time.time() + within
    while time.time() < until:
        if cond():
            return True
        time.sleep(0.005)
    return False


def bash_job(log, body):
    """A bash child that logs S/E lines with $EPOCHREALTIME (no fork for the timestamp),
    its id the pid and start time (pids come round again within a second here)."""
    return ["bash", "-c", f'id=$$-$EPOCHREALTIME; echo "S $id $EPOCHREALTIME" >> {log}; {body}; '
                          f'echo "E $id $EPOCHREALTIME" >> {log}']


COMPILED = {}


def c_program(name):
    """bench/NAME.c compiled once per run; "" without a C compiler."""
    if name not in COMPILED:
        out = os.path.join(tempfile.mkdtemp(), name)
        ok = subprocess.run(["cc", "-O2", "-o", out, os.path.join(HERE, name + ".c")], stderr=subprocess.DEVNULL).returncode == 0
        COMPILED[name] = out if ok else ""
    return COMPILED[name]


def beat_program():
    beat = c_program("beat")
    if not beat:
        raise RowFailed("cannot compile bench/beat.c (no C compiler?): the killed holder's command cannot be timed")
    return beat


def stamp_job(log, ms):
    """The job used for handoffs: a tiny C program if a C compiler is here, else bash."""
    stamp = c_program("stamp")
    if stamp:
        return [stamp, log, str(ms)], "C stamp program"
    return bash_job(log, f"sleep {ms / 1000}"), "bash with $EPOCHREALTIME (no C compiler)"


def read_log(log):
    """(start, end) of every job that wrote both lines, and how many wrote only one."""
    starts, ends = {}, {}
    for line in read_text(log).splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        t = float(parts[2].replace(",", "."))
        (starts if parts[0] == "S" else ends)[parts[1]] = t
    pairs = [(starts[k], ends[k]) for k in starts if k in ends]
    return pairs, len(set(starts) ^ set(ends))


def max_concurrent(intervals):
    """The most jobs running at once, from their own timestamps (an end before a start
    at the same instant), as tests/it/harness.rs max_overlap."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    cur = peak = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    return peak


def first_stamp_cmd(log):
    """The next holder's command in the failover rows: the C stamp program, whose first
    act is to write its start time (bash would take a millisecond or two first)."""
    stamp = c_program("stamp")
    if not stamp:
        raise RowFailed("cannot compile bench/stamp.c (no C compiler?)")
    return [stamp, log, "0"]


def first_stamp(log):
    """The start time the stamp program wrote, or None."""
    for line in read_text(log).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "S":
            return float(parts[2])
    return None


def read_float(path):
    """A timestamp a child wrote ($EPOCHREALTIME, maybe with a decimal comma), or None."""
    try:
        with open(path) as f:
            return float(f.read().strip().replace(",", "."))
    except (OSError, ValueError):
        return None


def read_beat(path):
    """(pid, time) of the last beat bench/beat.c wrote, or (None, None)."""
    for _ in range(3):  # a beat being rewritten as we read: read again
        parts = read_text(path).split()
        if len(parts) == 2:
            try:
                return int(parts[0]), float(parts[1])
            except ValueError:
                pass
        time.sleep(0.002)
    return None, None


def read_text(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def proc_state(pid):
    """The state letter of a process (Z: zombie), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def beat_alive(pid, beat, hb):
    """Is `pid` still our beat program for `hb`, and not a zombie? (Checked by its
    command line: pids come round again within a second on a busy machine.)"""
    return pid is not None and pid in pids_running(beat, hb) and proc_state(pid) not in (None, "Z", "X")


def pids_running(exe, arg):
    """Host PIDs of the processes running `exe` with `arg` (a unique temp path) among
    their arguments."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/cmdline", "rb") as f:
                    if arg.encode() in f.read().split(b"\0") and os.readlink(f"/proc/{name}/exe") == exe:
                        out.append(int(name))
            except OSError:
                pass
    return out


def stop_all(procs):
    """SIGKILLs and reaps every process of ours still running (cleanup on any exit)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass


def kill_pid(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except (OSError, TypeError):
        pass


def run_with_go(tool, key, err, extra=(), addr=None):
    """Runs a held command (`sh` that waits for a file) and checks that the server shows
    the key held while it runs. Returns a problem or None."""
    d = tempfile.mkdtemp()
    pidfile, go = os.path.join(d, "pid"), os.path.join(d, "go")
    prefix = key.rsplit("/", 1)[0]
    p = tool.run(tool.lock_cmd(prefix, ["sh", "-c", f"echo $$ > {pidfile}; while [ ! -e {go} ]; do sleep 0.01; done"], extra),
                 addr=addr, stderr=err.f)
    try:
        wait_for(lambda: p.poll() is not None or read_text(pidfile).strip().isdigit())
        if not read_text(pidfile).strip().isdigit():
            return f"{tool.name} exited {p.poll()} without running its command{err.last()}"
        held = tool.holder(prefix)
        open(go, "w").close()
        code = p.wait(timeout=60)
        if not held:
            return f"{tool.name} ran its command while {key} was not held"
        if code != 0:
            return f"{tool.name} exited {code} after a command that succeeded{err.last()}"
        return None
    finally:
        open(go, "w").close()
        stop_all([p])


# 1 -------------------------------------------------------------------------------
def bench_uncontended(tools, runs, proxy):
    """Wall time of direct runs, the tools interleaved; peak RSS from GNU time's own fork
    (ru_maxrss of a child forked from Python includes Python's pre-exec image: even `true`
    shows ~14 MiB); requests per run through the counting proxy; threads and processes
    created per run with strace, if it is installed. Every part interleaves the tools, and
    every run must exit 0; two more runs check that the key is held while the command runs."""
    walls = {t.name: [] for t in tools}
    problems = {t.name: [] for t in tools}
    errs = {t.name: ErrLog(f"1-{t.name}") for t in tools}
    # The harness's own floor, measured the same way and interleaved: spawning `true`.
    floor = []
    # The protocol's floor: the same four requests around a spawn of `true`, from a C
    # program with no safety machinery (bench/floor.c). It speaks plain HTTP to an IPv4
    # literal without an ACL token: skipped (None) where that cannot work.
    plain = tools[0].server.addr.startswith("http://") and not os.environ.get("CONSUL_HTTP_TOKEN")
    proto = c_program("floor") if plain and re.match(r"^\d+\.\d+\.\d+\.\d+:\d+$", tools[0].server.hostport) else ""
    proto_walls = []
    for i in range(runs + 3):
        t0 = time.perf_counter()
        subprocess.Popen(["true"], env=tools[0].env(), stdin=subprocess.DEVNULL).wait()
        if i >= 3:
            floor.append((time.perf_counter() - t0) * 1000)
        if proto:
            t0 = time.perf_counter()
            code = subprocess.Popen([proto, f"bench/uncontended/floor/{i}", "true"], env=tools[0].env(), stdin=subprocess.DEVNULL).wait()
            if code != 0:
                print(f"bench: the protocol floor program failed with {code}; not measured", file=sys.stderr)
                proto, proto_walls = "", []
            elif i >= 3:
                proto_walls.append((time.perf_counter() - t0) * 1000)
        for tool in tools:
            prefix = f"bench/uncontended/{tool.name}"
            t0 = time.perf_counter()
            code = tool.run(tool.lock_cmd(prefix, ["true"]), stderr=errs[tool.name].f).wait()
            wall = time.perf_counter() - t0
            if code != 0:
                problems[tool.name].append(f"timed run {i} exited {code}{errs[tool.name].last()}")
            elif i >= 3:  # warm-up
                walls[tool.name].append(wall * 1000)
    rss = {t.name: [] for t in tools}
    if os.path.exists("/usr/bin/time"):
        for i in range(min(runs, 10)):
            for tool in tools:
                r = subprocess.run(
                    ["/usr/bin/time", "-f", "MAXRSS %M", *tool.lock_cmd(f"bench/uncontended/{tool.name}", ["true"])],
                    env=tool.env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                )
                m = re.search(r"MAXRSS (\d+)", r.stderr)
                if r.returncode != 0:
                    problems[tool.name].append(f"RSS run {i} exited {r.returncode}: {r.stderr.strip()[-300:]}")
                elif m:
                    rss[tool.name].append(int(m.group(1)) / 1024)
    counts = {t.name: [] for t in tools}
    for i in range(3):
        for tool in tools:
            before = proxy.requests()
            code = tool.run(tool.lock_cmd(f"bench/uncontended/{tool.name}", ["true"]), addr=proxy.hostport,
                            stderr=errs[tool.name].f).wait()
            if code != 0:
                problems[tool.name].append(f"counted run {i} exited {code}{errs[tool.name].last()}")
            else:
                counts[tool.name].append(proxy.requests() - before)
    for i in range(2):
        for tool in tools:
            why = run_with_go(tool, f"bench/uncontended/held/{tool.name}/{i}/.lock", errs[tool.name])
            if why:
                problems[tool.name].append(why)
    clones = {t.name: ([], []) for t in tools}
    if shutil.which("strace"):
        for i in range(3):
            for tool in tools:
                why = count_clones(tool, f"bench/uncontended/{tool.name}", *clones[tool.name])
                if why:
                    problems[tool.name].append(f"strace run {i}: {why}")
    out = {}
    for tool in tools:
        n = tool.name
        out[n] = {
            "runs": runs,
            "wall_ms_p50": median(walls[n]),
            "true_wall_ms_p50": median(floor),
            "true_wall_ms_p99": pct(floor, 99),
            "protocol_floor_ms_p50": median(proto_walls),
            "wall_ms_p99": pct(walls[n], 99),
            "rss_mib_p50": median(rss[n]),
            "rss_mib_max": max(rss[n]) if rss[n] else None,
            "rss_note": "max RSS of the tool and its waited-for children, via /usr/bin/time" if rss[n] else "/usr/bin/time missing: not measured",
            "requests_per_run": median(counts[n]),
            "requests_per_run_all": counts[n],
            "threads_per_run": median(clones[n][0]),
            "processes_per_run": median(clones[n][1]),
            "problems": problems[n],
        }
    return out


def count_clones(tool, prefix, threads, procs):
    """Threads and processes one run creates (clone/clone3 calls seen by strace -f),
    appended to `threads` and `procs`; returns a problem or None."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as f:
        r = subprocess.run(
            ["strace", "-f", "-qq", "-e", "trace=clone,clone3,fork,vfork", "-o", f.name,
             *tool.lock_cmd(prefix, ["true"])],
            env=tool.env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        if r.returncode != 0:
            return f"exited {r.returncode}: {r.stderr.strip()[-300:]}"
        calls = [l for l in f.read().splitlines() if re.search(r"\b(clone3?|v?fork)\(", l) and "resumed" not in l]
    threads.append(sum(1 for l in calls if "CLONE_THREAD" in l))
    procs.append(sum(1 for l in calls if "CLONE_THREAD" not in l))
    return None


# 2 -------------------------------------------------------------------------------
def bench_handoff(tools, waiters, handoffs, rounds):
    """Keeps `waiters` contenders queued behind the holder; each handoff is the gap from
    one job's last line to the next job's first line. The tools take turns, `rounds`
    times each, `handoffs / rounds` handoffs per turn. Every job must exit 0 and write
    both lines, and no two jobs may overlap (from their own timestamps)."""
    res = {t.name: {"gaps": [], "overlaps": 0, "failed_jobs": 0, "missing_stamps": 0, "problems": []} for t in tools}
    kinds = {}
    for _ in range(rounds):
        for tool in tools:
            kinds[tool.name] = handoff_round(tool, waiters, max(1, handoffs // rounds), res[tool.name])
    out = {}
    for t in tools:
        r = res[t.name]
        if r["overlaps"]:
            r["problems"].append(f"{r['overlaps']} jobs started while another was running")
        out[t.name] = {"waiters": waiters, "job": kinds[t.name], "handoffs": len(r["gaps"]),
                       "p50_ms": median(r["gaps"]), "p99_ms": pct(r["gaps"], 99),
                       "overlaps": r["overlaps"], "failed_jobs": r["failed_jobs"],
                       "missing_stamps": r["missing_stamps"], "problems": r["problems"]}
    return out


def handoff_round(tool, waiters, handoffs, acc):
    d = tempfile.mkdtemp()
    log = os.path.join(d, "log")
    err = ErrLog(f"2-{tool.name}")
    prefix = f"bench/handoff/{tool.name}/{time.time_ns()}"
    total = handoffs + 1
    started, running, codes = 0, [], []

    job, kind = stamp_job(log, 50)

    def start():
        nonlocal started
        running.append(tool.run(tool.lock_cmd(prefix, job), stderr=err.f))
        started += 1

    try:
        start()
        if not wait_for(lambda: tool.holder(prefix) is not None or running[0].poll() is not None):
            acc["problems"].append("the first holder was not seen holding within 60 s")
        deadline = time.time() + 120 + total * 0.5
        while started < min(total, waiters + 1):
            start()
        while running and time.time() < deadline:
            for p in list(running):
                if p.poll() is not None:
                    running.remove(p)
                    codes.append(p.returncode)
                    if started < total:
                        start()
            time.sleep(0.002)
        if running:
            acc["problems"].append(f"{len(running)} jobs still running at the round's deadline ({120 + total * 0.5:.0f} s)")
    finally:
        stop_all(running)
    failed = [c for c in codes if c != 0]
    if failed:
        acc["failed_jobs"] += len(failed)
        acc["problems"].append(f"{len(failed)} of {len(codes)} jobs exited nonzero ({sorted(set(failed))}){err.last()}")
    iv, half = read_log(log)
    iv.sort()
    missing = total - len(iv)
    if missing:
        acc["missing_stamps"] += missing
        acc["problems"].append(f"{missing} of {total} jobs left no start and end timestamps ({half} only one)")
    latest_end = None
    for s, e in iv:
        if latest_end is not None and s < latest_end:
            acc["overlaps"] += 1
        latest_end = e if latest_end is None else max(latest_end, e)
    acc["gaps"] += [(iv[i + 1][0] - iv[i][1]) * 1000 for i in range(len(iv) - 1)]
    return kind


# 3 -------------------------------------------------------------------------------
def bench_loss_reaction(server, binary, runs):
    """From `session/destroy` to the command's TERM trap; conlock must exit 124 (lost)."""
    reactions, problems = [], []
    err = ErrLog("3")
    for i in range(runs + 1):
        d = tempfile.mkdtemp()
        mark = os.path.join(d, "sig")
        key = f"bench/loss/{i}/{time.time_ns()}"
        cmd = ["bash", "-c", f'trap \'echo $EPOCHREALTIME > {mark}; exit 0\' TERM; sleep 60 & wait $!']
        tool = Tool("conlock", binary, server)
        # Kill-grace shorter than the lock-delay: the safe combination (no warning per run).
        p = tool.run([binary, "run", "--key", key, "--lock-delay", "1s", "--kill-grace", "200ms", "--", *cmd],
                     stderr=err.f)
        try:
            if not wait_for(lambda: p.poll() is not None or server.holder(key) is not None) or p.poll() is not None:
                problems.append(f"run {i}: the holder did not acquire (exit {p.poll()}){err.last()}")
                continue
            time.sleep(0.2)
            session = server.holder(key)
            t0 = time.time()
            server.call("PUT", f"/v1/session/destroy/{session}")
            code = p.wait(timeout=60)
            wait_for(lambda: read_float(mark) is not None, 10)
            t1 = read_float(mark)
            if t1 is None or code != 124:
                problems.append(f"run {i}: conlock exited {code} (124 expected), the command "
                                f"{'got' if t1 else 'never got'} SIGTERM{err.last()}")
            elif i >= 1:
                reactions.append((t1 - t0) * 1000)
        finally:
            stop_all([p])
    return {"runs": len(reactions), "p50_ms": median(reactions), "p99_ms": pct(reactions, 99),
            "max_ms": max(reactions) if reactions else None, "problems": problems}


# 4 -------------------------------------------------------------------------------
def bench_failover(tools, server, settings, runs):
    """SIGKILLs the holder's wrapper process (not its session) and measures until the
    next holder's command starts. The holder's command is bench/beat.c: its last beat
    tells when it died. It must have died before the next command started (conlock's
    guardian kills it; `consul lock` leaves it running: recorded, not judged for it).
    `settings[name]` holds each tool's extra flags; the lock-delay and TTL actually used
    are read from the holder's session."""
    beat = beat_program()
    out = {t.name: {"failover_ms": [], "margins_ms": [], "lock_delay_s": None, "ttl_s": None,
                    "alive_at_next_start": 0, "problems": []} for t in tools}
    errs = {t.name: ErrLog(f"4-{t.name}") for t in tools}
    # `consul lock` goes first: conlock then takes the lock-delay and TTL it was seen using.
    tools = sorted(tools, key=lambda t: t.name == "conlock")
    for i in range(runs):
        for tool in tools:
            if tool.name == "conlock" and "consul-lock" in out and out["consul-lock"]["lock_delay_s"]:
                ld, ttl = out["consul-lock"]["lock_delay_s"], out["consul-lock"]["ttl_s"] or 15
                settings["conlock"] = ["--lock-delay", f"{ld:g}s", "--ttl", f"{max(ttl, 10):g}s"]
                if ld <= 5:
                    settings["conlock"] += ["--kill-grace", "200ms"]
            failover_run(tool, server, beat, settings.get(tool.name, []), i, out[tool.name], errs[tool.name])
    for name, r in out.items():
        v, m = r.pop("failover_ms"), r.pop("margins_ms")
        r["dead_before_next_ms_min"] = min(m) if m else None
        if name == "conlock" and r["alive_at_next_start"]:
            r["problems"].append(f"in {r['alive_at_next_start']} runs the killed holder's command was still "
                                 "running when the next holder's command started")
        r.update({"runs": len(v), "p50_ms": median(v), "max_ms": max(v) if v else None,
                  "killed": "the holder's wrapper process, SIGKILL"})
    return out


def failover_run(tool, server, beat, extra, i, r, err):
    d = tempfile.mkdtemp()
    started, hb = os.path.join(d, "b"), os.path.join(d, "beat")
    prefix = f"bench/failover/{tool.name}/{i}/{time.time_ns()}"
    key = prefix + "/.lock"
    a = tool.run(tool.lock_cmd(prefix, [beat, hb], extra), stderr=err.f)
    procs, cmd_pid = [a], None
    try:
        if not wait_for(lambda: a.poll() is not None or (server.holder(key) is not None and read_beat(hb)[0])) \
                or a.poll() is not None:
            r["problems"].append(f"run {i}: the holder did not acquire and start its command (exit {a.poll()}){err.last()}")
            return
        cmd_pid = read_beat(hb)[0]
        ids = server.session_ids()
        b = tool.run(tool.lock_cmd(prefix, first_stamp_cmd(started), extra), stderr=err.f)
        procs.append(b)
        if not wait_for(lambda: b.poll() is not None or server.session_ids() - ids) or b.poll() is not None:
            r["problems"].append(f"run {i}: the next holder made no session (exit {b.poll()}){err.last()}")
            return
        time.sleep(0.3)
        s = [x for x in server.sessions() if x["ID"] == server.holder(key)]
        if s:
            r["lock_delay_s"] = s[0]["LockDelay"] / 1e9
            r["ttl_s"] = duration_s(s[0].get("TTL", ""))
        t0 = time.time()
        a.send_signal(signal.SIGKILL)
        try:
            code = b.wait(timeout=300)
        except subprocess.TimeoutExpired:
            code = "none: still waiting after 300 s"
        t1 = first_stamp(started)
        a.wait()
        _, last = read_beat(hb)
        if code != 0 or t1 is None:
            r["problems"].append(f"run {i}: the next holder exited {code}, its command "
                                 f"{'ran' if t1 else 'never ran'}{err.last()}")
            return
        # Still beating after the next command started, or alive now: both held at once.
        if last is None or last >= t1 or beat_alive(cmd_pid, beat, hb):
            r["alive_at_next_start"] += 1
        else:
            r["margins_ms"].append((t1 - last) * 1000)
        r["failover_ms"].append((t1 - t0) * 1000)
    finally:
        stop_all(procs)
        if beat_alive(cmd_pid, beat, hb):  # `consul lock` leaves its command running when it is killed
            kill_pid(cmd_pid)


def duration_s(text):
    m = re.fullmatch(r"([0-9.]+)(ms|s|m|h)", text or "")
    if not m:
        return None
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[m.group(2)]


# 5 -------------------------------------------------------------------------------
def bench_semaphore(tools, server, proxy, jobs, job_s, limit, rounds):
    """Each turn: `jobs` jobs of `job_s` through the counting proxy, tools alternating.
    Every job must exit 0 and write both timestamps, at most `limit` at once."""
    res = {t.name: [] for t in tools}
    for _ in range(rounds):
        for tool in tools:
            res[tool.name].append(semaphore_round(tool, proxy, jobs, job_s, limit))
    out = {}
    for name, rs in res.items():
        ok = [r for r in rs if r["wall_s"] is not None]
        out[name] = {
            "jobs": jobs, "limit": limit, "rounds": len(rs), "failed": sum(r["failed"] for r in rs),
            "missing_stamps": sum(r["missing_stamps"] for r in rs),
            "wall_s": median([r["wall_s"] for r in ok]), "ideal_s": jobs / limit * job_s,
            "ratio": median([r["ratio"] for r in ok]),
            "ratio_all": [r["ratio"] for r in ok],
            "max_concurrent": max(r["max_concurrent"] for r in rs),
            "requests_per_job": median([r["requests_per_job"] for r in ok]),
            "ramp_ms": median([r["ramp_ms"] for r in ok]),
            "slot_gap_ms_p50": median([r["slot_gap_ms_p50"] for r in ok]),
            "slot_gap_ms_mean": median([r["slot_gap_ms_mean"] for r in ok]),
            "slot_gap_ms_max": max([r["slot_gap_ms_max"] for r in ok], default=None),
            "tail_ms": median([r["tail_ms"] for r in ok]),
            "job": rs[0]["job"],
            "job_ms_mean": statistics.mean(m) if (m := [r["job_ms_mean"] for r in rs if r["job_ms_mean"] is not None]) else None,
            "note": "through the counting proxy",
            "problems": [p for r in rs for p in r["problems"]],
        }
    return out


def semaphore_round(tool, proxy, jobs, job_s, limit):
    d = tempfile.mkdtemp()
    log = os.path.join(d, "log")
    err = ErrLog(f"5-{tool.name}")
    prefix = f"bench/sem/{tool.name}/{time.time_ns()}"
    problems = []
    before = proxy.requests()
    t0, t0_wall = time.perf_counter(), time.time()
    # The job that lasts job_s itself (the C stamp program when it can be built): a bash
    # job with an external `sleep` lasts a few ms longer, counted against the tool.
    job, kind = stamp_job(log, int(job_s * 1000))
    procs = [tool.run(tool.sem_cmd(prefix, limit, job), addr=proxy.hostport, stderr=err.f)
             for _ in range(jobs)]
    within = max(60.0, 20 * jobs / limit * job_s)
    try:
        if not wait_for(lambda: all(p.poll() is not None for p in procs), within):
            problems.append(f"{sum(1 for p in procs if p.poll() is None)} jobs still running after {within:.0f} s")
        wall = time.perf_counter() - t0
        t_end = time.time()
    finally:
        stop_all(procs)
    codes = [p.returncode for p in procs]
    after = proxy.requests()
    iv, half = read_log(log)
    peak = max_concurrent(iv)
    failed = [c for c in codes if c != 0]
    if failed:
        problems.append(f"{len(failed)} of {jobs} jobs exited nonzero ({sorted(set(map(str, failed)))}){err.last()}")
    if len(iv) != jobs:
        problems.append(f"{jobs - len(iv)} of {jobs} jobs left no start and end timestamps")
    if peak > limit:
        problems.append(f"{peak} jobs ran at once (limit {limit})")
    ideal = jobs / limit * job_s
    done = not failed and len(iv) == jobs
    # Where the time goes: until the first `limit` jobs ran, each freed slot until the
    # next job started in it (the k-th end frees the slot of the (limit + k)-th start),
    # and from the last end until every process had exited.
    starts, ends = sorted(s for s, _ in iv), sorted(e for _, e in iv)
    gaps = [(starts[limit + k] - ends[k]) * 1000 for k in range(len(starts) - limit)] if done else []
    return {
        "ramp_ms": (starts[limit - 1] - t0_wall) * 1000 if done else None,
        "slot_gap_ms_p50": median(gaps),
        "slot_gap_ms_mean": statistics.mean(gaps) if gaps else None,
        "slot_gap_ms_max": max(gaps) if gaps else None,
        "tail_ms": (t_end - ends[-1]) * 1000 if done else None,
        "job": kind,
        "job_ms_mean": statistics.mean((e - s) * 1000 for s, e in iv) if iv else None,
        "failed": len(failed),
        "missing_stamps": jobs - len(iv),
        "wall_s": wall if done else None,
        "ratio": wall / ideal if done else None,
        "max_concurrent": peak,
        "requests_per_job": (after - before) / jobs if done else None,
        "problems": problems,
    }


# 6 -------------------------------------------------------------------------------
def bench_idle(binary, server, proxy, seconds):
    """Requests per minute of an idle holder and of 10 idle waiters, each side through
    its own counting proxy (a difference of two windows would count the holder's jitter
    against the waiters); all must still be running, the holder holding, at the end."""
    tool = Tool("conlock", binary, server)
    err = ErrLog("6")
    key = f"bench/idle/{time.time_ns()}"
    problems = []
    wproxy = CountingProxy(server.hostport)
    h = tool.run([binary, "run", "--key", key, "--", "sleep", "3600"], addr=proxy.hostport, stderr=err.f)
    waiters = []
    try:
        if not wait_for(lambda: h.poll() is not None or server.holder(key) is not None) or h.poll() is not None:
            raise RowFailed(f"the idle holder did not acquire (exit {h.poll()}){err.last()}")
        sid = server.holder(key)
        ids = server.session_ids()
        waiters = [tool.run([binary, "run", "--key", key, "--", "true"], addr=wproxy.hostport, stderr=err.f)
                   for _ in range(10)]
        if not wait_for(lambda: len(server.session_ids() - ids) >= 10 or any(p.poll() is not None for p in waiters)):
            problems.append("the 10 waiters did not all make their sessions within 60 s")
        time.sleep(1)
        h0, w0 = proxy.requests(), wproxy.requests()
        time.sleep(seconds)
        holder_rpm = (proxy.requests() - h0) * 60 / seconds
        per_waiter_rpm = (wproxy.requests() - w0) * 60 / seconds / 10
        gone = [p.returncode for p in waiters + [h] if p.poll() is not None]
        if gone:
            problems.append(f"{len(gone)} of the holder and 10 waiters exited while idle ({gone}){err.last()}")
        if server.holder(key) != sid:
            problems.append("the holder no longer held the key at the end")
        if wproxy.errors:
            problems.append(f"the waiters' counting proxy misread {wproxy.errors} request streams")
    finally:
        for p in waiters + [h]:
            if p.poll() is None:
                p.terminate()
        stop_all(waiters + [h])
        wproxy.close()
    return {
        "seconds": seconds,
        "holder_rpm": holder_rpm,
        # Defaults: a renewal every 7.5 s and a consistent confirmation every 3.08 s
        # (docs/safety.md: window 9.25 s / 3).
        "holder_renewals_rpm_expected": 60 / 7.5,
        "holder_confirmations_rpm_expected": 60 / 3.083,
        "per_waiter_rpm": per_waiter_rpm,
        "blocking_wait_s": 300,
        "problems": problems,
    }


# 7 -------------------------------------------------------------------------------
def bench_wakeup(server, n):
    host, port = server.hostport.rsplit(":", 1)
    key = f"bench/wake/{time.time_ns()}"
    server.call("PUT", f"/v1/kv/{key}", b"0")
    idx = server.call("GET", f"/v1/kv/{key}")[0]["ModifyIndex"]
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(f"GET /v1/kv/{key}?index={idx}&wait=60s HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        socks.append(s)
    time.sleep(2)  # let every query reach its wait
    # One epoll loop reads them all: 1000 Python threads measured the GIL, not the server
    # (205 ms to 1.65 s between runs).
    sel = selectors.DefaultSelector()
    for s in socks:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    done = []
    t0 = time.perf_counter()
    server.call("PUT", f"/v1/kv/{key}", b"1")
    end = t0 + 30
    while len(done) < n and time.perf_counter() < end:
        for ev, _ in sel.select(timeout=max(0.0, end - time.perf_counter())):
            try:
                data = ev.fileobj.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            sel.unregister(ev.fileobj)
            if data:
                done.append(time.perf_counter())
    sel.close()
    for s in socks:
        s.close()
    woken = len(done)
    return {
        "queries": n,
        "woken": woken,
        "all_woken_ms": (max(done) - t0) * 1000 if done else None,
        "server_peak_rss_mib": (server.rss_kib() or 0) / 1024,
        "problems": [] if woken == n else [f"only {woken} of {n} blocking queries were answered within 30 s"],
    }


def wait_quiet(proxy, quiet=0.5, within=60.0):
    """Until no request passed the proxy for `quiet` seconds (a waiter sits in its
    blocking query)."""
    last = [proxy.requests(), time.time()]

    def settled():
        n = proxy.requests()
        if n != last[0]:
            last[:] = [n, time.time()]
        return time.time() - last[1] >= quiet

    return wait_for(settled, within)


# 9 -------------------------------------------------------------------------------
def bench_lock_delay(tools, server, proxy, runs, delay_s=15):
    """A holder's session (created with a 15 s lock-delay) is destroyed
    (`PUT /v1/session/destroy`, which applies the lock-delay, as tests/it/peers.rs does
    with an expiry); a waiter for the same key, queued before and talking through the
    counting proxy, must sleep through the delay instead of polling and start its child
    right after it. Lateness = the child's own timestamp - (the moment the destroy was
    sent + the delay): measured from before the call, so it errs on the late side, and a
    negative value is a start inside the delay. The tools take turns (each with a holder
    of its own kind: `consul lock` always uses a 15 s lock-delay)."""
    out = {t.name: {"runs_all": [], "problems": []} for t in tools}
    for i in range(runs):
        for tool in tools:
            lock_delay_run(tool, server, proxy, delay_s, i, out[tool.name])
    for name, r in out.items():
        rs = r["runs_all"]
        late = [x["late_ms"] for x in rs]
        inside = sum(1 for v in late if v < 0)
        if inside and name == "conlock":
            r["problems"].append(f"{inside} of {len(rs)} runs started inside the lock-delay")
        r.update({
            "runs": len(rs),
            "lock_delay_s": rs[0]["lock_delay_s"] if rs else None,
            "invalidated_by": "PUT /v1/session/destroy/<holder session> (lock-delay applied)",
            "requests_until_child_started": max(x["requests_until_child_started"] for x in rs) if rs else None,
            "requests_during_delay": max(x["requests_during_delay"] for x in rs) if rs else None,
            "requests_note": "the waiter's requests through the counting proxy from the destroy: until its child "
                             "wrote its timestamp, and until 250 ms before the delay ended (max over runs)",
            "late_ms_p50": median(late),
            "late_ms_max": max(late) if late else None,
            "started_inside_lock_delay": inside,
        })
    return out


def lock_delay_run(tool, server, proxy, delay_s, i, r):
    d = tempfile.mkdtemp()
    pidfile, started, go, ev = (os.path.join(d, n) for n in ("pid", "started", "go", "events"))
    herr, werr = ErrLog(f"9-{tool.name}-holder"), ErrLog(f"9-{tool.name}-waiter")
    prefix = f"bench/lockdelay/{tool.name}/{i}/{time.time_ns()}"
    key = prefix + "/.lock"
    hold = ["--lock-delay", f"{delay_s}s", "--kill-grace", "1s"] if tool.name == "conlock" else []
    procs = []
    try:
        h = tool.run(tool.lock_cmd(prefix, ["bash", "-c", f"echo $$ > {pidfile}; exec sleep 600"], hold),
                     stderr=herr.f)
        procs.append(h)
        wait_for(lambda: h.poll() is not None or (server.holder(key) is not None and os.path.exists(pidfile)))
        if h.poll() is not None or server.holder(key) is None:
            r["problems"].append(f"run {i}: the holder exited {h.poll()} without holding{herr.last()}")
            return
        sid = server.holder(key)
        sess = [s for s in server.sessions() if s["ID"] == sid]
        applied = sess[0]["LockDelay"] / 1e9 if sess else None
        if applied != delay_s:
            r["problems"].append(f"run {i}: the holder's session has a lock-delay of {applied} s, not {delay_s} s")
        ids = server.session_ids()
        wait = ["--events", ev] if tool.name == "conlock" else []
        w = tool.run(tool.lock_cmd(prefix, ["bash", "-c", f"echo $EPOCHREALTIME > {started}; "
                                                          f"while [ ! -e {go} ]; do sleep 0.01; done"],
                                   [*tool.timeout_flag(120), *wait]),
                     addr=proxy.hostport, stderr=werr.f)
        procs.append(w)
        # conlock says when it waits; for `consul lock`, its session is the sign.
        if tool.name == "conlock":
            waiting = lambda: '"waiting"' in read_text(ev)  # noqa: E731
        else:
            waiting = lambda: bool(server.session_ids() - ids)  # noqa: E731
        if not wait_for(lambda: w.poll() is not None or waiting()) or w.poll() is not None:
            r["problems"].append(f"run {i}: the waiter exited {w.poll()} before it waited{werr.last()}")
            return
        if not wait_quiet(proxy):
            r["problems"].append(f"run {i}: the waiter never settled in its blocking query")
            return
        before = proxy.requests()
        t0 = time.time()
        server.call("PUT", f"/v1/session/destroy/{sid}")
        t1 = time.time()
        # Sampled shortly before the delay ends (as tests/it/peers.rs does).
        time.sleep(max(0.0, t0 + delay_s - 0.25 - time.time()))
        during = proxy.requests() - before
        # The child stays until `go`, so the release is not counted; polling every 5 ms
        # reads the count well before conlock's monitor's first query (50 ms after start).
        wait_for(lambda: read_float(started) is not None or w.poll() is not None, delay_s + 120)
        to_start = proxy.requests() - before
        t_child = read_float(started)
        if t_child is None:
            r["problems"].append(f"run {i}: the waiter exited {w.poll()} without running its command{werr.last()}")
            return
        open(go, "w").close()
        code = w.wait(timeout=60)
        hcode = h.wait(timeout=60)
        if code != 0:
            r["problems"].append(f"run {i}: the waiter exited {code} after a command that succeeded{werr.last()}")
        r["runs_all"].append({
            "requests_during_delay": during,
            "requests_until_child_started": to_start,
            "late_ms": (t_child - (t0 + delay_s)) * 1000,
            "late_ms_from_destroy_answer": (t_child - (t1 + delay_s)) * 1000,
            "destroy_call_ms": (t1 - t0) * 1000,
            "lock_delay_s": applied,
            "waiter_exit": code,
            "holder_exit": hcode,
        })
    finally:
        open(go, "w").close()
        stop_all(procs)


# 10 ------------------------------------------------------------------------------
def unshare_works():
    """None if PID namespaces can be made here, else why not (as tests/it/guardian.rs)."""
    if not shutil.which("unshare"):
        return "unshare is not installed"
    try:
        r = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
                           stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot run unshare: {e}"
    if r.returncode != 0:
        return (f"unshare --pid --fork --mount-proc failed ({r.returncode}: {r.stderr.strip()}); "
                "needs root or user namespaces")
    return None


def bench_no_reaper(server, binary, runs, lock_delay="15s"):
    """tests/it/guardian.rs `failover_when_pid_1_never_reaps`: the holder runs in a PID
    namespace whose init is `sleep` (it never reaps); its command (bench/beat.c) stamps
    the time and SIGKILLs conlock, then beats on; the guardian must kill it, take the
    zombie for dead and release. Failover = the waiter's child's timestamp - the kill's.
    The killed command's last beat must come before the next command started. The
    lock-delay only matters if the session were invalidated instead of released: 15 s
    makes that visible."""
    why = unshare_works()
    if why:
        print(f"bench: row 10 skipped: {why}", file=sys.stderr)
        return {"skipped": True, "skip_reason": why}
    beat = beat_program()
    tool = Tool("conlock", binary, server)
    problems, failovers, margins, alive_after = [], [], [], 0
    err = ErrLog("10")
    for i in range(runs):
        d = tempfile.mkdtemp()
        hb, go, killed, started, ev = (os.path.join(d, n) for n in ("beat", "go", "killed", "started", "events"))
        key = f"bench/noreaper/{i}/{time.time_ns()}"
        env = tool.env()
        env.update({"B_BIN": binary, "B_KEY": key, "B_DELAY": lock_delay, "B_BEAT": beat, "B_HB": hb,
                    "B_GO": go, "B_KILLED": killed})
        procs, cmd_pid = [], None
        try:
            ns = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c",
                 '"$B_BIN" run --key "$B_KEY" --lock-delay "$B_DELAY" -- "$B_BEAT" "$B_HB" "$B_GO" "$B_KILLED" & '
                 'exec sleep 100000'],
                env=env, stdin=subprocess.DEVNULL, stderr=err.f)
            procs.append(ns)
            if not wait_for(lambda: read_beat(hb)[0] or ns.poll() is not None) or not read_beat(hb)[0]:
                problems.append(f"run {i}: the holder's command never started (namespace exit {ns.poll()}){err.last()}")
                continue
            found = pids_running(beat, hb)
            cmd_pid = found[0] if len(found) == 1 else None  # the host's PID, not the namespace's
            if cmd_pid is None:
                problems.append(f"run {i}: cannot tell the holder's command among {found}")
                continue
            w = tool.run([binary, "run", "--key", key, "--timeout", "120s", "--events", ev, "--",
                          *first_stamp_cmd(started)], stderr=err.f)
            procs.append(w)
            if not wait_for(lambda: w.poll() is not None or '"waiting"' in read_text(ev)) or w.poll() is not None:
                problems.append(f"run {i}: the waiter exited {w.poll()} before it waited{err.last()}")
                continue
            open(go, "w").close()
            try:
                code = w.wait(timeout=180)
            except subprocess.TimeoutExpired:
                code = "none: still waiting after 180 s"
            t0, t1 = read_float(killed), first_stamp(started)
            _, last = read_beat(hb)
            if code != 0 or t0 is None or t1 is None:
                problems.append(f"run {i}: the waiter exited {code}; kill stamped: {t0 is not None}, "
                                f"next command started: {t1 is not None}{err.last()}")
                continue
            if last is None or last >= t1 or beat_alive(cmd_pid, beat, hb):
                alive_after += 1
                problems.append(f"run {i}: the killed holder's command was still running when the next one started")
            else:
                margins.append((t1 - last) * 1000)
            failovers.append((t1 - t0) * 1000)
        finally:
            open(go, "w").close()
            stop_all(procs)  # SIGKILL of unshare: --kill-child takes the whole namespace
            if beat_alive(cmd_pid, beat, hb):
                kill_pid(cmd_pid)
    return {
        "runs": len(failovers),
        "problems": problems,
        "alive_at_next_start": alive_after,
        "dead_before_next_ms_min": min(margins) if margins else None,
        "lock_delay": lock_delay,
        "killed": "conlock (the holder) by its own command, SIGKILL, inside a PID namespace whose PID 1 is sleep",
        "p50_ms": median(failovers),
        "max_ms": max(failovers) if failovers else None,
        "all_ms": failovers,
    }


# 11 ------------------------------------------------------------------------------
def proc_status_kib(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def proc_pss_kib(pid):
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def children_of(ppid):
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == ppid:
            out.append(int(name))
    return out


def same_exe(a, b):
    try:
        return os.readlink(f"/proc/{a}/exe") == os.readlink(f"/proc/{b}/exe")
    except OSError:
        return False


def bench_guardian_rss(tools, server, runs):
    """VmHWM (peak RSS) of the tool and of its helper processes (conlock's guardian: the
    child running conlock's executable that is not the command; `consul lock` has none),
    polled every 2 ms from the command's start until each exits (VmHWM only grows, so
    the last reading is the peak but for the last 2 ms). The tools take turns. RSS
    counts the pages the forked guardian still shares with conlock; PSS (shared pages
    split among their users) is given beside it."""
    rows = {t.name: [] for t in tools}
    problems = {t.name: [] for t in tools}
    errs = {t.name: ErrLog(f"11-{t.name}") for t in tools}
    for i in range(runs):
        for tool in tools:
            row = rss_run(tool, i, problems[tool.name], errs[tool.name])
            if row:
                rows[tool.name].append(row)
    out = {}
    for tool in tools:
        rs = rows[tool.name]

        def mib(field, f):
            v = [r[field] / 1024 for r in rs if r[field] is not None]
            return f(v) if v else None

        out[tool.name] = {
            "runs": len(rs),
            "conlock_hwm_mib_p50": mib("main_hwm_kib", statistics.median) if tool.name == "conlock" else None,
            "conlock_hwm_mib_max": mib("main_hwm_kib", max) if tool.name == "conlock" else None,
            "conlock_pss_mib_p50": mib("main_pss_kib", statistics.median) if tool.name == "conlock" else None,
            "guardian_hwm_mib_p50": mib("helper_hwm_kib", statistics.median) if tool.name == "conlock" else None,
            "guardian_hwm_mib_max": mib("helper_hwm_kib", max) if tool.name == "conlock" else None,
            "guardian_pss_mib_p50": mib("helper_pss_kib", statistics.median) if tool.name == "conlock" else None,
            "total_hwm_mib_p50": mib("total_hwm_kib", statistics.median),
            "total_hwm_mib_max": mib("total_hwm_kib", max),
            "unit": "MiB (1024 * 1024 bytes); the targets are 5 MB and 2.5 MB (10^6 bytes) = 4.77 and 2.38 MiB",
            "note": "VmHWM from /proc/<pid>/status polled from the command's start until the process exits; "
                    "conlock's guardian is found as conlock's child with conlock's executable that is not the "
                    "command; total = the tool + its helpers",
            "problems": problems[tool.name],
            "runs_all": rs,
        }
    return out


def rss_run(tool, i, problems, err):
    d = tempfile.mkdtemp()
    pidfile, go = os.path.join(d, "pid"), os.path.join(d, "go")
    prefix = f"bench/rss/{tool.name}/{i}/{time.time_ns()}"
    p = tool.run(tool.lock_cmd(prefix, ["sh", "-c", f"echo $$ > {pidfile}; while [ ! -e {go} ]; do sleep 0.01; done"]),
                 stderr=err.f)
    try:
        if not wait_for(lambda: p.poll() is not None or read_text(pidfile).strip().isdigit()) or p.poll() is not None:
            problems.append(f"run {i}: {tool.name} exited {p.poll()} without running its command{err.last()}")
            return None
        cmd = int(read_text(pidfile))
        found = []

        def helpers_seen():
            found[:] = [c for c in children_of(p.pid) if c != cmd and same_exe(c, p.pid)]
            return bool(found)

        if tool.name == "conlock":
            wait_for(helpers_seen, 10)
            if len(found) != 1:
                problems.append(f"run {i}: {len(found)} guardian candidates {found}")
        else:
            helpers_seen()
        time.sleep(0.2)  # the command runs a while, as any would: the holder's monitor starts
        row = {"main_pss_kib": proc_pss_kib(p.pid),
               "helper_pss_kib": sum(proc_pss_kib(g) or 0 for g in found) if found else None}
        peaks = {}

        def sample():
            for pid in [p.pid, *found]:
                v = proc_status_kib(pid, "VmHWM")
                if v is not None:
                    peaks[pid] = v

        sample()
        open(go, "w").close()
        while p.poll() is None:
            sample()
            time.sleep(0.002)
        if p.returncode != 0:
            problems.append(f"run {i}: {tool.name} exited {p.returncode} after a command that succeeded{err.last()}")
            return None
        main = peaks.get(p.pid)
        helpers = [peaks[g] for g in found if g in peaks]
        row.update({"main_hwm_kib": main, "helper_hwm_kib": sum(helpers) if helpers else None,
                    "total_hwm_kib": (main or 0) + sum(helpers) if main else None})
        return row
    finally:
        open(go, "w").close()
        stop_all([p])


# 12-14: etcd -------------------------------------------------------------------------
class EtcdServer:
    """A single-member etcd from ETCD, on 127.0.0.1 only with both ports explicit, its data
    dir on /dev/shm (etcd preallocates 64 MB of WAL; removed at stop), no ETCD_* variable
    of ours leaking in as a flag. Stopped by its PID."""

    def __init__(self, etcd):
        self.etcd = etcd
        self.version = etcd_version(etcd)
        self.dir = tempfile.mkdtemp(prefix="bench-etcd-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        fd, self.logpath = tempfile.mkstemp(prefix="bench-etcd-", suffix=".log")
        client, peer = free_ports(2)
        self.addr, purl = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
        argv = [etcd, "--name", "bench", "--data-dir", os.path.join(self.dir, "bench.etcd"),
                "--listen-client-urls", self.addr, "--advertise-client-urls", self.addr,
                "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                "--initial-cluster", f"bench={purl}", "--initial-cluster-state", "new",
                "--initial-cluster-token", "conlock-bench-" + os.path.basename(self.dir)]
        with os.fdopen(fd, "w") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         cwd=self.dir, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
        self.kind = f"etcd {self.version} single member ({etcd}, pid {self.proc.pid}, data on {self.dir})"
        if not wait_for(self._ready, 60) or self.proc.poll() is not None:
            tail = read_text(self.logpath)[-2000:]
            self.stop()
            raise SystemExit(f"bench: etcd ({' '.join(argv)}) was not healthy within 60 s; its log:\n{tail}")

    @property
    def hostport(self):
        return self.addr.split("://", 1)[1]

    def _ready(self):
        if self.proc.poll() is not None:
            return True
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(self.addr + "/health", timeout=2) as r:
                ok = b'"true"' in r.read()
        except (urllib.error.URLError, OSError):
            ok = False
        if not ok:
            time.sleep(0.05)
        return ok

    def call(self, path, body, timeout=30):
        req = urllib.request.Request(self.addr + path, data=json.dumps(body).encode(), method="POST")
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=timeout) as r:
            return json.loads(r.read() or b"{}")

    def holder(self, name):
        """The key holding `etcdctl lock NAME` (the smallest create revision under NAME/),
        or None."""
        b64 = lambda b: base64.b64encode(b).decode()  # noqa: E731
        try:
            kvs = self.call("/v3/kv/range", {"key": b64(name.encode() + b"/"), "range_end": b64(name.encode() + b"0")}).get("kvs", [])
        except (urllib.error.URLError, OSError, ValueError):
            return None
        return min(kvs, key=lambda kv: int(kv["create_revision"]))["key"] if kvs else None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            os.unlink(self.logpath)
        except OSError:
            pass


def etcd_version(etcd):
    try:
        out = subprocess.run([etcd, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"bench: cannot run {etcd} --version: {e}")
    m = re.search(r"etcd Version: (\S+)", out)
    if not m:
        raise SystemExit(f"bench: {etcd} is not an etcd binary (`etcd --version` said {out.strip()!r})")
    return m.group(1)


def etcdctl_beside(etcd):
    """etcdctl beside the etcd binary, else on PATH (Debian's etcd-client)."""
    beside = os.path.join(os.path.dirname(etcd), "etcdctl")
    found = beside if os.access(beside, os.X_OK) else shutil.which("etcdctl")
    if not found:
        raise SystemExit(f"bench: no etcdctl beside {etcd} or on PATH (install Debian's etcd-client)")
    return found


# Both tools with etcdctl's default lease TTL, 10 s. conlock refuses a --kill-grace plus its
# margin above TTL/2 on etcd, so its default 5 s grace is cut to 2 s (the lock-delay stays
# 15 s: it only matters after an involuntary end, which these rows do not have).
ETCD_TTL_S = 10
ETCD_CONLOCK_TIMINGS = ["--ttl", f"{ETCD_TTL_S}s", "--kill-grace", "2s"]


class EtcdTool(Tool):
    """`conlock run --backend etcd --key NAME` or `etcdctl lock NAME`: each finds etcd
    through ETCDCTL_ENDPOINTS (the counting proxy's address where `addr` is given)."""

    def env(self, addr=None):
        e = {k: v for k, v in os.environ.items() if not k.startswith(("CONSUL_", "CONLOCK_", "ETCDCTL_"))}
        e["ETCDCTL_API"] = "3"
        e["ETCDCTL_ENDPOINTS"] = "http://" + (addr or self.server.hostport)
        if self.name == "conlock":
            e["CONLOCK_BACKEND"] = "etcd"
        return e

    def lock_cmd(self, prefix, cmd, extra=()):
        if self.name == "conlock":
            return [self.binary, "run", "--key", prefix, *ETCD_CONLOCK_TIMINGS, *extra, "--", *cmd]
        # etcdctl (cobra) needs `--` before a command with flags of its own.
        return [self.binary, "lock", f"--ttl={ETCD_TTL_S}", *extra, prefix, "--", *cmd]

    def sem_cmd(self, prefix, limit, cmd):
        assert self.name == "conlock", "etcdctl has no semaphore"
        return [self.binary, "sem", "--limit", str(limit), "--prefix", prefix, *ETCD_CONLOCK_TIMINGS, "--", *cmd]

    def holder(self, prefix):
        return self.server.holder(prefix)

    def run(self, argv, addr=None, **kw):
        # etcdctl prints the key it holds: not into the table.
        kw.setdefault("stdout", subprocess.DEVNULL)
        return super().run(argv, addr=addr, **kw)


def bench_etcd_uncontended(tools, runs, proxy):
    """Wall time of `run -- true` beside `etcdctl lock NAME -- true`, interleaved (with
    spawning `true` alone as the floor); conlock's requests per run through the counting
    proxy (etcdctl speaks gRPC, HTTP/2: not counted); two runs per tool check that the
    lock is held while the command runs. Every run must exit 0."""
    walls = {t.name: [] for t in tools}
    problems = {t.name: [] for t in tools}
    errs = {t.name: ErrLog(f"12-{t.name}") for t in tools}
    floor = []
    for i in range(runs + 3):
        t0 = time.perf_counter()
        subprocess.Popen(["true"], env=tools[0].env(), stdin=subprocess.DEVNULL).wait()
        if i >= 3:
            floor.append((time.perf_counter() - t0) * 1000)
        for tool in tools:
            t0 = time.perf_counter()
            code = tool.run(tool.lock_cmd(f"bench/etcd/uncontended/{tool.name}", ["true"]),
                            stderr=errs[tool.name].f).wait()
            wall = time.perf_counter() - t0
            if code != 0:
                problems[tool.name].append(f"timed run {i} exited {code}{errs[tool.name].last()}")
            elif i >= 3:  # warm-up
                walls[tool.name].append(wall * 1000)
    counts = []
    c = tools[0]
    for i in range(3):
        before = proxy.requests()
        code = c.run(c.lock_cmd(f"bench/etcd/uncontended/{c.name}", ["true"]), addr=proxy.hostport,
                     stderr=errs[c.name].f).wait()
        if code != 0:
            problems[c.name].append(f"counted run {i} exited {code}{errs[c.name].last()}")
        else:
            counts.append(proxy.requests() - before)
    if proxy.errors:
        problems[c.name].append(f"the counting proxy misread {proxy.errors} request streams")
    for i in range(2):
        for tool in tools:
            why = run_with_go(tool, f"bench/etcd/held/{tool.name}/{i}/.lock", errs[tool.name])
            if why:
                problems[tool.name].append(why)
    return {t.name: {"runs": runs, "wall_ms_p50": median(walls[t.name]), "wall_ms_p99": pct(walls[t.name], 99),
                     "true_wall_ms_p50": median(floor),
                     "requests_per_run": median(counts) if t is c else None,
                     "requests_per_run_all": counts if t is c else None,
                     "timings": ETCD_CONLOCK_TIMINGS if t is c else [f"--ttl={ETCD_TTL_S}"],
                     "problems": problems[t.name]} for t in tools}


def etcd_sem_available(tool):
    """None if `conlock sem --backend etcd` takes a lock, else what it said when it refused
    (before the etcd semaphore existed: 'does not support --backend etcd yet', exit 125)."""
    r = subprocess.run(tool.sem_cmd(f"bench/etcd/sem-probe/{time.time_ns()}", 4, ["true"]), env=tool.env(),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    if r.returncode == 125 and re.search(r"not support|not supported|yet", r.stderr):
        return r.stderr.strip()[-300:]
    if r.returncode != 0:
        raise RowFailed(f"conlock sem --backend etcd -- true exited {r.returncode}: {r.stderr.strip()[-300:]}")
    return None


def bench_etcd_semaphore(tool, proxy, jobs, job_s, limit, rounds):
    """Row 5 on etcd, conlock only (etcdctl has no semaphore). A `conlock sem` that still
    refuses etcd makes the row 'not available': a MISS, never a PASS."""
    why = etcd_sem_available(tool)
    if why:
        return {"conlock": {"error": f"not available: conlock sem --backend etcd refused ({why})", "unavailable": True}}
    res = bench_semaphore([tool], tool.server, proxy, jobs, job_s, limit, rounds)
    if proxy.errors:
        res["conlock"]["problems"].append(f"the counting proxy misread {proxy.errors} request streams")
    return res


# Verdicts --------------------------------------------------------------------------
class Max:
    def __init__(self, x, text=None):
        self.x, self._text = x, text

    def text(self, unit):
        return self._text or f"<= {self.x:g}{' ' + unit if unit else ''}"

    def ok(self, v, other):
        return v <= self.x


class Eq(Max):
    def text(self, unit):
        return self._text or f"= {self.x:g}"

    def ok(self, v, other):
        return v == self.x


class Ratio(Max):
    """At most x times consul lock's value, measured in the same run."""

    def text(self, unit):
        return self._text or f"<= {self.x:g}x consul lock"

    def ok(self, v, other):
        return isinstance(other, (int, float)) and v <= self.x * other


# (label, row, field, unit, target on the dev server, target on a real agent). A target
# of None: shown, not judged. The real agent's targets are issue 30's.
SPEC = [
    ("0 request streams the proxy misread", "0_harness", "proxy_errors", "", Eq(0), Eq(0)),
    ("1 uncontended wall p50", "1_uncontended", "wall_ms_p50", "ms", Max(4), Ratio(0.15)),
    ("1 spawning `true` alone, p50", "1_uncontended", "true_wall_ms_p50", "ms", None, None),
    ("1 spawning `true` alone, p99", "1_uncontended", "true_wall_ms_p99", "ms", None, None),
    ("1 same requests + spawn in C, p50", "1_uncontended", "protocol_floor_ms_p50", "ms", None, None),
    ("1 uncontended peak RSS p50", "1_uncontended", "rss_mib_p50", "MiB", Max(5), Max(5)),
    ("1 requests per uncontended run", "1_uncontended", "requests_per_run", "", Max(6), Max(6)),
    ("1 threads created per run", "1_uncontended", "threads_per_run", "", Max(5), Max(5)),
    ("1 processes created per run", "1_uncontended", "processes_per_run", "", None, None),
    ("2 handoff, 10 waiters, p50", "2_handoff", "p50_ms", "ms", Max(2.5), None),
    ("2 handoff, 10 waiters, p99", "2_handoff", "p99_ms", "ms", Max(5), None),
    ("2 handoff, 10 waiters, overlaps", "2_handoff", "overlaps", "", Eq(0), Eq(0)),
    ("2 handoff, 5 waiters, p50", "2_handoff_5", "p50_ms", "ms", Max(2.5), Ratio(0.7)),
    ("2 handoff, 5 waiters, p99", "2_handoff_5", "p99_ms", "ms", Max(5), Ratio(0.7)),
    ("2 handoff, 5 waiters, overlaps", "2_handoff_5", "overlaps", "", Eq(0), Eq(0)),
    ("2 handoff, 1 waiter, p50", "2_handoff_1", "p50_ms", "ms", None, None),
    ("2 handoff, 1 waiter, p99", "2_handoff_1", "p99_ms", "ms", None, None),
    ("2 handoff, 1 waiter, overlaps", "2_handoff_1", "overlaps", "", Eq(0), Eq(0)),
    ("3 loss reaction p50", "3_loss_reaction", "p50_ms", "ms", Max(100), Max(100)),
    ("3 loss reaction max", "3_loss_reaction", "max_ms", "ms", Max(100), Max(100)),
    ("4 failover after SIGKILL p50", "4_failover", "p50_ms", "ms", Max(100), None),
    ("4 failover after SIGKILL max", "4_failover", "max_ms", "ms", None, None),
    ("4 killed command alive at next start", "4_failover", "alive_at_next_start", "", Eq(0), Eq(0)),
    ("4 last beat before next start, min", "4_failover", "dead_before_next_ms_min", "ms", None, None),
    ("4 lock-delay used", "4_failover", "lock_delay_s", "s", None, None),
    ("4 session TTL used", "4_failover", "ttl_s", "s", None, None),
    ("5 semaphore wall / ideal", "5_semaphore", "ratio", "x", Max(1.05), Max(1.05)),
    # Dev-server request targets of rows 5 and 9 at what exact flags cost (issue 30: no
    # Flags in /v1/txn before Consul 1.7, so a slot is a contender write, a list, a
    # check-and-set, a rewrite and a list; a waiter renews after its read-back); they
    # were 12 and 5 with the one-transaction writes. docs/benchmarks.md, 2026-11-28.
    ("5 semaphore requests per job", "5_semaphore", "requests_per_job", "", Max(15), None),
    ("5 semaphore max concurrent", "5_semaphore", "max_concurrent", "", Max(4), Max(4)),
    ("5 until the first 4 jobs ran", "5_semaphore", "ramp_ms", "ms", None, None),
    ("5 freed slot to next start, p50", "5_semaphore", "slot_gap_ms_p50", "ms", None, None),
    ("5 freed slot to next start, mean", "5_semaphore", "slot_gap_ms_mean", "ms", None, None),
    ("5 last end to last exit", "5_semaphore", "tail_ms", "ms", None, None),
    ("6 idle holder requests/min", "6_idle", "holder_rpm", "", None, None),
    ("6 idle waiter requests/min", "6_idle", "per_waiter_rpm", "", Max(0.2), Max(0.2)),
    ("7 1000 blocking queries woken", "7_devserver_wakeup", "woken", "", Eq(1000), None),
    ("7 all woken after", "7_devserver_wakeup", "all_woken_ms", "ms", Max(1000), None),
    ("7 dev server peak RSS", "7_devserver_wakeup", "server_peak_rss_mib", "MiB", None, None),
    ("8 release binary size", "8_binary", "size_mb", "MB", Max(5), Max(5)),
    ("9 waiter reqs, 15 s lock-delay", "9_lock_delay", "requests_until_child_started", "", Max(6), Max(10)),
    ("9 of them before the delay ended", "9_lock_delay", "requests_during_delay", "", None, None),
    ("9 start after lock-delay p50", "9_lock_delay", "late_ms_p50", "ms", Max(100), Max(200)),
    ("9 start after lock-delay max", "9_lock_delay", "late_ms_max", "ms", Max(100), Max(200)),
    ("9 starts inside the lock-delay", "9_lock_delay", "started_inside_lock_delay", "", Eq(0), Eq(0)),
    ("10 failover, PID 1 no reaper p50", "10_no_reaper", "p50_ms", "ms", Max(100), Max(500)),
    ("10 failover, PID 1 no reaper max", "10_no_reaper", "max_ms", "ms", Max(100), Max(500)),
    ("10 killed command alive at next start", "10_no_reaper", "alive_at_next_start", "", Eq(0), Eq(0)),
    ("10 last beat before next start, min", "10_no_reaper", "dead_before_next_ms_min", "ms", None, None),
    ("11 conlock peak RSS (VmHWM) p50", "11_rss", "conlock_hwm_mib_p50", "MiB", Max(4.77, "<= 4.77 MiB (5 MB)"), Max(4.77, "<= 4.77 MiB (5 MB)")),
    ("11 guardian peak RSS (VmHWM) p50", "11_rss", "guardian_hwm_mib_p50", "MiB", Max(2.38, "<= 2.38 MiB (2.5 MB)"), Max(2.38, "<= 2.38 MiB (2.5 MB)")),
    ("11 guardian peak RSS (VmHWM) max", "11_rss", "guardian_hwm_mib_max", "MiB", Max(2.38, "<= 2.38 MiB (2.5 MB)"), Max(2.38, "<= 2.38 MiB (2.5 MB)")),
    ("11 guardian PSS p50", "11_rss", "guardian_pss_mib_p50", "MiB", None, None),
    ("11 tool + helpers peak RSS p50", "11_rss", "total_hwm_mib_p50", "MiB", None, Ratio(0.25)),
]


# The etcd rows (--etcd-bin), the same on both kinds of Consul: the ratios are to
# `etcdctl lock` on the same etcd, measured in the same run (issue 33).
ETCD_SPEC = [
    ("12 etcd uncontended wall p50", "12_etcd_uncontended", "wall_ms_p50", "ms", Ratio(0.3, "<= 0.3x etcdctl lock"), None),
    ("12 etcd uncontended wall p99", "12_etcd_uncontended", "wall_ms_p99", "ms", None, None),
    ("12 etcd spawning `true` alone, p50", "12_etcd_uncontended", "true_wall_ms_p50", "ms", None, None),
    ("12 etcd requests per uncontended run", "12_etcd_uncontended", "requests_per_run", "", None, None),
    ("13 etcd handoff, 5 waiters, p50", "13_etcd_handoff_5", "p50_ms", "ms", Ratio(0.7, "<= 0.7x etcdctl lock"), None),
    ("13 etcd handoff, 5 waiters, p99", "13_etcd_handoff_5", "p99_ms", "ms", Ratio(0.7, "<= 0.7x etcdctl lock"), None),
    ("13 etcd handoff, 5 waiters, overlaps", "13_etcd_handoff_5", "overlaps", "", Eq(0), None),
    ("14 etcd semaphore wall / ideal", "14_etcd_semaphore", "ratio", "x", Max(1.05), None),
    ("14 etcd semaphore max concurrent", "14_etcd_semaphore", "max_concurrent", "", Max(4), None),
    ("14 etcd semaphore requests per job", "14_etcd_semaphore", "requests_per_job", "", None, None),
    ("14 etcd freed slot to next start, p50", "14_etcd_semaphore", "slot_gap_ms_p50", "ms", None, None),
]
ETCD_SPEC = [(label, key, field, unit, dev, dev) for label, key, field, unit, dev, _ in ETCD_SPEC]


SHARED = {"true_wall_ms_p50", "true_wall_ms_p99", "protocol_floor_ms_p50", "proxy_errors"}


def judge(tools, real, spec=SPEC, other="consul-lock"):
    """One line per measured SPEC entry: (label, value, unit, target text, verdict,
    consul lock's value, ratio), and the reasons of the MISSes. A row that failed, or
    had problems, is a MISS on every line with a target; so is a ratio whose `consul
    lock` (`other`) runs failed."""
    c, o = tools.get("conlock", {}), tools.get(other)
    lines, reasons = [], {}

    def trouble(row, name):
        if row is None:
            return None
        if "error" in row:
            return row["error"]
        if row.get("problems"):
            return "; ".join(row["problems"][:5]) + (f"; and {len(row['problems']) - 5} more" if len(row["problems"]) > 5 else "")
        return None

    for label, key, field, unit, dev, agent in spec:
        row = c.get(key)
        if row is None:
            continue
        orow = o.get(key) if o else None
        target = agent if real else dev
        if isinstance(target, Ratio) and not orow:
            target = None  # nothing to compare with (the table says so)
        if row.get("skipped"):
            if target and label.endswith("p50"):
                lines.append((label, "skipped", "", target.text(unit), "SKIP", None, None))
                reasons[f"{key} (conlock)"] = row["skip_reason"]
            continue
        v = None if "error" in row else row.get(field)
        # The floors are one measurement, not the tools': no `consul lock` column.
        ov = orow.get(field) if orow and field not in SHARED else None
        ratio = v / ov if isinstance(v, (int, float)) and isinstance(ov, (int, float)) and ov else None
        verdict = ""
        if target:
            why = trouble(row, "conlock")
            if why:
                reasons[f"{key} (conlock)"] = why
            owhy = trouble(orow, other) if isinstance(target, Ratio) else None
            if owhy:
                reasons[f"{key} ({other.replace('-', ' ')}: nothing to compare with)"] = owhy
            if why or owhy or v is None or (isinstance(target, Ratio) and ov is None):
                verdict = "MISS"
            else:
                verdict = "PASS" if target.ok(v, ov) else "MISS"
        shown = ("not avail." if row.get("unavailable") else "failed") if "error" in row else v
        if v is None and "error" not in row and target is None:
            continue  # not measured here (no C compiler, no strace, ...) and nothing to judge
        lines.append((label, shown, unit, target.text(unit) if target else "", verdict, ov, ratio))
    return lines, reasons


def fmt(v, unit=""):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        # Ratios to 3 places: 1.054 must not print as the 1.05 it missed.
        places = 3 if unit == "x" else 2 if abs(v) < 10 else 1
        return f"{v:.{places}f}"
    return f"{v}"


def report(r, out, real):
    lines, reasons = judge(r["tools"], real)
    elines, ereasons = judge(r["tools"], real, ETCD_SPEC, "etcdctl")
    n = r["noise"]
    print(f"server: {r['server']}")
    if r.get("etcd"):
        print(f"etcd: {r['etcd']['server']}; etcdctl: {r['etcd']['etcdctl']}")
    print(f"machine: {n['cpus']} CPUs, load average {n['loadavg_start']} at the start, "
          f"{n['loadavg_end']} at the end; targets for {'a real agent' if real else 'the dev server'}")
    if n.get("agent"):
        a = n["agent"]
        print(f"agent: {a['late_answers']} answers came more than 1 s later than asked for"
              + (f" (worst {a['worst_late_s']:.1f} s late: the agent was stalled; see {n['agent_log']})"
                 if a["late_answers"] else ""))
    # The Consul rows beside `consul lock`, then the etcd rows beside `etcdctl lock`.
    for rows, why, name, label in ((lines, reasons, "consul-lock", "consul lock"),
                                   (elines, ereasons, "etcdctl", "etcdctl lock")):
        if not rows:
            continue
        other = name in r["tools"]
        w = max(11, len(label))
        head = f"{'measurement':<38} {'conlock':>11} {'target':>22} {'verdict':>7}"
        if other:
            head += f" {label:>{w}} {'ratio':>6}"  # ratio: conlock / the other tool
        if rows is elines:
            print()
        print(head)
        print("-" * len(head))
        for lbl, v, unit, target, verdict, ov, ratio in rows:
            line = f"{lbl:<38} {fmt(v, unit) + (' ' + unit if unit and isinstance(v, (int, float)) else ''):>11} {target:>22} {verdict:>7}"
            if other:
                line += f" {fmt(ov, unit):>{w}} {'n/a' if ratio is None else f'{ratio:.3f}':>6}"
            print(line)
        if real and not other and rows is lines:
            print("(the targets relative to `consul lock` are not judged: it was not measured)")
        for what, text in why.items():
            print(f"  {what}: {text}")
    lines = lines + elines
    b = r.get("binary", {})
    print(f"\nresults written to {out} (conlock: {b.get('path')}, {b.get('linking')})")
    verdicts = [l[4] for l in lines if l[4]]
    missed = [l[0] for l in lines if l[4] == "MISS"]
    skipped = verdicts.count("SKIP")
    print(f"bench: {len(verdicts)} targets: {verdicts.count('PASS')} PASS, {len(missed)} MISS"
          + (f", {skipped} SKIP" if skipped else "") + (f" ({', '.join(missed)})" if missed else ""))
    r["verdicts"] = [{"measurement": l[0], "value": l[1], "target": l[3], "verdict": l[4]} for l in lines if l[4]]
    return not missed


def loadavg():
    return " ".join(read_text("/proc/loadavg").split()[:3])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=release_binary(), help="default: the release build make made last (target/release-target)")
    ap.add_argument("--consul-bin", metavar="PATH",
                    help="start a real `consul agent -dev` from this binary on loopback, measure against it and "
                         "compare with its `consul lock` (real-agent targets)")
    ap.add_argument("--consul-addr", help="measure against this Consul instead of a dev server (real-agent targets)")
    ap.add_argument("--compare-consul-lock", metavar="PATH", help="also measure this consul binary's `consul lock`")
    ap.add_argument("--etcd-bin", metavar="PATH",
                    help="also start a single-member etcd from this binary on loopback and measure rows 12-14 "
                         "on it, beside the etcdctl found beside it or on PATH")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--out", help="default: bench/results.json, bench/results-consul.json against a real agent")
    ap.add_argument("--only", default="1,2,3,4,5,6,7,8,9,10,11,12,13,14",
                    help="comma-separated measurement numbers (12-14: etcd, with --etcd-bin)")
    a = ap.parse_args()
    only = {int(x) for x in a.only.split(",")}
    binary = os.path.abspath(a.bin)
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"bench: {binary} is not an executable conlock (build it with `make release`, or pass --bin)")
    runs = 5 if a.quick else 20
    real = bool(a.consul_bin or a.consul_addr)
    out_path = a.out or os.path.join(HERE, "results-consul.json" if real else "results.json")
    compare = a.compare_consul_lock or a.consul_bin
    # SIGTERM (make interrupted) unwinds like Ctrl-C, so that the agent is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = ConsulAgent(os.path.abspath(a.consul_bin)) if a.consul_bin and not a.consul_addr else Server(binary, a.consul_addr)
    proxy = CountingProxy(server.hostport)
    results = {"server": server.kind,
               "binary": {"path": binary, "linking": linking(binary)},
               "targets": "real agent (issue 30)" if real else "dev server",
               "noise": {"cpus": os.cpu_count(), "loadavg_start": loadavg()},
               "interleaved": True, "tools": {}}
    tools = [Tool("conlock", binary, server)]
    if compare:
        tools.append(Tool("consul-lock", os.path.abspath(compare), server))
        results["consul_lock"] = os.path.abspath(compare)
    per_tool = {t.name: {} for t in tools}
    etcd = etcd_proxy = None
    etcd_tools = []
    if a.etcd_bin and only & {12, 13, 14}:
        etcdctl = etcdctl_beside(os.path.abspath(a.etcd_bin))
        try:
            etcd = EtcdServer(os.path.abspath(a.etcd_bin))
        except BaseException:
            proxy.close()
            server.stop()
            raise
        etcd_proxy = CountingProxy(etcd.hostport)
        etcd_tools = [EtcdTool("conlock", binary, etcd), EtcdTool("etcdctl", etcdctl, etcd)]
        per_tool["etcdctl"] = {}
        results["etcd"] = {"server": etcd.kind, "etcdctl": etcdctl, "version": etcd.version,
                           "conlock_timings": ETCD_CONLOCK_TIMINGS, "etcdctl_ttl_s": ETCD_TTL_S}

    def row(key, by_tool, fn, *args):
        """Runs one row; a row that cannot be measured is recorded as failed (a MISS)."""
        print(f"[{' and '.join(by_tool)}] {key} ...", file=sys.stderr)
        try:
            res = fn(*args)
        except RowFailed as e:
            res = {name: {"error": str(e)} for name in by_tool}
        except Exception as e:  # a harness bug must not pass for a measurement either
            traceback.print_exc()
            res = {name: {"error": f"harness error: {e!r}"} for name in by_tool}
        else:
            if len(by_tool) == 1 and by_tool[0] not in res:
                res = {by_tool[0]: res}
        for name, v in res.items():
            per_tool[name][key] = v
            if "error" in v:
                print(f"bench: {key} ({name}) failed: {v['error']}", file=sys.stderr)

    everyone, conlock = [t.name for t in tools], ["conlock"]
    try:
        if 1 in only:
            row("1_uncontended", everyone, bench_uncontended, tools, runs, proxy)
        if 2 in only:
            # Enough handoffs that p99 is not the single worst one (30 made it the maximum).
            row("2_handoff", everyone, bench_handoff, tools, 10, 30 if a.quick else 200, 1 if a.quick else 4)
            # The target is for 5 to 10 waiters: the low end too, with as many handoffs.
            row("2_handoff_5", everyone, bench_handoff, tools, 5, 10 if a.quick else 200, 1 if a.quick else 4)
            # The same with one waiter: what the ten waiters racing for 2 CPUs add.
            row("2_handoff_1", everyone, bench_handoff, tools, 1, 10 if a.quick else 100, 1 if a.quick else 2)
        if 4 in only:
            # `consul lock` has no flags for them: it always uses a 15 s lock-delay and TTL,
            # so conlock gets the same when compared; alone, a short lock-delay keeps it quick
            # (replaced by the values seen in `consul lock`'s session when compared)
            settings = {"conlock": ["--lock-delay", "1s", "--kill-grace", "200ms"]}
            row("4_failover", everyone, bench_failover, tools, server, settings, 2 if a.quick else 5)
        if 5 in only:
            row("5_semaphore", everyone, bench_semaphore, tools, server, proxy, 60, 0.2, 4, 1 if a.quick else 2)
        if 3 in only:
            row("3_loss_reaction", conlock, bench_loss_reaction, server, binary, 5 if a.quick else 15)
        if 6 in only:
            row("6_idle", conlock, bench_idle, binary, server, proxy, 10 if a.quick else 30)
        if 9 in only:
            row("9_lock_delay", everyone, bench_lock_delay, tools, server, proxy, 1 if a.quick else 2)
        if 10 in only:
            row("10_no_reaper", conlock, bench_no_reaper, server, binary, 3 if a.quick else 5)
        if 11 in only:
            row("11_rss", everyone, bench_guardian_rss, tools, server, min(runs, 10))
        if isinstance(server.proc, subprocess.Popen) and not real and 7 in only:
            row("7_devserver_wakeup", conlock, bench_wakeup, server, 1000)
        if 8 in only:
            per_tool["conlock"]["8_binary"] = {"size_mb": os.path.getsize(binary) / 1e6}
        etcd_names = [t.name for t in etcd_tools]
        if etcd and 12 in only:
            row("12_etcd_uncontended", etcd_names, bench_etcd_uncontended, etcd_tools, runs, etcd_proxy)
        if etcd and 13 in only:
            row("13_etcd_handoff_5", etcd_names, bench_handoff, etcd_tools, 5, 10 if a.quick else 200, 1 if a.quick else 4)
        if etcd and 14 in only:
            row("14_etcd_semaphore", conlock, bench_etcd_semaphore, etcd_tools[0], etcd_proxy, 60, 0.2, 4, 1 if a.quick else 2)
    finally:
        proxy.close()
        server.stop()
        if etcd:
            etcd_proxy.close()
            etcd.stop()
    results["tools"] = per_tool
    results["noise"]["loadavg_end"] = loadavg()
    if isinstance(server, ConsulAgent):
        results["noise"]["agent"] = server.stalls()
        results["noise"]["agent_log"] = server.logpath
    # Request counts are only as good as the proxy's parsing.
    per_tool["conlock"]["0_harness"] = {"proxy_errors": proxy.errors}
    passed = report(results, out_path, real)
    with open(out_path, "w") as f:
        json.dump(results, f, indent=2)
    sys.exit(0 if passed else 1)


def linking(path):
    """'static' or 'dynamic' (the ELF file names a program interpreter), for the report:
    the release build is a static musl binary where that Rust target is installed."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if head[:4] != b"\x7fELF" or head[4] != 2:
                return "unknown"
            phoff = int.from_bytes(head[0x20:0x28], "little")
            phentsize = int.from_bytes(head[0x36:0x38], "little")
            phnum = int.from_bytes(head[0x38:0x3A], "little")
            f.seek(phoff)
            table = f.read(phentsize * phnum)
    except OSError:
        return "unknown"
    types = {int.from_bytes(table[i:i + 4], "little") for i in range(0, len(table), phentsize)}
    return "dynamic" if 3 in types else "static"  # 3: PT_INTERP


if __name__ == "__main__":
    main()
