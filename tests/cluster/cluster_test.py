#!/usr/bin/env python3
"""Jobs across hosts, on a simulated cluster (scripts/simcluster.sh).

Each case makes its own cluster (hosts are network namespaces on a bridge,
198.18.0.<i+1>), starts the test worker in them the way a launcher would,
checks every rank's result, and removes the cluster on every exit path. No
address or interface variable is set: the ranks must find their addresses
themselves. Exits 77 (skipped) where a cluster cannot be made (no root, no
iproute2).

    cluster_test.py --worker W --ronderun R --python P CASE
"""
import argparse
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIM = os.path.join(ROOT, "scripts", "simcluster.sh")
SKIP = 77

# Variables of an enclosing launch or of the developer's shell that would
# give the ranks what they must find out themselves.
SCRUB_PREFIXES = ("RONDE_", "SLURM_", "OMPI_", "TORCHELASTIC_", "PMI_")
SCRUB_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
               "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}


class Failure(Exception):
    pass


def check(cond, what, outputs=None):
    if not cond:
        dump = ""
        for i, out in enumerate(outputs or []):
            dump += f"\n----- process {i} -----\n{out}"
        raise Failure(what + dump)


# This case's own directory for shared-memory segments (main makes it):
# ctest runs the cases beside each other, and they share /dev/shm, so a
# case that counts what its jobs left behind must not see another's.
SHM_DIR = None


def base_env(timeout=30):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(SCRUB_PREFIXES) and k not in SCRUB_NAMES}
    env["RONDE_TIMEOUT_SECONDS"] = str(timeout)
    if SHM_DIR is not None:
        env["RONDE_SHM_DIR"] = SHM_DIR
    return env


class Cluster:
    """`hosts` test hosts; removed on exit, whatever happened inside."""

    def __init__(self, hosts, tag):
        self.hosts = hosts
        self.name = f"rt{os.getpid() % 100000}{tag}"
        self.procs = []

    def __enter__(self):
        subprocess.run([SIM, "up", "--hosts", str(self.hosts), "--name", self.name],
                       check=True, stdout=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        subprocess.run([SIM, "down", self.name], check=False)
        for p in self.procs:
            p.wait()
        return False

    def ns(self, host):
        return f"{self.name}-{host}"

    def addr(self, host):
        return f"198.18.0.{host + 1}"

    def start(self, host, argv, env):
        p = subprocess.Popen(["ip", "netns", "exec", self.ns(host)] + argv, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, start_new_session=True)
        self.procs.append(p)
        return p

    def pids(self, host):
        out = subprocess.run(["ip", "netns", "pids", self.ns(host)],
                             capture_output=True, text=True).stdout
        return [int(x) for x in out.split()]


def wait_all(procs, timeout):
    deadline = time.monotonic() + timeout
    outputs = []
    timed_out = False
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
        outputs.append(out)
    return [p.returncode for p in procs], outputs, timed_out


def port():
    # A fresh namespace has every port free.
    return random.randint(20000, 40000)


def expect_job(codes, outputs, timed_out, backend, topologies):
    check(not timed_out, "the job timed out", outputs)
    check(all(c == 0 for c in codes), f"exit codes {codes}", outputs)
    joined = "\n".join(outputs)
    check(joined.count(f"HOST_BACKEND: {backend}") == len(topologies),
          f"every rank should report host backend '{backend}'", outputs)
    found = sorted(re.findall(r"TOPOLOGY: (\d+ \d+ \d+ \d+)", joined))
    want = sorted(" ".join(map(str, t)) for t in topologies.values())
    check(found == want, f"topologies {found}, expected {want}", outputs)


def layout(hosts, per_host):
    """(host, local rank) of every rank, ranks filling hosts in order."""
    return [(h, l) for h in range(hosts) for l in range(per_host)]


def torchrun_env(c, rank, size, host, local, per_host, p):
    env = base_env()
    env.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(local),
               LOCAL_WORLD_SIZE=str(per_host), GROUP_RANK=str(host),
               MASTER_ADDR=c.addr(0), MASTER_PORT=str(p))
    return env


def slurm_env(c, rank, size, host, local, per_host, p, hosts):
    env = base_env()
    env.update(SLURM_PROCID=str(rank), SLURM_NTASKS=str(size),
               SLURM_LOCALID=str(local), SLURM_NODEID=str(host),
               SLURM_NNODES=str(hosts), SLURM_NTASKS_PER_NODE=f"{per_host}(x{hosts})",
               SLURM_JOB_ID=str(p), MASTER_ADDR=c.addr(0), MASTER_PORT=str(p))
    return env


def topologies_for(hosts, per_host):
    return {h * per_host + l: (l, per_host, h, hosts)
            for h, l in layout(hosts, per_host)}


