#!/usr/bin/env python3
"""Where the wait after backward goes: runs train_bench under ronderun with
a timeline (RONDE_TIMELINE) and splits each step's "wait for all-reduces"
by what the communication thread was doing meanwhile.

    .venv/bin/python benchmarks/wait_breakdown.py --workload cnn --np 2 \
        [--steps 6] [--env RONDE_AUTOTUNE=0] [--out wait.json]

Per step (the warm-up steps left out), from rank 0's timeline:
- `wait_ms`: the span synchronize() waited for the all-reduces;
- `tail_ms`: from the last gradient hook (the end of backward) to the end
  of the last bucket's all-reduce;
- `busy_before_ms` / `busy_last_ms`: the communication thread's time inside
  the wait on buckets launched before the last hook, and on the buckets
  launched by it (the last bucket(s), which nothing can overlap);
- `idle_ms`: time inside the wait when no all-reduce ran (hand-offs,
  wake-ups, the unpack);
- `unpack_ms`: the unpack span after the wait (pointing .grad at the
  buckets; copies only without bucket views);
- `launch_order`: hooks fired before each bucket's launch.
Medians over the steps are printed and written as JSON.
"""
import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_events(path):
    with open(path) as f:
        text = f.read().strip()
    if not text.startswith("["):
        text = "[" + text
    text = text.rstrip(",\n ")
    if not text.endswith("]"):
        text += "]"
    return json.loads(text)


def steps_of(events):
    """Each step's events, split at the end of every optimizer step."""
    spans = sorted((e for e in events if e.get("ph") in ("X", "i")),
                   key=lambda e: e["ts"])
    steps, cur = [], []
    for e in spans:
        cur.append(e)
        if e.get("ph") == "X" and e.get("cat") == "step":
            steps.append(cur)
            cur = []
    return steps


def breakdown(step):
    wait = next((e for e in step if e.get("cat") == "wait"), None)
    hooks = [e for e in step if e.get("cat") == "hook"]
    colls = [e for e in step if e.get("cat") == "collective"
             and "ronde.bucket" in e.get("name", "")]
    if wait is None or not hooks or not colls:
        return None
    last_hook = max(h["ts"] for h in hooks)
    w0, w1 = wait["ts"], wait["ts"] + wait["dur"]
    before = last = 0.0
    covered = []
    for c in colls:
        submitted = c["ts"] - c.get("args", {}).get("queued_us", 0)
        c0, c1 = max(c["ts"], w0), min(c["ts"] + c["dur"], w1)
        if c1 <= c0:
            continue
        covered.append((c0, c1))
        if submitted < last_hook:
            before += c1 - c0
        else:
            last += c1 - c0
    busy = 0.0
    end = None
    for a, b in sorted(covered):
        if end is None or a > end:
            busy += b - a
            end = b
        elif b > end:
            busy += b - end
            end = b
    unpack = sum(e["dur"] for e in step if e.get("cat") == "unpack")
    coll_end = max(c["ts"] + c["dur"] for c in colls)
    return {
        "wait_ms": wait["dur"] / 1e3,
        "tail_ms": max(0.0, coll_end - last_hook) / 1e3,
        "busy_before_ms": before / 1e3,
        "busy_last_ms": last / 1e3,
        "idle_ms": max(0.0, wait["dur"] - busy) / 1e3,
        "unpack_ms": unpack / 1e3,
        "buckets": len(colls),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--workload", default="cnn")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--env", action="append", default=[],
                   help="VAR=VALUE for the job (repeatable)")
    p.add_argument("--out")
    a = p.parse_args()
    bin_dir = os.path.join(a.build, "bin")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, RONDE_TIMELINE=os.path.join(tmp, "t.json"))
        for kv in a.env:
            k, v = kv.split("=", 1)
            env[k] = v
        subprocess.run(
            [os.path.join(bin_dir, "ronderun"), "-np", str(a.np), "--",
             os.path.join(bin_dir, "train_bench"), "--workload", a.workload,
             "--mode", "ronde", "--steps", str(a.steps)],
            check=True, env=env, stdout=subprocess.DEVNULL)
        files = sorted(glob.glob(os.path.join(tmp, "t*.json")))
        if not files:
            sys.exit("no timeline was written")
        events = load_events(files[0])
    rows = [r for r in (breakdown(s) for s in steps_of(events)) if r]
    rows = rows[2:] if len(rows) > 3 else rows  # warm-up steps
    summary = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    out = {"benchmark": "wait_breakdown", "workload": a.workload,
           "ranks": a.np, "env": a.env, "steps": rows, "median": summary}
    print(f"# {a.workload}, {a.np} ranks, rank 0, median over "
          f"{len(rows)} steps ({' '.join(a.env) or 'default settings'})")
    for k, v in summary.items():
        print(f"{k:>16} {v:9.1f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
