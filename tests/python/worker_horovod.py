"""Horovod names and behaviours of ronde.torch beyond the collectives'
gradients (worker_autograd.py), each checked on every rank against a local
reference:

- names: HorovodInternalError, Compression's compress/decompress,
  grouped_allgather and grouped_reducescatter, Horovod's ValueErrors (names
  still in flight too), and join(device);
- semantics (3 ranks): Horovod's arithmetic on integer tensors and in a
  join, global root ranks on process sets, ProcessSet.size() outside the
  set, DistributedOptimizer outside its set, sparse all-reduces and sparse
  gradients, broadcast_optimizer_state's zero gradients, the
  synchronize() warning and Adasum's refusal.

    worker_horovod.py names|semantics OUT_DIR
"""
import time
import warnings

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
    # A call every rank rejects (here: rows that do not split evenly, splits
    # that do not add up) is a ValueError and, as before, a RuntimeError.
    for rows, splits in ((n + 1, None), (1, [1] * n)):
        try:
            hvd.alltoall(torch.arange(float(rows)), splits=splits)
            failures.append(f"alltoall of {rows} rows accepted")
        except hvd.InvalidArgumentError as e:
            check(isinstance(e, ValueError) and isinstance(e, RuntimeError)
                  and "rejected" in str(e), f"alltoall rejection: {e!r}")

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


def integers(n, me, check):
    """Average, prescale and postscale on integer tensors: in float64,
    truncated, as Horovod computes them."""
    base = torch.tensor([-7, 5, 100, 3, -1, 64], dtype=torch.int64)
    mine = (base * (me + 1)).to(torch.int32)
    total = sum(base * (r + 1) for r in range(n))
    got = hvd.allreduce(mine, op=hvd.Average)
    check(got.dtype == torch.int32 and
          torch.equal(got.long(), (total.double() / n).long()),
          f"int Average: {got}")
    got = hvd.allreduce(mine, op=hvd.Sum, prescale_factor=0.35)
    want = sum((base * (r + 1)).double().mul(0.35).long() for r in range(n))
    check(torch.equal(got.long(), want), f"int prescale: {got} want {want}")
    got = hvd.allreduce(mine, op=hvd.Sum, postscale_factor=0.35)
    want = (total.double() * 0.35).long()
    check(torch.equal(got.long(), want), f"int postscale: {got}")
    inplace = mine.clone()
    h = hvd.allreduce_async_(inplace, op=hvd.Average)
    check(hvd.synchronize(h) is inplace and torch.equal(
        inplace.long(), (total.double() / n).long()), f"int async_: {inplace}")
    rows = torch.arange(2 * n, dtype=torch.int64) * (me + 1)
    got = hvd.reducescatter(rows, op=hvd.Average)
    want = (torch.arange(2 * n) * sum(range(1, n + 1))).double() / n
    check(torch.equal(got, want.long()[2 * me:2 * me + 2]),
          f"int reducescatter Average: {got}")
    got = hvd.grouped_allreduce([mine, mine.double()], op=hvd.Average)
    check(torch.equal(got[0].long(), (total.double() / n).long()) and
          torch.allclose(got[1], total.double() / n),
          f"grouped int and float Average: {got}")


def process_sets(n, me, check):
    """Global root ranks on a set of ranks 1 and 2; size() on rank 0,
    outside it; a DistributedOptimizer outside its set steps alone."""
    s = hvd.add_process_set([1, 2])
    check(s.size() == 2, f"size() of [1, 2] on rank {me}: {s.size()}")
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.fill_(float(me))
        model.bias.fill_(0.0)
    if me in (1, 2):
        got = hvd.broadcast(torch.tensor([float(me)]), root_rank=2,
                            process_set=s)
        check(got.item() == 2.0, f"broadcast root 2 on [1, 2]: {got}")
        obj = hvd.broadcast_object({"from": me}, root_rank=2, process_set=s)
        check(obj == {"from": 2}, f"broadcast_object root 2: {obj}")
        hvd.broadcast_parameters(model.state_dict(), root_rank=2,
                                 process_set=s)
        check(torch.all(model.weight == 2.0), "broadcast_parameters root 2")
        try:
            hvd.broadcast(torch.zeros(1), root_rank=0, process_set=s)
            check(False, "broadcast from rank 0, outside [1, 2], accepted")
        except ValueError as e:
            check("not in the process set" in str(e), f"root outside: {e}")
        # join() names the last rank globally on a set too.
        if me == 2:
            time.sleep(0.2)
        check(hvd.join(s) == 2, "join on [1, 2] did not return rank 2")
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=1.0),
        named_parameters=model.named_parameters(), process_set=s)
    x = torch.full((1, 3), float(me + 1))
    model(x).sum().backward()
    opt.step()
    # d(sum(w x + b))/dw = x: the set averages ranks 1 and 2's x.
    want = model.weight.detach().clone()
    start = 0.0 if me == 0 else 2.0
    step = (me + 1) if me == 0 else (2 + 3) / 2
    check(torch.allclose(model.weight, torch.full_like(want, start - step)),
          f"DistributedOptimizer on [1, 2], rank {me}: {model.weight}")
    hvd.remove_process_set(s)


