"""ronde against torch.distributed across hosts of a simulated cluster
(scripts/simcluster.sh: each host a network namespace on one bridge, host i
at 198.18.0.<i+1>, its link limited to --rate in both directions by a token
bucket). Every program of a round runs back to back in the same cluster,
alternating over several rounds (this machine is noisy); medians over rounds
are reported. Needs root (network namespaces).

    .venv/bin/python benchmarks/run_cluster.py allreduce \\
        --rates 1gbit,5gbit --rounds 3 --plot cluster-allreduce.png
    .venv/bin/python benchmarks/run_cluster.py train --rate 1gbit --rounds 3

`allreduce`: --hosts x --per-host ranks (default 2 x 2). For each rate, one
cluster at that rate; each round runs `hier` (allreduce_bench under
ronderun -H, RONDE_HIERARCHICAL=1: shared-memory reduce-scatter within a
host, Gloo all-reduce across hosts, all-gather within the host), `flat` (the
same with RONDE_HIERARCHICAL=0: one Gloo ring over every rank) and `torch`
(torch_allreduce_bench.py, one process per rank started in its host,
torch.distributed's gloo); with --arena also `hier_arena` (`hier` with the
buffer in the arena, as the engine makes its buckets: the reduce-scatter
within a host reads it where it lies). --impls picks among them. Writes benchmarks/results/cluster-allreduce-
<date>.json (--out), which benchmarks/fit_scaling.py reads.

`train`: --hosts x --per-host ranks (default 2 x 1) at one --rate (default
1gbit), one workload (default mlp): `ronde` (train_bench --mode ronde under
ronderun -H), `ronde_<c>` for each wire format in --compression (default
fp16), `ddp` (ddp_train_bench.py: DistributedDataParallel over gloo) and
`ddp_<c>` (DDP with its fp16_compress_hook / bf16_compress_hook, the peer
of ronde's wire compression; powersgdR: ronde's PowerSGD hook and DDP's
powerSGD_hook at rank R, both compressing from the third step, after the
warmup). Writes
benchmarks/results/cluster-train-<date>.json (--out).

Ranks find their own addresses: no RONDE_HOSTNAME is set. torch's ranks get
GLOO_SOCKET_IFNAME=eth0 (each host's one interface). Two ranks in one host
talk over that host's loopback, not its link, for every program alike.
The clusters are removed on every exit, a signal included.
"""
import argparse
import datetime
import json
import os
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from run_allreduce import comma_list, size_label  # same directory

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM = os.path.join(ROOT, "scripts", "simcluster.sh")
HERE = os.path.join(ROOT, "benchmarks")

# Variables of an enclosing launch or of the caller's shell that would tell
# the ranks what they must find out themselves, or change what is measured.
SCRUB_PREFIXES = ("RONDE_", "SLURM_", "OMPI_", "TORCHELASTIC_", "PMI_")
SCRUB_NAMES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
               "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
               "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"}
TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_threshold=33554432:"
            "glibc.malloc.trim_threshold=4294967296")
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def rate_bits(rate):
    """simcluster's rate syntax (an integer and gbit, mbit, kbit or bit) in
    bits per second."""
    for unit, mult in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3),
                       ("bit", 1)):
        if rate.endswith(unit) and rate[:-len(unit)].isdigit():
            return int(rate[:-len(unit)]) * mult
    raise ValueError(f"not a rate (e.g. 1gbit, 500mbit): {rate}")


def base_env():
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(SCRUB_PREFIXES) and k not in SCRUB_NAMES}
    env["OMP_NUM_THREADS"] = "1"
    return env


def repo_relative(obj):
    """The record with this checkout's absolute paths made relative to it,
    so that the results say the same on every machine."""
    if isinstance(obj, str):
        return obj.replace(ROOT + os.sep, "")
    if isinstance(obj, list):
        return [repo_relative(x) for x in obj]
    if isinstance(obj, dict):
        return {k: repo_relative(v) for k, v in obj.items()}
    return obj


def load(path):
    with open(path) as f:
        return json.load(f)


