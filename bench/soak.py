#!/usr/bin/env python3
"""conlock soak (`make soak`): about 5 minutes of contention under faults.

10 contenders per key on several lock keys and one semaphore repeatedly run short jobs.
Random SIGKILLs hit conlock processes and random session destroys hit holders. At the end
it reports jobs run, the maximum observed concurrency per key and per semaphore, orphaned
job processes, and sessions and keys left after cleanup. Exit 1 if any invariant broke.

Concurrency is computed from the jobs' own start/end timestamps. A job killed with its
conlock writes no end line; its end is the last moment the soak saw one of the job's own
processes alive (polled every 2 ms), which can only hide an overlap shorter than that,
never invent one. The job's own processes are those of its `bash -c BODY MARK:id` (and
its forks): conlock and its guardian carry the job's argv too (the guardian is forked,
not exec'd), and their last milliseconds after a release are not the job's. The report
gives the host's load (1-minute average, at the start, the end and the highest sampled),
since the deadline assumes conlock and its guardian get the CPU within the margin
(docs/safety.md).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

MARK = f"conlock-soak-{os.getpid()}"


def call(addr, method, path):
    req = urllib.request.Request(addr + path, method=method)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=30) as r:
        data = r.read()
    return json.loads(data) if data else None


def job_id(cmdline):
    """The job id of a process, if it is one of a job's own: `bash -c BODY MARK:id` (or a
    fork of it), with the mark as $0. conlock and its guardian have the mark further on
    in their argv (after `--`), and are not the job's."""
    args = cmdline.split(b"\0")
    if len(args) >= 4 and args[1] == b"-c" and args[3].startswith(MARK.encode() + b":"):
        return args[3].decode().split(":", 1)[1]
    return None


