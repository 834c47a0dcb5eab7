"""Horovod's spellings, where they mean what ronde's calls do, so that a
script written for ``horovod.torch`` runs with ``import ronde.torch as hvd``:
``average=`` beside ``op=``, ``compression=`` on the collectives, alltoall
splits as a tensor, ``grouped_allreduce``, ``allgather_object`` and the
capability queries. README.md ("Coming from Horovod") lists what differs.
"""
import functools as _functools
import io as _io
import warnings as _warnings

import torch as _torch

from . import _C
from . import _autograd
from ._horovod_arithmetic import (  # noqa: F401  (Adasum, _root re-exported)
    Adasum,
    _Finished,
    _horovod_scaling,
    _refuse_adasum,
    _root,
)

_ReduceOp = _C.ReduceOp


def _resolve_op(average, op, caller):
    """Horovod's rule: ``average`` is the deprecated spelling of ``op``;
    both at once is an error; neither is Average."""
    if isinstance(average, _ReduceOp):  # ronde's positional op
        if op is not None:
            raise ValueError(f"ronde: {caller}: op given twice")
        return average
    if average is not None:
        if op is not None:
            raise ValueError(
                f"ronde: {caller}: average= and op= are exclusive "
                "(average is the deprecated spelling of op)")
        _warnings.warn(
            f"{caller}: average= is deprecated, use op=Average or op=Sum "
            "as in Horovod", DeprecationWarning, stacklevel=3)
        return _ReduceOp.Average if average else _ReduceOp.Sum
    return _ReduceOp.Average if op is None else op


class _Wire:
    """Horovod's ``compression=`` on a collective: the tensor travels as
    float16 or bfloat16 and comes back in its own dtype."""

    def __init__(self, compression, tensor):
        self.dtype = tensor.dtype
        self.to = None
        if compression is not None and tensor.is_floating_point():
            if compression == _C.Compression.fp16:
                self.to = _torch.float16
            elif compression == _C.Compression.bf16:
                self.to = _torch.bfloat16
        if self.to == self.dtype:
            self.to = None

    def down(self, t):
        return t if self.to is None else t.to(self.to)

    def up(self, t):
        return t if self.to is None else t.to(self.dtype)


def _set(process_set):
    return _C.global_process_set() if process_set is None else process_set