def machine(build):
    info = {"cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "load_avg_at_start": list(os.getloadavg())}

    def capture(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True,
                                  check=True, cwd=ROOT).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None
    info["git_commit"] = capture(["git", "rev-parse", "HEAD"])
    status = capture(["git", "status", "--porcelain", "--untracked-files=no"])
    info["git_dirty"] = bool(status) if status is not None else None
    info["build"] = build
    return info


class Interrupted(SystemExit):
    pass


def on_signal(signum, _frame):
    # Raised where the main thread is, so every `finally` (the cluster's
    # removal first) runs.
    raise Interrupted(128 + signum)


class Cluster:
    """A simulated cluster of `hosts` hosts at `rate`; removed on exit, by
    simcluster.sh down, which also kills every process left in its hosts."""

    def __init__(self, hosts, rate, tag):
        self.hosts, self.rate = hosts, rate
        self.name = f"rc{os.getpid() % 100000}{tag}"

    def __enter__(self):
        taken = subprocess.run(["ip", "netns", "list"], capture_output=True,
                               text=True).stdout
        if any(l.split()[0].startswith(self.name + "-")
               for l in taken.splitlines() if l.strip()):
            raise SystemExit(f"a cluster named {self.name} exists already: "
                             f"{SIM} down {self.name}")
        print(f"cluster {self.name}: {self.hosts} hosts at {self.rate}",
              file=sys.stderr, flush=True)
        try:
            subprocess.run([SIM, "up", "--hosts", str(self.hosts), "--rate",
                            self.rate, "--name", self.name], check=True,
                           stdout=subprocess.DEVNULL)
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc):
        self.remove()
        return False

    def remove(self):
        # No signal may stop the removal half-way; one that arrives now is
        # delivered (and raised) once it is done.
        old = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
        try:
            subprocess.run([SIM, "down", self.name], check=False)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def ns(self, host):
        return f"{self.name}-{host}"

    @staticmethod
    def addr(host):
        return f"198.18.0.{host + 1}"

    def rsh(self):
        return f"{shlex.quote(SIM)} exec {self.name} {{host}} sh -c"


class JobFailed(SystemExit):
    pass


def run_procs(argvs, envs, label, log_dir, timeout):
    """Starts every argv (each its own process group, output to a log),
    waits for all; on a failure or the timeout kills the rest and exits with
    every process's whole output."""
    procs, logs = [], []
    try:
        for i, (argv, env) in enumerate(zip(argvs, envs)):
            log = os.path.join(log_dir, f"{label}.{i}.log")
            logs.append(log)
            with open(log, "w") as f:
                procs.append(subprocess.Popen(
                    argv, env=env, stdout=f, stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL, cwd=ROOT,
                    start_new_session=True))
        deadline = time.monotonic() + timeout
        failed = None
        while any(p.poll() is None for p in procs):
            bad = [p for p in procs if p.poll() not in (None, 0)]
            if bad or time.monotonic() > deadline:
                failed = (f"exit code {bad[0].returncode}" if bad else
                          f"still running after {timeout} s")
                break
            time.sleep(0.2)
        if failed is None and any(p.returncode != 0 for p in procs):
            failed = f"exit codes {[p.returncode for p in procs]}"
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait()
    if failed:
        text = ""
        for i, (argv, log) in enumerate(zip(argvs, logs)):
            with open(log, errors="replace") as f:
                text += (f"\n----- process {i}: {shlex.join(argv)}\n"
                         f"{f.read()}")
        raise JobFailed(f"{label} failed ({failed}):{text}")


def ronderun_argv(a, c, prog, extra_x=()):
    spec = ",".join(f"{c.addr(h)}:{a.per_host}" for h in range(a.hosts))
    argv = ["ip", "netns", "exec", c.ns(0),
            os.path.join(a.build, "bin", "ronderun"), "-H", spec,
            "--rsh", c.rsh(), "--timeout", str(a.ronde_timeout)]
    for x in extra_x:
        argv += ["-x", x]
    return argv + ["--"] + prog


