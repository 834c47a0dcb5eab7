"""Sharded optimizer state (ZeRO stages 1 and 2) for torch.optim, over the
C++ engine's shards (docs/sharding.md): the optimizer's param groups hold
flat views of this rank's pieces of the parameters; state_dict() is the
unsharded format, consolidated on one rank; load_state_dict() slices it.
Also clip_grad_norm_ and ZeroRedundancyOptimizer (PyTorch's signature)."""
import io

import torch

from . import _C

# Optimizers whose update of an element reads only that element's gradient,
# parameter and state. A user optimizer declares itself with a class
# attribute ``ronde_elementwise = True``.
ELEMENTWISE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW,
               torch.optim.RMSprop, torch.optim.Adagrad)


def check_elementwise(optimizer):
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError(
            f"ronde: shard_optimizer_state cannot shard LBFGS on rank "
            f"{_C.rank()}: its line search and history need whole "
            "parameter vectors")
    if not (isinstance(optimizer, ELEMENTWISE)
            or getattr(optimizer, "ronde_elementwise", False)):
        raise ValueError(
            "ronde: shard_optimizer_state needs an element-wise optimizer "
            "(SGD, Adam, AdamW, RMSprop, Adagrad, or one whose class sets "
            f"ronde_elementwise = True); {type(optimizer).__name__} is not "
            f"known to be one (rank {_C.rank()})")


def setup(optimizer):
    """Remembers the full groups and points the groups at the shards;
    state the optimizer already has is sliced like a saved one."""
    optimizer._ronde_full_groups = [list(g["params"])
                                    for g in optimizer.param_groups]
    optimizer._ronde_consolidated = None
    existing = None
    if len(optimizer.state):
        existing = _full_from_unsharded(optimizer)
    optimizer._ronde_reducer.shards_changed()
    _point_groups_at_shards(optimizer)
    optimizer.state.clear()
    if existing is not None:
        _load_slices(optimizer, existing)


def _point_groups_at_shards(optimizer):
    where = {}
    for g, group in enumerate(optimizer._ronde_full_groups):
        for j, p in enumerate(group):
            where[id(p)] = (g, j)
    lists = [[] for _ in optimizer._ronde_full_groups]
    spots = [[] for _ in optimizer._ronde_full_groups]
    for param, offset, numel, shard in optimizer._ronde_reducer.shards():
        g, j = where[id(param)]
        lists[g].append(shard)
        spots[g].append((g, j, offset, numel))
    for group, shards in zip(optimizer.param_groups, lists):
        group["params"] = shards
    optimizer._ronde_spots = spots


def _blob(optimizer):
    """This rank's shards' state with where each shard sits, as bytes."""
    states = []
    for group in optimizer.param_groups:
        for shard in group["params"]:
            states.append({k: v for k, v in optimizer.state.get(
                shard, {}).items()})
    buf = io.BytesIO()
    torch.save({"spots": [s for g in optimizer._ronde_spots for s in g],
                "states": states}, buf)
    return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)


def _exchange(optimizer, root):
    """Every rank's blob (root None) or root's only (the others get [])."""
    ps = optimizer._ronde_process_set
    mine = _blob(optimizer)
    sizes = _C.allgather(torch.tensor([mine.numel()]),
                         name="ronde.shard.state_sizes", process_set=ps)
    if root is None:
        all_ = _C.allgather(mine, name="ronde.shard.state", process_set=ps)
    else:
        splits = [0] * ps.size()
        splits[root] = mine.numel()
        all_ = _C.alltoall(mine, splits=splits, name="ronde.shard.state",
                           process_set=ps)
        if ps.rank() != root:
            return []
    blobs, at = [], 0
    for n in sizes.tolist():
        blobs.append(torch.load(io.BytesIO(all_[at:at + n].numpy().tobytes()),
                                weights_only=False))
        at += n
    return blobs


def _assemble(optimizer, blobs):
    """[group][index] -> state dict of the full parameter."""
    groups = optimizer._ronde_full_groups
    pieces = [[{} for _ in g] for g in groups]
    values = [[{} for _ in g] for g in groups]
    for blob in blobs:
        for (g, j, offset, numel), state in zip(blob["spots"],
                                                blob["states"]):
            for name, v in state.items():
                if (torch.is_tensor(v) and v.dim() == 1
                        and v.numel() == numel):
                    pieces[g][j].setdefault(name, []).append((offset, v))
                    continue
                seen = values[g][j].get(name)
                if seen is not None and not _same(seen, v):
                    raise RuntimeError(
                        f"ronde: the state '{name}' differs between the "
                        f"shards of group {g}, parameter {j}: the optimizer "
                        "is not element-wise")
                values[g][j][name] = v
    full = []
    for g, group in enumerate(groups):
        full.append([])
        for j, param in enumerate(group):
            state = dict(values[g][j])
            for name, parts in pieces[g][j].items():
                parts.sort(key=lambda x: x[0])
                at = 0
                for offset, t in parts:
                    if offset != at:
                        raise RuntimeError(
                            f"ronde: the shards of group {g}, parameter {j} "
                            f"do not cover it for the state '{name}'")
                    at += t.numel()
                if at != param.numel():
                    raise RuntimeError(
                        f"ronde: the shards of group {g}, parameter {j} hold "
                        f"{at} of its {param.numel()} elements for '{name}'")
                state[name] = torch.cat([t for _, t in parts]).view(
                    param.shape)
            full[-1].append(state)
    return full


def _same(a, b):
    if torch.is_tensor(a) and torch.is_tensor(b):
        return torch.equal(a, b)
    return a == b


def _full_from_unsharded(optimizer):
    """The optimizer's own state of the full parameters, as _assemble's."""
    return [[dict(optimizer.state.get(p, {})) for p in group]
            for group in optimizer._ronde_full_groups]


