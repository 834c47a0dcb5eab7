"""torch.distributed collectives on backend="ronde" beside backend="gloo"
and ronde's own API, in one job: the default group is ronde's, a second
group of every rank is gloo's, and ronde.torch's collectives run on the
same world. For each size, rounds alternate between the three. Launched
by torchrun; rank 0 prints one JSON line. benchmarks/run_c10d.py drives
it.

  all_reduce             float32 sum, in place, `bytes` per rank
  all_reduce_async       the same with async_op=True, waited on at once
                         (ronde_api: synchronize(allreduce_async_))
  all_gather_into_tensor bytes / n in per rank, bytes out
  reduce_scatter_tensor  bytes in per rank, bytes / n out, sum
  broadcast              in place, from rank 0
  all_to_all_single      even splits, `bytes` in and out per rank
"""
import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import ronde.torch as rt

OPS = ("all_reduce", "all_reduce_async", "all_gather_into_tensor",
       "reduce_scatter_tensor", "broadcast", "all_to_all_single")


def parse_size(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * units[s[-1]]) if s[-1] in units else int(s)


def callers(op, nbytes, n, gloo):
    """The three ways to run `op` on `nbytes`: c10d on ronde, c10d on gloo,
    ronde.torch."""
    numel = max(n, nbytes // 4 // n * n)
    if op == "all_reduce":
        t = torch.ones(numel)
        return {"ronde": lambda: dist.all_reduce(t),
                "gloo": lambda: dist.all_reduce(t, group=gloo),
                "ronde_api": lambda: rt.allreduce_(t, op=rt.Sum)}
    if op == "all_reduce_async":
        t = torch.ones(numel)
        return {"ronde": lambda: dist.all_reduce(t, async_op=True).wait(),
                "gloo": lambda: dist.all_reduce(t, group=gloo,
                                                async_op=True).wait(),
                "ronde_api": lambda: rt.synchronize(
                    rt.allreduce_async_(t, op=rt.Sum))}
    if op == "all_to_all_single":
        src, out = torch.ones(numel), torch.empty(numel)
        return {"ronde": lambda: dist.all_to_all_single(out, src),
                "gloo": lambda: dist.all_to_all_single(out, src, group=gloo),
                "ronde_api": lambda: rt.alltoall(src)}
    if op == "broadcast":
        t = torch.ones(numel)
        return {"ronde": lambda: dist.broadcast(t, 0),
                "gloo": lambda: dist.broadcast(t, 0, group=gloo),
                "ronde_api": lambda: rt.broadcast_(t, 0)}
    if op == "all_gather_into_tensor":
        src, out = torch.ones(numel // n), torch.empty(numel)
        return {"ronde": lambda: dist.all_gather_into_tensor(out, src),
                "gloo": lambda: dist.all_gather_into_tensor(out, src, group=gloo),
                "ronde_api": lambda: rt.allgather(src)}
    src, out = torch.ones(numel), torch.empty(numel // n)
    return {"ronde": lambda: dist.reduce_scatter_tensor(out, src),
            "gloo": lambda: dist.reduce_scatter_tensor(out, src, group=gloo),
            "ronde_api": lambda: rt.reducescatter(src, op=rt.Sum)}


def time_one(fn, iters):
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="4K,64K,1M,16M,256M")
    p.add_argument("--ops", default=",".join(OPS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--budget-s", type=float, default=0.3,
                   help="seconds of one round of one implementation")
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("ronde")
    gloo = dist.new_group(backend="gloo")
    n, me = dist.get_world_size(), dist.get_rank()
    rows = []
    for op in a.ops.split(","):
        for size in a.sizes.split(","):
            nbytes = parse_size(size)
            fns = callers(op, nbytes, n, gloo)
            try:
                fns["gloo"]()
            except Exception as e:  # noqa: BLE001  a gloo without the op
                fns.pop("gloo")
                if me == 0:
                    print(f"# gloo: {op}: {e}".splitlines()[0])
            for fn in fns.values():  # warm-up, and connections made
                fn()
            # Each one's iterations from its own first calls (a budget of
            # time per round each, so that a fast one is not timed over a
            # few calls), alike on ranks.
            t = torch.tensor([time_one(fn, 3) for fn in fns.values()],
                             dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            iters = {k: max(2, min(20000, int(a.budget_s / max(x, 1e-7))))
                     for k, x in zip(fns, t.tolist())}
            samples = {k: [] for k in fns}
            for r in range(a.rounds):
                names = list(fns) if r % 2 == 0 else list(fns)[::-1]
                for k in names:
                    samples[k].append(time_one(fns[k], iters[k]))
            row = {"op": op, "bytes": nbytes, "ranks": n, "iters": iters}
            for k, v in samples.items():
                s = torch.tensor([statistics.median(v)], dtype=torch.float64)
                dist.all_reduce(s, op=dist.ReduceOp.MAX)
                row[f"{k}_us"] = s.item() * 1e6
            rows.append(row)
            if me == 0:
                print(f"# {op} {size}: " + ", ".join(
                    f"{k} {row[k + '_us']:.1f} us" for k in samples), flush=True)
    if me == 0:
        print(json.dumps({"ranks": n, "rows": rows}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
