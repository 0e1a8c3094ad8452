#!/usr/bin/env python3
"""conlock benchmark harness (`make bench`).

Starts its own `conlock dev-server` (or uses --consul-addr), measures the targets of
issue 6, prints a table and writes bench/results.json. With --compare-consul-lock PATH it
runs the same work with HashiCorp's `consul lock` on the same server, in the same run.

Every measurement is a median over repeated runs after warm-up runs; p99 is given where
there are enough samples. Request counts come from the dev server's own counter.
"""
import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))


def now_ns():
    return time.time_ns()


class Server:
    """A dev server we started, or an external Consul."""

    def __init__(self, binary, external=None):
        self.proc = None
        if external:
            self.addr = external if external.startswith("http") else "http://" + external
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

    def requests(self):
        if not self.proc:
            return None
        return self.call("GET", "/v1/conlock-dev/stats")["requests"]

    def rss_kib(self, peak=True):
        if not self.proc:
            return None
        field = "VmHWM" if peak else "VmRSS"
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1])
        return None

    def holder(self, key):
        try:
            pairs = self.call("GET", "/v1/kv/" + key)
        except urllib.error.HTTPError:
            return None
        return pairs[0].get("Session") if pairs else None

    def sessions(self):
        return self.call("GET", "/v1/session/list") or []

    def stop(self):
        if self.proc:
            self.proc.terminate()
            self.proc.wait()


class Tool:
    """How to run 'CMD under a lock' with conlock or consul lock."""

    def __init__(self, name, binary, server):
        self.name, self.binary, self.server = name, binary, server

    def env(self):
        e = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
        e["CONSUL_HTTP_ADDR"] = self.server.hostport
        return e

    def lock_cmd(self, prefix, cmd, extra=()):
        if self.name == "conlock":
            return [self.binary, "run", "--prefix", prefix, *extra, "--", *cmd]
        return [self.binary, "lock", *extra, prefix, *cmd]

    def sem_cmd(self, prefix, limit, cmd):
        if self.name == "conlock":
            return [self.binary, "sem", "--limit", str(limit), "--prefix", prefix, "--", *cmd]
        return [self.binary, "lock", "-n", str(limit), prefix, *cmd]

    def run(self, argv, **kw):
        return subprocess.Popen(argv, env=self.env(), stdin=subprocess.DEVNULL, **kw)


def pct(values, p):
    if not values:
        return None
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100 * (len(s) - 1)))))
    return s[k]


def wait_for(cond, within=60.0):
    until = time.time() + within
    while time.time() < until:
        if cond():
            return True
        time.sleep(0.005)
    return False


def bash_job(log, body):
    """A bash child that logs S/E lines with $EPOCHREALTIME (no fork for the timestamp)."""
    return ["bash", "-c", f'echo "S $$ $EPOCHREALTIME" >> {log}; {body}; echo "E $$ $EPOCHREALTIME" >> {log}']


STAMP = None


def stamp_job(log, ms):
    """The job used for handoffs: a tiny C program if a C compiler is here, else bash."""
    global STAMP
    if STAMP is None:
        out = os.path.join(tempfile.mkdtemp(), "stamp")
        ok = subprocess.run(["cc", "-O2", "-o", out, os.path.join(HERE, "stamp.c")], stderr=subprocess.DEVNULL).returncode == 0
        STAMP = out if ok else ""
    if STAMP:
        return [STAMP, log, str(ms)], "C stamp program"
    return bash_job(log, f"sleep {ms / 1000}"), "bash with $EPOCHREALTIME (no C compiler)"


def read_log(log):
    starts, ends = {}, {}
    with open(log) as f:
        for line in f:
            parts = line.split()
            if len(parts) != 3:
                continue
            t = float(parts[2].replace(",", "."))
            (starts if parts[0] == "S" else ends)[parts[1]] = t
    return [(starts[k], ends[k]) for k in starts if k in ends]


