"""Runs the all-reduce sweep of ronde and of torch.distributed (gloo) side by
side, alternating them over several rounds (this machine is noisy), and
prints per size the median over rounds of each and their ratio.

    .venv/bin/python benchmarks/run_allreduce.py --np 2 --rounds 3

--baseline-build DIR adds a third program to every round: ronde as built
in DIR (another checkout, before a change), so that a change is measured
against what it changed in one command, alternating with it.

Writes benchmarks/results/allreduce-<date>.json unless --out says otherwise.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env):
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-b", default="4K")
    p.add_argument("-e", default="256M")
    p.add_argument("-f", default="2")
    p.add_argument("--baseline-build",
                   help="also run ronde from this build, in every round")
    p.add_argument("--out")
    a = p.parse_args()
    ronderun = os.path.join(a.build, "bin", "ronderun")
    bench = os.path.join(a.build, "bin", "allreduce_bench")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f]
    impls = ["ronde", "torch"] + (["baseline"] if a.baseline_build else [])
    rounds = {impl: [] for impl in impls}
    torch_bench = [sys.executable,
                   os.path.join(ROOT, "benchmarks", "torch_allreduce_bench.py")]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for impl in impls:
                out = os.path.join(tmp, f"{impl}{r}.json")
                launcher, prog = ronderun, [bench]
                if impl == "torch":
                    prog = torch_bench
                elif impl == "baseline":
                    launcher = os.path.join(a.baseline_build, "bin", "ronderun")
                    prog = [os.path.join(a.baseline_build, "bin",
                                         "allreduce_bench")]
                print(f"round {r + 1}/{a.rounds}: {impl}", file=sys.stderr)
                run([launcher, "-np", str(a.np), "--"] + prog + sweep +
                    ["--json", out], env)
                with open(out) as f:
                    rounds[impl].append(json.load(f))
    sizes = [row["bytes"] for row in rounds["ronde"][0]["results"]]

    def per_size(impl, key):
        return [statistics.median(run["results"][i][key] for run in rounds[impl])
                for i in range(len(sizes))]

    def spread(impl, i):
        vals = [run["results"][i]["busbw_GBs"] for run in rounds[impl]]
        return (max(vals) - min(vals)) / statistics.median(vals)

    rb, tb = per_size("ronde", "busbw_GBs"), per_size("torch", "busbw_GBs")
    rt, nc = per_size("ronde", "time_us"), per_size("ronde", "nocheck_time_us")
    bb = per_size("baseline", "busbw_GBs") if a.baseline_build else None
    print(f"# all-reduce, {a.np} ranks, float32 sum; median over {a.rounds} "
          f"alternating rounds; busbw in GB/s")
    print(f"{'bytes':>11} {'ronde':>8} {'torch':>8} {'ratio':>6} "
          f"{'spread_r':>8} {'spread_t':>8} {'check_cost':>10}" +
          (f" {'baseline':>8} {'vs_base':>7}" if bb else ""))
    rows = []
    for i, size in enumerate(sizes):
        ratio = rb[i] / tb[i]
        cost = (rt[i] - nc[i]) / nc[i]
        line = (f"{size:>11} {rb[i]:>8.3f} {tb[i]:>8.3f} {ratio:>6.2f} "
                f"{spread('ronde', i):>8.0%} {spread('torch', i):>8.0%} "
                f"{cost:>10.0%}")
        row = {"bytes": size, "ronde_busbw_GBs": rb[i],
               "torch_busbw_GBs": tb[i], "ratio": ratio,
               "ronde_time_us": rt[i], "ronde_nocheck_time_us": nc[i]}
        if bb:
            line += f" {bb[i]:>8.3f} {rb[i] / bb[i]:>7.2f}"
            row.update(baseline_busbw_GBs=bb[i], vs_baseline=rb[i] / bb[i])
        print(line)
        rows.append(row)
    out = a.out or os.path.join(
        ROOT, "benchmarks", "results",
        f"allreduce-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump({"benchmark": "allreduce", "ranks": a.np, "rounds": a.rounds,
                   "summary": rows, "raw": rounds}, f, indent=1)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
