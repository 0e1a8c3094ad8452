#!/usr/bin/env python3
"""Checks the systemd recipes in contrib/systemd/.

1. Parses every unit and checks the keys the recipes rely on (always).
2. Runs each ExecStart's conlock command line, with the job replaced by one that touches
   a marker, against a dev server: conlock must accept the flags as written and run the
   job (always).
3. `systemd-analyze verify` on copies whose ExecStart names the built binary (systemd
   checks that the command exists) with the man pages on MANPATH; any warning fails.
   Skipped, with a notice, where systemd-analyze is not installed.

Usage: check-units.py PATH/TO/conlock
"""

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "contrib" / "systemd"
errors = []


def fail(unit, msg):
    errors.append(f"{unit}: {msg}")


def parse(path):
    """systemd's ini dialect: sections of `Key=value`, `#`/`;` comments, repeated keys."""
    sections, cur = {}, None
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            cur = sections.setdefault(line[1:-1], {})
            continue
        if cur is None or "=" not in line:
            fail(path.name, f"line {n}: not a key=value inside a section: {raw!r}")
            continue
        k, v = line.split("=", 1)
        cur.setdefault(k.strip(), []).append(v.strip())
    return sections


def seconds(text):
    """A systemd or Go duration such as 30s, 1min, 500ms, 2m."""
    units = {"ms": 0.001, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}
    total, pos = 0.0, 0
    for m in re.finditer(r"(\d+(?:\.\d+)?)\s*([a-z]+)", text):
        if m.start() != pos or m.group(2) not in units:
            raise ValueError(text)
        total += float(m.group(1)) * units[m.group(2)]
        pos = m.end()
    if pos != len(text) or pos == 0:
        raise ValueError(text)
    return total


def one(unit, sec, sections, key):
    vals = sections.get(sec, {}).get(key, [])
    if len(vals) != 1:
        fail(unit, f"[{sec}] needs exactly one {key}=, has {len(vals)}")
        return None
    return vals[0]


def conlock_argv(unit, exec_start):
    """ExecStart as conlock's argv, job after `--` kept apart; checks systemd's $ quoting."""
    for m in re.finditer(r"\$+\{?([A-Z_][A-Z0-9_]*)", exec_start):
        dollars = len(m.group(0)) - len(m.group(0).lstrip("$"))
        if m.group(1).startswith("CONLOCK_") and dollars % 2 == 1:
            fail(unit, f"${m.group(1)} would be expanded by systemd (empty): write $${m.group(1)}")
    argv = shlex.split(exec_start.replace("$$", "$").replace("%H", "host"))
    if argv[:1] != ["conlock"] or len(argv) < 2 or argv[1] not in ("run", "sem"):
        fail(unit, f"ExecStart must start with `conlock run` or `conlock sem`: {exec_start}")
        return None, None
    if "--" not in argv:
        fail(unit, "ExecStart needs `--` before the job")
        return None, None
    i = argv.index("--")
    return argv[1:i], argv[i + 1 :]


def flag(args, name):
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def check_service(path, sections, timers):
    u = path.name
    for sec in ("Unit", "Service"):
        if sec not in sections:
            fail(u, f"no [{sec}] section")
            return None
    one(u, "Unit", sections, "Description")
    exec_start = one(u, "Service", sections, "ExecStart")
    if exec_start is None:
        return None
    args, job = conlock_argv(u, exec_start)
    if args is None:
        return None
    if not job:
        fail(u, "no job after `--`")
    if one(u, "Service", sections, "KillMode") != "mixed":
        fail(u, "KillMode=mixed: only conlock may get SIGTERM, it stops the job itself")
    stop = one(u, "Service", sections, "TimeoutStopSec")
    try:
        grace = seconds(flag(args, "--kill-grace") or "5s")
        if stop is not None and seconds(stop) < grace + 10:
            fail(u, f"TimeoutStopSec={stop} leaves less than 10 s after --kill-grace to release")
    except ValueError as e:
        fail(u, f"unreadable duration {e}")
    success = " ".join(sections["Service"].get("SuccessExitStatus", [])).split()
    if "143" not in success:
        fail(u, "SuccessExitStatus needs 143: a job stopped by the forwarded SIGTERM")
    kind = sections["Service"].get("Type", ["simple"])[-1]
    if kind == "oneshot":
        if flag(args, "--timeout") != "0s":
            fail(u, "a cron-style job needs --timeout 0s (skip if busy)")
        if flag(args, "--min-hold") is None:
            fail(u, "a cron-style job needs --min-hold: a timer that fires late runs it again")
        if "75" not in success and flag(args, "--busy-exit-code") != "0":
            fail(u, "busy must count as success: SuccessExitStatus=75 or --busy-exit-code 0")
        if path.stem not in timers:
            fail(u, f"no {path.stem}.timer beside it")
    else:
        if sections["Service"].get("Restart", [""])[-1] != "always":
            fail(u, "a leader-only service needs Restart=always (wait for the lock again)")
        if flag(args, "--timeout") is not None:
            fail(u, "a leader-only service waits for the lock: no --timeout")
        if not sections.get("Install", {}).get("WantedBy"):
            fail(u, "[Install] WantedBy= missing")
    return args


