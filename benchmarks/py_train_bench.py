"""The train benchmark's mlp and cnn workloads from Python: ronde.torch's
DistributedOptimizer (over torch.optim.SGD) against PyTorch's
DistributedDataParallel (ddp_train_bench.py), same models, same loop, both
on 2 ranks through ronderun, alternating over the rounds.

    .venv/bin/python benchmarks/py_train_bench.py --rounds 3

Prints medians, the ronde/DDP step-time ratio per workload and each mode's
eff_local2 (local2: two plain-torch processes at once, the floor), and writes
benchmarks/results/py-train-<date>.json. With --worker it is one rank of
the ronde mode (what the driver launches). --comm-hooks python adds a mode
whose buckets go through a Python callable that all-reduces them (what a
Python hook costs over the C++ path: the GIL taken per bucket on the
communication thread). --autotune adds ronde_autotune: the bucket-size
search on, its steps timed after it has chosen. --ddp-ronde adds
ddp_ronde: the same DDP on ronde's torch.distributed backend (what a DDP
program gets by changing its backend's name). Every mode beside ronde
gets its step over ronde's and over DDP's, and its eff_local2.
"""
import argparse
import datetime
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DDP = os.path.join(HERE, "ddp_train_bench.py")


def local_worker(a, models):
    """One process alone, plain torch, no communication: local2 runs two
    at once, the floor two ranks on two cores could reach."""
    import torch
    import torch.nn.functional as F

    model, batch, x, y = models.make_workload(a.workload)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    clock = models.StepClock()
    for s in range(a.warmup + a.steps):
        clock.start()
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if s >= a.warmup:
            clock.stop()
    main_cpu, other_cpu = clock.cpu()
    with open(a.json, "w") as f:
        json.dump({"workload": a.workload, "mode": "local",
                   "batch_per_rank": batch,
                   "step_s": statistics.median(clock.wall),
                   "main_cpu_s": main_cpu, "other_cpu_s": other_cpu}, f)


def worker(a):
    import torch
    import torch.nn.functional as F

    # The models of the DDP baseline, so both sides train the same thing.
    spec = importlib.util.spec_from_file_location("ddp_train_bench", DDP)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    if a.local:
        return local_worker(a, models)
    import ronde.torch as rt

    rt.init()
    model, batch, x, y = models.make_workload(a.workload)
    rt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    hook = {}
    if a.comm_hook == "python":
        def python_allreduce(bucket):  # the default's work, from Python
            rt.allreduce_(bucket.buffer, op=bucket.op, name=bucket.name,
                          prescale_factor=bucket.prescale_factor,
                          postscale_factor=bucket.postscale_factor,
                          process_set=bucket.process_set)
        hook["comm_hook"] = python_allreduce
    elif a.comm_hook != "none":
        hook["comm_hook"] = a.comm_hook  # a built-in's name
    opt = rt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  compression=a.compression, autotune=a.tune,
                                  **hook)
    warmup = a.warmup
    if a.tune:
        # The search is warm-up: until it has chosen (every rank adopts
        # rank 0's choice at the same step, so all stop alike).
        while not opt.bucket_sizing()[2] and warmup < 400:
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            warmup += 1
    clock, waits = models.StepClock(), []
    for s in range(a.warmup + a.steps):
        clock.start()
        opt.zero_grad(set_to_none=False)  # as the DDP baseline
        F.cross_entropy(model(x), y).backward()
        opt.step()
        if s >= a.warmup:
            clock.stop()
            waits.append(opt.last_step_profile().wait_seconds)
    step = rt.allreduce(torch.tensor([statistics.median(clock.wall)],
                                     dtype=torch.float64), op=rt.Max).item()
    # CPU: the mean over the ranks (ronde's communication thread is the
    # other one).
    main_cpu, other_cpu = rt.allreduce(
        torch.tensor(clock.cpu(), dtype=torch.float64), op=rt.Average).tolist()
    if rt.rank() == 0:
        print(f"{a.workload} ronde-py: {rt.size()} rank(s), median step "
              f"{step * 1e3:.1f} ms, {rt.size() * batch / step:.1f} samples/s")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"workload": a.workload, "mode": "ronde-py",
                           "ranks": rt.size(), "batch_per_rank": batch,
                           "step_s": step, "wait_s": statistics.median(waits),
                           "main_cpu_s": main_cpu, "other_cpu_s": other_cpu,
                           "samples_per_s": rt.size() * batch / step,
                           "steps": a.steps,
                           "bucket_mb": opt.bucket_sizing()[0],
                           "warmup_steps": warmup}, f)
    rt.shutdown()