def backend_for(hosts, per_host):
    return "hierarchical" if per_host > 1 else "gloo"


def run_env_job(args, hosts, per_host, style, scenario, tag):
    with Cluster(hosts, tag) as c:
        p = port()
        size = hosts * per_host
        procs = []
        for rank, (h, l) in enumerate(layout(hosts, per_host)):
            if style == "torchrun":
                env = torchrun_env(c, rank, size, h, l, per_host, p)
            else:
                env = slurm_env(c, rank, size, h, l, per_host, p, hosts)
            procs.append(c.start(h, [args.worker] + scenario, env))
        return wait_all(procs, 180)


def case_vars(args, hosts, per_host, style, tag):
    codes, outputs, timed_out = run_env_job(
        args, hosts, per_host, style, ["collectives"], tag)
    expect_job(codes, outputs, timed_out, backend_for(hosts, per_host),
               topologies_for(hosts, per_host))
    # No job secret given: rank 0 says, once, that the job is open.
    check(outputs[0].count("spans hosts and is not authenticated") == 1,
          "rank 0 did not warn once that the job is unauthenticated", outputs)
    # With several ranks per host, every bucket in the host's arena (the
    # worker's `zerocopy` variant): the reduce-scatter within each host
    # reads the buckets where they lie. The collectives above cover the
    # copying one.
    variant = "zerocopy" if per_host > 1 else "plain"
    codes, outputs, timed_out = run_env_job(
        args, hosts, per_host, style, ["optim", "adam", variant], tag + "o")
    check(not timed_out and all(c == 0 for c in codes),
          f"training across hosts: exit codes {codes}", outputs)


def case_torchrun(args, hosts, per_host, tag):
    """Real torchrun, one agent per host (--nnodes, --node-rank)."""
    with Cluster(hosts, tag) as c:
        p = port()
        procs = []
        for h in range(hosts):
            argv = [args.python, "-m", "torch.distributed.run",
                    "--nnodes", str(hosts), "--node-rank", str(h),
                    "--nproc-per-node", str(per_host),
                    "--master-addr", c.addr(0), "--master-port", str(p),
                    "--no-python", args.worker, "collectives"]
            procs.append(c.start(h, argv, base_env()))
        codes, outputs, timed_out = wait_all(procs, 240)
    expect_job(codes, outputs, timed_out, backend_for(hosts, per_host),
               topologies_for(hosts, per_host))


def ronderun_argv(args, c, spec, extra, scenario):
    rsh = f"{shlex.quote(SIM)} exec {c.name} {{host}} sh -c"
    return [args.ronderun, "-H", spec, "--rsh", rsh, "--timeout", "30"] + extra + \
        ["--", args.worker] + scenario


def case_ronderun(args, hosts, per_host, tag):
    """Multi-host ronderun, run from host 0, starting ranks through the
    netns template."""
    # ronderun's private directory and the other hosts' mktemp copies go
    # to TMPDIR: one of this test's own, which other jobs do not share.
    private = tempfile.mkdtemp(prefix="ronde-cluster-")
    try:
        env = base_env()
        env["TMPDIR"] = private
        with Cluster(hosts, tag) as c:
            spec = ",".join(f"{c.addr(h)}:{per_host}" for h in range(hosts))
            argv = ronderun_argv(args, c, spec, [], ["collectives"])
            proc = c.start(0, argv, env)
            codes, outputs, timed_out = wait_all([proc], 180)
        left = os.listdir(private)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    check(not timed_out and codes == [0], f"ronderun exited {codes}", outputs)
    # ronderun's secret authenticated the job on every host; the copies it
    # gave the other hosts' ranks, and its own, are gone.
    check("not authenticated" not in outputs[0],
          "a job under ronderun warned that it is unauthenticated", outputs)
    check(not left, f"secret files left behind in TMPDIR: {sorted(left)}",
          outputs)
    for r in range(hosts * per_host):
        check(f"[{r}] HOST_BACKEND: {backend_for(hosts, per_host)}" in outputs[0],
              f"rank {r}'s output is not prefixed [{r}]", outputs)
    expect_job([0], outputs, False, backend_for(hosts, per_host),
               topologies_for(hosts, per_host))


def case_digest(args, tag):
    """Sums of random floating tensors up to 3.1M elements (2-3 pieces of
    the hierarchical pipeline), checked against a reference in each rank:
    every rank of the job must hold the same bits. Then PowerSGD training
    on the same 2 x 2 job."""
    codes, outputs, timed_out = run_env_job(args, 2, 2, "torchrun", ["digest"], tag)
    check(not timed_out and all(c == 0 for c in codes), f"exit codes {codes}",
          outputs)
    digests = {re.search(r"DIGEST: (\w+)", o).group(1) for o in outputs}
    check(len(digests) == 1, f"ranks disagree on the bits: {digests}", outputs)
    check(all("HOST_BACKEND: hierarchical" in o for o in outputs),
          "the job should be hierarchical", outputs)
    # PowerSGD's two all-reduces per bucket through the same pipeline: the
    # replicas stay bitwise equal after every step.
    codes, outputs, timed_out = run_env_job(
        args, 2, 2, "torchrun", ["powersgd_train"], tag + "p")
    check(not timed_out and all(c == 0 for c in codes),
          f"PowerSGD across hosts: exit codes {codes}", outputs)


