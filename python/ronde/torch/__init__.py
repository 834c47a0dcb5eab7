"""ronde for PyTorch: the C++ engine of ronde (Gloo collectives, fused
gradient buckets all-reduced during backward) driving any
``torch.optim.Optimizer``.

    import torch
    import ronde.torch as rt

    rt.init()
    model = Net()
    rt.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = rt.DistributedOptimizer(opt, named_parameters=model.named_parameters())
    rt.broadcast_optimizer_state(opt, root_rank=0)
    for x, y in my_shard_of_the_data:
        opt.zero_grad()
        loss_fn(model(x), y).backward()   # buckets all-reduce during backward
        opt.step()                        # waits, then steps on the averages

Import torch first (``import ronde.torch`` does it): LibTorch must be loaded
before libronde, which then keeps its own Gloo apart from LibTorch's.
"""
import io as _io

import torch as _torch

from . import _build_info


def _check_torch():
    # The extension links the C++ ABI of one torch release; another one's
    # LibTorch would fail to load it with a symbol error, or load it and
    # crash later. Say so before loading it.
    built = _build_info.TORCH_VERSION
    have = _torch.__version__
    if have.split("+")[0] != built.split("+")[0]:
        raise ImportError(
            f"ronde.torch was built against torch {built}, but this Python "
            f"has torch {have} ({_torch.__file__}). Install torch=="
            f"{built.split('+')[0]}, or rebuild ronde against this torch: "
            f"pip install --no-build-isolation --force-reinstall ronde "
            f"(from its source).")
    if _build_info.WITH_NCCL and _torch.version.cuda is None:
        raise ImportError(
            f"ronde.torch was built with NCCL against a CUDA build of torch "
            f"{built}, but this torch {have} has no CUDA.")


_check_torch()

from . import _C  # noqa: E402
from ._C import (  # noqa: F401,E402  (re-exported)
    CommBucket,
    CommError,
    CommHook,
    Compression,
    Decay,
    DecayShape,
    GradientReducer,
    Handle,
    InvalidArgumentError,
    LrScaling,
    ProcessSet,
    ReduceOp,
    StepProfile,
    WarmupShape,
    add_process_set,
    allreduce_hook,
    barrier,
    barrier_async,
    bf16_compress_hook,
    cross_rank,
    cross_size,
    fp16_compress_hook,
    global_process_set,
    init,
    is_initialized,
    job_id,
    local_rank,
    local_size,
    lr_scale_factor,
    host_backend,
    powersgd_hook,
    process_sets,
    rank,
    remove_process_set,
    shutdown,
    size,
    timeout_seconds,
)

__version__ = _C.version()

Sum = ReduceOp.Sum
Average = ReduceOp.Average
Min = ReduceOp.Min
Max = ReduceOp.Max
Product = ReduceOp.Product


def synchronize(handle):
    """Waits for an _async collective and returns its output (Horovod's
    ``hvd.synchronize``)."""
    return handle.result()


def poll(handle):
    """Whether an _async collective has finished."""
    return handle.done()


def _named_tensors(tensors):
    if hasattr(tensors, "items"):
        tensors = tensors.items()
    names, values = [], []
    for name, t in tensors:
        if not isinstance(t, _torch.Tensor):
            raise TypeError(
                f"ronde: '{name}' is a {type(t).__name__}, not a torch.Tensor")
        names.append(name)
        values.append(t)
    return names, values


def _set_or_global(process_set):
    return _C.global_process_set() if process_set is None else process_set


def broadcast_parameters(params, root_rank, process_set=None):
    """Copies root_rank's values into every rank's tensors, in place, fused
    into one broadcast per dtype. ``params``: ``model.state_dict()`` (buffers
    included), ``model.named_parameters()`` or any (name, tensor) pairs;
    names must agree across ranks. With ``process_set``, among its ranks
    (``root_rank`` is a global rank, as in Horovod)."""
    names, tensors = _named_tensors(params)
    ps = _set_or_global(process_set)
    with _torch.no_grad():
        _C.broadcast_parameters(
            names, tensors, _root(root_rank, ps, "broadcast_parameters"),
            process_set=ps)


def broadcast_object(obj, root_rank=0, name=None, process_set=None):
    """Returns root_rank's ``obj`` on every rank (through torch.save); with
    ``process_set``, on every rank of that set (``root_rank`` is a global
    rank, as in Horovod)."""
    name = name or "ronde.broadcast_object"
    ps = _set_or_global(process_set)
    _root(root_rank, ps, "broadcast_object")
    if _C.rank() == root_rank:
        buf = _io.BytesIO()
        _torch.save(obj, buf)
        data = _torch.frombuffer(bytearray(buf.getvalue()), dtype=_torch.uint8)
        length = _torch.tensor([data.numel()], dtype=_torch.int64)
    else:
        length = _torch.zeros(1, dtype=_torch.int64)
    length = broadcast(length, root_rank, name=name + ".size", process_set=ps)
    if _C.rank() != root_rank:
        data = _torch.empty(int(length.item()), dtype=_torch.uint8)
    data = broadcast(data, root_rank, name=name, process_set=ps)
    if _C.rank() == root_rank:
        return obj
    return _torch.load(_io.BytesIO(data.numpy().tobytes()), weights_only=False)


