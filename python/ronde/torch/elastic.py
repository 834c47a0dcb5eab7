"""Elastic training with Horovod's names: a job that goes on when ranks die,
without restarting the survivors and without losing a sample. Run it under
``ronderun -np N --min-np M``, whose store outlives every rank::

    import ronde.torch as hvd

    state = hvd.elastic.TorchState(model, optimizer, sampler=sampler,
                                   epoch=0, batch=0)

    @hvd.elastic.run
    def train(state):
        for state.epoch in range(state.epoch, epochs):
            for state.batch, (x, y) in enumerate(loader, state.batch):
                ...
                state.sampler.record_batch(state.batch, batch_size)
                if state.batch % 10 == 0:
                    state.commit()
            state.batch = 0
            state.sampler.set_epoch(state.epoch + 1)

    train(state)

``record_batch`` is called once per batch trained, in order: it records the
next batch the sampler yielded, so the batch number may go on from the
restored ``state.batch`` (as here) or count from 0 after each reset
(Horovod's ``enumerate(loader)``).

On a ``CommError`` inside ``train`` every survivor forms a new world with
the others (the lowest survivor becomes rank 0), the state becomes rank 0's
last commit, the reset callbacks run, and ``train`` is called again. A
DistributedOptimizer's LR factor follows the new world size, and an
``ElasticSampler`` splits what is left of the epoch over the new ranks.
Processes ronderun starts into the running job (``--restart-failed``,
``--host-discovery-script``) join at a commit: ``commit()`` raises
``HostsUpdatedInterrupt``, ``run`` admits them, and they take the state
from rank 0.
"""
import copy as _copy
import functools as _functools
import sys as _sys

import torch as _torch

from . import _C


class HostsUpdatedInterrupt(RuntimeError):
    """Raised by ``commit()`` when processes wait to join the job (ronderun
    started them: --restart-failed, --host-discovery-script); ``run``
    admits them and goes on from that commit."""

    def __init__(self, skip_sync=False):
        super().__init__("hosts updated")
        self.skip_sync = skip_sync


def _rank():
    return _C.rank()


class State:
    """What ``run`` commits, restores and syncs (Horovod's State)."""

    def __init__(self):
        self._reset_callbacks = []

    def register_reset_callbacks(self, callbacks):
        """Callbacks run after each change of world, once the state is
        rank 0's last commit."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages_reset()
        for callback in self._reset_callbacks:
            callback()

    def _host_messages_reset(self):
        pass

    def commit(self):
        """Keeps a copy of the state in this rank's memory (no disk)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """A collective: raises HostsUpdatedInterrupt when processes wait
        to join the job (``run`` then admits them at this commit)."""
        if _C.is_initialized() and _C._check_host_updates():
            raise HostsUpdatedInterrupt()

    def save(self):
        raise NotImplementedError

    def restore(self):
        raise NotImplementedError

    def sync(self):
        raise NotImplementedError


class ObjectState(State):
    """Picklable attributes, given as keywords (``epoch=0``)."""

    def __init__(self, **kwargs):
        super().__init__()
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._saved = None
        self.save()

    def _values(self):
        return {name: getattr(self, name) for name in self._names}

    def _load_values(self, values):
        for name, value in values.items():
            setattr(self, name, value)

    def save(self):
        self._saved = _copy.deepcopy(self._values())

    def restore(self):
        self._load_values(_copy.deepcopy(self._saved))

    def sync(self):
        from . import broadcast_object
        if _C.size() > 1:
            self._saved = broadcast_object(self._saved, 0,
                                           name="ronde.elastic.state")
        self.restore()


def _state_dict_copy(obj):
    return _copy.deepcopy(obj.state_dict())


class TorchState(ObjectState):
    """A model, an optimizer, and any other object with state_dict() and
    load_state_dict() (samplers, schedulers: given by keyword), plus
    picklable attributes (``epoch=0, batch=0``)."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        self.model = model
        self.optimizer = optimizer
        stateful = {name: v for name, v in kwargs.items()
                    if hasattr(v, "state_dict") and
                    hasattr(v, "load_state_dict")}
        self._stateful = {"model": model, "optimizer": optimizer}
        self._stateful = {k: v for k, v in self._stateful.items()
                          if v is not None}
        self._stateful.update(stateful)
        for name, value in stateful.items():
            setattr(self, name, value)
        plain = {k: v for k, v in kwargs.items() if k not in stateful}
        super().__init__(**plain)

    def save(self):
        self._saved = {
            "values": _copy.deepcopy(self._values()),
            "objects": {name: _state_dict_copy(obj)
                        for name, obj in self._stateful.items()},
        }

    def restore(self):
        saved = _copy.deepcopy(self._saved)
        self._load_values(saved["values"])
        for name, obj in self._stateful.items():
            obj.load_state_dict(saved["objects"][name])

    def _adapt_to_world(self):
        # What depends on the world follows it before the commit is loaded
        # (which is then read in the new world's terms).
        for obj in self._stateful.values():
            adapt = getattr(obj, "_ronde_adapt_to_world", None)
            if adapt is not None:
                adapt()


