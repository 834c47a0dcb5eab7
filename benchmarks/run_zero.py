"""Sharded optimizer state side by side: the same Adam MLP (4 layers of
5000 x 5000, about 100M parameters) at 1, 2 and 4 ranks on one host,
unsharded (stage 0), stage 1 and stage 2, in alternating rounds (with
--torch, PyTorch's DDP and ZeroRedundancyOptimizer over gloo too, under
torchrun: benchmarks/torch_zero_bench.py). Reports
optimizer-state bytes per rank, peak resident memory per rank and the
median step time, and what ZeRO's model predicts for the memory.

    .venv/bin/python benchmarks/run_zero.py --rounds 1 --nps 2,4 --torch

--compression fp16|bf16 gives ronde's stages a 16-bit wire (PyTorch's
side has none here, so not with --torch).

Prints a table and writes benchmarks/results/zero-<date>.json.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--nps", default="1,2,4")
    p.add_argument("--width", type=int, default=5000)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--torch", action="store_true",
                   help="also PyTorch's DDP and ZeroRedundancyOptimizer")
    p.add_argument("--compression", choices=["none", "fp16", "bf16"],
                   default="none", help="ronde's wire (zero_bench)")
    p.add_argument("--out")
    a = p.parse_args()
    if a.torch and a.compression != "none":
        p.error("--compression: torch_zero_bench.py sends no 16-bit wire, "
                "so the side by side would not be like for like")
    bin_dir = os.path.join(a.build, "bin")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    peer = os.path.join(ROOT, "benchmarks", "torch_zero_bench.py")
    runs = {}
    for r in range(a.rounds):
        for np_ in [int(x) for x in a.nps.split(",")]:
            # PyTorch's DDP (stage "ddp") and ZeroRedundancyOptimizer over
            # gloo (stage "torch-zero"), side by side with ronde's.
            for impl in (["--plain"], []) if a.torch else ():
                cmd = [torchrun, "--nproc-per-node", str(np_),
                       "--master-port", str(29600 + r), peer,
                       "--width", str(a.width), "--layers", str(a.layers),
                       "--steps", str(a.steps)] + impl
                out = subprocess.run(cmd, env=env, capture_output=True,
                                     text=True, timeout=900)
                line = [ln for ln in out.stdout.splitlines()
                        if ln.startswith("{")]
                if out.returncode != 0 or not line:
                    raise SystemExit(f"{cmd} failed:\n{out.stdout}\n"
                                     f"{out.stderr}")
                row = json.loads(line[-1])
                runs.setdefault((np_, row["impl"]), []).append(row)
            for stage in (0, 1, 2):
                cmd = [os.path.join(bin_dir, "ronderun"), "-np", str(np_),
                       "--", os.path.join(bin_dir, "zero_bench"),
                       "--stage", str(stage), "--width", str(a.width),
                       "--layers", str(a.layers), "--steps", str(a.steps),
                       "--compression", a.compression]
                out = subprocess.run(cmd, env=env, capture_output=True,
                                     text=True, timeout=900)
                line = [ln for ln in out.stdout.splitlines()
                        if ln.lstrip("[0] ").startswith("{")]
                if out.returncode != 0 or not line:
                    raise SystemExit(f"{cmd} failed:\n{out.stdout}\n"
                                     f"{out.stderr}")
                row = json.loads(line[-1][line[-1].index("{"):])
                runs.setdefault((np_, stage), []).append(row)
    rows = []
    print(f"{'np':>3} {'stage':>10} {'state MB/rank':>14} {'peak RSS MB':>12}"
          f" {'step s':>8} {'state / unsharded':>18}")
    for (np_, stage), rs in sorted(runs.items(), key=lambda kv: (
            kv[0][0], str(kv[0][1]))):
        base = runs[(np_, 0)][0]["state_bytes_per_rank"]
        row = {
            "np": np_, "stage": stage, "params": rs[0]["params"],
            "state_bytes_per_rank": rs[0]["state_bytes_per_rank"],
            "state_ratio": rs[0]["state_bytes_per_rank"] / base,
            "peak_rss_mb": statistics.median(x["peak_rss_mb"] for x in rs),
            "step_s": statistics.median(x["step_s"] for x in rs),
            "rounds": len(rs),
        }
        rows.append(row)
        print(f"{np_:>3} {stage:>10} {row['state_bytes_per_rank'] / 1e6:>14.1f}"
              f" {row['peak_rss_mb']:>12.0f} {row['step_s']:>8.3f}"
              f" {row['state_ratio']:>18.3f}")
    out = a.out or os.path.join(
        ROOT, "benchmarks", "results",
        f"zero-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump({"command": "benchmarks/run_zero.py", "width": a.width,
                   "layers": a.layers, "compression": a.compression,
                   "rows": rows}, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
