"""What a joined rank's shadow costs the others: in one job, rounds that
alternate between every rank training (`all`) and the last rank inside
`rt.Join()` answering the others' gradient all-reduces with zeros while
they train (`joined`). Rank 0's step times, medians per phase and round,
then the median over rounds and the joined/all ratio. The mlp and cnn
workloads of py_train_bench.py.

    build/bin/ronderun -np 2 -- .venv/bin/python benchmarks/join_bench.py \\
        --workload mlp --rounds 5 --steps 20 [--json F]

At 2 ranks `joined` leaves one rank training and one answering, so the
ratio also holds what one rank's step saves over two ranks' (no other
rank to wait for in the all-reduce); from 3 ranks, ranks keep training on
both sides.
"""
import argparse
import importlib.util
import json
import os
import statistics
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DDP = os.path.join(HERE, "ddp_train_bench.py")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args()

    import torch
    import torch.nn.functional as F

    import ronde.torch as rt

    spec = importlib.util.spec_from_file_location("ddp_train_bench", DDP)
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rt.init()
    model, _, x, y = models.make_workload(a.workload)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    opt = rt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    shadow = rt.rank() == rt.size() - 1

    def step():
        opt.zero_grad(set_to_none=False)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    for _ in range(a.warmup):
        step()
    phases = {"all": [], "joined": []}
    for _ in range(a.rounds):
        for phase in ("all", "joined"):
            rt.barrier()
            samples = []
            with rt.Join():
                if not (phase == "joined" and shadow):
                    for _ in range(a.steps):
                        t0 = time.perf_counter()
                        step()
                        samples.append(time.perf_counter() - t0)
            if samples:
                phases[phase].append(statistics.median(samples))
    if rt.rank() == 0:
        res = {"benchmark": "join", "workload": a.workload,
               "ranks": rt.size(), "steps_per_phase": a.steps,
               "rounds": a.rounds, "loadavg_at_end": os.getloadavg()}
        for phase, meds in phases.items():
            res[phase + "_step_ms"] = statistics.median(meds) * 1e3
            res[phase + "_rounds_ms"] = [round(m * 1e3, 2) for m in meds]
        res["joined_vs_all"] = res["joined_step_ms"] / res["all_step_ms"]
        print(f"{a.workload}, {rt.size()} ranks: median step all "
              f"{res['all_step_ms']:.1f} ms, one rank joined "
              f"{res['joined_step_ms']:.1f} ms, ratio "
              f"{res['joined_vs_all']:.2f} (rounds: all {res['all_rounds_ms']}, "
              f"joined {res['joined_rounds_ms']})")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
    rt.shutdown()


if __name__ == "__main__":
    main()