def torch_job(a, c, prog, env):
    """One process per rank, started in its own host: (argvs, envs)."""
    port = random.randint(20000, 40000)
    n = a.hosts * a.per_host
    argvs, envs = [], []
    for r in range(n):
        h, local = divmod(r, a.per_host)
        argvs.append(["ip", "netns", "exec", c.ns(h)] + prog)
        envs.append(dict(env, RANK=str(r), WORLD_SIZE=str(n),
                         LOCAL_RANK=str(local),
                         LOCAL_WORLD_SIZE=str(a.per_host),
                         MASTER_ADDR=c.addr(0), MASTER_PORT=str(port),
                         GLOO_SOCKET_IFNAME="eth0"))
    return argvs, envs


def described(argvs, envs, keys):
    """The command lines as a shell would run them, with the variables that
    matter."""
    out = []
    for argv, env in zip(argvs, envs):
        pre = " ".join(f"{k}={shlex.quote(env[k])}" for k in keys if k in env)
        out.append((pre + " " if pre else "") + shlex.join(argv))
    return out


# ------------------------------------------------------------- all-reduce

AR_IMPLS = ("hier", "hier_arena", "flat", "torch")
AR_LABELS = {"hier": "ronde hierarchical (RONDE_HIERARCHICAL=1)",
             "hier_arena": "ronde hierarchical, buffer in the arena",
             "flat": "ronde flat Gloo ring (RONDE_HIERARCHICAL=0)",
             "torch": "torch.distributed (gloo)"}
AR_BACKEND = {"hier": "hierarchical", "hier_arena": "hierarchical",
              "flat": "gloo"}


def summarize_allreduce(runs, impls):
    sizes = [x["bytes"] for x in runs[impls[0]][0]["results"]]
    for impl in impls:
        for r in runs[impl]:
            got = [x["bytes"] for x in r["results"]]
            if got != sizes:
                raise SystemExit(f"{impl}: sizes {got}, {impls[0]} {sizes}: "
                                 "the sweeps differ")
    rows = []
    for i, size in enumerate(sizes):
        row = {"bytes": size}
        for impl in impls:
            bw = [r["results"][i]["busbw_GBs"] for r in runs[impl]]
            t = [r["results"][i]["time_us"] for r in runs[impl]]
            row[f"{impl}_busbw_GBs"] = statistics.median(bw)
            row[f"{impl}_busbw_min_max"] = [min(bw), max(bw)]
            row[f"{impl}_time_us"] = statistics.median(t)
            row[f"spread_{impl}"] = (max(bw) - min(bw)) / statistics.median(bw)
        for impl in ("hier", "flat"):
            if impl in impls and "torch" in impls:
                row[f"{impl}_over_torch"] = (row[f"{impl}_busbw_GBs"] /
                                             row["torch_busbw_GBs"])
                row[f"{impl}_over_torch_per_round"] = [
                    x["results"][i]["busbw_GBs"] / y["results"][i]["busbw_GBs"]
                    for x, y in zip(runs[impl], runs["torch"])]
        if "hier" in impls and "flat" in impls:
            row["hier_over_flat"] = row["hier_busbw_GBs"] / row["flat_busbw_GBs"]
        if "hier" in impls and "hier_arena" in impls:
            row["arena_over_hier"] = (row["hier_arena_busbw_GBs"] /
                                      row["hier_busbw_GBs"])
            row["arena_over_hier_per_round"] = [
                x["results"][i]["busbw_GBs"] / y["results"][i]["busbw_GBs"]
                for x, y in zip(runs["hier_arena"], runs["hier"])]
        rows.append(row)
    return rows