# 1 -------------------------------------------------------------------------------
def bench_uncontended(tool, runs):
    """Wall time of direct runs; peak RSS from GNU time's own fork. (ru_maxrss of a child
    forked from Python includes Python's pre-exec image: even `true` shows ~14 MiB.)"""
    walls, rss = [], []
    prefix = f"bench/uncontended/{tool.name}"
    for i in range(runs + 3):
        t0 = time.perf_counter()
        code = tool.run(tool.lock_cmd(prefix, ["true"])).wait()
        wall = time.perf_counter() - t0
        if code != 0:
            raise SystemExit(f"bench: {tool.name} run failed with {code}")
        if i >= 3:  # warm-up
            walls.append(wall * 1000)
    if os.path.exists("/usr/bin/time"):
        for _ in range(min(runs, 10)):
            out = subprocess.run(
                ["/usr/bin/time", "-f", "MAXRSS %M", *tool.lock_cmd(prefix, ["true"])],
                env=tool.env(), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            )
            m = re.search(r"MAXRSS (\d+)", out.stderr)
            if m:
                rss.append(int(m.group(1)) / 1024)
    return {
        "wall_ms_p50": statistics.median(walls),
        "wall_ms_p99": pct(walls, 99),
        "rss_mib_p50": statistics.median(rss) if rss else None,
        "rss_mib_max": max(rss) if rss else None,
        "rss_note": "max RSS of the tool and its waited-for children, via /usr/bin/time" if rss else "/usr/bin/time missing: not measured",
    }


# 2 -------------------------------------------------------------------------------
def bench_handoff(tool, waiters, handoffs):
    """Keeps `waiters` contenders queued behind the holder; each handoff is the gap from
    one job's last line to the next job's first line (both bash, $EPOCHREALTIME)."""
    d = tempfile.mkdtemp()
    log = os.path.join(d, "log")
    prefix = f"bench/handoff/{tool.name}/{time.time_ns()}"
    key = prefix + "/.lock"
    total = handoffs + 1
    started, running = 0, []

    job, kind = stamp_job(log, 50)

    def start():
        nonlocal started
        running.append(tool.run(tool.lock_cmd(prefix, job)))
        started += 1

    start()
    wait_for(lambda: tool.server.holder(key) is not None)
    while started < min(total, waiters + 1):
        start()
    while running:
        for p in list(running):
            if p.poll() is not None:
                running.remove(p)
                if started < total:
                    start()
        time.sleep(0.002)
    iv = sorted(read_log(log))
    gaps = [(iv[i + 1][0] - iv[i][1]) * 1000 for i in range(len(iv) - 1)]
    return {"waiters": waiters, "job": kind, "handoffs": len(gaps), "p50_ms": statistics.median(gaps), "p99_ms": pct(gaps, 99)}


# 3 -------------------------------------------------------------------------------
def bench_loss_reaction(server, binary, runs):
    reactions = []
    for i in range(runs + 1):
        d = tempfile.mkdtemp()
        mark = os.path.join(d, "sig")
        key = f"bench/loss/{i}"
        cmd = ["bash", "-c", f'trap \'echo $EPOCHREALTIME > {mark}; exit 0\' TERM; sleep 60 & wait $!']
        tool = Tool("conlock", binary, server)
        p = tool.run([binary, "run", "--key", key, "--lock-delay", "0s", "--", *cmd])
        if not wait_for(lambda: server.holder(key) is not None):
            raise SystemExit("bench: holder did not acquire")
        time.sleep(0.2)
        session = server.holder(key)
        t0 = time.time()
        server.call("PUT", f"/v1/session/destroy/{session}")
        p.wait()
        wait_for(lambda: os.path.exists(mark) and open(mark).read().strip())
        t1 = float(open(mark).read().strip().replace(",", "."))
        if i >= 1:
            reactions.append((t1 - t0) * 1000)
    return {"p50_ms": statistics.median(reactions), "p99_ms": pct(reactions, 99), "max_ms": max(reactions)}


# 4 -------------------------------------------------------------------------------
def bench_failover(tool, server, lock_delay_s, runs):
    extra_after = []
    for i in range(runs):
        d = tempfile.mkdtemp()
        started = os.path.join(d, "b")
        prefix = f"bench/failover/{tool.name}/{i}"
        key = prefix + "/.lock"
        holder_extra = ["--lock-delay", f"{lock_delay_s}s"] if tool.name == "conlock" else []
        a = tool.run(tool.lock_cmd(prefix, ["sleep", "60"], holder_extra))
        if not wait_for(lambda: server.holder(key) is not None):
            raise SystemExit("bench: holder did not acquire")
        b = tool.run(tool.lock_cmd(prefix, ["bash", "-c", f"echo $EPOCHREALTIME > {started}"]))
        wait_for(lambda: len(server.sessions()) >= 2)
        time.sleep(0.3)
        delay = lock_delay_s
        if tool.name != "conlock":
            # consul lock always uses a 15 s lock-delay; read it from the session.
            s = [x for x in server.sessions() if x["ID"] == server.holder(key)]
            delay = s[0]["LockDelay"] / 1e9 if s else 15.0
        t0 = time.time()
        server.call("PUT", f"/v1/session/destroy/{server.holder(key)}")
        b.wait(timeout=120)
        a.wait(timeout=60)
        t1 = float(open(started).read().strip().replace(",", "."))
        extra_after.append((t1 - t0 - delay) * 1000)
    return {"lock_delay_s": lock_delay_s, "p50_ms_after_delay": statistics.median(extra_after), "max_ms_after_delay": max(extra_after)}


