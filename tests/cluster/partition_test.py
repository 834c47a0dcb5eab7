#!/usr/bin/env python3
"""A host cut off from the job while its processes live, on the simulated
cluster (scripts/simcluster.sh cut): an elastic 2 x 2 job under ronderun
--min-np 2 --timeout 30, one host's link taken down mid-training.

The side that keeps the store goes on with 2 ranks and finishes; the ranks
on the other side can reach neither the store nor their peers, and must
exit non-zero within the timeout plus 10 s, saying they lost contact with
the store; ronderun exits within the same bound. Two variants: the store
(ronderun) on the surviving host, and on the host that is cut off. Nothing
is left in the hosts, in /dev/shm or in TMPDIR.

    partition_test.py --worker W --ronderun R CASE
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import cluster_test
from cluster_test import (SIM, Cluster, Failure, base_env, check,
                          ronderun_argv, shm_segments)

TIMEOUT = 30  # ronderun_argv's --timeout
BOUND = TIMEOUT + 10


class Reader(threading.Thread):
    """Collects a process's output lines with the time each arrived."""

    def __init__(self, proc):
        super().__init__(daemon=True)
        self.proc = proc
        self.lines = []

    def run(self):
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line))

    def text(self):
        return "".join(line for _, line in self.lines)

    def first(self, pattern, after=0.0):
        for t, line in list(self.lines):
            if t >= after and re.search(pattern, line):
                return t
        return None


def wait_for(cond, limit):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def run_partition(args, store_on_cut_host, tag):
    """ronderun on host `r` (0, or 1 when the store is on the cut host);
    host 1 is cut. Returns a report of what happened, and checks it."""
    before = shm_segments()
    private = tempfile.mkdtemp(prefix="ronde-partition-")
    report = {}
    try:
        env = base_env(TIMEOUT)
        env["TMPDIR"] = private
        with Cluster(2, tag) as c:
            launcher_host = 1 if store_on_cut_host else 0
            other = 1 - launcher_host
            # The launcher's host comes first: its ranks are 0 and 1.
            spec = f"{c.addr(launcher_host)}:2,{c.addr(other)}:2"
            argv = ronderun_argv(args, c, spec, ["--min-np", "2"],
                                 ["elastic_train", "-1", "sleep", "150"])
            proc = c.start(launcher_host, argv, env)
            reader = Reader(proc)
            reader.start()
            check(wait_for(lambda: reader.first(r"STEP 3\b"), 120),
                  "training did not start", [reader.text()])
            subprocess.run([SIM, "cut", c.name, "1"], check=True)
            cut_at = time.monotonic()
            # The ranks that lost the store: those not on the launcher's host.
            lost = other
            gone = wait_for(lambda: not c.pids(lost), BOUND + 20)
            report["cut off ranks gone after"] = time.monotonic() - cut_at
            try:
                proc.wait(timeout=max(1, cut_at + BOUND + 60 - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise Failure("ronderun did not end\n" + reader.text())
            report["ronderun exited after"] = time.monotonic() - cut_at
            reader.join(timeout=10)
            finished = reader.first(r"\[0\] finished at step")
            report["survivors finished after"] = (
                finished - cut_at if finished else float("nan"))
            report["ronderun rc"] = proc.returncode
            out = reader.text()
            left_procs = c.pids(0) + c.pids(1)
            name = c.name
        left_files = os.listdir(private)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    lost_ranks = (2, 3)
    for k, v in report.items():
        print(f"{k}: {v:.1f} s" if isinstance(v, float) else f"{k}: {v}")
    check(gone, "the cut-off ranks never exited", [out])
    check(report["cut off ranks gone after"] <= BOUND,
          f"the cut-off ranks took {report['cut off ranks gone after']:.0f} s "
          f"to exit (bound {BOUND} s)", [out])
    # ronderun waits for the survivors' training, not for the cut-off ranks
    # beyond the bound.
    done = max(report["cut off ranks gone after"],
               report["survivors finished after"])
    check(report["ronderun exited after"] <= max(BOUND, done) + 5,
          f"ronderun took {report['ronderun exited after']:.0f} s to exit "
          f"(bound {BOUND} s; the survivors finished after {done:.0f} s)",
          [out])
    for r in lost_ranks:
        said = re.search(rf"\[{r}\].*lost contact with the store.*", out)
        check(said, f"rank {r} should say it lost contact with the store",
              [out])
        print(said.group(0))
    check("the store is gone" not in out,
          "a cut-off rank blamed a store that is alive", [out])
    # The side with the store went on as 2 ranks and finished right.
    for want in ("every sample once: yes", "parameters match the reference",
                 "lr 0.04 for 2 ranks"):
        check(want in out, f"the survivors: missing {want!r}", [out])
    check(out.count("with 2 ranks over shm\n") == 2,
          "two survivors should finish over shared memory", [out])
    check(report["ronderun rc"] == 0,
          f"ronderun exited {report['ronderun rc']}: the job finished on "
          "the side of the store", [out])
    check(not left_procs, "processes were left in the hosts", [out])
    left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                          text=True).stdout
    check(name + "-" not in left, f"namespaces left behind: {left}")
    check(shm_segments() <= before, f"segments left: {shm_segments() - before}")
    check(not left_files, f"files left in TMPDIR: {left_files}")


CASES = {
    "partition_store_kept": lambda a: run_partition(a, False, "p"),
    "partition_store_cut": lambda a: run_partition(a, True, "q"),
}


if __name__ == "__main__":
    sys.exit(cluster_test.main(CASES, __doc__))
