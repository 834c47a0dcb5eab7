"""Gradients through the collectives, with Horovod's backward rules: the
output of ``allreduce``, ``broadcast``, ``allgather``, ``alltoall``,
``reducescatter`` and the grouped forms carries a ``grad_fn`` when its
input requires a gradient. For allreduce and alltoall that is the gradient
of the sum of the ranks' losses; broadcast and allgather average where that
sum adds, and reducescatter scales by the set's size, as Horovod does:

- allreduce (Sum, Average, with pre- and postscale): the same all-reduce
  of the output's gradients; Product: the summed gradients times the
  product over this rank's input (Horovod reduces them with Product, which
  is not a gradient); Min and Max have no gradient and refuse an input
  that requires one;
- broadcast: the averaged gradients on the root, zero elsewhere;
- allgather: the averaged gradients of this rank's rows;
- alltoall: an alltoall of the gradients back along the received splits;
- reducescatter: an allgather of the parts' gradients, times the set's
  size for Sum, times the pre- and postscale factors.

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


def _summed(grad, process_set):
    return _C.allreduce(grad.contiguous(), _ReduceOp.Sum, 1.0, 1.0, "",
                        process_set)


def _averaged(grad, process_set):
    """The gradients' sum over the set divided by its size (not by the
    ranks outside a join: this is the loss's average over the set)."""
    return _summed(grad, process_set).div_(process_set.size())


class _Allreduce(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, pre, post, name, process_set):
        out = _C.allreduce(tensor, op, pre, post, name, process_set)
        ctx.op, ctx.pre, ctx.post, ctx.set = op, pre, post, process_set
        if op == _ReduceOp.Product:
            ctx.save_for_backward(tensor, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        if ctx.op == _ReduceOp.Product:
            tensor, out = ctx.saved_tensors
            g = _summed(grad, ctx.set) * out / tensor
        else:
            g = _C.allreduce(grad.contiguous(), ctx.op, ctx.pre, ctx.post, "",
                             ctx.set)
        return g, None, None, None, None, None


def allreduce(tensor, op, pre, post, name, process_set):
    if not _needs_grad(tensor):
        return _C.allreduce(tensor, op, pre, post, name, process_set)
    _refuse_no_gradient(op, "allreduce")
    return _Allreduce.apply(tensor, op, pre, post, name, process_set)


class _Broadcast(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.set = root_rank, process_set
        return _C.broadcast(tensor, root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        g = _averaged(grad, ctx.set)
        if ctx.set.rank() != ctx.root:
            g = _torch.zeros_like(g)
        return g, None, None, None


def broadcast(tensor, root_rank, name, process_set):
    if not _needs_grad(tensor):
        return _C.broadcast(tensor, root_rank, name, process_set)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Allgather(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.set = process_set
        ctx.rows = tensor.shape[0] if tensor.dim() > 0 else 1
        return _C.allgather(tensor, name, process_set, None)

    @staticmethod
    def backward(ctx, grad):
        rows = _C.allgather(_torch.tensor([ctx.rows], dtype=_torch.int64), "",
                            ctx.set, None)
        offset = int(rows[:ctx.set.rank()].sum())
        g = _averaged(grad, ctx.set).narrow(0, offset, ctx.rows)
        return g, None, None


def allgather(tensor, name, process_set, out=None):
    if out is not None or not _needs_grad(tensor):
        return _C.allgather(tensor, name, process_set, out)
    return _Allgather.apply(tensor, name, process_set)


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


class _Reducescatter(_torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, op, pre, post, name, process_set):
        ctx.scale = pre * post * (
            process_set.size() if op == _ReduceOp.Sum else 1)
        ctx.set = process_set
        return _C.reducescatter(tensor, op, pre, post, name, process_set,
                                None)

    @staticmethod
    def backward(ctx, grad):
        g = _C.allgather(grad.contiguous(), "", ctx.set, None)
        if ctx.scale != 1.0:
            g = g * ctx.scale
        return g, None, None, None, None, None


def reducescatter(tensor, op, pre, post, name, process_set, out=None):
    if out is not None or not _needs_grad(tensor):
        return _C.reducescatter(tensor, op, pre, post, name, process_set, out)
    if op not in (_ReduceOp.Sum, _ReduceOp.Average):
        raise RuntimeError(
            f"ronde: reducescatter with op {op.name} has no gradient here, "
            f"and the input requires one (rank {_C.rank()}): detach the "
            "input, or reduce with Sum or Average")
    return _Reducescatter.apply(tensor, op, pre, post, name, process_set)


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
