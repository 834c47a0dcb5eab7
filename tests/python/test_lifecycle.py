"""shutdown() then init() at once, 10 times, under ronderun, torchrun and
fixed variables (worker_lifecycle.py): every cycle meets the same ranks
and reduces right; no cycle waits for a timeout. Before ronde kept a new
world's store keys apart from the last one's, torchrun's agent store
refused the second init() ("rank 1 was claimed by another process"); before
shutdown() waited for rank 0's store server to go, a rank could meet the
last world's server in its next init() (2 of 3 runs of 20 cycles failed)."""
import os
import subprocess
import sys

import pytest

from conftest import HERE, _env, _free_port

WORKER = os.path.join(HERE, "worker_lifecycle.py")


def check_cycles(ranks, np_):
    for r in range(np_):
        took = ranks.load("reinit", r)["init_seconds"]
        assert len(took) == 10
        # A cycle that met the last world's store would wait out the
        # rendezvous timeout (30 s) and fail; none comes near it.
        assert max(took) < 15, f"rank {r}: init() took {took}"


@pytest.mark.parametrize("launcher", [
    pytest.param("ronderun", marks=pytest.mark.installed), "torchrun"])
def test_init_again_right_after_shutdown(ranks, launcher):
    ranks.run("reinit", "bare=1", np=2, launcher=launcher, worker=WORKER)
    check_cycles(ranks, 2)


def test_init_again_right_after_shutdown_with_fixed_variables(ranks):
    port = _free_port()
    procs = []
    for r in range(2):
        env = _env()
        env.update(RONDE_RANK=str(r), RONDE_SIZE="2",
                   RONDE_RENDEZVOUS_ADDR="127.0.0.1",
                   RONDE_RENDEZVOUS_PORT=str(port),
                   RONDE_JOB_ID=f"reinit{port}")
        procs.append(subprocess.Popen(
            [sys.executable, WORKER, "reinit", ranks.out, "bare=1"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    check_cycles(ranks, 2)


def test_init_on_a_job_a_failure_broke_starts_a_new_one(ranks):
    # Rank 1 comes to the all-reduce 2 s after the others' 3 s timeout:
    # every rank's communicator fails; each rank's init() then starts a new
    # job, as shutdown() and init() would, in which the same call succeeds.
    ranks.run("broken", np=2, launcher_args=("--timeout", "3"), worker=WORKER)
    for r in range(2):
        assert "allreduce" in ranks.load("broken", r)["failed"]
