"""Elastic recovery side by side: the same mlp job of NP ranks on one host
loses launch rank KILL at step S, and goes on either under ronde's elastic
run (ronderun --min-np, the survivors keep going from their last in-memory
commit) or under torchrun --max-restarts 1 (every worker restarted, the
state reloaded from a Checkpointer file). Both commit or checkpoint every
K steps. Rounds alternate the two.

    .venv/bin/python benchmarks/run_elastic.py --rounds 2

Prints a table and writes benchmarks/results/elastic-<date>.json.
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--np", type=int, default=4)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--commit-every", type=int, default=10)
    p.add_argument("--kill-step", type=int, default=15)
    p.add_argument("--kill-rank", type=int, default=1)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--out")
    a = p.parse_args()
    bin_dir = os.path.join(a.build, "bin")
    bench = os.path.join(bin_dir, "elastic_bench")
    ronderun = os.path.join(bin_dir, "ronderun")
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        def run(mode, r):
            js = os.path.join(tmp, f"{mode}-{r}.json")
            kill = os.path.join(tmp, f"kill-{mode}-{r}")
            args = ["--mode", mode, "--steps", str(a.steps),
                    "--commit-every", str(a.commit_every),
                    "--kill-rank", str(a.kill_rank),
                    "--kill-step", str(a.kill_step), "--kill-file", kill,
                    "--width", str(a.width), "--json", js,
                    "--dir", os.path.join(tmp, f"ckpt-{r}")]
            if mode == "elastic":
                cmd = [ronderun, "-np", str(a.np), "--min-np", "2",
                       "--timeout", "30", "--", bench] + args
            else:
                cmd = [torchrun, "--no-python", "--nproc-per-node",
                       str(a.np), "--max-restarts", "1", "--master-port",
                       str(29500 + r), bench] + args
            done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True,
                                  timeout=900)
            if done.returncode != 0:
                sys.exit(f"{mode} round {r} failed ({done.returncode}):\n"
                         + done.stderr[-3000:])
            with open(js) as f:
                row = json.load(f)
            row["round"] = r
            print(row, flush=True)
            rows.append(row)

        for r in range(a.rounds):
            for mode in (("elastic", "checkpoint") if r % 2 == 0
                         else ("checkpoint", "elastic")):
                run(mode, r)

    def med(mode, key):
        return statistics.median(x[key] for x in rows if x["mode"] == mode)

    summary = {m: {k: med(m, k) for k in ("recovery_s", "step_s", "commit_s")}
               for m in ("elastic", "checkpoint")}
    for m in summary:
        summary[m]["steps_lost"] = med(m, "kill_step") - med(m, "resumed_from")
    summary["elastic"]["commit_overhead"] = (
        summary["elastic"]["commit_s"] /
        (a.commit_every * summary["elastic"]["step_s"]))
    summary["recovery_ratio"] = (summary["elastic"]["recovery_s"] /
                                 summary["checkpoint"]["recovery_s"])
    bytes_ = [x for x in rows if x["mode"] == "elastic"][0]
    summary["committed_bytes"] = bytes_["committed_bytes"]
    summary["commit_vs_memcpy"] = (summary["elastic"]["commit_s"] /
                                   max(bytes_["memcpy_s"], 1e-9))
    print(json.dumps(summary, indent=1))
    out = a.out or os.path.join(
        ROOT, "benchmarks", "results",
        f"elastic-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump({"np": a.np, "rounds": a.rounds, "rows": rows,
                   "summary": summary, "load": os.getloadavg()}, f, indent=1)
    print("wrote", out)


if __name__ == "__main__":
    main()
