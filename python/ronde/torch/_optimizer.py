"""DistributedOptimizer, GradScaler and WarmupScheduler for torch.optim."""
import contextlib
import warnings

import torch

from . import _C
from . import _zero


class _DistributedOptimizer:
    """Mixed into the wrapped optimizer's class (see DistributedOptimizer):
    ronde's C++ engine averages the gradients, the Python optimizer steps."""

    def synchronize(self):
        """Waits for every bucket's all-reduce and writes the averaged
        gradients into ``.grad``: call it to touch gradients before step()
        (clipping, unscaling), and step inside skip_synchronize(); a plain
        step() does not reduce again either, but warns as Horovod's does."""
        self._ronde_reducer.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self):
        """step() inside this block does not synchronize (after an explicit
        synchronize(), e.g. around ``torch.amp.GradScaler.step``)."""
        self._ronde_should_synchronize = False
        try:
            yield
        finally:
            self._ronde_should_synchronize = True

    def step(self, closure=None):
        # The engine's step: synchronize (or check that it was), then the
        # optimizer's own step, then end the step; with a closure (LBFGS),
        # each evaluation synchronised and its loss averaged over ranks.
        base_step = super().step
        if self._ronde_should_synchronize and \
                self._ronde_reducer.synchronized():
            # Horovod's warning, word for word: scripts and tests look for it.
            warnings.warn(
                "optimizer.step() called without "
                "optimizer.skip_synchronize() context after "
                "optimizer.synchronize(). This can cause training slowdown. "
                "You may want to consider using "
                "optimizer.skip_synchronize() context if you use "
                "optimizer.synchronize() in your code.")
        watch = self._ronde_sparse
        if watch is not None and watch.sparse:
            base_step = _sparse_step(self, base_step)
        if self._ronde_sharded:
            self._ronde_consolidated = None
        out = self._ronde_reducer.step(
            base_step, closure, self._ronde_should_synchronize)
        if watch is not None:
            watch.settle()
        if self._ronde_sharded:
            _zero.follow_shards(self)
        return out

    def zero_grad(self, set_to_none=True):
        # A step synchronised but never taken (torch.amp.GradScaler skips
        # step() after an overflow) ends here, on every rank alike.
        if self._ronde_reducer.synchronized():
            self._ronde_reducer.finish_step()
        super().zero_grad(set_to_none=set_to_none)
        if self._ronde_sharded:
            _zero.zero_full_grads(self, set_to_none)

    def consolidate_state_dict(self, to=0):
        """Sharded: gathers every rank's shards of the state to rank ``to``
        of the set, whose state_dict() then returns the unsharded format.
        Every rank calls it (PyTorch's ZeroRedundancyOptimizer name)."""
        if not self._ronde_sharded:
            raise RuntimeError("ronde: consolidate_state_dict() on an "
                               "optimizer that does not shard")
        _zero.consolidate_state_dict(self, to)

    def skip_step(self):
        """Ends the step without updating the parameters: still completes
        this step's all-reduces, so every rank stays in step."""
        self._ronde_reducer.skip_step()

    def gradient_buffers(self):
        """The tensors holding this step's averaged gradients after
        synchronize(): the bucket buffers when gradients are bucket views,
        else the gradients."""
        return self._ronde_reducer.gradient_buffers()

    def buckets(self):
        """Parameter names per bucket, in launch order."""
        return self._ronde_reducer.buckets()

    def last_step_profile(self):
        return self._ronde_reducer.last_step_profile()

    def bucket_sizing(self):
        """(bucket MiB, first bucket MiB, autotuned): the sizes in use,
        autotune's choice once it has chosen."""
        return self._ronde_reducer.bucket_sizing()

    def state_dict(self):
        # Autotune's choice travels with the optimizer's state, as in C++,
        # and so does the LR factor the saved LRs carry.
        state = (_zero.state_dict(self) if self._ronde_sharded
                 else super().state_dict())
        state["ronde_bucket_sizing"] = list(
            self._ronde_reducer.bucket_sizing())
        state["ronde_lr_scale_factor"] = self._ronde_lr_scale_factor
        hook_state = self._ronde_reducer.comm_hook_state()
        if hook_state:
            state["ronde_comm_hook_state"] = hook_state
        return state

    def load_state_dict(self, state_dict):
        state_dict = dict(state_dict)
        sizing = state_dict.pop("ronde_bucket_sizing", None)
        then = state_dict.pop("ronde_lr_scale_factor", None)
        hook_state = state_dict.pop("ronde_comm_hook_state", b"")
        if self._ronde_sharded:
            _zero.load_state_dict(self, state_dict)
        else:
            super().load_state_dict(state_dict)
        self._ronde_reducer.load_comm_hook_state(hook_state)
        if sizing is not None and sizing[2]:
            self._ronde_reducer.set_bucket_sizing(
                float(sizing[0]), float(sizing[1]), True)
        # Saved by a world of another size: the LRs follow this one's.
        if then and then != self._ronde_lr_scale_factor:
            _scale_lrs(self, self._ronde_lr_scale_factor / then)

    def _ronde_adapt_to_world(self):
        """After an elastic change of world (a collective of the new
        world): drops the step in flight, takes rank 0's bucket layout and
        recomputes the LR factor for the new size."""
        self._ronde_reducer.adapt_to_world()
        factor = _C.lr_scale_factor(self._ronde_lr_scaling,
                                    self._ronde_process_set.size(),
                                    self._ronde_backward_passes)
        if factor != self._ronde_lr_scale_factor:
            _scale_lrs(self, factor / self._ronde_lr_scale_factor)
        self._ronde_lr_scale_factor = factor

    @property
    def lr_scale_factor(self):
        """The factor lr_scaling applied to the base LRs (1 without)."""
        return self._ronde_lr_scale_factor

    @property
    def base_lrs(self):
        return [g["ronde_base_lr"] for g in self.param_groups]


