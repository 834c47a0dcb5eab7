#!/usr/bin/env python3
"""The step-time cost of SyncBatchNorm against BatchNorm2d: the cnn workload
of train_bench (ResNet-18, 32x32 inputs) under ronderun, the two variants in
alternating rounds; medians; JSON out.

    benchmarks/sync_bn_bench.py [--build build] [--np 2] [--rounds 5]
        [--steps 5] [--out FILE]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile


def run(build, np_, steps, sync):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        cmd = [os.path.join(build, "bin", "ronderun"), "-np", str(np_), "--",
               os.path.join(build, "bin", "train_bench"), "--workload", "cnn",
               "--mode", "ronde", "--steps", str(steps), "--warmup", "2",
               "--windows", "1", "--json", out] + (["--sync-bn"] if sync else [])
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--np", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--out")
    a = ap.parse_args()
    steps = {False: [], True: []}
    for _ in range(a.rounds):
        for sync in (False, True):
            steps[sync].append(run(a.build, a.np, a.steps, sync)["step_s"])
    plain, sync = statistics.median(steps[False]), statistics.median(steps[True])
    report = {
        "benchmark": "sync_bn",
        "workload": "cnn (ResNet-18, batch 32 per rank)",
        "ranks": a.np,
        "rounds": a.rounds,
        "steps_per_round": a.steps,
        "batch_norm_step_s": plain,
        "sync_batch_norm_step_s": sync,
        "sync_over_plain": sync / plain,
        "all_step_s": {"batch_norm": steps[False], "sync_batch_norm": steps[True]},
        "load_average": os.getloadavg()[0],
    }
    text = json.dumps(report, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    sys.exit(main())