def print_allreduce(group, rounds, impls, n):
    link = group["link_GBs"]
    print(f"# all-reduce, float32 sum, {group['hosts']} hosts x "
          f"{group['per_host']} ranks at {group['rate']} per host link "
          f"({link:.3f} GB/s); median over {rounds} alternating rounds; busbw "
          f"in GB/s (x 2(n-1)/n, n = {n}: a flat ring's ceiling is the link, "
          f"the hierarchical one's (n-1)/n / ((H-1)/H) = "
          f"{(n - 1) / n / ((group['hosts'] - 1) / group['hosts']):.2f} x it)")
    head = f"{'bytes':>10}" + "".join(f" {i:>8}" for i in impls)
    head += "".join(f" {i + '/torch':>11}" for i in ("hier", "flat")
                    if i in impls and "torch" in impls)
    head += (f" {'hier/flat':>9}" if "hier_over_flat" in group["summary"][0]
             else "")
    head += (f" {'arena/hier':>10}" if "arena_over_hier" in group["summary"][0]
             else "")
    head += "".join(f" {'spread_' + i:>12}" for i in impls)
    print(head)
    for x in group["summary"]:
        line = f"{size_label(x['bytes']):>10}"
        line += "".join(f" {x[i + '_busbw_GBs']:>8.4f}" for i in impls)
        line += "".join(f" {x[i + '_over_torch']:>11.2f}"
                        for i in ("hier", "flat") if i + "_over_torch" in x)
        if "hier_over_flat" in x:
            line += f" {x['hier_over_flat']:>9.2f}"
        if "arena_over_hier" in x:
            line += f" {x['arena_over_hier']:>10.2f}"
        line += "".join(f" {x['spread_' + i]:>12.0%}" for i in impls)
        print(line)
    sys.stdout.flush()


def plot_allreduce(path, groups, impls):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 5),
                             squeeze=False)
    styles = {"hier": "o-C0", "hier_arena": "D-C3", "flat": "s-C2",
              "torch": "^-C1"}
    for ax, g in zip(axes[0], groups):
        rows = g["summary"]
        sizes = [x["bytes"] for x in rows]
        for impl in impls:
            ax.plot(sizes, [x[impl + "_busbw_GBs"] for x in rows],
                    styles[impl], label=AR_LABELS[impl])
            lo = [x[impl + "_busbw_min_max"][0] for x in rows]
            hi = [x[impl + "_busbw_min_max"][1] for x in rows]
            ax.fill_between(sizes, lo, hi, color=styles[impl][-2:], alpha=0.15,
                            lw=0)
        ax.axhline(g["link_GBs"], color="k", ls="--", lw=1,
                   label=f"link rate ({g['rate']})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        step = max(1, (len(sizes) + 8) // 9)
        ax.set_xticks(sizes[::step], [size_label(s) for s in sizes[::step]])
        ax.minorticks_off()
        ax.set_xlabel("message size (bytes, log2 scale)")
        ax.set_ylabel("busbw (GB/s), log scale")
        ax.set_title(f"all-reduce, {g['hosts']} hosts x {g['per_host']} "
                     f"ranks, {g['rate']} links")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cmd_allreduce(a):
    rates = comma_list(a.rates)
    for r in rates:
        try:
            rate_bits(r)
        except ValueError as e:
            raise SystemExit(f"--rates: {e}")
    if a.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise SystemExit(f"--plot needs matplotlib: {sys.executable} -m "
                             "pip install matplotlib")
    wanted = comma_list(a.impls) if a.impls else [
        i for i in AR_IMPLS if i != "hier_arena" or a.arena]
    unknown = [i for i in wanted if i not in AR_IMPLS]
    if unknown:
        raise SystemExit(f"--impls: unknown {unknown} (of {list(AR_IMPLS)})")
    impls = [i for i in AR_IMPLS if i in wanted and
             (not i.startswith("hier") or a.per_host > 1)]
    if not impls:
        raise SystemExit("nothing to measure")
    if "hier" not in impls:
        print("--per-host 1: no hierarchical all-reduce to measure",
              file=sys.stderr)
    n = a.hosts * a.per_host
    bench = os.path.join(a.build, "bin", "allreduce_bench")
    torch_bench = [sys.executable, os.path.join(HERE, "torch_allreduce_bench.py")]
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f]
    env = base_env()
    info = machine(a.build)
    groups = []
    with tempfile.TemporaryDirectory() as tmp:
        for ri, rate in enumerate(rates):
            runs = {impl: [] for impl in impls}
            commands = {}
            with Cluster(a.hosts, rate, f"a{ri}") as c:
                for r in range(a.rounds):
                    for impl in impls:
                        label = f"{rate}-{impl}-{r}"
                        out = os.path.join(tmp, label + ".json")
                        print(f"[{rate}] round {r + 1}/{a.rounds}: {impl}",
                              file=sys.stderr, flush=True)
                        if impl == "torch":
                            argvs, envs = torch_job(
                                a, c, torch_bench + sweep + ["--json", out], env)
                            keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                    "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                    "MASTER_PORT", "GLOO_SOCKET_IFNAME",
                                    "OMP_NUM_THREADS")
                        else:
                            e = dict(env, RONDE_HIERARCHICAL=(
                                "1" if impl.startswith("hier") else "0"))
                            arena = ["--arena"] if impl == "hier_arena" else []
                            argvs = [ronderun_argv(
                                a, c, [bench] + sweep + arena + ["--json", out])]
                            envs = [e]
                            keys = ("RONDE_HIERARCHICAL", "OMP_NUM_THREADS")
                        t0 = time.monotonic()
                        run_procs(argvs, envs, label, tmp, a.run_timeout)
                        result = load(out)
                        result["wall_s"] = time.monotonic() - t0
                        want, got = AR_BACKEND.get(impl), result.get("backend")
                        if want and got != want:
                            raise SystemExit(
                                f"{impl} ran over {got}, not {want}: "
                                f"{shlex.join(argvs[0])}")
                        result["command"] = described(argvs, envs, keys)
                        commands.setdefault(impl, result["command"])
                        runs[impl].append(result)
            group = {"rate": rate, "rate_bits": rate_bits(rate),
                     "link_GBs": rate_bits(rate) / 8e9, "hosts": a.hosts,
                     "per_host": a.per_host, "ranks": n,
                     "summary": summarize_allreduce(runs, impls),
                     "commands": commands, "raw": runs}
            groups.append(group)
            print_allreduce(group, a.rounds, impls, n)
    info["load_avg_at_end"] = list(os.getloadavg())
    out = a.out or os.path.join(
        HERE, "results",
        f"cluster-allreduce-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump(repo_relative({"benchmark": "cluster-allreduce", "hosts": a.hosts,
                   "per_host": a.per_host, "ranks": n, "rounds": a.rounds,
                   "rates": rates, "impls": impls,
                   "sweep": {"b": a.b, "e": a.e, "f": a.f},
                   "command_line": [sys.executable] + sys.argv,
                   "machine": info, "groups": groups}), f, indent=1)
    print(f"wrote {out}", file=sys.stderr)
    if a.plot:
        plot_allreduce(a.plot, groups, impls)
        print(f"wrote {a.plot}", file=sys.stderr)


