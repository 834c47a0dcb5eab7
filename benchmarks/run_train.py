"""Training throughput side by side: local (one process, no communication),
local2 (two independent processes at once: the fair baseline when two ranks
share two cores), ronde (DistributedOptimizer, 2 ranks, shared memory on
one host), ronde-gloo (the same over Gloo, RONDE_SHM=0) and PyTorch DDP
(gloo, 2 ranks), all alternating over several rounds.

    .venv/bin/python benchmarks/run_train.py --rounds 3

Prints a table and writes benchmarks/results/train-<date>.json.
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


def load(path):
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--workloads", default="mlp,cnn")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--compression", default="fp16,bf16",
                   help="wire formats also measured on the mlp workload "
                        "(empty: none)")
    p.add_argument("--allocator", choices=["tuned", "default"], default="tuned",
                   help="tuned: glibc keeps large blocks and backs them with "
                        "huge pages (see benchmarks/README.md); default: as is")
    p.add_argument("--out")
    a = p.parse_args()
    bin_dir = os.path.join(a.build, "bin")
    bench = os.path.join(bin_dir, "train_bench")
    ronderun = os.path.join(bin_dir, "ronderun")
    ddp = [sys.executable, os.path.join(ROOT, "benchmarks", "ddp_train_bench.py")]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    if a.allocator == "tuned":
        # Every mode alike, C++ and Python: without this, glibc unmaps each
        # large gradient buffer when it is freed and the next step faults it
        # back in 4 KiB at a time (about 50k page faults per mlp step).
        env["GLIBC_TUNABLES"] = ("glibc.malloc.hugetlb=1:"
                                 "glibc.malloc.mmap_threshold=33554432:"
                                 "glibc.malloc.trim_threshold=4294967296")
    out_rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wl in a.workloads.split(","):
            common = ["--workload", wl, "--steps", str(a.steps), "--warmup", "2"]

            def run(cmd, name, extra_env=None):
                path = os.path.join(tmp, name + ".json")
                done = subprocess.run(cmd + ["--json", path],
                                      env=dict(env, **(extra_env or {})),
                                      stdout=subprocess.DEVNULL)
                if done.returncode != 0:
                    # torch's gloo at times aborts in destroy_process_group()
                    # ("terminate called without an active exception"),
                    # after rank 0 wrote its figures: those stand.
                    if not os.path.exists(path):
                        raise SystemExit(f"{name} failed ({done.returncode})")
                    print(f"[{name}] exited {done.returncode} after writing "
                          "its figures; kept", file=sys.stderr)
                return load(path)

            def run_local2(r):
                procs, paths = [], []
                for i in range(a.np):
                    path = os.path.join(tmp, f"{wl}-local2-{r}-{i}.json")
                    paths.append(path)
                    procs.append(subprocess.Popen(
                        [bench, "--mode", "local"] + common + ["--json", path],
                        env=env, stdout=subprocess.DEVNULL))
                for pr in procs:
                    if pr.wait() != 0:
                        raise SystemExit("local2 run failed")
                return max(load(x)["step_s"] for x in paths)

            wires = [c for c in a.compression.split(",") if c] if wl == "mlp" else []
            # The baselines run every round too, so every mode's spread over
            # rounds is known and no mode sees a quieter machine than another.
            # ronde-gloo: the same ronde job over Gloo's TCP loopback
            # (RONDE_SHM=0) instead of shared memory. ronde-4m: 4 MiB
            # buckets, the size the shared-memory arena holds (all-reduced
            # without a copy in); ronde-4m-copy: the same buckets with the
            # arena off (RONDE_SHM_ARENA_BYTES=0).
            impls = (["local", "local2", "ronde", "ronde-4m", "ronde-4m-copy",
                      "ronde-gloo", "ddp"] +
                     [f"ronde_{c}" for c in wires])
            runs = {impl: [] for impl in impls}
            for r in range(a.rounds):
                for impl in impls:
                    print(f"[{wl}] round {r + 1}/{a.rounds}: {impl}", file=sys.stderr)
                    if impl == "local":
                        runs[impl].append(run([bench, "--mode", "local"] + common,
                                              f"{wl}-local-{r}"))
                        continue
                    if impl == "local2":
                        runs[impl].append({"step_s": run_local2(r)})
                        continue
                    if impl == "ddp":
                        prog = ddp
                    elif impl in ("ronde-gloo", "ronde-4m", "ronde-4m-copy"):
                        prog = [bench, "--mode", "ronde"]
                        extra = {"RONDE_SHM": "0"} if impl == "ronde-gloo" else {
                            "RONDE_FUSION_THRESHOLD": str(4 << 20)}
                        if impl == "ronde-4m-copy":
                            extra["RONDE_SHM_ARENA_BYTES"] = "0"
                        runs[impl].append(run(
                            [ronderun, "-np", str(a.np), "--"] + prog + common,
                            f"{wl}-{impl}-{r}", extra))
                        continue
                    else:
                        wire = impl.split("_")[1] if "_" in impl else "none"
                        prog = [bench, "--mode", "ronde", "--compression", wire]
                    runs[impl].append(run([ronderun, "-np", str(a.np), "--"] + prog + common,
                                          f"{wl}-{impl}-{r}"))
            local_step = statistics.median(x["step_s"] for x in runs["local"])
            local2_step = statistics.median(x["step_s"] for x in runs["local2"])
            batch = runs["local"][0]["batch_per_rank"]
            row = {"workload": wl, "batch_per_rank": batch, "ranks": a.np,
                   "local_step_s": local_step, "local2_step_s": local2_step,
                   "local_steps_s": [x["step_s"] for x in runs["local"]],
                   "local2_steps_s": [x["step_s"] for x in runs["local2"]]}
            for impl in ("ronde", "ronde-4m", "ronde-4m-copy", "ronde-gloo",
                         "ddp"):
                key = impl.replace("-", "_")
                steps = [x["step_s"] for x in runs[impl]]
                row[f"{key}_step_s"] = statistics.median(steps)
                row[f"{key}_steps_s"] = steps
            row["ronde_wait_s"] = statistics.median(x["wait_s"] for x in runs["ronde"])
            row["compression"] = {}
            for c in wires:
                steps_c = [x["step_s"] for x in runs[f"ronde_{c}"]]
                row["compression"][c] = {
                    "step_s": statistics.median(steps_c),
                    "steps_s": steps_c,
                    "wire_bytes": runs[f"ronde_{c}"][0]["wire_bytes"],
                    "baseline_wire_bytes": runs["ronde"][0]["wire_bytes"],
                    "step_over_uncompressed": [c_ / u for c_, u in zip(steps_c, [x["step_s"] for x in runs["ronde"]])],
                }
            ratios = [r_["step_s"] / d["step_s"] for r_, d in zip(runs["ronde"], runs["ddp"])]
            row["ronde_over_ddp"] = row["ronde_step_s"] / row["ddp_step_s"]
            row["ronde_over_ddp_per_round"] = ratios
            row["ronde_gloo_over_ddp"] = (row["ronde_gloo_step_s"] /
                                          row["ddp_step_s"])
            row["ronde_4m_copy_over_arena_per_round"] = [
                c["step_s"] / z["step_s"]
                for c, z in zip(runs["ronde-4m-copy"], runs["ronde-4m"])]
            for impl in ("ronde", "ronde_4m", "ronde_4m_copy", "ddp"):
                # Scaling efficiency: throughput of N ranks over N x one
                # process alone (local), and over N independent processes
                # sharing the machine the same way (local2).
                row[f"{impl}_eff_local"] = local_step / row[f"{impl}_step_s"]
                row[f"{impl}_eff_local2"] = local2_step / row[f"{impl}_step_s"]
                row[f"{impl}_samples_s"] = a.np * batch / row[f"{impl}_step_s"]
            out_rows.append(row)
    print(f"# training step, {a.np} ranks x 1 thread, median over {a.rounds} "
          f"alternating rounds of the median of {a.steps} steps; allocator {a.allocator}")
    print(f"{'workload':>8} {'mode':>6} {'step_ms':>8} {'samples/s':>9} "
          f"{'eff_local':>9} {'eff_local2':>10}")
    for row in out_rows:
        b = row["batch_per_rank"]
        print(f"{row['workload']:>8} {'local':>6} {row['local_step_s'] * 1e3:>8.1f} "
              f"{b / row['local_step_s']:>9.1f}")
        print(f"{row['workload']:>8} {'local2':>6} {row['local2_step_s'] * 1e3:>8.1f} "
              f"{a.np * b / row['local2_step_s']:>9.1f}")
        for impl in ("ronde", "ronde_4m", "ronde_4m_copy", "ddp"):
            print(f"{row['workload']:>8} {impl.replace('ronde_', 'r-'):>6} {row[impl + '_step_s'] * 1e3:>8.1f} "
                  f"{row[impl + '_samples_s']:>9.1f} {row[impl + '_eff_local']:>9.0%} "
                  f"{row[impl + '_eff_local2']:>10.0%}")
        cr = row["ronde_4m_copy_over_arena_per_round"]
        print(f"{row['workload']:>8} 4 MiB buckets without the arena "
              f"(RONDE_SHM_ARENA_BYTES=0): the step takes "
              f"{row['ronde_4m_copy_step_s'] / row['ronde_4m_step_s']:.3f}x "
              f"(per round {min(cr):.3f}..{max(cr):.3f})")
        rr = row["ronde_over_ddp_per_round"]
        print(f"{row['workload']:>8} {'r-gloo':>6} "
              f"{row['ronde_gloo_step_s'] * 1e3:>8.1f}")
        print(f"{row['workload']:>8} ronde/ddp step time {row['ronde_over_ddp']:.3f} "
              f"(per round {min(rr):.3f}..{max(rr):.3f}); ronde waits "
              f"{row['ronde_wait_s'] * 1e3:.1f} ms per step on communication; "
              f"over Gloo (RONDE_SHM=0) ronde/ddp "
              f"{row['ronde_gloo_over_ddp']:.3f}")
        for c, info in row["compression"].items():
            ratios = info["step_over_uncompressed"]
            print(f"{row['workload']:>8} ronde {c} on the wire: "
                  f"{info['wire_bytes'] / 2**20:.0f} MiB per step instead of "
                  f"{info['baseline_wire_bytes'] / 2**20:.0f}; step "
                  f"{info['step_s'] * 1e3:.1f} ms, "
                  f"{info['step_s'] / row['ronde_step_s']:.3f}x uncompressed "
                  f"(per round {min(ratios):.3f}..{max(ratios):.3f})")
    out = a.out or os.path.join(ROOT, "benchmarks", "results",
                                f"train-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump({"benchmark": "train", "rounds": a.rounds, "allocator": a.allocator,
                   "glibc_tunables": env.get("GLIBC_TUNABLES", ""), "rows": out_rows},
                  f, indent=1)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
