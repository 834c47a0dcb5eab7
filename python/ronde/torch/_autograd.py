"""Gradients through the collectives that Python adds to the C++ ones.

The blocking collectives of the extension (``_C.allreduce``,
``broadcast``, ``allgather``, ``reducescatter``) are differentiable in
C++ (plugin/src/comm/autograd.cpp), with Horovod's backward rules, and
refuse an input that requires a gradient where an op has none. Here:

- alltoall: ``ronde.torch.alltoall`` needs the splits received, which only
  the asynchronous form's handle gives, and that form records no
  gradient; this node applies the C++ rule (an alltoall of the gradients
  back along the received splits);
- grouped_allreduce: one node for the list, whose backward is the same
  grouped all-reduce of the gradients (Sum and Average).

The asynchronous and in-place forms stay outside autograd, as in Horovod.
"""
import torch as _torch

from . import _C

_ReduceOp = _C.ReduceOp


def _needs_grad(*tensors):
    return _torch.is_grad_enabled() and any(
        isinstance(t, _torch.Tensor) and t.requires_grad for t in tensors)


def _refuse_no_gradient(op, caller):
    if op in (_ReduceOp.Min, _ReduceOp.Max):
        raise RuntimeError(
            f"ronde: {caller} with op {op.name} has no gradient, and the "
            f"input requires one (rank {_C.rank()}): detach the input, or "
            "reduce with Sum or Average")


class _Alltoall(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set, received):
        handle = _C.alltoall_async(tensor, splits, name, process_set, None)
        out = handle.result()
        ctx.set = process_set
        ctx.received = list(handle.received_splits())
        received.extend(ctx.received)
        return out

    @staticmethod
    def backward(ctx, grad):
        g = _C.alltoall(grad.contiguous(), ctx.received, "", ctx.set, None)
        return g, None, None, None, None


def alltoall(tensor, splits, name, process_set, out=None):
    """The rows received, and how many came from each rank."""
    if out is not None or not _needs_grad(tensor):
        handle = _C.alltoall_async(tensor, splits, name, process_set, out)
        got = handle.result()
        return (got if out is None else out), list(handle.received_splits())
    received = []
    got = _Alltoall.apply(tensor, splits, name, process_set, received)
    return got, received


class _Grouped(_torch.autograd.Function):
    """The grouped all-reduce as one node: ``reduce(list) -> list``."""

    @staticmethod
    def forward(ctx, reduce, op, pre, post, name, process_set, *tensors):
        ctx.reduce, ctx.op, ctx.pre, ctx.post, ctx.set = (
            reduce, op, pre, post, process_set)
        return tuple(reduce(list(tensors), op, name, pre, post, process_set))

    @staticmethod
    def backward(ctx, *grads):
        got = ctx.reduce([g.contiguous() for g in grads], ctx.op, None,
                         ctx.pre, ctx.post, ctx.set)
        return (None, None, None, None, None, None, *got)


def grouped(reduce, tensors, op, name, pre, post, process_set):
    """``reduce(tensors, op, name, pre, post, set)``, differentiable when a
    tensor requires a gradient (Sum and Average only)."""
    if not _needs_grad(*tensors):
        return reduce(tensors, op, name, pre, post, process_set)
    _refuse_no_gradient(op, "grouped_allreduce")
    if op == _ReduceOp.Product:
        raise RuntimeError(
            "ronde: grouped_allreduce with op Product has no gradient here, "
            f"and an input requires one (rank {_C.rank()}): use allreduce")
    return list(_Grouped.apply(reduce, op, pre, post, name, process_set,
                               *tensors))
