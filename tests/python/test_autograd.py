"""Gradients through ronde.torch's collectives (worker_autograd.py): every
rank's input gradient equals the one computed in a single process over
every rank's input, at 2 and 3 ranks."""
import os

import pytest

from conftest import HERE

AUTOGRAD_WORKER = os.path.join(HERE, "worker_autograd.py")


@pytest.mark.parametrize("np_", [2, 3])
def test_collectives_backpropagate_as_the_single_process_reference(ranks, np_):
    ranks.run("grads", np=np_, worker=AUTOGRAD_WORKER)
    for r in range(np_):
        failures = ranks.load("grads", r)
        assert not failures, f"rank {r}:\n" + "\n".join(failures)


HOROVOD_WORKER = os.path.join(HERE, "worker_horovod.py")


def test_horovod_compression_grouped_collectives_and_internal_error(ranks):
    ranks.run("names", np=2, worker=HOROVOD_WORKER)
    for r in range(2):
        failures = ranks.load("names", r)
        assert not failures, f"rank {r}:\n" + "\n".join(failures)


@pytest.mark.installed
def test_horovod_arithmetic_process_sets_sparse_and_optimizer(ranks):
    ranks.run("semantics", np=3, worker=HOROVOD_WORKER)
    for r in range(3):
        failures = ranks.load("semantics", r)
        assert not failures, f"rank {r}:\n" + "\n".join(failures)
