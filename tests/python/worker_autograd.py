"""Gradients through ronde.torch's collectives, on every rank: each rank
backpropagates its own loss through a collective, and its input's gradient
must equal Horovod's: the gradient of the sum of every rank's loss,
computed in this one process with plain torch over every rank's input
(they are known functions of the rank), times Horovod's factor for the
collective (1/size for broadcast and allgather, whose backward averages
where that sum adds; size for reducescatter, whose backward scales the
gathered gradients by it for Sum and not down for Average).

    worker_autograd.py grads OUT_DIR
"""

import torch

import ronde.torch as rt
from common import run_check_worker

D = torch.float64


def x_of(r, rows=3, cols=2):
    return (torch.arange(rows * cols, dtype=D).view(rows, cols) + 1) * (r + 2) / 4


def w_of(r, shape):
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=D).view(shape) % 5 - 2 + r) / 3


def parts(rows, n):
    base, extra = divmod(rows, n)
    return [base + (1 if r < extra else 0) for r in range(n)]


class Case:
    """`ours(x)`: this rank's output through ronde; `ref(xs, r)`: rank r's
    output from every rank's input, in plain torch."""

    def __init__(self, name, ours, ref, shape=lambda r: (3, 2), factor=1.0):
        self.name, self.ours, self.ref, self.shape = name, ours, ref, shape
        self.factor = factor


def cases(n):
    pre, post = 0.5, 3.0
    splits = [[1 + (r + k) % 2 for k in range(n)] for r in range(n)]

    def alltoall_ref(xs, r):
        return torch.cat([torch.split(xs[s], splits[s])[r] for s in range(n)])

    def reducescatter_ref(op):
        def ref(xs, r):
            total = sum(xs) / (n if op == rt.Average else 1)
            return torch.split(total, parts(xs[0].shape[0], n))[r]
        return ref

    return [
        Case("allreduce Sum", lambda x: rt.allreduce(x, op=rt.Sum),
             lambda xs, r: sum(xs)),
        Case("allreduce Average", lambda x: rt.allreduce(x),
             lambda xs, r: sum(xs) / n),
        Case("allreduce Sum scaled",
             lambda x: rt.allreduce(x, op=rt.Sum, prescale_factor=pre,
                                    postscale_factor=post),
             lambda xs, r: post * sum(pre * v for v in xs)),
        Case("allreduce Product", lambda x: rt.allreduce(x, op=rt.Product),
             lambda xs, r: torch.stack(xs).prod(0)),
        Case("allreduce fp16 wire",
             lambda x: rt.allreduce(x, op=rt.Sum,
                                    compression=rt.Compression.fp16),
             lambda xs, r: sum(xs)),
        Case("broadcast root 0", lambda x: rt.broadcast(x, 0),
             lambda xs, r: xs[0].clone(), factor=1 / n),
        Case(f"broadcast root {n - 1}", lambda x: rt.broadcast(x, n - 1),
             lambda xs, r: xs[n - 1].clone(), factor=1 / n),
        Case("allgather", lambda x: rt.allgather(x),
             lambda xs, r: torch.cat(xs), shape=lambda r: (r + 1, 2),
             factor=1 / n),
        Case("alltoall", lambda x: rt.alltoall(x, splits[rt.rank()])[0],
             alltoall_ref, shape=lambda r: (sum(splits[r]), 2)),
        Case("reducescatter Sum", lambda x: rt.reducescatter(x, op=rt.Sum),
             reducescatter_ref(rt.Sum), shape=lambda r: (2 * n + 1, 2),
             factor=n),
        Case("reducescatter Average", lambda x: rt.reducescatter(x),
             reducescatter_ref(rt.Average), shape=lambda r: (2 * n + 1, 2),
             factor=n),
    ]


def check_case(case, n, me, failures):
    xs = [x_of(r, *case.shape(r)).requires_grad_() for r in range(n)]
    # The reference: every rank's loss summed, in one process.
    outs = [case.ref(xs, r) for r in range(n)]
    total = sum((o * w_of(r, o.shape)).sum() for r, o in enumerate(outs))
    want = torch.autograd.grad(total, xs[me], allow_unused=True)[0]
    if want is None:  # a broadcast's input off the root
        want = torch.zeros_like(xs[me])
    want = want * case.factor
    x = x_of(me, *case.shape(me)).requires_grad_()
    out = case.ours(x)
    if out.grad_fn is None:
        failures.append(f"{case.name}: the output has no grad_fn")
        return
    got_out = out.detach()
    if not torch.allclose(got_out, outs[me].detach(), rtol=1e-3):
        failures.append(f"{case.name}: forward {got_out.tolist()} "
                        f"want {outs[me].tolist()}")
    (out * w_of(me, out.shape)).sum().backward()
    if x.grad is None or not torch.allclose(x.grad, want, rtol=1e-3):
        failures.append(f"{case.name}: grad {None if x.grad is None else x.grad.tolist()} "
                        f"want {want.tolist()}")


def grouped(n, me, failures):
    xs = [[x_of(r).requires_grad_(), x_of(r, 2, 3).requires_grad_()]
          for r in range(n)]
    total = 0
    for r in range(n):
        for k in range(2):
            out = sum(xs[s][k] for s in range(n))
            total = total + (out * w_of(r + k, out.shape)).sum()
    want = torch.autograd.grad(total, xs[me])
    mine = [x_of(me).requires_grad_(), x_of(me, 2, 3).requires_grad_()]
    outs = rt.grouped_allreduce(mine, op=rt.Sum)
    loss = sum((o * w_of(me + k, o.shape)).sum() for k, o in enumerate(outs))
    loss.backward()
    for k in range(2):
        if mine[k].grad is None or not torch.allclose(mine[k].grad, want[k]):
            failures.append(f"grouped_allreduce tensor {k}: grad "
                            f"{mine[k].grad} want {want[k]}")


def refusals(failures):
    for op in (rt.Min, rt.Max):
        try:
            rt.allreduce(x_of(0).requires_grad_(), op=op)
            failures.append(f"allreduce {op.name} accepted an input that "
                            "requires a gradient")
        except RuntimeError as e:
            if "has no gradient" not in str(e):
                failures.append(f"allreduce {op.name}: unclear error {e}")
    # Without a gradient to track, Min and Max run as before.
    got = rt.allreduce(x_of(rt.rank()), op=rt.Max)
    if not torch.equal(got, x_of(rt.size() - 1)):
        failures.append(f"allreduce Max without grad: {got.tolist()}")
    with torch.no_grad():
        plain = rt.allreduce(x_of(0).requires_grad_(), op=rt.Sum)
    if plain.grad_fn is not None:
        failures.append("a collective under no_grad() recorded a grad_fn")


def grads(out):
    n, me = rt.size(), rt.rank()
    failures = []
    for case in cases(n):
        check_case(case, n, me, failures)
    grouped(n, me, failures)
    refusals(failures)
    return failures


if __name__ == "__main__":
    run_check_worker({"grads": grads})
