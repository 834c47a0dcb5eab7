"""ronde's torch.distributed backend against gloo (and ronde's own API):
the collectives of benchmarks/c10d_bench.py at 2 and 4 ranks, then DDP
(and ZeroRedundancyOptimizer) step times of benchmarks/ddp_train_bench.py
on backend="ronde" and backend="gloo" in alternating rounds, all under
torchrun on this host.

    .venv/bin/python benchmarks/run_c10d.py --nps 2,4 --rounds 3 \\
        --plot benchmarks/results/c10d-collectives.png

Prints tables and writes benchmarks/results/c10d-<date>.json.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")


def torchrun(np_, port, script, args, env, json_line=True):
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"),
           "--nproc-per-node", str(np_), "--master-port", str(port),
           os.path.join(HERE, script)] + args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                       timeout=1800)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or (json_line and not lines):
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    return json.loads(lines[-1]) if json_line else None


def plot(path, collectives):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ops = sorted({r["op"] for res in collectives for r in res["rows"]})
    fig, axes = plt.subplots(len(collectives), len(ops),
                             figsize=(4 * len(ops), 3.2 * len(collectives)),
                             squeeze=False)
    for i, res in enumerate(collectives):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            rows = [r for r in res["rows"] if r["op"] == op]
            for k, style in (("ronde", "o-"), ("ronde_api", "x--"), ("gloo", "s-")):
                pts = [(r["bytes"], r["bytes"] / r[k + "_us"] / 1e3)
                       for r in rows if k + "_us" in r]
                if pts:
                    ax.plot(*zip(*pts), style, label=k)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {res['ranks']} ranks", fontsize=9)
            ax.set_xlabel("bytes")
            ax.set_ylabel("GB/s (bytes / time)")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--nps", default="2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sizes", default="4K,64K,1M,16M,256M")
    p.add_argument("--ops", help="c10d_bench.py's --ops (default: all)")
    p.add_argument("--workloads", default="mlp,cnn")
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--skip-collectives", action="store_true")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--plot")
    p.add_argument("--out")
    a = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    build_py = os.path.join(ROOT, "build", "python")
    if os.path.isdir(build_py):
        env["PYTHONPATH"] = os.pathsep.join(
            [build_py] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    port = 29700
    result = {"date": datetime.date.today().isoformat(),
              "load": os.getloadavg(), "collectives": [], "train": []}
    if not a.skip_collectives:
        for np_ in [int(x) for x in a.nps.split(",")]:
            port += 1
            res = torchrun(np_, port, "c10d_bench.py",
                           ["--sizes", a.sizes, "--rounds", str(a.rounds)] +
                           (["--ops", a.ops] if a.ops else []), env)
            result["collectives"].append(res)
            print(f"\n{np_} ranks: op, bytes, ronde/gloo speedup, "
                  "c10d ronde / ronde API time")
            for r in res["rows"]:
                g = r.get("gloo_us")
                print(f"  {r['op']:24s} {r['bytes']:>10d}  "
                      f"{(g / r['ronde_us']) if g else float('nan'):7.2f}x  "
                      f"{r['ronde_us'] / r['ronde_api_us']:5.2f}")
    if not a.skip_train:
        runs = {}
        for rnd in range(a.rounds):
            for wl in a.workloads.split(","):
                for zero in (False, True):
                    order = ("ronde", "gloo") if rnd % 2 == 0 else ("gloo", "ronde")
                    for backend in order:
                        port += 1
                        args = ["--workload", wl, "--steps", str(a.steps),
                                "--backend", backend]
                        path = os.path.join("/tmp", f"ronde_c10d_{port}.json")
                        torchrun(2, port, "ddp_train_bench.py",
                                 args + (["--zero"] if zero else []) +
                                 ["--json", path], env, json_line=False)
                        with open(path) as f:
                            row = json.load(f)
                        os.unlink(path)
                        runs.setdefault((wl, zero, backend), []).append(row["step_s"])
        print("\nDDP step, 2 ranks: workload, optimizer, ronde ms, gloo ms, gloo/ronde")
        for (wl, zero, backend), v in sorted(runs.items()):
            if backend != "ronde":
                continue
            g = statistics.median(runs[(wl, zero, "gloo")])
            r = statistics.median(v)
            result["train"].append({"workload": wl, "zero": zero, "ranks": 2,
                                    "ronde_step_s": r, "gloo_step_s": g,
                                    "ronde_rounds": v,
                                    "gloo_rounds": runs[(wl, zero, "gloo")]})
            print(f"  {wl:4s} {'zero' if zero else 'sgd ':4s} {r * 1e3:8.1f} "
                  f"{g * 1e3:8.1f} {g / r:6.2f}x")
    out = a.out or os.path.join(HERE, "results", f"c10d-{result['date']}.json")
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(out)
    if a.plot and result["collectives"]:
        plot(a.plot, result["collectives"])


if __name__ == "__main__":
    main()