def driver(a):
    ronderun = os.path.join(a.build, "bin", "ronderun")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(a.build, "python")] +
        [p for p in [env.get("PYTHONPATH")] if p])
    if a.allocator == "tuned":  # as run_train.py, every mode alike
        env["GLIBC_TUNABLES"] = ("glibc.malloc.hugetlb=1:"
                                 "glibc.malloc.mmap_threshold=33554432:"
                                 "glibc.malloc.trim_threshold=4294967296")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for wl in a.workloads.split(","):
            common = ["--workload", wl, "--steps", str(a.steps),
                      "--warmup", str(a.warmup)]
            me = [sys.executable, os.path.abspath(__file__), "--worker"]
            progs = {"ronde": me, "ddp": [sys.executable, DDP]}
            for h in filter(None, a.comm_hooks.split(",")):
                progs[f"ronde_{h}"] = me + ["--comm-hook", h]
            if a.autotune:
                progs["ronde_autotune"] = me + ["--tune"]
            if a.ddp_ronde:
                progs["ddp_ronde"] = [sys.executable, DDP, "--backend", "ronde"]
            runs = {m: [] for m in progs}
            runs["local2"] = []
            for r in range(a.rounds):
                # local2: np independent processes at once, the slower one.
                paths = [os.path.join(tmp, f"{wl}-local2-{r}-{i}.json")
                         for i in range(a.np)]
                procs = [subprocess.Popen(me + ["--local"] + common +
                                          ["--json", x], env=env,
                                          stdout=subprocess.DEVNULL)
                         for x in paths]
                if any(pr.wait() != 0 for pr in procs):
                    raise SystemExit(f"{wl} local2 failed")
                halves = []
                for x in paths:
                    with open(x) as f:
                        halves.append(json.load(f))
                runs["local2"].append({
                    "step_s": max(h["step_s"] for h in halves),
                    "main_cpu_s": statistics.mean(h["main_cpu_s"] for h in halves),
                    "other_cpu_s": statistics.mean(h["other_cpu_s"] for h in halves)})
                for mode, prog in progs.items():
                    print(f"[{wl}] round {r + 1}/{a.rounds}: {mode}",
                          file=sys.stderr)
                    path = os.path.join(tmp, f"{wl}-{mode}-{r}.json")
                    done = subprocess.run(
                        [ronderun, "-np", str(a.np), "--"] + prog + common +
                        ["--json", path], env=env, stdout=subprocess.DEVNULL)
                    # torch's gloo at times aborts in destroy_process_group()
                    # after rank 0 wrote its figures: those stand.
                    if done.returncode != 0 and not os.path.exists(path):
                        raise SystemExit(f"{wl} {mode} failed ({done.returncode})")
                    with open(path) as f:
                        runs[mode].append(json.load(f))
            row = {"workload": wl, "ranks": a.np,
                   "batch_per_rank": runs["ddp"][0]["batch_per_rank"]}
            row["cpu_modes"] = ["local2"] + list(progs)
            for mode in list(progs) + ["local2"]:
                steps = [x["step_s"] for x in runs[mode]]
                row[f"{mode}_step_s"] = statistics.median(steps)
                row[f"{mode}_steps_s"] = steps
                # CPU per step: the training thread's, every other thread's.
                for what in ("main_cpu_s", "other_cpu_s"):
                    row[f"{mode}_{what}"] = statistics.median(
                        x[what] for x in runs[mode])
            for mode in progs:
                # Over two independent processes sharing the machine alike.
                row[f"{mode}_eff_local2"] = (row["local2_step_s"] /
                                             row[f"{mode}_step_s"])
            row["ronde_wait_s"] = statistics.median(
                x["wait_s"] for x in runs["ronde"])
            row["ronde_over_ddp"] = row["ronde_step_s"] / row["ddp_step_s"]
            row["ronde_over_ddp_per_round"] = [
                x["step_s"] / y["step_s"]
                for x, y in zip(runs["ronde"], runs["ddp"])]
            if a.ddp_ronde:
                row["ddp_ronde_over_ddp"] = (row["ddp_ronde_step_s"] /
                                             row["ddp_step_s"])
                row["ddp_ronde_over_ddp_per_round"] = [
                    x["step_s"] / y["step_s"]
                    for x, y in zip(runs["ddp_ronde"], runs["ddp"])]
            for mode in progs:
                if mode.startswith("ronde_"):
                    row[f"{mode}_over_ronde"] = (row[f"{mode}_step_s"] /
                                                 row["ronde_step_s"])
                    row[f"{mode}_over_ddp"] = (row[f"{mode}_step_s"] /
                                               row["ddp_step_s"])
                    row[f"{mode}_bucket_mb"] = [x.get("bucket_mb")
                                                for x in runs[mode]]
            rows.append(row)
    print(f"# Python training step, {a.np} ranks x 1 thread, median over "
          f"{a.rounds} alternating rounds of the median of {a.steps} steps; "
          f"allocator {a.allocator}")
    print(f"{'workload':>8} {'ronde_ms':>9} {'ddp_ms':>8} {'ronde/ddp':>9} "
          f"{'per round':>15} {'wait_ms':>8} {'local2_ms':>9} "
          f"{'ronde_eff':>9} {'ddp_eff':>7}")
    for row in rows:
        rr = row["ronde_over_ddp_per_round"]
        print(f"{row['workload']:>8} {row['ronde_step_s'] * 1e3:>9.1f} "
              f"{row['ddp_step_s'] * 1e3:>8.1f} {row['ronde_over_ddp']:>9.3f} "
              f"{min(rr):>7.3f}..{max(rr):.3f} {row['ronde_wait_s'] * 1e3:>8.1f} "
              f"{row['local2_step_s'] * 1e3:>9.1f} "
              f"{row['ronde_eff_local2']:>9.0%} {row['ddp_eff_local2']:>7.0%}")
        for key in sorted(k for k in row if k.endswith("_over_ronde")):
            mode = key[:-len("_over_ronde")]
            print(f"{'':>8} {mode}: {row[mode + '_step_s'] * 1e3:.1f} ms, "
                  f"{row[key]:.3f}x the ronde step, "
                  f"{row[mode + '_over_ddp']:.3f}x DDP's, eff_local2 "
                  f"{row[mode + '_eff_local2']:.0%}, buckets "
                  f"{sorted(set(row[mode + '_bucket_mb']))} MiB")
        print(f"{'':>8} CPU per step, training thread + other threads: " +
              ", ".join(f"{m} {row[m + '_main_cpu_s'] * 1e3:.1f} + "
                        f"{row[m + '_other_cpu_s'] * 1e3:.1f} ms"
                        for m in row["cpu_modes"]))
        if "ddp_ronde_step_s" in row:
            rr = row["ddp_ronde_over_ddp_per_round"]
            print(f"{'':>8} ddp_ronde (DDP on ronde's backend): "
                  f"{row['ddp_ronde_step_s'] * 1e3:.1f} ms, "
                  f"{row['ddp_ronde_over_ddp']:.3f}x DDP's on gloo "
                  f"({min(rr):.3f}..{max(rr):.3f}), eff_local2 "
                  f"{row['ddp_ronde_eff_local2']:.0%}")
    out = a.out or os.path.join(
        HERE, "results",
        f"py-train-{datetime.date.today().isoformat()}.json")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump({"rows": rows, "rounds": a.rounds, "steps": a.steps,
                   "allocator": a.allocator}, f, indent=1)
    print(f"wrote {out}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--worker", action="store_true",
                   help="run one rank of the ronde mode (under a launcher)")
    p.add_argument("--workload", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--workloads", default="mlp,cnn")
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--compression", default="none")
    p.add_argument("--local", action="store_true",
                   help="worker: plain torch alone, no ronde (local2's half)")
    p.add_argument("--comm-hook", default="none",
                   help="worker: none, a built-in hook's name, or python")
    p.add_argument("--comm-hooks", default="",
                   help="modes added beside ronde and DDP, one per hook "
                        "(python: a Python callable that all-reduces)")
    p.add_argument("--autotune", action="store_true",
                   help="add ronde_autotune: the bucket-size search on, "
                        "timed after it has chosen")
    p.add_argument("--ddp-ronde", action="store_true",
                   help="add ddp_ronde: ddp_train_bench.py on ronde's "
                        "torch.distributed backend")
    p.add_argument("--tune", action="store_true",
                   help="worker: autotune on, warm up until it has chosen")
    p.add_argument("--allocator", choices=["tuned", "default"],
                   default="tuned")
    p.add_argument("--json")
    p.add_argument("--out")
    a = p.parse_args()
    worker(a) if a.worker else driver(a)


if __name__ == "__main__":
    main()