class _SparseWatch:
    """The parameters whose gradients come sparse (nn.Embedding(sparse=True)):
    the engine reduces them dense in the fused buckets, and the optimizer
    steps on them sparse again (Horovod's sparse_as_dense; SparseAdam needs
    sparse gradients). A module's gradients keep their layout from step to
    step, so each parameter's hook goes after the first step that gave it
    a gradient: later backward passes call no Python per parameter."""

    def __init__(self, optimizer):
        self.sparse, self._seen, self._hooks = set(), set(), {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and p not in self._hooks:
                    self._hooks[p] = p.register_hook(self._note(p))

    def _note(self, p):
        def note(grad):
            self._seen.add(p)
            if grad.is_sparse:
                self.sparse.add(p)
        return note

    def settle(self):
        """After a step: stops watching the parameters it saw."""
        for p in self._seen:
            self._hooks.pop(p).remove()
        self._seen.clear()


def _sparse_step(optimizer, base_step):
    """``base_step`` with the gradients that came sparse made sparse for
    it, and dense again (the engine's) afterwards."""

    def step(closure=None):
        swapped = [(p, p.grad) for p in optimizer._ronde_sparse.sparse
                   if p.grad is not None and not p.grad.is_sparse]
        for p, dense in swapped:
            p.grad = dense.to_sparse()
        try:
            return base_step(closure) if closure is not None else base_step()
        finally:
            for p, dense in swapped:
                p.grad = dense

    return step


class _LocalOptimizer:
    """Horovod's DistributedOptimizer on a rank outside its process set: the
    wrapped optimizer, stepping on this rank's own gradients."""

    def synchronize(self):
        pass

    @contextlib.contextmanager
    def skip_synchronize(self):
        yield


def _scale_lrs(optimizer, ratio):
    for group in optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].mul_(ratio)
        else:
            group["lr"] = group["lr"] * ratio


_classes = {}


def _distributed_class(base):
    cls = _classes.get(base)
    if cls is None:
        cls = type(base.__name__, (_DistributedOptimizer, base),
                   {"__module__": base.__module__,
                    "__doc__": base.__doc__})
        _classes[base] = cls
    return cls


def _parse_enum(enum, value, what):
    if isinstance(value, str):
        try:
            return enum.__members__[value.lower()]
        except KeyError:
            names = ", ".join(enum.__members__)
            raise ValueError(
                f"ronde: unknown {what} '{value}' (one of {names})") from None
    if value is None:
        return enum.__members__["none"]
    return value


class _CallableHook(_C.CommHook):
    """A plain function as a communication hook: fn(bucket) reduces
    bucket.buffer in place."""

    def __init__(self, fn):
        super().__init__()
        self._fn = fn

    def name(self):
        return getattr(self._fn, "__name__", "callable")

    def reduce(self, bucket):
        self._fn(bucket)


_BUILTIN_HOOKS = {
    "allreduce": _C.allreduce_hook,
    "fp16": _C.fp16_compress_hook,
    "bf16": _C.bf16_compress_hook,
    "powersgd": _C.powersgd_hook,
}