def job_ids():
    """The unique ids of the job processes alive now (ids, not pids: pids get reused
    over thousands of processes)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    jid = job_id(f.read())
            except OSError:
                continue
            if jid is not None:
                out.append(jid)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=None, help="default: the release build make made last (see bench.py)")
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--keys", type=int, default=3)
    ap.add_argument("--contenders", type=int, default=10)
    ap.add_argument("--limit", type=int, default=3)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    rnd = random.Random(a.seed)
    if a.bin is None:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench import release_binary
        a.bin = release_binary()
    binary = os.path.abspath(a.bin)
    srv = subprocess.Popen([binary, "dev-server", "--addr", "127.0.0.1:0", "--session-ttl-min", "1s"], stdout=subprocess.PIPE, text=True)
    addr = re.search(r"(http://[0-9.:]+)", srv.stdout.readline()).group(1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONSUL_")}
    env["CONSUL_HTTP_ADDR"] = addr.split("://")[1]
    tmp = tempfile.mkdtemp(prefix="conlock-soak-")
    log = os.path.join(tmp, "log")
    targets = [("lock", f"soak/key{i}") for i in range(a.keys)] + [("sem", "soak/sem")]
    stop = threading.Event()
    procs_lock = threading.Lock()
    running = []  # (Popen, target)
    last_seen = {}  # job id -> last time seen alive
    started = {"jobs": 0, "sigkills": 0, "session_destroys": 0}

    counter = iter(range(10**9))
    counter_lock = threading.Lock()

    def job_cmd(kind, name):
        with counter_lock:
            jid = f"{name}#{next(counter)}"
        body = f'echo "S {name} {jid} $EPOCHREALTIME" >> {log}; trap \'echo "E {name} {jid} $EPOCHREALTIME" >> {log}; exit 0\' TERM; sleep 0.$((RANDOM % 20 + 5)) & wait $!; echo "E {name} {jid} $EPOCHREALTIME" >> {log}'
        # bash -c BODY NAME: the job's id stands in its argv ($0), for the liveness poller.
        cmd = ["bash", "-c", body, f"{MARK}:{jid}"]
        common = ["--ttl", "10s", "--lock-delay", "1s", "--kill-grace", "200ms", "-q"]
        if kind == "lock":
            return [binary, "run", "--key", name, *common, "--", *cmd]
        return [binary, "sem", "--limit", str(a.limit), "--prefix", name, *common, "--", *cmd]

    def contender(kind, name):
        while not stop.is_set():
            p = subprocess.Popen(job_cmd(kind, name), env=env, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            with procs_lock:
                running.append(p)
                started["jobs"] += 1
            p.wait()
            with procs_lock:
                running.remove(p)

    load = {"start": os.getloadavg()[0], "max": os.getloadavg()[0]}

    def load_sampler():
        while not stop.wait(1.0):
            load["max"] = max(load["max"], os.getloadavg()[0])

    def poller():
        while not stop.is_set() or job_ids():
            t = time.time()
            for jid in job_ids():
                last_seen[jid] = t
            time.sleep(0.002)

    def chaos():
        while not stop.is_set():
            time.sleep(rnd.uniform(0.2, 1.0))
            if rnd.random() < 0.5:
                with procs_lock:
                    victims = list(running)
                if victims:
                    rnd.choice(victims).kill()
                    started["sigkills"] += 1
            else:
                try:
                    sessions = call(addr, "GET", "/v1/session/list") or []
                    if sessions:
                        call(addr, "PUT", f"/v1/session/destroy/{rnd.choice(sessions)['ID']}")
                        started["session_destroys"] += 1
                except Exception:
                    pass

    threads = [threading.Thread(target=contender, args=t) for t in targets for _ in range(a.contenders)]
    threads += [threading.Thread(target=chaos), threading.Thread(target=poller), threading.Thread(target=load_sampler)]
    for t in threads:
        t.start()
    print(f"soak: {len(targets)} targets x {a.contenders} contenders for {a.seconds:.0f}s (seed {a.seed})", file=sys.stderr)
    time.sleep(a.seconds)
    stop.set()
    for t in threads:
        t.join()
    # Every conlock has exited; give guardians a moment, then look for leftovers.
    deadline = time.time() + 30
    while time.time() < deadline and (job_ids() or call(addr, "GET", "/v1/session/list")):
        time.sleep(0.1)
    orphans = job_ids()
    sessions = call(addr, "GET", "/v1/session/list") or []
    try:
        keys = call(addr, "GET", "/v1/kv/soak?keys") or []
    except urllib.error.HTTPError:
        keys = []
    srv.terminate()
    srv.wait()

    starts, ends = {}, {}
    with open(log) as f:
        for line in f:
            p = line.split()
            if len(p) == 4:
                (starts if p[0] == "S" else ends)[(p[1], p[2])] = float(p[3].replace(",", "."))
    report = {
        "seed": a.seed,
        "seconds": a.seconds,
        "jobs_started": started["jobs"],
        "jobs_run": len(starts),
        "conlock_sigkills": started["sigkills"],
        "session_destroys": started["session_destroys"],
        "cpus": os.cpu_count(),
        "loadavg_1m": {"start": load["start"], "end": os.getloadavg()[0], "max": load["max"]},
        "per_target": {},
    }
    ok = True
    for kind, name in targets:
        iv = []
        for (n, jid), s in starts.items():
            if n == name:
                iv.append((s, ends.get((n, jid), last_seen.get(jid, s))))
        ev = sorted([(s, 1) for s, _ in iv] + [(e, -1) for _, e in iv])
        cur = peak = 0
        for _, d in ev:
            cur += d
            peak = max(peak, cur)
        bound = 1 if kind == "lock" else a.limit
        report["per_target"][name] = {"jobs": len(iv), "max_concurrency": peak, "allowed": bound}
        ok &= peak <= bound
    report.update({"orphaned_processes": len(orphans), "sessions_left": len(sessions), "keys_left": len(keys)})
    ok &= not orphans and not sessions and not keys
    print(json.dumps(report, indent=2))
    print("soak: OK" if ok else "soak: FAILED", file=sys.stderr)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
