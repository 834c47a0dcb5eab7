"""Training throughput side by side: local (one process, no communication),
local2 (two independent processes at once: the fair baseline when two ranks
share two cores), ronde (DistributedOptimizer, 2 ranks, shared memory on
one host), ronde-gloo (the same over Gloo, RONDE_SHM=0) and PyTorch DDP
(gloo, 2 ranks), all alternating over several rounds; --bucket-mb,
--no-arena, --autotune, --pin, --shard and --variant add ronde modes
(--shard also DDP with torch's ZeroRedundancyOptimizer, its peer). Every mode
also gives its CPU time per step by thread (benchmarks/README.md).
--background N runs N busy processes (--background-kind matmul: one
process of N matmul threads) beside every mode's turn, as
run_allreduce.py does: training on shared cores.

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
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
from run_allreduce import Background  # noqa: E402


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
    p.add_argument("--bucket-mb", default="4,25",
                   help="bucket sizes (MiB, comma-separated) each measured "
                        "as its own ronde mode, ronde-<size>m "
                        "(RONDE_FUSION_THRESHOLD); empty: none")
    p.add_argument("--no-arena", action="store_true",
                   help="add ronde-noarena: the default sizes with the "
                        "shared-memory arena off (RONDE_SHM_ARENA_BYTES=0)")
    p.add_argument("--autotune", action="store_true",
                   help="add ronde-autotune: the bucket-size search on, "
                        "timed after it has chosen (train_bench --autotune)")
    p.add_argument("--pin", action="store_true",
                   help="add ronde-pinned: the default mode with each rank "
                        "bound to one core (taskset -c <local rank>)")
    p.add_argument("--shard", default="",
                   help="ZeRO stages (comma-separated: 1, 2) each measured as "
                        "ronde-zero<stage> (train_bench --shard), and then "
                        "ddp-zero too: DDP with torch's "
                        "ZeroRedundancyOptimizer; empty: none")
    p.add_argument("--variant", action="append", default=[],
                   metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                   help="add ronde-NAME: the default ronde mode with these "
                        "variables set (e.g. a setting's former default); "
                        "may be repeated")
    p.add_argument("--background", type=int, default=0, metavar="N",
                   help="N busy processes beside every mode's turn")
    p.add_argument("--background-kind", choices=("busy", "matmul"),
                   default="busy")
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
                with Background(a.background, a.background_kind):
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
                background = Background(a.background, a.background_kind)
                background.__enter__()
                for i in range(a.np):
                    path = os.path.join(tmp, f"{wl}-local2-{r}-{i}.json")
                    paths.append(path)
                    procs.append(subprocess.Popen(
                        [bench, "--mode", "local"] + common + ["--json", path],
                        env=env, stdout=subprocess.DEVNULL))
                codes = [pr.wait() for pr in procs]
                background.__exit__()
                if any(codes):
                    raise SystemExit("local2 run failed")
                figures = [load(x) for x in paths]
                return {"step_s": max(x["step_s"] for x in figures),
                        "main_cpu_s": statistics.mean(
                            x["main_cpu_s"] for x in figures),
                        "other_cpu_s": statistics.mean(
                            x["other_cpu_s"] for x in figures)}

            wires = [c for c in a.compression.split(",") if c] if wl == "mlp" else []
            # The baselines run every round too, so every mode's spread over
            # rounds is known and no mode sees a quieter machine than another.
            # Every ronde mode: (extra train_bench arguments, extra
            # environment). ronde: the defaults; ronde-<x>m: x MiB buckets;
            # ronde-noarena: the shared-memory arena off (buckets in private
            # memory, copied in); ronde-autotune: the bucket-size search;
            # ronde-gloo: Gloo's TCP loopback (RONDE_SHM=0) instead of
            # shared memory; ronde_<wire>: gradients compressed on the wire.
            variants = {"ronde": ([], {})}
            for mb in [x for x in a.bucket_mb.split(",") if x]:
                variants[f"ronde-{mb}m"] = (
                    [], {"RONDE_FUSION_THRESHOLD": str(int(float(mb) * 2**20))})
            if a.no_arena:
                variants["ronde-noarena"] = ([], {"RONDE_SHM_ARENA_BYTES": "0"})
            if a.autotune:
                variants["ronde-autotune"] = (["--autotune"], {})
            for spec in a.variant:
                name, _, assignments = spec.partition(":")
                variants[f"ronde-{name}"] = ([], dict(
                    kv.split("=", 1) for kv in assignments.split(",") if kv))
            if a.pin:
                variants["ronde-pinned"] = ([], {})
            stages = [x for x in a.shard.split(",") if x]
            for st in stages:
                if st not in ("1", "2"):
                    raise SystemExit(f"--shard {st}: stages are 1 and 2")
                variants[f"ronde-zero{st}"] = (["--shard", st], {})
            variants["ronde-gloo"] = ([], {"RONDE_SHM": "0"})
            for c in wires:
                variants[f"ronde_{c}"] = (["--compression", c], {})
            peers = ["ddp"] + (["ddp-zero"] if stages else [])
            impls = ["local", "local2"] + list(variants) + peers
            runs = {impl: [] for impl in impls}
            for r in range(a.rounds):
                for impl in impls:
                    print(f"[{wl}] round {r + 1}/{a.rounds}: {impl}", file=sys.stderr)
                    if impl == "local":
                        runs[impl].append(run([bench, "--mode", "local"] + common,
                                              f"{wl}-local-{r}"))
                    elif impl == "local2":
                        runs[impl].append(run_local2(r))
                    elif impl in peers:
                        zero = ["--zero"] if impl == "ddp-zero" else []
                        runs[impl].append(run(
                            [ronderun, "-np", str(a.np), "--"] + ddp + zero +
                            common, f"{wl}-{impl}-{r}"))
                    else:
                        args, extra = variants[impl]
                        cmd = [bench, "--mode", "ronde"] + args + common
                        if impl == "ronde-pinned":
                            # Rank i on core i (modulo the cores; not
                            # nproc's count, which OMP_NUM_THREADS=1 makes 1).
                            cores = len(os.sched_getaffinity(0))
                            cmd = ["bash", "-c",
                                   f'exec taskset -c $((RONDE_LOCAL_RANK % '
                                   f'{cores})) "$@"', "pin"] + cmd
                        runs[impl].append(run(
                            [ronderun, "-np", str(a.np), "--"] + cmd,
                            f"{wl}-{impl}-{r}", extra))
            local_step = statistics.median(x["step_s"] for x in runs["local"])
            local2_step = statistics.median(x["step_s"] for x in runs["local2"])
            batch = runs["local"][0]["batch_per_rank"]
            row = {"workload": wl, "batch_per_rank": batch, "ranks": a.np,
                   "local_step_s": local_step, "local2_step_s": local2_step,
                   "local_steps_s": [x["step_s"] for x in runs["local"]],
                   "local2_steps_s": [x["step_s"] for x in runs["local2"]]}
            # CPU time per step (train_bench's own clocks, the mean over the
            # ranks): the training thread's and every other thread's (the
            # communication thread).
            for impl in ["local", "local2"] + peers + [m for m in variants]:
                key = impl.replace("-", "_")
                for what in ("main_cpu_s", "other_cpu_s"):
                    per_round = [x[what] for x in runs[impl]]
                    row[f"{key}_{what}"] = statistics.median(per_round)
                    row[f"{key}_{what}_per_round"] = per_round
            modes = [m for m in variants if not m.startswith("ronde_")] + peers
            for impl in modes:
                key = impl.replace("-", "_")
                steps = [x["step_s"] for x in runs[impl]]
                row[f"{key}_step_s"] = statistics.median(steps)
                row[f"{key}_steps_s"] = steps
                # Scaling efficiency: throughput of N ranks over N x one
                # process alone (local), and over N independent processes
                # sharing the machine the same way (local2).
                row[f"{key}_eff_local"] = local_step / row[f"{key}_step_s"]
                row[f"{key}_eff_local2"] = local2_step / row[f"{key}_step_s"]
                row[f"{key}_samples_s"] = a.np * batch / row[f"{key}_step_s"]
                if impl not in peers:
                    # Against DDP, and the sharded modes against the
                    # sharded peer as well: the ratio of the medians, and
                    # round by round.
                    for peer in ["ddp"] + (
                            ["ddp-zero"] if impl.startswith("ronde-zero") else []):
                        name = f"{key}_over_{peer.replace('-', '_')}"
                        row[name] = row[f"{key}_step_s"] / statistics.median(
                            x["step_s"] for x in runs[peer])
                        row[name + "_per_round"] = [
                            x["step_s"] / d["step_s"]
                            for x, d in zip(runs[impl], runs[peer])]
                    row[f"{key}_wait_s"] = statistics.median(
                        x["wait_s"] for x in runs[impl])
                    row[f"{key}_bucket_mb"] = [x.get("bucket_mb") for x in runs[impl]]
            row["modes"] = [m.replace("-", "_") for m in modes]
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
            out_rows.append(row)
    print(f"# training step, {a.np} ranks x 1 thread, median over {a.rounds} "
          f"alternating rounds of the median of {a.steps} steps; allocator {a.allocator}")
    print(f"{'workload':>8} {'mode':>14} {'step_ms':>8} {'samples/s':>9} "
          f"{'eff_local':>9} {'eff_local2':>10} {'/ddp':>6} {'per round':>13} "
          f"{'wait_ms':>7} {'buckets':>8} {'cpu_ms':>7} {'other':>6}")
    for row in out_rows:
        b = row["batch_per_rank"]
        def cpu(key, width):
            return (f"{' ' * width}{row[key + '_main_cpu_s'] * 1e3:>7.1f} "
                    f"{row[key + '_other_cpu_s'] * 1e3:>6.1f}")
        print(f"{row['workload']:>8} {'local':>14} {row['local_step_s'] * 1e3:>8.1f} "
              f"{b / row['local_step_s']:>9.1f}" + cpu("local", 61))
        print(f"{row['workload']:>8} {'local2':>14} {row['local2_step_s'] * 1e3:>8.1f} "
              f"{a.np * b / row['local2_step_s']:>9.1f}" + cpu("local2", 61))
        for key in row["modes"]:
            line = (f"{row['workload']:>8} {key.replace('_', '-'):>14} "
                    f"{row[key + '_step_s'] * 1e3:>8.1f} "
                    f"{row[key + '_samples_s']:>9.1f} {row[key + '_eff_local']:>9.0%} "
                    f"{row[key + '_eff_local2']:>10.0%}")
            if not key.startswith("ddp"):
                rr = row[key + "_over_ddp_per_round"]
                sizes = sorted({x for x in row[key + "_bucket_mb"] if x})
                line += (f" {row[key + '_over_ddp']:>6.3f} "
                         f"{min(rr):>6.3f}..{max(rr):<5.3f} "
                         f"{row[key + '_wait_s'] * 1e3:>7.1f} "
                         f"{','.join(f'{x:g}' for x in sizes):>8}")
                line += cpu(key, 1)
            else:
                line += cpu(key, 46)
            print(line)
        for key in row["modes"]:
            if key + "_over_ddp_zero" in row:
                rr = row[key + "_over_ddp_zero_per_round"]
                print(f"{row['workload']:>8} {key.replace('_', '-')} / ddp-zero: "
                      f"{row[key + '_over_ddp_zero']:.3f} "
                      f"(per round {min(rr):.3f}..{max(rr):.3f})")
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
                   "background": a.background,
                   "background_kind": a.background_kind,
                   "glibc_tunables": env.get("GLIBC_TUNABLES", ""), "rows": out_rows},
                  f, indent=1)
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