# ---------------------------------------------------------------- training

def cmd_train(a):
    try:
        rate_bits(a.rate)
    except ValueError as e:
        raise SystemExit(f"--rate: {e}")
    wires = comma_list(a.compression)
    bad = [w for w in wires if w not in ("fp16", "bf16") and
           not re.fullmatch(r"powersgd[1-9][0-9]*", w)]
    if bad:
        raise SystemExit(f"--compression: {', '.join(bad)} (fp16, bf16, "
                         "powersgdR)")
    n = a.hosts * a.per_host
    bench = os.path.join(a.build, "bin", "train_bench")
    ddp = [sys.executable, os.path.join(HERE, "ddp_train_bench.py")]
    common = ["--workload", a.workload, "--steps", str(a.steps),
              "--warmup", str(a.warmup)]
    env = base_env()
    extra_x = []
    if a.allocator == "tuned":
        # As run_train.py, for every program alike (see benchmarks/README.md);
        # ronderun forwards it to remote ranks with -x.
        env["GLIBC_TUNABLES"] = TUNABLES
        extra_x = ["GLIBC_TUNABLES"]
    impls = (["ronde"] + [f"ronde_{w}" for w in wires] + ["ddp"] +
             [f"ddp_{w}" for w in wires])
    runs = {impl: [] for impl in impls}
    commands = {}
    info = machine(a.build)
    with tempfile.TemporaryDirectory() as tmp:
        with Cluster(a.hosts, a.rate, "t") as c:
            for r in range(a.rounds):
                for impl in impls:
                    label = f"{a.workload}-{impl}-{r}"
                    out = os.path.join(tmp, label + ".json")
                    print(f"[{a.workload}, {a.rate}] round {r + 1}/{a.rounds}:"
                          f" {impl}", file=sys.stderr, flush=True)
                    if impl.startswith("ddp"):
                        wire = impl.split("_")[1] if "_" in impl else "none"
                        argvs, envs = torch_job(
                            a, c, ddp + common + ["--compression", wire,
                                                  "--json", out], env)
                        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                "MASTER_PORT", "GLOO_SOCKET_IFNAME",
                                "OMP_NUM_THREADS", "GLIBC_TUNABLES")
                    else:
                        wire = impl.split("_")[1] if "_" in impl else "none"
                        prog = [bench, "--mode", "ronde", "--compression",
                                wire] + common + ["--json", out]
                        argvs = [ronderun_argv(a, c, prog, extra_x)]
                        envs = [env]
                        keys = ("OMP_NUM_THREADS", "GLIBC_TUNABLES")
                    t0 = time.monotonic()
                    run_procs(argvs, envs, label, tmp, a.run_timeout)
                    result = load(out)
                    result["wall_s"] = time.monotonic() - t0
                    result["command"] = described(argvs, envs, keys)
                    commands.setdefault(impl, result["command"])
                    runs[impl].append(result)
    info["load_avg_at_end"] = list(os.getloadavg())

    def steps(impl):
        return [x["step_s"] for x in runs[impl]]

    row = {"workload": a.workload, "rate": a.rate,
           "link_GBs": rate_bits(a.rate) / 8e9, "hosts": a.hosts,
           "per_host": a.per_host, "ranks": n,
           "batch_per_rank": runs["ronde"][0]["batch_per_rank"]}
    for impl in impls:
        row[f"{impl}_step_s"] = statistics.median(steps(impl))
        row[f"{impl}_steps_s"] = steps(impl)
    row["ronde_wait_s"] = statistics.median(x["wait_s"] for x in runs["ronde"])
    row["ronde_wire_bytes"] = runs["ronde"][0]["wire_bytes"]
    row["ronde_over_ddp"] = row["ronde_step_s"] / row["ddp_step_s"]
    row["ronde_over_ddp_per_round"] = [
        x / y for x, y in zip(steps("ronde"), steps("ddp"))]
    row["compression"] = {}
    for w in wires:
        k = f"ronde_{w}"
        row["compression"][w] = {
            "step_s": row[f"{k}_step_s"], "steps_s": steps(k),
            "wait_s": statistics.median(x["wait_s"] for x in runs[k]),
            "wire_bytes": runs[k][0]["wire_bytes"],
            "over_uncompressed": row[f"{k}_step_s"] / row["ronde_step_s"],
            "over_uncompressed_per_round": [
                x / y for x, y in zip(steps(k), steps("ronde"))],
            "over_ddp": row[f"{k}_step_s"] / row["ddp_step_s"],
            # Against DDP with its own compression hook: the fair pairing.
            "over_ddp_hook": row[f"{k}_step_s"] / row[f"ddp_{w}_step_s"],
            "over_ddp_hook_per_round": [
                x / y for x, y in zip(steps(k), steps(f"ddp_{w}"))]}

    print(f"# training step, {a.workload}, {a.hosts} hosts x {a.per_host} "
          f"rank(s) x 1 thread at {a.rate} per host link; median over "
          f"{a.rounds} alternating rounds of the median of {a.steps} steps; "
          f"allocator {a.allocator}")
    print(f"{'mode':>15} {'step_ms':>9} {'samples/s':>9} per round (ms)")
    b = row["batch_per_rank"]
    for impl in impls:
        s = row[f"{impl}_step_s"]
        per = " ".join(f"{x * 1e3:.0f}" for x in steps(impl))
        print(f"{impl:>15} {s * 1e3:>9.1f} {n * b / s:>9.1f} {per}")
    rr = row["ronde_over_ddp_per_round"]
    print(f"ronde/ddp step time {row['ronde_over_ddp']:.3f} (per round "
          f"{min(rr):.3f}..{max(rr):.3f}); ronde waits "
          f"{row['ronde_wait_s'] * 1e3:.1f} ms per step on communication, "
          f"{row['ronde_wire_bytes'] / 2**20:.0f} MiB of gradients per rank")
    for w, x in row["compression"].items():
        rr = x["over_uncompressed_per_round"]
        print(f"ronde {w}/ronde uncompressed step time "
              f"{x['over_uncompressed']:.3f} (per round {min(rr):.3f}.."
              f"{max(rr):.3f}); {x['wire_bytes'] / 2**20:.2f} MiB on the "
              f"wire; ronde {w}/ddp {w} hook {x['over_ddp_hook']:.3f} "
              f"(per round {min(x['over_ddp_hook_per_round']):.3f}.."
              f"{max(x['over_ddp_hook_per_round']):.3f}); waits "
              f"{x['wait_s'] * 1e3:.1f} ms")
    out = a.out or os.path.join(
        HERE, "results",
        f"cluster-train-{datetime.date.today().isoformat()}.json")
    with open(out, "w") as f:
        json.dump(repo_relative({"benchmark": "cluster-train", "rounds": a.rounds,
                   "steps": a.steps, "warmup": a.warmup,
                   "allocator": a.allocator,
                   "glibc_tunables": env.get("GLIBC_TUNABLES", ""),
                   "impls": impls,
                   "command_line": [sys.executable] + sys.argv,
                   "machine": info, "commands": commands, "row": row,
                   "raw": runs}), f, indent=1)
    print(f"wrote {out}", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)

    def common(q, hosts, per_host):
        q.add_argument("--build", default=os.path.join(ROOT, "build"))
        q.add_argument("--hosts", type=int, default=hosts)
        q.add_argument("--per-host", type=int, default=per_host,
                       help="ranks per host")
        q.add_argument("--rounds", type=int, default=3)
        q.add_argument("--ronde-timeout", type=int, default=120,
                       help="ronderun --timeout: ronde's rendezvous and "
                            "collective timeout, seconds")
        q.add_argument("--run-timeout", type=int, default=1800,
                       help="seconds one program's run may take")
        q.add_argument("--out")

    q = sub.add_parser("allreduce", help="all-reduce sweep per link rate")
    common(q, 2, 2)
    q.add_argument("--rates", default="1gbit,5gbit",
                   help="per-host link rates, comma-separated")
    q.add_argument("-b", default="4K")
    q.add_argument("-e", default="256M")
    q.add_argument("-f", default="4")
    q.add_argument("--arena", action="store_true",
                   help="also hier_arena: hier with the buffer in the arena")
    q.add_argument("--impls", help="comma-separated subset of "
                   + ",".join(AR_IMPLS) + " (default: all but hier_arena, "
                   "which --arena adds)")
    q.add_argument("--plot", metavar="FILE.png",
                   help="busbw against size, one panel per rate")
    q = sub.add_parser("train", help="training step, ronde against DDP")
    common(q, 2, 1)
    q.add_argument("--rate", default="1gbit")
    q.add_argument("--workload", choices=["mlp", "cnn"], default="mlp")
    q.add_argument("--steps", type=int, default=6)
    q.add_argument("--warmup", type=int, default=2)
    q.add_argument("--compression", default="fp16",
                   help="ronde wire formats or hooks also measured, each "
                        "beside DDP's own (fp16,bf16,powersgd1,powersgd4...; "
                        "empty: none)")
    q.add_argument("--allocator", choices=["tuned", "default"],
                   default="tuned",
                   help="as run_train.py: tuned keeps glibc from unmapping "
                        "large gradient buffers")
    a = p.parse_args()
    if a.hosts < 2 or a.per_host < 1 or a.rounds < 1:
        p.error("--hosts must be at least 2, --per-host and --rounds 1")
    for prog in ("ronderun", "allreduce_bench" if a.cmd == "allreduce"
                 else "train_bench"):
        if not os.access(os.path.join(a.build, "bin", prog), os.X_OK):
            p.error(f"no {a.build}/bin/{prog}: build first")
    if subprocess.run([SIM, "check"]).returncode != 0:
        raise SystemExit("no simulated cluster can be made here (see above)")
    for s in SIGNALS:
        signal.signal(s, on_signal)
    try:
        (cmd_allreduce if a.cmd == "allreduce" else cmd_train)(a)
    except Interrupted:
        print("interrupted: the cluster is removed", file=sys.stderr)
        raise


if __name__ == "__main__":
    main()
