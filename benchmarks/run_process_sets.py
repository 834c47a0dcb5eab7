"""What a collective on a process set costs against the same collective on
the whole job: allreduce_bench on the global set, on a set of every rank
(`--process-set all`: a communicator of its own over the same transport),
and on two halves at once (`--process-set half`: each half a set of its
own, both sweeping together), alternating over several rounds (this
machine is noisy), medians per size and their ratios to the global set.

    .venv/bin/python benchmarks/run_process_sets.py --np 2,4 --rounds 3

Writes benchmarks/results/process-sets-<date>.json unless --out says
otherwise. Sizes and bus bandwidths count the ranks of the set that ran.
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
MODES = ("global", "all", "half")


def sweep(build, np_, mode, op, begin, end, env):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r.json")
        cmd = [os.path.join(build, "bin", "ronderun"), "-np", str(np_), "--",
               os.path.join(build, "bin", "allreduce_bench"), "-b", begin,
               "-e", end, "-f", "4", "--op", op, "--process-set", mode,
               "--json", out]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--np", default="2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--op", default="allreduce")
    p.add_argument("-b", default="4K")
    p.add_argument("-e", default="16M")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out")
    a = p.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    groups = []
    for np_ in [int(x) for x in a.np.split(",")]:
        runs = {m: [] for m in MODES}
        for _ in range(a.rounds):
            for mode in MODES:
                if mode == "half" and np_ < 4:
                    continue  # halves of one rank: local copies, no transport
                runs[mode].append(sweep(a.build, np_, mode, a.op, a.b, a.e, env))
        modes = [m for m in MODES if runs[m]]
        sizes = [r["bytes"] for r in runs["global"][0]["results"]]
        rows = []
        for i, size in enumerate(sizes):
            row = {"bytes": size}
            for m in modes:
                t = [r["results"][i]["time_us"] for r in runs[m]]
                row[m + "_time_us"] = statistics.median(t)
                row[m + "_spread"] = (max(t) - min(t)) / statistics.median(t)
            for m in modes[1:]:
                row[m + "_vs_global"] = row[m + "_time_us"] / row["global_time_us"]
            rows.append(row)
        backend = runs["global"][0]["backend"]
        print(f"# {a.op}, {np_} ranks over {backend}, median time (us) over "
              f"{a.rounds} alternating rounds; half: {np_ // 2} ranks per set, "
              "both halves at once")
        head = f"{'bytes':>10}" + "".join(f" {m:>9}" for m in modes) + "".join(
            f" {m + '/global':>12}" for m in modes[1:])
        print(head)
        for row in rows:
            line = f"{row['bytes']:>10}" + "".join(
                f" {row[m + '_time_us']:>9.1f}" for m in modes) + "".join(
                f" {row[m + '_vs_global']:>12.2f}" for m in modes[1:])
            print(line)
        sys.stdout.flush()
        groups.append({"np": np_, "op": a.op, "backend": backend,
                       "rounds": a.rounds, "rows": rows})
    out = a.out or os.path.join(
        ROOT, "benchmarks", "results",
        f"process-sets-{datetime.date.today().isoformat()}.json")
    load = os.getloadavg()
    with open(out, "w") as f:
        json.dump({"benchmark": "process_sets",
                   "command": "benchmarks/run_process_sets.py " +
                   " ".join(sys.argv[1:]),
                   "loadavg_at_end": [round(x, 2) for x in load],
                   "groups": groups}, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
