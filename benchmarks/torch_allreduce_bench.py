"""The same all-reduce sweep as allreduce_bench.cpp, through PyTorch's
torch.distributed with its own Gloo backend: the baseline ronde is compared
with. Launched by ronderun (reads RONDE_* variables) or torchrun."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def env(name, fallback):
    return os.environ.get(name) or os.environ.get(fallback)


def time_allreduce(t, warmup, iters):
    for _ in range(warmup):
        dist.all_reduce(t)
    samples = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        samples.append(time.perf_counter() - t0)
    m = torch.tensor([statistics.median(samples)], dtype=torch.float64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    return m.item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("-b", default="4K")
    p.add_argument("-e", default="256M")
    p.add_argument("-f", type=float, default=2)
    p.add_argument("-w", type=int, default=3)
    p.add_argument("-n", type=int, default=5)
    p.add_argument("--json")
    a = p.parse_args()
    torch.set_num_threads(1)
    rank = int(env("RONDE_RANK", "RANK"))
    size = int(env("RONDE_SIZE", "WORLD_SIZE"))
    addr = env("RONDE_RENDEZVOUS_ADDR", "MASTER_ADDR")
    # A port next to ronde's: ronderun's own store is not running here.
    port = int(env("RONDE_RENDEZVOUS_PORT", "MASTER_PORT"))
    dist.init_process_group("gloo", init_method=f"tcp://{addr}:{port}",
                            rank=rank, world_size=size)
    bus = 2.0 * (size - 1) / size if size > 1 else 1.0
    results = []
    if rank == 0:
        print(f"# torch.distributed gloo allreduce, {size} ranks, float32 sum, "
              f"torch {torch.__version__}")
        print(f"{'bytes':>12} {'time_us':>10} {'algbw_GBs':>10} {'busbw_GBs':>10}")
    nbytes = parse_size(a.b)
    while nbytes <= parse_size(a.e):
        t = torch.ones(nbytes // 4)
        probe = time_allreduce(t, 1, 1)
        iters = min(200, max(a.n, int(0.5 / max(probe, 1e-6))))
        it = torch.tensor([iters])
        dist.all_reduce(it, op=dist.ReduceOp.MAX)
        sec = time_allreduce(t, a.w, int(it.item()))
        algbw = t.numel() * 4 / sec / 1e9
        if rank == 0:
            print(f"{t.numel() * 4:>12} {sec * 1e6:>10.1f} {algbw:>10.3f} "
                  f"{algbw * bus:>10.3f}", flush=True)
        results.append({"bytes": t.numel() * 4, "iters": int(it.item()),
                        "time_us": sec * 1e6, "algbw_GBs": algbw,
                        "busbw_GBs": algbw * bus})
        nbytes = int(nbytes * a.f)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"benchmark": "allreduce", "impl": "torch.distributed",
                       "torch": torch.__version__, "ranks": size,
                       "results": results}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