class ElasticSampler(_torch.utils.data.Sampler):
    """Horovod's ElasticSampler: this rank's share of the dataset, the
    epoch's permutation read with a stride; ``record_batch`` (or
    ``record_indices``) says how far the job got, ``set_epoch(e + 1)`` at
    the end of epoch e starts the next. After a change of world, what is
    left of the epoch is split over the new ranks, so every sample is read
    once even when ranks were lost (the processed indices of a dropped rank
    are not lost: the job's position is counted, not each rank's set).
    The one exception: when what is left does not divide by the number of
    ranks, the split is padded with the epoch's first samples (fewer than
    the number of ranks), read a second time in the epoch's last batch.

    The sampler yields its split in order, from where the last commit left
    it; ``record_batch`` is called once per batch trained, in order, and
    records the next batch of the split whatever its ``batch_idx``."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self._start = 0  # where the current split begins in the permutation
        self.processed_num = 0  # samples this rank read since then
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self._start = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        """Records that this rank trained on the next batch the sampler
        yielded: the next ``batch_size`` unrecorded indices of its split
        (fewer at the split's end). Call it once per batch, in order.
        ``batch_idx`` is not used to find the batch, so it may count from 0
        after each reset (Horovod's ``enumerate(loader)``) or go on from the
        restored batch number (``enumerate(loader, state.batch)``)."""
        begin = self.processed_num
        self.record_indices(self.indices[begin:begin + batch_size])

    def record_indices(self, indices):
        """Records that this rank trained on ``indices``: counted, as the
        next ``len(indices)`` indices of its split."""
        self.processed_num += len(indices)

    def get_indices(self, batch_idx, batch_size):
        """Batch ``batch_idx`` of this rank's split, counted from the last
        reset or ``set_epoch`` (Horovod's meaning)."""
        begin = batch_idx * batch_size
        return self.indices[begin:begin + batch_size]

    def consumed(self):
        """Samples of the epoch's permutation the whole job has read."""
        return min(len(self.dataset),
                   self._start + self.processed_num * self.num_replicas)

    def state_dict(self):
        return {"epoch": self.epoch, "consumed": self.consumed()}

    def load_state_dict(self, state):
        self.epoch = int(state["epoch"])
        self._start = int(state["consumed"])
        self.reset()

    def _ronde_adapt_to_world(self):
        self._start = self.consumed()
        self.reset()

    def reset(self):
        self.num_replicas = _C.size() if _C.is_initialized() else 1
        self.rank = _C.rank() if _C.is_initialized() else 0
        n = len(self.dataset)
        if self.shuffle:
            g = _torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            order = _torch.randperm(n, generator=g).tolist()
        else:
            order = list(range(n))
        left = order[self._start:]
        # Padded with the epoch's first samples to a multiple of the ranks.
        total = -(-len(left) // self.num_replicas) * self.num_replicas
        left += (order * (1 + total // max(n, 1)))[:total - len(left)]
        self.indices = left[self.rank::self.num_replicas]
        self.num_samples = len(self.indices)
        self.processed_num = 0

    def __iter__(self):
        return iter(self.indices[self.processed_num:])

    def __len__(self):
        return self.num_samples - self.processed_num


def run(func):
    """Horovod's ``@hvd.elastic.run``: ``func(state, ...)`` runs until it
    returns; on a ronde CommError the survivors form a new world, the state
    becomes rank 0's last commit, the reset callbacks run, and ``func`` is
    called again. Raises the CommError when the job cannot go on (fewer
    ranks than ``--min-np`` within the timeout, or the store gone)."""

    @_functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        changed = False
        if _C._joining():
            if _C._join_world()[3] < 0:
                return None  # the job finished before it could take us
            changed = True
        while True:
            try:
                if changed:
                    changed = False
                    if hasattr(state, "_adapt_to_world"):
                        state._adapt_to_world()
                    state.sync()
                    state.on_reset()
                else:
                    state.sync()
                result = func(state, *args, **kwargs)
                if _C.rank() == 0:
                    _C._close_to_joiners()
                return result
            except _C.CommError as e:
                print(f"ronde: rank {_C.rank()}: {e}; forming a new world "
                      "without the ranks that failed", file=_sys.stderr,
                      flush=True)
                change = _C._change_world(list(e.suspect_ranks))
                if _C.rank() == 0:
                    print(f"ronde: elastic epoch {change[0]}: {change[4]} "
                          f"rank(s), {change[2]} before", file=_sys.stderr,
                          flush=True)
                changed = True
            except HostsUpdatedInterrupt:
                change = _C._admit_joiners()
                if _C.rank() == 0:
                    print(f"ronde: elastic epoch {change[0]}: {change[4]} "
                          f"rank(s), {change[2]} before (ranks joined)",
                          file=_sys.stderr, flush=True)
                changed = True

    return wrapper