# 5 -------------------------------------------------------------------------------
def bench_semaphore(tool, server, jobs, job_s, limit):
    d = tempfile.mkdtemp()
    log = os.path.join(d, "log")
    prefix = f"bench/sem/{tool.name}/{time.time_ns()}"
    before = server.requests()
    t0 = time.perf_counter()
    procs = [tool.run(tool.sem_cmd(prefix, limit, bash_job(log, f"sleep {job_s}"))) for _ in range(jobs)]
    codes = [p.wait() for p in procs]
    wall = time.perf_counter() - t0
    after = server.requests()
    iv = read_log(log)
    events = sorted([(s, 1) for s, _ in iv] + [(e, -1) for _, e in iv])
    cur = peak = 0
    for _, delta in events:
        cur += delta
        peak = max(peak, cur)
    ideal = jobs / limit * job_s
    return {
        "jobs": jobs,
        "failed": sum(1 for c in codes if c != 0),
        "wall_s": wall,
        "ideal_s": ideal,
        "ratio": wall / ideal,
        "max_concurrent": peak,
        "requests_per_job": None if before is None else (after - before) / jobs,
    }


# 6 -------------------------------------------------------------------------------
def bench_idle(binary, server, seconds):
    tool = Tool("conlock", binary, server)
    key = "bench/idle"
    h = tool.run([binary, "run", "--key", key, "--", "sleep", "3600"])
    wait_for(lambda: server.holder(key) is not None)
    time.sleep(1)
    r0 = server.requests()
    time.sleep(seconds)
    holder_rpm = (server.requests() - r0) * 60 / seconds
    waiters = [tool.run([binary, "run", "--key", key, "--", "true"]) for _ in range(10)]
    wait_for(lambda: len(server.sessions()) >= 11)
    time.sleep(1)
    r0 = server.requests()
    time.sleep(seconds)
    total_rpm = (server.requests() - r0) * 60 / seconds
    for p in waiters + [h]:
        p.terminate()
    for p in waiters + [h]:
        p.wait()
    return {
        "seconds": seconds,
        "holder_rpm": holder_rpm,
        "holder_renewals_rpm_expected": 60 / 7.5,
        "per_waiter_rpm": (total_rpm - holder_rpm) / 10,
        "blocking_wait_s": 300,
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
    done = []
    lock = threading.Lock()

    def reader(s):
        s.settimeout(30)
        try:
            data = s.recv(65536)
            if data:
                with lock:
                    done.append(time.perf_counter())
        except OSError:
            pass

    threads = [threading.Thread(target=reader, args=(s,)) for s in socks]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    server.call("PUT", f"/v1/kv/{key}", b"1")
    for t in threads:
        t.join()
    for s in socks:
        s.close()
    woken = len(done)
    return {
        "queries": n,
        "woken": woken,
        "all_woken_ms": (max(done) - t0) * 1000 if done else None,
        "server_peak_rss_mib": (server.rss_kib() or 0) / 1024,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "target", "release", "conlock"))
    ap.add_argument("--consul-addr", help="measure against this Consul instead of a dev server")
    ap.add_argument("--compare-consul-lock", metavar="PATH", help="also measure this consul binary's `consul lock`")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"))
    ap.add_argument("--only", default="1,2,3,4,5,6,7,8", help="comma-separated measurement numbers")
    a = ap.parse_args()
    only = {int(x) for x in a.only.split(",")}
    binary = os.path.abspath(a.bin)
    runs = 5 if a.quick else 20
    server = Server(binary, a.consul_addr)
    results = {"server": "external " + server.addr if a.consul_addr else "conlock dev-server", "tools": {}}
    tools = [Tool("conlock", binary, server)]
    if a.compare_consul_lock:
        tools.append(Tool("consul-lock", os.path.abspath(a.compare_consul_lock), server))
    try:
        for tool in tools:
            r = {}
            if 1 in only:
                print(f"[{tool.name}] 1 uncontended run ...", file=sys.stderr)
                r["1_uncontended"] = bench_uncontended(tool, runs)
            if 2 in only:
                print(f"[{tool.name}] 2 handoff ...", file=sys.stderr)
                r["2_handoff"] = bench_handoff(tool, 10, 30)
            if 4 in only:
                print(f"[{tool.name}] 4 failover ...", file=sys.stderr)
                r["4_failover"] = bench_failover(tool, server, 1, 3 if a.quick else 5)
            if 5 in only:
                print(f"[{tool.name}] 5 semaphore ...", file=sys.stderr)
                r["5_semaphore"] = bench_semaphore(tool, server, 60, 0.2, 4)
            results["tools"][tool.name] = r
        c = results["tools"]["conlock"]
        if 3 in only:
            print("[conlock] 3 lock-loss reaction ...", file=sys.stderr)
            c["3_loss_reaction"] = bench_loss_reaction(server, binary, 5 if a.quick else 15)
        if server.proc and 6 in only:
            print("[conlock] 6 idle load ...", file=sys.stderr)
            c["6_idle"] = bench_idle(binary, server, 10 if a.quick else 30)
        if server.proc and 7 in only:
            print("[dev-server] 7 wake-up of 1000 blocking queries ...", file=sys.stderr)
            results["7_devserver_wakeup"] = bench_wakeup(server, 1000)
        if 8 in only:
            results["8_binary_size_mb"] = os.path.getsize(binary) / 1e6
    finally:
        server.stop()
    with open(a.out, "w") as f:
        json.dump(results, f, indent=2)
    report(results)