def case_uneven(args, tag):
    """Host 0 runs 2 ranks, host 1 one: the flat ring, said once."""
    with Cluster(2, tag) as c:
        spec = f"{c.addr(0)}:2,{c.addr(1)}:1"
        proc = c.start(0, ronderun_argv(args, c, spec, [], ["collectives"]), base_env())
        codes, outputs, timed_out = wait_all([proc], 180)
    check(not timed_out and codes == [0], f"ronderun exited {codes}", outputs)
    check(outputs[0].count("uneven numbers of ranks (2,1)") == 1,
          "the fallback should be logged once", outputs)
    expect_job([0], outputs, False, "gloo",
               {0: (0, 2, 0, 2), 1: (1, 2, 0, 1), 2: (0, 1, 1, 2)})


def case_loopback_refused(args, tag):
    """(a) MASTER_ADDR=h0, which resolves to 127.0.1.1 on h0 itself (as
    Debian's /etc/hosts has it) and to 198.18.0.1 elsewhere; (b) a forced
    RONDE_HOSTNAME=127.0.0.1 on host 1. Every rank refuses, naming the rank."""
    for variant in ("name", "forced"):
        with Cluster(2, tag + variant[0]) as c:
            p = port()
            procs = []
            for rank in range(2):
                env = torchrun_env(c, rank, 2, rank, 0, 1, p)
                if variant == "name":
                    env["MASTER_ADDR"] = "h0"
                elif rank == 1:
                    env["RONDE_HOSTNAME"] = "127.0.0.1"
                procs.append(c.start(rank, [args.worker, "collectives"], env))
            codes, outputs, timed_out = wait_all(procs, 90)
        check(not timed_out, f"{variant}: the refusal should not wait for a timeout",
              outputs)
        check(all(c != 0 for c in codes), f"{variant}: exit codes {codes}", outputs)
        bad = 0 if variant == "name" else 1
        source = "route to h0" if variant == "name" else "RONDE_HOSTNAME"
        for out in outputs:
            check(f"rank {bad} would advertise 127.0.0.1 (from {source})" in out,
                  f"{variant}: every rank should name rank {bad}", outputs)
            check("RONDE_SOCKET_IFNAME" in out,
                  f"{variant}: the message should name the variable to set", outputs)


def shm_segments():
    """The segments this case's jobs have in SHM_DIR now."""
    try:
        return {f for f in os.listdir(SHM_DIR) if f.startswith("ronde")}
    except OSError:
        return set()


def read_until(proc, marker, limit):
    seen = ""
    deadline = time.monotonic() + limit
    while marker not in seen and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen += line
    return seen


