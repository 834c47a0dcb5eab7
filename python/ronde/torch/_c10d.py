"""ronde as a torch.distributed backend.

``import ronde.torch`` registers it as ``"ronde"``, for CPU tensors::

    import torch.distributed as dist
    import ronde.torch  # noqa: F401  (registers the backend)

    dist.init_process_group("ronde")               # CPU tensors on ronde
    dist.init_process_group("cpu:ronde,cuda:nccl")  # CUDA tensors on NCCL

Every torch.distributed call on CPU tensors, DDP, FSDP and
ZeroRedundancyOptimizer then run on ronde's collectives: shared memory
between the ranks of a host, hierarchical across hosts. The default group
is ronde's global process set (started from the group's store, rank, size
and timeout unless ``ronde.torch.init()`` came first, whose world it must
match); ``new_group`` makes a ronde process set of its members.
docs/c10d_backend.md has the whole contract.
"""
import torch.distributed as _dist

from . import _C

BACKEND_NAME = "ronde"


def _create_backend(options, backend_options=None):
    # torch's extended creator API: options is a _DistributedBackendOptions.
    return _C._c10d_backend(
        options.store,
        options.group_rank,
        options.group_size,
        options.timeout,
        [int(r) for r in (options.global_ranks_in_group or [])],
        str(options.group_id),
    )


def register_c10d_backend():
    """Registers ronde with torch.distributed as ``"ronde"`` (for CPU
    tensors). ``import ronde.torch`` already did; calling it again does
    nothing. Returns the name."""
    if not _dist.is_available():
        raise RuntimeError(
            "ronde: this torch has no torch.distributed to register with")
    if BACKEND_NAME.upper() not in _dist.Backend._plugins:
        _dist.Backend.register_backend(
            BACKEND_NAME, _create_backend, extended_api=True,
            devices=["cpu"])
    return BACKEND_NAME