def join_average(n, me, check):
    """In a join, Horovod's Average divides by the set's size."""
    if me == 0:
        hvd.join()
        return
    got = hvd.allreduce(torch.ones(2), op=hvd.Average)
    check(torch.allclose(got, torch.full((2,), (n - 1) / n)),
          f"Average with rank 0 joined: {got}")
    hvd.join()


def sparse(n, me, check):
    """sparse_allreduce_async against a dense all-reduce, and SparseAdam
    stepping on an embedding's averaged sparse gradients, against one
    process that sees every rank's batch."""
    dense = torch.zeros(6, 3)
    dense[me] = me + 1.0
    dense[5] = 1.0
    h = hvd.sparse_allreduce_async(dense.to_sparse(), name="sp", op=hvd.Sum)
    got = h()
    check(got.is_sparse and torch.allclose(
        got.to_dense(), hvd.allreduce(dense, op=hvd.Sum)),
        f"sparse_allreduce_async: {got}")

    def batch(r):
        return torch.tensor([[1, 2 + r], [r, 7]])

    for as_dense in (False, True):
        torch.manual_seed(5)
        emb = torch.nn.Embedding(10, 3, sparse=True)
        ref = torch.nn.Embedding(10, 3, sparse=True)
        ref.load_state_dict(emb.state_dict())
        opt = hvd.DistributedOptimizer(
            torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
            named_parameters=emb.named_parameters(),
            sparse_as_dense=as_dense)
        emb(batch(me)).pow(2).sum().backward()
        opt.step()
        grads = []
        for r in range(n):
            ref.zero_grad()
            ref(batch(r)).pow(2).sum().backward()
            grads.append(ref.weight.grad.to_dense())
        ref.weight.grad = (sum(grads) / n).to_sparse()
        torch.optim.SparseAdam(list(ref.parameters()), lr=0.1).step()
        check(torch.allclose(emb.weight, ref.weight, atol=1e-6),
              f"SparseAdam, sparse_as_dense={as_dense}")


def optimizer_details(n, me, check):
    model = torch.nn.Linear(2, 2)
    frozen = torch.nn.Parameter(torch.ones(1), requires_grad=False)
    model.register_parameter("frozen", frozen)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters())
    check(opt._parameter_names.get(model.weight) == "weight",
          f"_parameter_names: {opt._parameter_names}")
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    check(model.weight.grad is not None and
          torch.count_nonzero(model.weight.grad) == 0 and frozen.grad is None,
          "broadcast_optimizer_state left no zero .grad")
    # No zero-gradient step (Horovod's): the state stays as it was.
    check(not opt.state_dict()["state"], "broadcast_optimizer_state stepped")
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        opt.step()
    check(len(seen) == 1 and "without optimizer.skip_synchronize()" in
          str(seen[0].message), f"step() after synchronize(): {seen}")
    opt.zero_grad()
    model(torch.ones(1, 2)).sum().backward()
    opt.synchronize()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with opt.skip_synchronize():
            opt.step()
    check(not seen, f"skip_synchronize still warned: {seen}")
    for what, call in (
            ("allreduce", lambda: hvd.allreduce(torch.ones(2),
                                                op=hvd.Adasum)),
            ("DistributedOptimizer", lambda: hvd.DistributedOptimizer(
                torch.optim.SGD(model.parameters(), lr=0.1),
                named_parameters=model.named_parameters(), op=hvd.Adasum))):
        try:
            call()
            check(False, f"{what} accepted Adasum")
        except NotImplementedError as e:
            check("Adasum" in str(e), f"{what} Adasum: {e}")


def semantics(out):
    n, me = hvd.size(), hvd.rank()
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)

    for part in (integers, process_sets, join_average, sparse,
                 optimizer_details):
        part(n, me, check)
    return failures


if __name__ == "__main__":
    run_check_worker({"names": names, "semantics": semantics})