def broadcast_optimizer_state(optimizer, root_rank, process_set=None):
    """Makes every rank's optimizer state and param-group options (LRs
    included) root_rank's, through ``state_dict()``: works for any
    ``torch.optim.Optimizer``, wrapped or not. ``process_set`` as for
    broadcast_parameters.

    Each parameter that requires a gradient and has none is left with a
    zero ``.grad``, as Horovod leaves it. Horovod also takes a step on those
    zero gradients to create the state it then broadcasts tensor by tensor;
    ronde broadcasts ``state_dict()`` whole and takes no such step, which
    would count an Adam step (shifting its bias correction) and decay
    AdamW's weights."""
    ps = _set_or_global(process_set)
    sparse = isinstance(optimizer, _torch.optim.SparseAdam)
    for group in ([] if getattr(optimizer, "_ronde_sharded", False)
                  else optimizer.param_groups):
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                zero = _torch.zeros_like(p)
                p.grad = zero.to_sparse() if sparse else zero
    state = broadcast_object(optimizer.state_dict(), root_rank,
                             name="ronde.optimizer_state", process_set=ps)
    if _C.rank() != root_rank:
        optimizer.load_state_dict(state)


def join(device=-1, process_set=None):
    """Horovod's ``hvd.join(device=-1)``: this rank has run out of data.
    Until every rank of the set has called it, it takes part in the others'
    collectives with inputs that change nothing (zeros in their gradient
    all-reduces); returns the rank that joined last. See ``Join``.
    ``device`` is Horovod's (where its zeros live); ronde makes them where
    each collective's tensors are, and takes a ProcessSet in its place.
    The rank returned is a global rank, as in Horovod (so that it can be
    the root_rank of a broadcast)."""
    if isinstance(device, _C.ProcessSet):
        device, process_set = -1, device
    ps = _set_or_global(process_set)
    last = _C.join(process_set=ps)
    return last if ps.is_global() else ps.ranks[last]


class Join:
    """Uneven inputs, as DDP's ``Join`` context manager and Horovod's
    ``hvd.join()``: every rank runs its own number of steps inside
    ``with rt.Join():``; a rank whose loop ends waits at the exit, taking
    part meanwhile in the others' gradient all-reduces (and their other
    collectives) with inputs that change nothing, until every rank got
    there. Afterwards ``last_rank`` is the (global) rank that joined last, the
    one whose model saw every step::

        with rt.Join(opt) as j:
            for x, y in my_uneven_shard:
                ...
        rt.broadcast_parameters(model.state_dict(), root_rank=j.last_rank)

    The set joined is ``process_set``, else that of the distributed
    optimizers given (which must share one), else the whole job.
    """

    def __init__(self, *optimizers, process_set=None):
        sets = []
        for opt in optimizers:
            if not hasattr(opt, "_ronde_process_set"):
                raise TypeError("ronde: Join takes optimizers made by "
                                "rt.DistributedOptimizer, got "
                                f"{type(opt).__name__}")
            if opt._ronde_process_set not in sets:
                sets.append(opt._ronde_process_set)
        if process_set is None and len(sets) > 1:
            raise ValueError("ronde: Join: these optimizers average over "
                             f"different process sets ({sets}); pass "
                             "process_set=")
        if process_set is None and sets:
            process_set = sets[0]
        self.process_set = process_set
        self.last_rank = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.last_rank = join(_set_or_global(self.process_set))
        return False


from ._optimizer import (  # noqa: E402,F401
    DistributedOptimizer,
    GradScaler,
    WarmupScheduler,
)
from ._zero import (  # noqa: E402,F401
    ZeroRedundancyOptimizer,
    clip_grad_norm_,
)
# Horovod's spellings (average=, compression=, tensor splits, grouped and
# object collectives, capability queries) over the calls above.
from ._horovod import (  # noqa: E402,F401
    Adasum,
    HorovodInternalError,
    allgather,
    allgather_async,
    allgather_object,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    ccl_built,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_reducescatter,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    reducescatter,
    reducescatter_async,
    rocm_built,
    sparse_allreduce_async,
)
from ._horovod import _root  # noqa: E402
from ._sync_batch_norm import SyncBatchNorm  # noqa: E402,F401
from . import elastic  # noqa: E402,F401  (hvd.elastic.run, TorchState, ...)

# torch.distributed's "ronde" backend (docs/c10d_backend.md), registered on
# import so that init_process_group("ronde") works after `import ronde.torch`.
if _torch.distributed.is_available():
    from ._c10d import register_c10d_backend  # noqa: E402,F401
    register_c10d_backend()
