"""The crossover of the two shared-memory all-reduce shapes: every rank
reduces every input (whole) against reduce-scatter + all-gather in memory
(split), forced with RONDE_SHM_SPLIT_BYTES, alternating over rounds.
Prints per size the median time of each (without the descriptor check)
and split / whole: below 1 the split is faster, and RONDE_SHM_SPLIT_BYTES
belongs at the first size where it stays so.

    .venv/bin/python benchmarks/shm_crossover.py --np 2,4 --rounds 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = (("whole", "1000000000000"), ("split", "0"))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--np", default="2,4")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-b", default="16K")
    p.add_argument("-e", default="4M")
    p.add_argument("--out")
    a = p.parse_args()
    nps = [int(x) for x in a.np.split(",")]
    ronderun = os.path.join(a.build, "bin", "ronderun")
    bench = os.path.join(a.build, "bin", "allreduce_bench")
    runs = {(n, s): [] for n in nps for s, _ in SHAPES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for n in nps:
                for shape, split in SHAPES:
                    print(f"round {r + 1}/{a.rounds}: {n} ranks, {shape}",
                          file=sys.stderr)
                    out = os.path.join(tmp, f"{n}-{shape}-{r}.json")
                    env = dict(os.environ, OMP_NUM_THREADS="1",
                               RONDE_SHM_SPLIT_BYTES=split)
                    env.pop("RONDE_SHM", None)
                    subprocess.run(
                        [ronderun, "-np", str(n), "--", bench, "-b", a.b,
                         "-e", a.e, "-f", "2", "-n", "10", "--json", out],
                        check=True, env=env, stdout=subprocess.DEVNULL)
                    with open(out) as f:
                        result = json.load(f)
                    if result.get("backend") != "shm":
                        sys.exit(f"ran over {result.get('backend')}, not shm")
                    runs[(n, shape)].append(result)
    summary = []
    for n in nps:
        print(f"# {n} ranks: median us over {a.rounds} rounds, no check")
        print(f"{'bytes':>10} {'whole':>9} {'split':>9} {'split/whole':>11}")
        first = runs[(n, "whole")][0]["results"]
        for i, row in enumerate(first):
            t = {s: statistics.median(x["results"][i]["nocheck_time_us"]
                                      for x in runs[(n, s)])
                 for s, _ in SHAPES}
            ratio = t["split"] / t["whole"]
            print(f"{row['bytes']:>10} {t['whole']:>9.1f} {t['split']:>9.1f} "
                  f"{ratio:>11.2f}")
            summary.append({"ranks": n, "bytes": row["bytes"],
                            "whole_us": t["whole"], "split_us": t["split"],
                            "split_over_whole": ratio})
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"benchmark": "shm_crossover", "rounds": a.rounds,
                       "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