def _comm_hook(spec):
    if spec is None or isinstance(spec, _C.CommHook):
        return spec
    if isinstance(spec, str):
        if spec not in _BUILTIN_HOOKS:
            raise ValueError(
                f"ronde: unknown comm_hook '{spec}'; the built-in ones are "
                + ", ".join(_BUILTIN_HOOKS))
        return _BUILTIN_HOOKS[spec]()
    if callable(spec):
        return _CallableHook(spec)
    raise TypeError("ronde: comm_hook takes a name, a CommHook or a "
                    f"callable, got {type(spec).__name__}")


def DistributedOptimizer(optimizer, named_parameters=None, *,
                         fusion_threshold_mb=0.0, first_bucket_mb=1.0,
                         backward_passes_per_step=1,
                         average_aggregated_gradients=True,
                         op=_C.ReduceOp.Average,
                         gradient_predivide_factor=1.0,
                         gradient_as_bucket_view=True,
                         compression=_C.Compression.none,
                         lr_scaling=_C.LrScaling.none,
                         rebuild_buckets=True, autotune=False,
                         process_set=None, divide_by_set_size=False,
                         shard_optimizer_state=False, shard_gradients=False,
                         comm_hook=None, sparse_as_dense=False):
    """Makes ``optimizer`` (any ``torch.optim.Optimizer``) step on gradients
    averaged over all ranks, and returns it.

    The optimizer object itself becomes an instance of a subclass of its
    class that adds synchronize(), skip_synchronize(), skip_step(),
    buckets(), last_step_profile(); its state, param groups and
    state_dict() are untouched. ronde's C++ engine hooks each parameter's
    gradient accumulator and all-reduces fused buckets during backward;
    step() waits for them and then runs the optimizer's own step.

    ``named_parameters``: ``model.named_parameters()`` (names must agree
    across ranks; ``requires_grad=False`` ones are left out). The options are
    those of the C++ DistributedOptimizerOptions; ``compression`` and
    ``lr_scaling`` also take strings ("fp16", "linear", ...). LR scaling
    multiplies every group's LR by the number of replicas x
    backward_passes_per_step (or its square root); the base LR is kept in
    each group's "ronde_base_lr", so wrapping again never compounds it.
    Create LR schedulers after wrapping. ``rebuild_buckets`` and
    ``autotune`` are the C++ options of those names (RONDE_AUTOTUNE, when
    set, overrides ``autotune``); state_dict() keeps autotune's choice
    under "ronde_bucket_sizing" and load_state_dict() restores it.
    ``process_set``: average over that set's ranks only (its size also
    sets the LR scaling); None: the whole job. ``divide_by_set_size``:
    while ranks are in ``rt.join()``, divide by the set's size instead of
    by the ranks that contributed.

    ``shard_optimizer_state`` (ZeRO stage 1) and ``shard_gradients``
    (stage 2) are the C++ options (docs/sharding.md): the optimizer's
    param groups then hold flat views of this rank's pieces of the
    parameters, so its state covers 1/N of them; state_dict() needs
    consolidate_state_dict(to) on every rank first and returns the
    unsharded format on rank ``to``; load_state_dict() takes that format.
    Use ``ronde.torch.clip_grad_norm_(optimizer, ...)`` to clip.

    ``comm_hook`` (docs/comm_hooks.md) replaces each bucket's all-reduce:
    "allreduce", "fp16", "bf16" or "powersgd" (its defaults), a hook made
    by ``powersgd_hook(rank=..., start_iter=...)`` and the like, a
    ``CommHook`` subclass written in Python, or a callable taking the
    ``CommBucket``. A Python hook runs on the communication thread and takes
    the GIL for each bucket. state_dict() keeps this rank's hook state
    (PowerSGD's) under "ronde_comm_hook_state".

    Sparse gradients (``nn.Embedding(sparse=True)``) are reduced dense in
    the fused buckets, and the optimizer steps on them sparse again, with
    ``sparse_as_dense`` or not (Horovod all-gathers them without it: the
    same values, sent as indices and rows). On a rank outside
    ``process_set`` the optimizer steps on its own gradients, as in
    Horovod.
    """
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError("ronde: DistributedOptimizer needs a "
                        "torch.optim.Optimizer to wrap, got "
                        f"{type(optimizer).__name__}")
    compression = _parse_enum(_C.Compression, compression, "compression")
    lr_scaling = _parse_enum(_C.LrScaling, lr_scaling, "lr_scaling")
    if isinstance(op, str):
        op = _C.ReduceOp.__members__[op.capitalize()]
    if not isinstance(op, _C.ReduceOp):
        raise NotImplementedError(
            f"ronde: DistributedOptimizer: op={op!r} is not implemented "
            "(Adasum needs MPI in Horovod); use Average or Sum")
    if "step" in optimizer.__dict__:
        # An LR scheduler made before wrapping patched the bound step():
        # that copy would step without averaging.
        raise RuntimeError(
            "ronde: this optimizer's step() was patched (by an LR scheduler "
            "made before wrapping?): create LR schedulers after "
            "DistributedOptimizer")
    if named_parameters is None:
        named_parameters = [
            (f"param_groups.{g}.{i}", p)
            for g, group in enumerate(optimizer.param_groups)
            for i, p in enumerate(group["params"])]
    else:
        named_parameters = list(named_parameters)
    names = [n for n, _ in named_parameters]
    params = [p for _, p in named_parameters]
    # Horovod's errors for these are ValueErrors; scripts catch them so.
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        where = f" on rank {_C.rank()}" if _C.is_initialized() else ""
        raise ValueError(
            f"ronde: DistributedOptimizer{where}: parameter names must be "
            f"unique; repeated: {', '.join(repeated[:5])}")
    try:
        _C._check_optimizer_parameters(
            params, [list(g["params"]) for g in optimizer.param_groups])
    except RuntimeError as e:
        raise ValueError(str(e)) from None

    if isinstance(optimizer, _DistributedOptimizer):
        base = optimizer._ronde_base_class
        optimizer._ronde_reducer = None  # releases the old hooks first
    else:
        base = type(optimizer)
    if process_set is None:
        process_set = _C.global_process_set()
    if not process_set.included():
        optimizer.__class__ = type(base.__name__, (_LocalOptimizer, base), {})
        optimizer._ronde_base_class = base
        optimizer._ronde_process_set = process_set
        optimizer._parameter_names = dict(zip(params, names))
        return optimizer
    sharded = bool(shard_optimizer_state or shard_gradients)
    if sharded:
        _zero.check_elementwise(optimizer)
    hook = _comm_hook(comm_hook)
    reducer = _C.GradientReducer(
        names, params,
        fusion_threshold_mb=fusion_threshold_mb,
        first_bucket_mb=first_bucket_mb,
        backward_passes_per_step=backward_passes_per_step,
        average_aggregated_gradients=average_aggregated_gradients,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        gradient_as_bucket_view=gradient_as_bucket_view,
        compression=compression,
        rebuild_buckets=rebuild_buckets,
        autotune=autotune,
        process_set=process_set,
        divide_by_set_size=divide_by_set_size,
        shard_optimizer_state=bool(shard_optimizer_state),
        shard_gradients=bool(shard_gradients),
        comm_hook=hook)
    factor = _C.lr_scale_factor(lr_scaling, process_set.size(),
                                backward_passes_per_step)
    for group in optimizer.param_groups:
        base_lr = group.setdefault("ronde_base_lr", group["lr"])
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(base_lr * factor)
        else:
            group["lr"] = base_lr * factor
    optimizer.__class__ = _distributed_class(base)
    optimizer._ronde_base_class = base
    optimizer._ronde_reducer = reducer
    optimizer._ronde_process_set = process_set
    optimizer._ronde_should_synchronize = True
    optimizer._ronde_lr_scale_factor = factor
    optimizer._ronde_lr_scaling = lr_scaling
    optimizer._ronde_backward_passes = backward_passes_per_step
    optimizer._ronde_sharded = sharded
    optimizer._ronde_sparse = None if sharded else _SparseWatch(optimizer)
    # Horovod's attribute, which scripts read: each parameter's name.
    optimizer._parameter_names = dict(zip(params, names))
    # The Python object of a hook written in Python lives as long as the
    # optimizer that calls it.
    optimizer._ronde_comm_hook = hook
    if sharded:
        _zero.setup(optimizer)
    return optimizer