def allreduce(tensor, average=None, name=None, compression=None, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """The reduction over ranks (Average unless ``op`` says otherwise), as a
    new tensor. Horovod's arguments: ``average`` (deprecated), ``op``,
    ``compression`` (``Compression.fp16``/``bf16``: sent as that type),
    ``prescale_factor``, ``postscale_factor``, ``process_set``."""
    op = _resolve_op(average, op, "allreduce")
    ps = _set(process_set)
    wire = _Wire(compression, tensor)
    sent, op, pre, post, finish = _horovod_scaling(
        wire.down(tensor), op, prescale_factor, postscale_factor, ps,
        "allreduce")
    # Differentiable in C++ when the input requires a gradient.
    out = _C.allreduce(sent, op, pre, post, name or "", ps)
    return wire.up(out if finish is None else finish(out))


def _completion(finish, into):
    """``finish`` (see _horovod_scaling) then, with ``into``, a copy into
    that tensor (the caller's, in place or ``out=``), which it returns."""

    def complete(got):
        got = finish(got)
        if into is None:
            return got
        into.copy_(got)
        return into

    return complete


def _with_op(fn, caller, doc, in_place, asynchronous):
    """A binding taking (tensor, op, prescale, postscale, name, set) with
    Horovod's keywords and arithmetic (see _horovod_scaling)."""

    def call(tensor, average=None, name=None, op=None, prescale_factor=1.0,
             postscale_factor=1.0, process_set=None):
        ps = _set(process_set)
        sent, op2, pre, post, finish = _horovod_scaling(
            tensor, _resolve_op(average, op, caller), prescale_factor,
            postscale_factor, ps, caller)
        got = fn(sent, op2, pre, post, name or "", ps)
        if finish is None:
            return got
        complete = _completion(finish, tensor if in_place else None)
        return _Finished(got, complete) if asynchronous else complete(got)

    call.__name__ = call.__qualname__ = caller
    call.__doc__ = doc
    return call


allreduce_ = _with_op(_C.allreduce_, "allreduce_",
                      "allreduce in place; returns ``tensor``.", True, False)
# The handles of this process's asynchronous collectives by name, while
# they run: Horovod refuses a second one of a name still in flight
# (ValueError), since its names key the ranks' negotiation.
_in_flight = {}


def _unique_name(fn, at):
    """``fn`` (an _async collective whose name is argument ``at`` or the
    keyword ``name``) refusing a name that one of this process's
    collectives still in flight has."""

    @_functools.wraps(fn)
    def call(*args, **kwargs):
        name = kwargs.get("name", args[at] if len(args) > at else None)
        if name:
            for done in [k for k, h in _in_flight.items() if h.done()]:
                del _in_flight[done]
            if name in _in_flight:
                raise ValueError(
                    f"ronde: {fn.__name__} on rank {_C.rank()}: a collective "
                    f"named {name!r} is still in flight; names of in-flight "
                    "collectives must be unique (as in Horovod)")
        handle = fn(*args, **kwargs)
        if name:
            _in_flight[name] = handle
        return handle

    return call


allreduce_async = _with_op(_C.allreduce_async, "allreduce_async",
                           "allreduce, returning a handle.", False, True)
allreduce_async_ = _with_op(_C.allreduce_async_, "allreduce_async_",
                            "allreduce in place, returning a handle.", True,
                            True)
allreduce_async = _unique_name(allreduce_async, 2)
allreduce_async_ = _unique_name(allreduce_async_, 2)


def _none_means_default(fn):
    """Horovod's scripts pass ``name=None`` and ``process_set=None`` for
    "none given": the bindings want a string and a set."""

    @_functools.wraps(fn)
    def call(*args, **kwargs):
        if kwargs.get("name", "") is None:
            kwargs["name"] = ""
        if "process_set" in kwargs and kwargs["process_set"] is None:
            del kwargs["process_set"]
        return fn(*args, **kwargs)

    return call


def allgather(tensor, name=None, process_set=None, out=None):
    """Every rank's rows, concatenated in rank order (differentiable)."""
    return _C.allgather(tensor, name or "", _set(process_set), out)


def _broadcast_form(fn, caller, doc):
    """A broadcast binding with Horovod's ``name=None``, ``process_set=None``
    and global ``root_rank``."""

    def call(tensor, root_rank, name=None, process_set=None):
        ps = _set(process_set)
        return fn(tensor, _root(root_rank, ps, caller), name or "", ps)

    call.__name__ = call.__qualname__ = caller
    call.__doc__ = doc
    return call


def reducescatter(tensor, op=_ReduceOp.Average, prescale_factor=1.0,
                  postscale_factor=1.0, name=None, process_set=None,
                  out=None):
    """The reduction's part of this rank (differentiable for Sum and
    Average)."""
    ps = _set(process_set)
    sent, op, pre, post, finish = _horovod_scaling(
        tensor, op, prescale_factor, postscale_factor, ps, "reducescatter")
    if finish is None:
        return _C.reducescatter(sent, op, pre, post, name or "", ps, out)
    return _completion(finish, out)(
        _C.reducescatter(sent, op, pre, post, name or "", ps, None))


allgather_async = _unique_name(_none_means_default(_C.allgather_async), 1)
broadcast = _broadcast_form(
    _C.broadcast, "broadcast",
    "``root_rank``'s tensor, as a new tensor (differentiable); "
    "``root_rank`` is a global rank, on a process set too.")
broadcast_ = _broadcast_form(_C.broadcast_, "broadcast_",
                             "broadcast in place; returns ``tensor``.")
broadcast_async = _unique_name(_broadcast_form(
    _C.broadcast_async, "broadcast_async",
    "broadcast, returning a handle."), 2)
broadcast_async_ = _unique_name(_broadcast_form(
    _C.broadcast_async_, "broadcast_async_",
    "broadcast in place, returning a handle."), 2)


@_functools.partial(_unique_name, at=4)
def reducescatter_async(tensor, op=_ReduceOp.Average, prescale_factor=1.0,
                        postscale_factor=1.0, name=None, process_set=None,
                        out=None):
    """reducescatter, returning a handle."""
    ps = _set(process_set)
    sent, op, pre, post, finish = _horovod_scaling(
        tensor, op, prescale_factor, postscale_factor, ps,
        "reducescatter_async")
    if finish is None:
        return _C.reducescatter_async(sent, op, pre, post, name or "", ps,
                                      out)
    return _Finished(_C.reducescatter_async(sent, op, pre, post, name or "",
                                            ps, None),
                     _completion(finish, out))


class _SplitsError(TypeError, ValueError):
    """Bad alltoall splits: a TypeError, as before, and the ValueError
    Horovod raises."""


def _splits(splits):
    if splits is None:
        return None
    if isinstance(splits, _torch.Tensor):
        if splits.dim() != 1 or splits.is_floating_point():
            raise _SplitsError("ronde: alltoall: splits must be a 1-d integer "
                               f"tensor, got {splits.dtype} of shape "
                               f"{tuple(splits.shape)}")
        return [int(s) for s in splits.tolist()]
    try:
        return [int(s) for s in splits]
    except (TypeError, ValueError) as e:
        raise _SplitsError(f"ronde: alltoall: splits must be integers: {e}") \
            from None


def alltoall(tensor, splits=None, name=None, process_set=None, out=None):
    """Rows ``splits[r]`` go to rank ``r`` (a list or a 1-d integer tensor,
    as in Horovod; equal parts when omitted). Returns the rows received;
    as in Horovod, with ``splits`` given, ``(rows, received_splits)``:
    how many rows came from each rank, a tensor of the splits' integer
    type (int32 for a list). With ``out``, what comes is written there (it
    must hold exactly the rows received) and ``out`` stands for the rows."""
    got, received = _autograd.alltoall(tensor, _splits(splits), name or "",
                                       _set(process_set), out)
    if splits is None:
        return got
    dtype = (splits.dtype if isinstance(splits, _torch.Tensor)
             else _torch.int32)
    return got, _torch.tensor(received, dtype=dtype)


@_functools.partial(_unique_name, at=2)
def alltoall_async(tensor, splits=None, name=None, process_set=None,
                   out=None):
    return _C.alltoall_async(tensor, _splits(splits), name or "",
                             _set(process_set), out)


def _grouped(tensors, op, name, prescale, postscale, process_set, out):
    """One all-reduce per dtype (and device) for the whole list: the
    tensors are packed into one flat buffer, reduced, and unpacked into
    ``out`` (the inputs themselves for the in-place form)."""
    tensors = list(tensors)
    if not tensors:
        return []
    groups = {}
    for i, t in enumerate(tensors):
        if not isinstance(t, _torch.Tensor):
            raise TypeError(f"ronde: grouped_allreduce: item {i} is a "
                            f"{type(t).__name__}, not a torch.Tensor")
        groups.setdefault((t.dtype, t.device), []).append(i)
    results = [None] * len(tensors)
    # In order of each group's first tensor (dicts keep insertion order).
    for g, idx in enumerate(groups.values()):
        flat = _torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        label = (name or "grouped_allreduce") + (f".{g}" if g else "")
        flat, op2, pre, post, finish = _horovod_scaling(
            flat, op, prescale, postscale, process_set, "grouped_allreduce")
        _C.allreduce_(flat, op2, pre, post, label, process_set)
        if finish is not None:
            flat = finish(flat)
        at = 0
        for i in idx:
            n = tensors[i].numel()
            piece = flat[at:at + n].view(tensors[i].shape)
            at += n
            if out is None:
                results[i] = piece.clone()
            else:
                with _torch.no_grad():
                    out[i].copy_(piece)
                results[i] = out[i]
    return results


def grouped_allreduce(tensors, average=None, name=None, compression=None,
                      op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=None):
    """allreduce of every tensor of a list in one fused collective per
    dtype; returns new tensors, in order."""
    op = _resolve_op(average, op, "grouped_allreduce")
    tensors = list(tensors)
    wires = [_Wire(compression, t) for t in tensors]
    sent = [w.down(t) for w, t in zip(wires, tensors)]
    got = _autograd.grouped(_grouped_new, sent, op, name, prescale_factor,
                            postscale_factor, _set(process_set))
    return [w.up(t) for w, t in zip(wires, got)]


def _grouped_new(tensors, op, name, prescale, postscale, process_set):
    return _grouped(tensors, op, name, prescale, postscale, process_set, None)


def grouped_allreduce_(tensors, average=None, name=None, op=None,
                       prescale_factor=1.0, postscale_factor=1.0,
                       process_set=None):
    """grouped_allreduce in place; returns the tensors."""
    op = _resolve_op(average, op, "grouped_allreduce_")
    tensors = list(tensors)
    return _grouped(tensors, op, name, prescale_factor, postscale_factor,
                    _set(process_set), tensors)


def allgather_object(obj, name=None, process_set=None):
    """Every rank's ``obj`` (any object torch.save takes), as a list in rank
    order (Horovod's ``hvd.allgather_object``)."""
    ps = _set(process_set)
    label = name or "ronde.allgather_object"
    buf = _io.BytesIO()
    _torch.save(obj, buf)
    data = _torch.frombuffer(bytearray(buf.getvalue()), dtype=_torch.uint8)
    sizes = _C.allgather(_torch.tensor([data.numel()], dtype=_torch.int64),
                         label + ".sizes", ps)
    gathered = _C.allgather(data, label, ps)
    out, at = [], 0
    for n in sizes.tolist():
        piece = gathered[at:at + n].numpy().tobytes()
        at += n
        out.append(_torch.load(_io.BytesIO(piece), weights_only=False))
    return out


def mpi_threads_supported():
    """False: ronde does not use MPI (Gloo, shared memory and NCCL)."""
    return False


def mpi_enabled():
    return False


def mpi_built():
    return False


def gloo_enabled():
    """True: Gloo serves the CPU between hosts (shared memory within one)."""
    return True


def gloo_built():
    return True


def nccl_built():
    """Whether this build has NCCL for CUDA tensors."""
    return _C.nccl_built()


def cuda_built():
    """Whether CUDA tensors can be reduced: LibTorch has CUDA (NCCL, or
    Gloo through host copies)."""
    return _torch.backends.cuda.is_built()


def rocm_built():
    return False


def ddl_built():
    return False


def ccl_built():
    return False


# Horovod raises HorovodInternalError where a collective fails; ronde raises
# CommError there (with the operation, the suspects and the backend's
# message): the same class under Horovod's name, so that `except
# hvd.HorovodInternalError` catches ronde's failures.
HorovodInternalError = _C.CommError


def _compress(self, tensor):
    """Horovod's ``Compression.X.compress``: ``(tensor on the wire, ctx)``;
    floating tensors go as float16 (fp16) or bfloat16 (bf16), others as
    they are."""
    to = {_C.Compression.fp16: _torch.float16,
          _C.Compression.bf16: _torch.bfloat16}.get(self)
    if to is None or not tensor.is_floating_point():
        return tensor, None
    return tensor.to(to), tensor.dtype


def _decompress(self, tensor, ctx):
    """Horovod's ``Compression.X.decompress``: back to the dtype ``ctx``
    (what ``compress`` returned) names."""
    return tensor if ctx is None else tensor.to(ctx)


# ronde's Compression is an enum of its C++ API; Horovod's members are
# classes with these two methods, which scripts (and Horovod's own tests)
# call directly.
_C.Compression.compress = _compress
_C.Compression.decompress = _decompress


def grouped_allgather(tensors, name=None, process_set=None):
    """allgather of every tensor of a list (one collective each); returns
    the gathered tensors, in order (differentiable, as allgather)."""
    return [allgather(t, name=f"{name}.{i}" if name else None,
                      process_set=process_set)
            for i, t in enumerate(tensors)]


def grouped_reducescatter(tensors, name=None, compression=None, op=None,
                          process_set=None, prescale_factor=1.0,
                          postscale_factor=1.0):
    """reducescatter of every tensor of a list (one collective each, Average
    unless ``op`` says otherwise); returns this rank's parts, in order."""
    op = _ReduceOp.Average if op is None else op
    out = []
    for i, t in enumerate(tensors):
        wire = _Wire(compression, t)
        part = reducescatter(wire.down(t), op, prescale_factor,
                             postscale_factor,
                             f"{name}.{i}" if name else None, process_set)
        out.append(wire.up(part))
    return out


def sparse_allreduce_async(tensor, name=None, op=None, process_set=None):
    """Horovod's all-reduce of a sparse COO tensor: every rank's indices and
    values are all-gathered (two collectives), and ``synchronize(handle)``
    returns their sum (Average: divided by the set's size) as a coalesced
    sparse tensor of ``tensor``'s shape."""
    op = _ReduceOp.Average if op is None else op
    _refuse_adasum(op, "sparse_allreduce_async")
    if op not in (_ReduceOp.Sum, _ReduceOp.Average):
        raise ValueError(f"ronde: sparse_allreduce_async: op {op.name} is "
                         "not supported (Sum or Average)")
    if not tensor.is_sparse:
        raise ValueError("ronde: sparse_allreduce_async needs a sparse COO "
                         f"tensor, got layout {tensor.layout}")
    ps = _set(process_set)
    t = tensor.coalesce()
    values = allgather_async(t.values().contiguous(),
                             name=f"{name}.values" if name else None,
                             process_set=ps)
    indices = allgather_async(t.indices().t().contiguous(),
                              name=f"{name}.indices" if name else None,
                              process_set=ps)

    def complete(gathered):
        if op == _ReduceOp.Average:
            gathered = gathered / ps.size()
        return _torch.sparse_coo_tensor(indices.result().t(), gathered,
                                        t.size()).coalesce()

    return _Finished(values, complete, indices)
