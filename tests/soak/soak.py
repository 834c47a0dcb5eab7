#!/usr/bin/env python3
"""Soak test: many steps of the train benchmark's mlp workload on 2 ranks,
sampling every rank's resident memory; fails if it grows after warm-up.

    tests/soak/soak.py [--build build] [--steps 2000] [--np 2] [--max-growth 0.05]

Resident set size (VmRSS) of each rank is read from /proc once a second.
Growth = (median RSS over the last 10% of the run) / (median RSS over the
10% after warm-up) - 1, per rank; the run fails when any rank grows by more
than --max-growth. Writes a JSON summary (--json) with the samples.
Not part of the default test run (about 25 minutes on 2 cores); CMake
registers it as `soak.mlp` with -DRONDE_SOAK_TEST=ON.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def children(pid):
    """Direct children of pid (from /proc/<pid>/task/*/children)."""
    out = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return out


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--warmup-share", type=float, default=0.1,
                    help="share of the samples treated as warm-up")
    ap.add_argument("--max-growth", type=float, default=0.05)
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    bindir = os.path.join(args.build, "bin")
    cmd = [os.path.join(bindir, "ronderun"), "-np", str(args.np), "--",
           os.path.join(bindir, "train_bench"), "--workload", "mlp", "--mode",
           "ronde", "--steps", str(args.steps), "--warmup", "0"]
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    samples = {}  # pid -> [(seconds, kib)]
    while proc.poll() is None:
        for pid in children(proc.pid):
            kib = rss_kib(pid)
            if kib is not None:
                samples.setdefault(pid, []).append((time.time() - start, kib))
        time.sleep(1.0)
    output = proc.stdout.read()
    seconds = time.time() - start
    if proc.returncode != 0:
        print(output)
        print(f"soak: the job failed with exit code {proc.returncode}")
        return 1

    ranks = []
    ok = True
    for i, (pid, s) in enumerate(sorted(samples.items())):
        values = [k for _, k in s]
        n = len(values)
        if n < 20:
            print(f"soak: only {n} samples for pid {pid}; run longer")
            return 1
        w = max(1, int(n * args.warmup_share))
        after_warmup = statistics.median(values[w:2 * w])
        end = statistics.median(values[-w:])
        growth = end / after_warmup - 1
        ok = ok and growth <= args.max_growth
        ranks.append({"pid": pid, "samples": n, "rss_after_warmup_kib": after_warmup,
                      "rss_end_kib": end, "rss_max_kib": max(values),
                      "growth": growth, "series": s})
        print(f"rank process {i}: RSS {after_warmup / 1024:.1f} MiB after warm-up, "
              f"{end / 1024:.1f} MiB at the end ({growth * 100:+.2f}%), "
              f"max {max(values) / 1024:.1f} MiB, {n} samples")
    print(f"soak: {args.steps} steps on {args.np} ranks in {seconds:.0f} s: "
          f"{'PASS' if ok else 'FAIL'} (limit {args.max_growth * 100:.0f}%)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": args.steps, "np": args.np, "seconds": seconds,
                       "max_growth": args.max_growth, "pass": ok, "ranks": ranks},
                      f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