def _is_distributed(optimizer):
    return isinstance(optimizer, _DistributedOptimizer)


class GradScaler(torch.amp.GradScaler):
    """torch.amp.GradScaler that knows DistributedOptimizer: unscale_()
    and step() synchronize first, so every rank unscales and checks the same
    averaged gradients and skips (or takes) the step alike. The plain
    recipe then works unchanged::

        scaler.scale(loss).backward()
        scaler.unscale_(opt)            # optional, to clip
        scaler.step(opt)
        scaler.update()

    With ``torch.amp.GradScaler`` itself, synchronize explicitly::

        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
        opt.zero_grad()                 # ends a step the scaler skipped
    """

    def __init__(self, device="cpu", init_scale=2.0**16, growth_factor=2.0,
                 backoff_factor=0.5, growth_interval=2000, enabled=True):
        super().__init__(device, init_scale=init_scale,
                         growth_factor=growth_factor,
                         backoff_factor=backoff_factor,
                         growth_interval=growth_interval, enabled=enabled)

    def unscale_(self, optimizer):
        if _is_distributed(optimizer):
            optimizer.synchronize()
        out = super().unscale_(optimizer)
        if _is_distributed(optimizer) and optimizer._ronde_sharded:
            # Each rank checked its own shards: agree on the verdict.
            found = self._per_optimizer_states[id(optimizer)][
                "found_inf_per_device"]
            for v in found.values():
                v.copy_(_C.allreduce(
                    v, op=_C.ReduceOp.Max, name="ronde.amp.found_inf",
                    process_set=optimizer._ronde_process_set))
        return out

    def step(self, optimizer, *args, **kwargs):
        if not _is_distributed(optimizer):
            return super().step(optimizer, *args, **kwargs)
        optimizer.synchronize()
        with optimizer.skip_synchronize():
            out = super().step(optimizer, *args, **kwargs)
        if optimizer._ronde_reducer.synchronized():
            # The scaler found inf/NaN and skipped the update.
            optimizer._ronde_reducer.finish_step()
        return out


