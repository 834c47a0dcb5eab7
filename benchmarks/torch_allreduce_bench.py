"""The same sweep as allreduce_bench.cpp, through PyTorch's torch.distributed
with its own Gloo backend: the baseline ronde is compared with. --op picks
the collective as there: allreduce (float32 sum, in place), broadcast (in
place, from rank 0), allgather (bytes / n per rank, gathered into one
tensor of bytes) or reducescatter (bytes in, bytes / n out, sum). A
collective this torch's Gloo does not provide is recorded in the JSON as
"unsupported", with no results. Launched by ronderun (reads RONDE_*
variables) or torchrun."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

OPS = ("allreduce", "broadcast", "allgather", "reducescatter")
DESCRIBE = {"allreduce": "float32 sum, in place",
            "broadcast": "float32, in place, root 0",
            "allgather": "float32, bytes / n in per rank",
            "reducescatter": "float32 sum, bytes / n out per rank"}


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def env(name, fallback):
    return os.environ.get(name) or os.environ.get(fallback)


def bus_factor(op, size):
    """nccl-tests' busbw factor; one rank: 1, busbw = algbw."""
    if size <= 1:
        return 1.0
    if op == "allreduce":
        return 2.0 * (size - 1) / size
    if op == "broadcast":
        return 1.0
    return (size - 1) / size


# The tensor-in, tensor-out forms: the newer names where this torch has them
# (the older ones are deprecated aliases there).
ALL_GATHER = getattr(dist, "all_gather_single", None) or getattr(
    dist, "all_gather_into_tensor", None)
REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or getattr(
    dist, "reduce_scatter_tensor", None)


def make_call(op, nbytes, size):
    """(the call, the bytes it moves: the larger of input and output) for a
    sweep size of nbytes; the tensors are sized as allreduce_bench sizes
    them."""
    count = nbytes // 4
    if op == "allreduce":
        t = torch.ones(count)
        return (lambda: dist.all_reduce(t)), count * 4
    if op == "broadcast":
        t = torch.ones(count)
        return (lambda: dist.broadcast(t, 0)), count * 4
    if op == "allgather":
        per_rank = max(1, count // size)
        t, out = torch.ones(per_rank), torch.empty(per_rank * size)
        return (lambda: ALL_GATHER(out, t)), per_rank * size * 4
    per_rank = max(1, count // size)
    t, out = torch.ones(per_rank * size), torch.empty(per_rank)
    return (lambda: REDUCE_SCATTER(out, t)), per_rank * size * 4


def unsupported(op):
    """Why this torch's Gloo cannot run op, or None when it can: a missing
    function, or one that fails on a small tensor (on every rank alike)."""
    if op == "allgather" and ALL_GATHER is None:
        return "torch.distributed has no all_gather_single/into_tensor"
    if op == "reducescatter" and REDUCE_SCATTER is None:
        return "torch.distributed has no reduce_scatter_single/tensor"
    try:
        call, _ = make_call(op, 64 * dist.get_world_size(),
                            dist.get_world_size())
        call()
    except (RuntimeError, NotImplementedError, ValueError) as e:
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return None


def time_call(call, warmup, iters):
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(iters):
        dist.barrier()
        t0 = time.perf_counter()
        call()
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
    p.add_argument("--op", choices=OPS, default="allreduce")
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
    bus = bus_factor(a.op, size)
    report = {"benchmark": "allreduce", "impl": "torch.distributed",
              "op": a.op, "torch": torch.__version__, "ranks": size,
              "dtype": "float32"}
    if a.op in ("allreduce", "reducescatter"):
        report["reduce_op"] = "sum"
    elif a.op == "broadcast":
        report["root"] = 0
    results = []
    why = unsupported(a.op)
    if why:
        report["unsupported"] = why
        if rank == 0:
            print(f"# torch.distributed gloo {a.op}: unsupported ({why})")
    else:
        if rank == 0:
            print(f"# torch.distributed gloo {a.op}, {size} ranks, "
                  f"{DESCRIBE[a.op]}, torch {torch.__version__}")
            print(f"{'bytes':>12} {'time_us':>10} {'algbw_GBs':>10} "
                  f"{'busbw_GBs':>10}")
        nbytes = parse_size(a.b)
        while nbytes <= parse_size(a.e):
            call, total = make_call(a.op, nbytes, size)
            probe = time_call(call, 1, 1)
            iters = min(200, max(a.n, int(0.5 / max(probe, 1e-6))))
            it = torch.tensor([iters])
            dist.all_reduce(it, op=dist.ReduceOp.MAX)
            sec = time_call(call, a.w, int(it.item()))
            algbw = total / sec / 1e9
            if rank == 0:
                print(f"{total:>12} {sec * 1e6:>10.1f} {algbw:>10.3f} "
                      f"{algbw * bus:>10.3f}", flush=True)
            results.append({"bytes": total, "iters": int(it.item()),
                            "time_us": sec * 1e6, "algbw_GBs": algbw,
                            "busbw_GBs": algbw * bus})
            nbytes = int(nbytes * a.f)
    report["results"] = results
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump(report, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