def fmt(v, unit=""):
    if v is None:
        return "n/a"
    return f"{v:.1f}{unit}" if isinstance(v, float) else f"{v}{unit}"


def report(r):
    c = r["tools"]["conlock"]
    other = r["tools"].get("consul-lock")

    def get(d, *path):
        for p in path:
            if not isinstance(d, dict) or p not in d:
                return None
            d = d[p]
        return d

    spec = [
        ("1 uncontended wall p50", ("1_uncontended", "wall_ms_p50"), "ms", "<= 10 ms"),
        ("1 uncontended peak RSS p50", ("1_uncontended", "rss_mib_p50"), "MiB", "<= 6 MiB"),
        ("2 handoff p50", ("2_handoff", "p50_ms"), "ms", "<= 3 ms"),
        ("2 handoff p99", ("2_handoff", "p99_ms"), "ms", ""),
        ("3 loss reaction p50", ("3_loss_reaction", "p50_ms"), "ms", "<= 100 ms"),
        ("3 loss reaction max", ("3_loss_reaction", "max_ms"), "ms", "<= 100 ms"),
        ("4 failover minus lock-delay p50", ("4_failover", "p50_ms_after_delay"), "ms", "<= 100 ms"),
        ("5 semaphore wall / ideal", ("5_semaphore", "ratio"), "x", "<= 1.25"),
        ("5 semaphore requests per job", ("5_semaphore", "requests_per_job"), "", "small"),
        ("5 semaphore max concurrent", ("5_semaphore", "max_concurrent"), "", "<= 4"),
        ("6 idle holder requests/min", ("6_idle", "holder_rpm"), "", "~8 (renewals)"),
        ("6 idle waiter requests/min", ("6_idle", "per_waiter_rpm"), "", "<= 0.2 (1 per 5 min)"),
    ]
    rows = [(n, get(c, *path), unit, target, get(other, *path) if other else None) for n, path, unit, target in spec]
    w = r.get("7_devserver_wakeup")
    if w:
        rows += [
            ("7 1000 blocking queries woken", w["woken"], "", "1000", None),
            ("7 all woken after", w["all_woken_ms"], "ms", "<= 1000 ms", None),
            ("7 dev server peak RSS", w["server_peak_rss_mib"], "MiB", "", None),
        ]
    if "8_binary_size_mb" in r:
        rows.append(("8 release binary size", r["8_binary_size_mb"], "MB", "<= 5 MB", None))
    rows = [row for row in rows if row[1] is not None]
    head = f"{'measurement':<34} {'conlock':>12} {'target':>22}"
    if other:
        head += f" {'consul lock':>12} {'ratio':>7}"
    print(head)
    print("-" * len(head))
    for name, v, unit, target, o in rows:
        line = f"{name:<34} {fmt(v) + (' ' + unit if unit else ''):>12} {target:>22}"
        if other:
            ratio = (v / o) if (isinstance(v, (int, float)) and isinstance(o, (int, float)) and o) else None
            line += f" {fmt(o):>12} {fmt(ratio):>7}"
        print(line)
    print(f"\nresults written to bench/results.json ({r['server']})")


if __name__ == "__main__":
    main()