def kill_host(c, host):
    for pid in c.pids(host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def case_host_killed(args, tag):
    """Every rank of host 1 killed mid-training: (a) started by torchrun-style
    variables, host 0's ranks fail with a CommError naming ranks 2 and 3
    within the timeout; (b) started by ronderun, it exits non-zero. No
    process, namespace or shared-memory segment is left behind."""
    before = shm_segments()
    names = []
    with Cluster(2, tag + "v") as c:
        names.append(c.name)
        p = port()
        procs = [c.start(h, [args.worker, "train_until_killed"],
                         torchrun_env(c, h * 2 + l, 4, h, l, 2, p))
                 for h, l in layout(2, 2)]
        seen = read_until(procs[0], "STEP 3", 120)
        check("STEP 3" in seen, "training did not start", [seen])
        killed_at = time.monotonic()
        kill_host(c, 1)
        codes, outputs, timed_out = wait_all(procs[:2], 90)
        took = time.monotonic() - killed_at
        outputs[0] = seen + outputs[0]
        check(not timed_out, "the survivors hung", outputs)
        for r in (0, 1):
            check(codes[r] == 3, f"rank {r} exited {codes[r]}, not by CommError",
                  outputs)
            m = re.search(r"^SUSPECTS:(.*)$", outputs[r], re.M)
            suspects = set(m.group(1).split()) if m else set()
            check({"2", "3"} <= suspects,
                  f"rank {r} should name ranks 2 and 3, named {suspects}", outputs)
        check(took < 60, f"the survivors took {took:.0f} s (timeout 30 s)", outputs)
    with Cluster(2, tag + "r") as c:
        names.append(c.name)
        spec = f"{c.addr(0)}:2,{c.addr(1)}:2"
        proc = c.start(0, ronderun_argv(args, c, spec, [], ["train_until_killed"]),
                       base_env())
        seen = read_until(proc, "STEP 3", 120)
        check("STEP 3" in seen, "training did not start under ronderun", [seen])
        kill_host(c, 1)
        try:
            rest, _ = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            rest, _ = proc.communicate()
            raise Failure("ronderun did not end after host 1 was lost\n" + seen + rest)
        check(proc.returncode != 0, "ronderun should exit non-zero", [seen + rest])
        check(not c.pids(0) and not c.pids(1), "processes were left in the hosts",
              [seen + rest])
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    for ns in names:
        check(ns + "-" not in left, f"namespaces left behind: {left}")
    check(shm_segments() <= before, f"segments left: {shm_segments() - before}")


def case_elastic_host_lost(args, tag):
    """An elastic 2x2 job under ronderun --min-np 2 loses both ranks of
    host 1 at one step: the two ranks of host 0 go on as 1x2 (from the
    hierarchical all-reduce to shared memory), rank 0's parameters equal
    the single-process reference, every sample is read once, and nothing
    is left in the hosts or in /dev/shm."""
    before = shm_segments()
    private = tempfile.mkdtemp(prefix="ronde-cluster-")
    try:
        env = base_env()
        env["TMPDIR"] = private
        with Cluster(2, tag) as c:
            name = c.name
            spec = f"{c.addr(0)}:2,{c.addr(1)}:2"
            argv = ronderun_argv(args, c, spec, ["--min-np", "2"],
                                 ["elastic_train", "7", "2", "forward",
                                  "3", "forward"])
            proc = c.start(0, argv, env)
            codes, outputs, timed_out = wait_all([proc], 180)
            left_procs = c.pids(0) + c.pids(1)
    finally:
        shutil.rmtree(private, ignore_errors=True)
    check(not timed_out and codes == [0], f"ronderun exited {codes}", outputs)
    out = outputs[0]
    for want in ("eras: 0:4 6:2", "parameters match the reference",
                 "every sample once: yes", "lr 0.04 for 2 ranks"):
        check(want in out, f"missing {want!r}", outputs)
    # The first world was hierarchical (its all-reduce failed as such);
    # the survivors of host 0 finished over shared memory.
    check("(hierarchical, peer failure)" in out,
          "the 2x2 world was not hierarchical", outputs)
    check(out.count("with 2 ranks over shm\n") == 2,
          "two survivors should finish over shared memory", outputs)
    check(not left_procs, "processes were left in the hosts", outputs)
    left = subprocess.run(["ip", "netns", "list"], capture_output=True,
                          text=True).stdout
    check(name + "-" not in left, f"namespaces left behind: {left}")
    check(shm_segments() <= before, f"segments left: {shm_segments() - before}")


CASES = {
    "vars_2x1": lambda a: case_vars(a, 2, 1, "torchrun", "a"),
    "vars_2x2": lambda a: case_vars(a, 2, 2, "torchrun", "b"),
    "slurm_2x2": lambda a: case_vars(a, 2, 2, "slurm", "c"),
    "torchrun_2x1": lambda a: case_torchrun(a, 2, 1, "d"),
    "torchrun_2x2": lambda a: case_torchrun(a, 2, 2, "e"),
    "ronderun_2x1": lambda a: case_ronderun(a, 2, 1, "f"),
    "ronderun_2x2": lambda a: case_ronderun(a, 2, 2, "g"),
    "uneven": lambda a: case_uneven(a, "h"),
    "digest_2x2": lambda a: case_digest(a, "k"),
    "loopback_refused": lambda a: case_loopback_refused(a, "i"),
    "host_killed": lambda a: case_host_killed(a, "j"),
    "elastic_host_lost": lambda a: case_elastic_host_lost(a, "l"),
}


def main(cases=None, doc=__doc__):
    """Runs one of `cases` (these by default), named on the command line;
    exits 77 where no cluster can be made."""
    cases = CASES if cases is None else cases
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--worker", required=True)
    ap.add_argument("--ronderun", required=True)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("case", choices=sorted(cases))
    args = ap.parse_args()
    probe = subprocess.run([SIM, "check"], capture_output=True, text=True)
    if probe.returncode != 0:
        print(f"SKIPPED: no simulated cluster here: {probe.stderr.strip()}")
        return SKIP
    global SHM_DIR
    SHM_DIR = tempfile.mkdtemp(prefix="ronde_cluster.", dir="/dev/shm")
    try:
        cases[args.case](args)
    except Failure as e:
        print(f"FAILED: {e}")
        return 1
    finally:
        shutil.rmtree(SHM_DIR, ignore_errors=True)
    print("PASSED")
    return 0


if __name__ == "__main__":
    sys.exit(main())