def check_timer(path, sections, services):
    u = path.name
    if "Timer" not in sections:
        fail(u, "no [Timer] section")
        return
    one(u, "Unit", sections, "Description")
    target = sections["Timer"].get("Unit", [path.stem + ".service"])[-1]
    if target not in services:
        fail(u, f"triggers {target}, which is not in contrib/systemd/")
    if not any(k.startswith("On") for k in sections["Timer"]):
        fail(u, "no On…= trigger")
    if "RandomizedDelaySec" in sections["Timer"]:
        fail(u, "RandomizedDelaySec lets a late machine run the job again after it finished")
    if sections.get("Install", {}).get("WantedBy") != ["timers.target"]:
        fail(u, "[Install] WantedBy=timers.target missing")


def run_flags(binary, argvs):
    """Each recipe's conlock flags, with a stand-in job, against a dev server."""
    server = subprocess.Popen(
        [binary, "dev-server", "--addr", "127.0.0.1:0", "--session-ttl-min", "1s"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        addr = None
        while addr is None and time.monotonic() < deadline:
            line = server.stdout.readline()
            m = re.search(r"listening on (http://[0-9.:]+)", line)
            if m:
                addr = m.group(1)
            elif not line:
                break
        if addr is None:
            errors.append("the dev server did not start")
            return
        env = dict(os.environ, CONSUL_HTTP_ADDR=addr)
        env.pop("CONSUL_HTTP_TOKEN", None)
        for unit, args in argvs:
            code, err = run_one(binary, args, env)
            if code != 0:
                fail(unit, f"conlock {' '.join(args)} -- JOB exited {code}: {err}")
    finally:
        server.terminate()
        server.wait(timeout=30)


def children_named(pid, name):
    """Processes whose parent is pid and whose command name is name (zombies included)."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        if ppid == pid and comm == name:
            found.append(int(d.name))
    return found


def run_one(binary, args, env):
    """conlock with the recipe's flags and a job that touches a marker. With --min-hold,
    conlock keeps the lock after the job; once the job has been reaped, SIGTERM ends the
    min-hold at once and conlock exits with the job's code (0)."""
    with tempfile.TemporaryDirectory() as tmp:
        marker = Path(tmp) / "ran"
        p = subprocess.Popen(
            [binary, *args, "--", "touch", str(marker)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline:
            if marker.exists() and not children_named(p.pid, "touch"):
                p.send_signal(signal.SIGTERM)
                break
            time.sleep(0.05)
        try:
            _, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            _, err = p.communicate()
            return "timeout", err.strip()
        if not marker.exists():
            return f"{p.returncode} without running the job", err.strip()
        return p.returncode, err.strip()


def analyze(binary):
    tool = shutil.which("systemd-analyze")
    if tool is None:
        print("units-check: systemd-analyze not found; only the key checks ran")
        return
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        man1 = tmp / "man" / "man1"
        man1.mkdir(parents=True)
        for page in (ROOT / "docs").glob("*.1"):
            shutil.copy(page, man1)
        copies = []
        for unit in sorted(UNITS.glob("*.service")) + sorted(UNITS.glob("*.timer")):
            text = unit.read_text().replace(
                "\nExecStart=conlock ", f"\nExecStart={Path(binary).resolve()} "
            )
            (tmp / unit.name).write_text(text)
            copies.append(str(tmp / unit.name))
        env = dict(os.environ, MANPATH=str(tmp / "man"), SYSTEMD_LOG_COLOR="0")
        r = subprocess.run([tool, "verify", *copies], env=env, capture_output=True, text=True)
        out = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or out:
            errors.append(f"systemd-analyze verify (exit {r.returncode}):\n{out}")
        else:
            print(f"units-check: systemd-analyze verify accepted {len(copies)} units")


def main():
    binary = sys.argv[1]
    paths = sorted(UNITS.glob("*.service")) + sorted(UNITS.glob("*.timer"))
    if not paths:
        sys.exit("units-check: no units in contrib/systemd/")
    services = {p.name for p in paths if p.suffix == ".service"}
    timers = {p.stem for p in paths if p.suffix == ".timer"}
    argvs = []
    for p in paths:
        sections = parse(p)
        if p.suffix == ".service":
            args = check_service(p, sections, timers)
            if args is not None:
                argvs.append((p.name, args))
        else:
            check_timer(p, sections, services)
    run_flags(binary, argvs)
    analyze(binary)
    if errors:
        print("units-check failed:\n  " + "\n  ".join(errors), file=sys.stderr)
        sys.exit(1)
    print(f"units-check: {len(paths)} units have the keys the recipes rely on; conlock accepts their flags")


if __name__ == "__main__":
    main()
