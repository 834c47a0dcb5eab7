"""Horovod names and behaviours of ronde.torch beyond the collectives'
gradients (worker_autograd.py): HorovodInternalError, Compression's
compress/decompress, grouped_allgather and grouped_reducescatter (each
checked on every rank against a local reference), Horovod's ValueErrors
(names still in flight too), and join(device).

    worker_horovod.py names OUT_DIR
"""
import time

import torch

import ronde.torch as hvd
from common import run_check_worker


def names(out):
    n, me = hvd.size(), hvd.rank()
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    # Compression objects, as Horovod's scripts and tests call them.
    x = torch.arange(6, dtype=torch.float64) / 3
    for c, dt in ((hvd.Compression.fp16, torch.float16),
                  (hvd.Compression.bf16, torch.bfloat16)):
        wire, ctx = c.compress(x)
        check(wire.dtype == dt, f"{c}: compressed to {wire.dtype}")
        back = c.decompress(wire, ctx)
        check(back.dtype == torch.float64 and
              torch.allclose(back, x, rtol=1e-2), f"{c}: came back {back}")
    i = torch.arange(4)
    wire, ctx = hvd.Compression.fp16.compress(i)
    check(wire is i and hvd.Compression.fp16.decompress(wire, ctx) is i,
          "fp16 changed an integer tensor")
    wire, ctx = hvd.Compression.none.compress(x)
    check(wire is x and ctx is None, "none changed the tensor")

    # grouped_allgather: rank r sends r + 1 rows of each tensor.
    ts = [torch.full((me + 1, 2), float(me)), torch.full((me + 1,), me + 10.0)]
    got = hvd.grouped_allgather(ts, name="ga")
    want = [torch.cat([torch.full((r + 1, 2), float(r)) for r in range(n)]),
            torch.cat([torch.full((r + 1,), r + 10.0) for r in range(n)])]
    check(all(torch.equal(g, w) for g, w in zip(got, want)),
          f"grouped_allgather: {got}")

    # grouped_reducescatter: Sum and Average of 2n rows.
    ts = [torch.arange(2 * n * 3, dtype=torch.float32).view(2 * n, 3) + me,
          torch.ones(2 * n) * (me + 1)]
    for op, div in ((hvd.Sum, 1), (hvd.Average, n)):
        got = hvd.grouped_reducescatter(ts, op=op)
        for k, t in enumerate(ts):
            total = sum(t - me + r if k == 0 else torch.ones(2 * n) * (r + 1)
                        for r in range(n)) / div
            want = total[2 * me:2 * me + 2]
            check(torch.allclose(got[k], want),
                  f"grouped_reducescatter {op.name} tensor {k}: {got[k]}")

    # Horovod's ValueErrors: repeated or missing parameter names, bad
    # alltoall splits.
    model = torch.nn.Linear(2, 1)
    for named, what in (
            ([("w", model.weight), ("w", model.bias)], "repeated"),
            ([("w", model.weight)], "missing")):
        try:
            hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1),
                named_parameters=named)
            failures.append(f"DistributedOptimizer accepted {what} names")
        except ValueError as e:
            check("rank" in str(e), f"{what} names: {e}")
    for splits in (torch.tensor([1.0, 1.0]), ["a", "b"]):
        try:
            hvd.alltoall(torch.arange(2.0), splits=splits)
            failures.append(f"alltoall accepted splits {splits}")
        except ValueError:
            pass

    # join(device) as Horovod spells it: every rank joins at once here.
    check(hvd.join(-1) in range(n), "join(-1) did not return a rank")
    check(hvd.join(hvd.global_process_set()) in range(n),
          "join(process_set) did not return a rank")

    # A name still in flight is refused (ValueError), as in Horovod. Rank
    # 1 comes late, so rank 0's first call is still in flight when it
    # tries the name again; once done, the name is free.
    if me == 1:
        time.sleep(0.3)
    h = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
    if me == 0:
        try:
            hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
            failures.append("a second collective named 'dup' was accepted")
        except ValueError as e:
            check("still in flight" in str(e), f"duplicate name: {e}")
    check(torch.equal(hvd.synchronize(h), torch.full((2,), float(n))),
          "the first 'dup' all-reduce")
    again = hvd.synchronize(hvd.allgather_async(torch.tensor([me]), name="dup"))
    check(again.tolist() == list(range(n)), f"'dup' again: {again}")

    # A failed collective is a HorovodInternalError (ronde's CommError).
    check(hvd.HorovodInternalError is hvd.CommError and
          issubclass(hvd.HorovodInternalError, RuntimeError),
          "HorovodInternalError is not CommError")
    return failures


if __name__ == "__main__":
    run_check_worker({"names": names})