def _load_slices(optimizer, full, saved_groups=None):
    optimizer.state.clear()
    for g, group in enumerate(optimizer.param_groups):
        if saved_groups is not None:
            for k, v in saved_groups[g].items():
                if k not in ("params", "ronde_base_lr"):
                    group[k] = v
        for shard, (gg, j, offset, numel) in zip(group["params"],
                                                 optimizer._ronde_spots[g]):
            src = full[gg][j]
            if not src:
                continue
            param = optimizer._ronde_full_groups[gg][j]
            state = {}
            for name, v in src.items():
                if torch.is_tensor(v) and v.shape == param.shape:
                    v = v.reshape(-1)[offset:offset + numel].clone().to(
                        shard.dtype if v.is_floating_point() else v.dtype)
                elif torch.is_tensor(v):
                    v = v.clone()
                state[name] = v
            optimizer.state[shard] = state


def follow_shards(optimizer):
    """After the buckets were laid out again: the state into new shards."""
    if not optimizer._ronde_reducer.shards_changed():
        return
    full = _assemble(optimizer, _exchange(optimizer, None))
    _point_groups_at_shards(optimizer)
    _load_slices(optimizer, full)


def consolidate_state_dict(optimizer, to=0):
    blobs = _exchange(optimizer, to)
    optimizer._ronde_consolidated = (_assemble(optimizer, blobs)
                                     if blobs else None)


def state_dict(optimizer):
    """The unsharded format: state by full parameter index, each group's
    options and its parameters' indices, as torch.optim writes it."""
    full = optimizer._ronde_consolidated
    if full is None:
        if optimizer._ronde_process_set.size() > 1:
            raise RuntimeError(
                "ronde: state_dict() of a sharded optimizer on rank "
                f"{_C.rank()} needs consolidate_state_dict(to="
                f"{optimizer._ronde_process_set.rank()}) on every rank "
                "first")
        full = _assemble(optimizer, [torch.load(
            io.BytesIO(_blob(optimizer).numpy().tobytes()),
            weights_only=False)])
    state, groups, index = {}, [], 0
    for g, group in enumerate(optimizer.param_groups):
        ids = []
        for j in range(len(optimizer._ronde_full_groups[g])):
            if full[g][j]:
                state[index] = full[g][j]
            ids.append(index)
            index += 1
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": ids})
    return {"state": state, "param_groups": groups}


def load_state_dict(optimizer, sd):
    groups = sd["param_groups"]
    if len(groups) != len(optimizer._ronde_full_groups):
        raise ValueError(
            f"ronde: the saved state has {len(groups)} param groups, this "
            f"optimizer {len(optimizer._ronde_full_groups)}")
    full = []
    for g, saved in enumerate(groups):
        if len(saved["params"]) != len(optimizer._ronde_full_groups[g]):
            raise ValueError(
                f"ronde: param group {g} of the saved state has "
                f"{len(saved['params'])} parameters, this optimizer's "
                f"{len(optimizer._ronde_full_groups[g])}")
        full.append([dict(sd["state"].get(i, sd["state"].get(str(i), {})))
                     for i in saved["params"]])
    _load_slices(optimizer, full, groups)


def zero_full_grads(optimizer, set_to_none):
    for group in optimizer._ronde_full_groups:
        for p in group:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                p.grad.zero_()


def clip_grad_norm_(optimizer, max_norm, norm_type=2.0):
    """torch.nn.utils.clip_grad_norm_ for a DistributedOptimizer's averaged
    gradients, sharded or not: the global norm comes from the engine
    (summed over the ranks' pieces, alike sharded or not), then every
    gradient the optimizer steps on is scaled. Returns the norm."""
    norm = optimizer._ronde_reducer.gradient_norm(float(norm_type))
    coef = float(max_norm) / (norm + 1e-6)
    if coef < 1:
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]
                 if p.grad is not None]
        if grads:
            torch._foreach_mul_(grads, coef)
    return torch.tensor(norm)


def ZeroRedundancyOptimizer(params, optimizer_class, process_group=None,
                            parameters_as_bucket_view=False,
                            overlap_with_ddp=False, **defaults):
    """torch.distributed.optim.ZeroRedundancyOptimizer's signature on
    ronde: ``optimizer_class(params, **defaults)`` wrapped in a
    DistributedOptimizer that shards its state (stage 1). ronde's engine
    averages the gradients itself; under DDP they are averaged a second
    time (the same values, but the extra communication can be saved by
    dropping DDP). The gradients are copied into ronde's buckets rather
    than viewed there (``gradient_as_bucket_view=False``): DDP writes its
    averages into ``.grad`` at the end of backward, which would otherwise
    land in buckets that ronde's reduce-scatter is still reading. ``process_group``: None (the whole job) or a
    ronde ProcessSet; ``parameters_as_bucket_view`` and
    ``overlap_with_ddp`` are accepted and ignored (ronde's buckets are
    its own, and its reduce-scatter already overlaps backward)."""
    from ._optimizer import DistributedOptimizer
    if not _C.is_initialized():
        _C.init()
    process_set = process_group
    if process_set is not None and not isinstance(process_set,
                                                  _C.ProcessSet):
        import torch.distributed as dist
        if process_group is not dist.group.WORLD:
            raise ValueError(
                "ronde: ZeroRedundancyOptimizer takes None, the default "
                "group or a ronde ProcessSet as process_group")
        process_set = None
    optimizer = optimizer_class(params, **defaults)
    return DistributedOptimizer(optimizer, shard_optimizer_state=True,
                                process_set=process_set,
                                gradient_as_bucket_view=False)
