"""Horovod's arithmetic and numbering over ronde's collectives, for the
Horovod spellings in _horovod.py: Average as a sum divided by the size,
integer tensors scaled in float64 and truncated, global root ranks on
process sets, Adasum's refusal, and handles that finish a result in
Python."""
from . import _C

_ReduceOp = _C.ReduceOp


class _AdasumOp:
    """Horovod's ``hvd.Adasum``: ronde does not implement Adasum (Horovod
    runs it on MPI); a collective or optimizer given it says so."""

    def __repr__(self):
        return "Adasum"


Adasum = _AdasumOp()


def _refuse_adasum(op, caller):
    if isinstance(op, _AdasumOp):
        raise NotImplementedError(
            f"ronde: {caller}: op=Adasum is not implemented (Horovod runs "
            "it over MPI only); use op=Average")


def _is_integer(tensor):
    return not (tensor.is_floating_point() or tensor.is_complex())


def _scaled(tensor, factor, divisor=1):
    """An integer ``tensor * factor / divisor`` as Horovod scales it: in
    float64, truncated back once (with a divisor alone, C's integer
    division)."""
    if factor == 1.0 and divisor == 1:
        return tensor
    return (tensor.double() * factor / divisor).to(tensor.dtype)


def _horovod_scaling(tensor, op, pre, post, process_set, caller):
    """Horovod's arithmetic over ronde's collectives: Average is the sum
    over the set divided by its size (in a join too, where ronde's C++
    Average divides by the ranks that contributed), and an integer tensor
    is scaled in float64 and truncated, before (prescale) and after
    (postscale) the sum. Returns (tensor to send, op, pre, post, finish):
    ``finish(result)``, where not None, completes the result (a new
    tensor: autograd follows the division)."""
    _refuse_adasum(op, caller)
    n = 1
    if op == _ReduceOp.Average:
        op, n = _ReduceOp.Sum, process_set.size()
    integer = _is_integer(tensor) and op == _ReduceOp.Sum
    if integer and (pre != 1.0 or post != 1.0 or n != 1):
        return (_scaled(tensor, pre), op, 1.0, 1.0,
                lambda out: _scaled(out, post, n))
    if n != 1:
        return tensor, op, pre, post, lambda out: out / n
    return tensor, op, pre, post, None


class _Finished:
    """A handle whose result is completed in Python when it is taken
    (integer scaling, a copy into the caller's tensor)."""

    def __init__(self, handle, finish, *others):
        self._handle, self._finish, self._out = handle, finish, None
        self._others = others

    def done(self):
        return self._handle.done() and all(h.done() for h in self._others)

    def wait(self, timeout=None):
        return self._handle.wait(timeout)

    def result(self):
        if self._out is None:
            self._out = self._finish(self._handle.result())
        return self._out

    # Horovod's sparse_allreduce_async returns a function to call.
    __call__ = result


def _root(root_rank, process_set, caller):
    """Horovod's root_rank is a global rank, on a process set too; ronde's
    C++ API numbers it within the set. Returns the set's number of it."""
    if process_set.is_global():
        return root_rank
    ranks = process_set.ranks
    if root_rank not in ranks:
        raise ValueError(
            f"ronde: {caller} on rank {_C.rank()}: root_rank {root_rank} is "
            f"not in the process set {list(ranks)} (root_rank is a global "
            "rank, as in Horovod)")
    return ranks.index(root_rank)
