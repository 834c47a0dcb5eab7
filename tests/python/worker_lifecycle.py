"""init() and shutdown() again and again in one process, with a collective
in each world whose result every rank checks (reinit); init() on a job a
failure broke (broken: the last rank comes to an all-reduce after the
others' timeout, so every rank's communicator fails; init() then starts a
new job, in which the same all-reduce succeeds).

    worker_lifecycle.py reinit|broken OUT_DIR [cycles=N]
"""
import os
import sys
import time
import traceback

import torch

import ronde.torch as rt


def reinit(out, cycles="10", bare="0"):
    """`bare=1`: nothing between init() and shutdown() but every second
    cycle's collective (the tightest loop a script can write)."""
    took = []
    for i in range(int(cycles)):
        start = time.monotonic()
        rt.init()
        took.append(time.monotonic() - start)
        n, me = rt.size(), rt.rank()
        if bare == "1" and i % 2:
            rt.shutdown()
            continue
        got = rt.allreduce(torch.full((4,), float(me + i)), op=rt.Sum)
        want = torch.full((4,), float(sum(r + i for r in range(n))))
        assert torch.equal(got, want), f"cycle {i}: {got} != {want}"
        rt.shutdown()
    torch.save({"init_seconds": took},
               os.path.join(out, f"reinit.rank{me}.pt"))


def broken(out):
    rt.init()
    n, me = rt.size(), rt.rank()
    if me == n - 1:
        time.sleep(rt.timeout_seconds() + 2)
    failed = None
    try:
        rt.allreduce(torch.ones(2), op=rt.Sum)
    except rt.CommError as e:
        failed = str(e)
    assert failed is not None, "the late all-reduce succeeded"
    rt.init()  # a new job, not a no-op
    got = rt.allreduce(torch.full((2,), float(me)), op=rt.Sum)
    want = torch.full((2,), float(sum(range(n))))
    assert torch.equal(got, want), f"after init(): {got} != {want}"
    rt.shutdown()
    torch.save({"failed": failed}, os.path.join(out, f"broken.rank{me}.pt"))


def main():
    scenario, out = sys.argv[1], sys.argv[2]
    kwargs = dict(a.split("=", 1) for a in sys.argv[3:])
    try:
        {"reinit": reinit, "broken": broken}[scenario](out, **kwargs)
    except Exception:
        traceback.print_exc()
        sys.exit(1)


if __name__ == "__main__":
    main()