class WarmupScheduler:
    """ronde's warmup-then-decay LR schedule (the C++ WarmupScheduler's
    arithmetic) on any torch.optim.Optimizer: sets every group's LR from its
    peak LR (the LR it has when the scheduler is made, typically already
    scaled by DistributedOptimizer), keeping the ratios between groups.
    step() advances one optimizer step; construction applies step 0.

    ``shape``: "linear", "exponential" or "constant" (WarmupShape);
    ``multiplier``: peak LR / base LR, 0 to take a DistributedOptimizer's
    lr_scale_factor (else 1); ``then``: a Decay (Decay.cosine(1000), ...).
    """

    def __init__(self, optimizer, warmup_steps=0, shape="linear",
                 multiplier=0.0, then=None):
        if warmup_steps < 0:
            raise RuntimeError(
                f"ronde: warmup_steps must be >= 0, got {warmup_steps}")
        if multiplier < 0:
            raise RuntimeError(
                f"ronde: warmup multiplier must be >= 0, got {multiplier:g}")
        self.optimizer = optimizer
        self.warmup_steps = int(warmup_steps)
        self.shape = _parse_enum(_C.WarmupShape, shape, "warmup shape")
        self.then = then if then is not None else _C.Decay.constant()
        self._auto_multiplier = multiplier == 0
        if multiplier == 0:
            multiplier = (optimizer.lr_scale_factor
                          if _is_distributed(optimizer) else 1.0)
        self.multiplier = float(multiplier)
        self.peak_lrs = [float(g["lr"]) for g in optimizer.param_groups]
        self._step = 0
        self._apply()

    def factor(self, t=None):
        return _C.schedule_factor(self.warmup_steps, self.shape, self.then,
                                  self.multiplier,
                                  self._step if t is None else t)

    def _apply(self):
        groups = self.optimizer.param_groups
        if len(groups) != len(self.peak_lrs):
            raise RuntimeError(
                f"ronde: the optimizer has {len(groups)} param groups, the "
                f"scheduler was made for {len(self.peak_lrs)}")
        f = self.factor()
        for group, peak in zip(groups, self.peak_lrs):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(peak * f)
            else:
                group["lr"] = peak * f

    def step(self):
        self._step += 1
        self._apply()

    @property
    def step_count(self):
        return self._step

    def get_last_lr(self):
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def _lr_factor(self):
        return (self.optimizer.lr_scale_factor
                if _is_distributed(self.optimizer) else 1.0)

    def state_dict(self):
        return {"step": self._step, "peak_lrs": list(self.peak_lrs),
                "multiplier": self.multiplier, "lr_factor": self._lr_factor()}

    def load_state_dict(self, state):
        self._step = int(state["step"])
        self.peak_lrs = list(state["peak_lrs"])
        self.multiplier = float(state["multiplier"])
        # Saved by a world of another size: the peak follows this one's LR
        # factor, the step stays.
        then, now = state.get("lr_factor"), self._lr_factor()
        if then and then != now:
            self.peak_lrs = [p * now / then for p in self.peak_lrs]
            if self._auto_multiplier:
                self.multiplier = now
        self._apply()
