"""Runs the collective sweeps of ronde and of torch.distributed (gloo) side
by side, alternating them over several rounds (this machine is noisy), and
prints per rank count, collective and size the median over rounds of each
and their ratios.

    .venv/bin/python benchmarks/run_allreduce.py --np 2 --rounds 3
    .venv/bin/python benchmarks/run_allreduce.py --np 2,4 \\
        --ops allreduce,allgather --plot allreduce.png

Every round runs, for each rank count and collective in turn: `ronde`
(allreduce_bench in the default environment: shared memory between ranks
on one host), `ronde-gloo` (the same binary with RONDE_SHM=0: Gloo over
TCP) and `torch` (torch_allreduce_bench.py); and once per round
`allreduce_bench --memcpy`, one thread's memcpy at the same sizes, the
ceiling of a copy through shared memory. When `mpirun` and `mpicc` are
present (Debian's openmpi-bin and libopenmpi-dev; `scripts/dev.sh bench`
installs them), `mpi` joins every round too: mpi_allreduce_bench.c, built
here, under mpirun with Open MPI's defaults (its shared memory on one
host; it binds each rank to a core, ronderun does not). --no-mpi leaves
it out.

--background N runs N busy processes beside every program's turn (each
turn has its own, started before it and stopped after it), for the shared
cores a training machine has: a data loader, intra-op threads, another
job; --background-kind matmul makes them one process of N threads doing
float32 matmuls instead. Beside the median of the medians, each row then
gives the 90th percentile of one call (p90, the largest over ranks, median
over rounds) for ronde and Open MPI: the tail a median hides. --impls
picks programs (ronde,mpi,baseline,ronde-gloo,torch,ronde-unbound; the
last is ronde under ronderun --bind-to none: ronderun binds each rank to
its own share of the CPUs by default).

--baseline-build DIR adds one more program to every round: ronde as built
in DIR (another checkout, before a change), so that a change is measured
against what it changed in one command, alternating with it.

Writes benchmarks/results/allreduce-<date>.json unless --out says otherwise.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = ("allreduce", "broadcast", "allgather", "reducescatter")
# Summary and JSON key stem of each program.
KEYS = {"ronde": "ronde", "ronde-gloo": "ronde_gloo", "torch": "torch",
        "baseline": "baseline", "mpi": "mpi", "ronde-unbound": "ronde_unbound"}


def run(cmd, env):
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)


def comma_list(s):
    return [x.strip() for x in s.split(",") if x.strip()]


def size_label(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return str(n)


def summarize(runs, memcpy_runs, impls):
    """Per size: the median over rounds of each program, and the ratios."""
    sizes = [row["bytes"] for row in runs["ronde"][0]["results"]]
    for impl, rs in list(runs.items()) + [("memcpy", memcpy_runs)]:
        for r in rs:
            if r["results"] and len(r["results"]) != len(sizes):
                raise SystemExit(f"{impl}: {len(r['results'])} sizes, ronde "
                                 f"{len(sizes)}: the sweeps differ")

    def per_size(rs, key):
        """Medians by size; None where a program has no results (torch with
        a collective its Gloo does not run)."""
        if not all(r["results"] and key in r["results"][0] for r in rs):
            return [None] * len(sizes)
        return [statistics.median(r["results"][i][key] for r in rs)
                for i in range(len(sizes))]

    def spread(impl, i):
        if impl not in runs or not all(r["results"] for r in runs[impl]):
            return None
        vals = [r["results"][i]["busbw_GBs"] for r in runs[impl]]
        return (max(vals) - min(vals)) / statistics.median(vals)

    bw = {impl: per_size(runs[impl], "busbw_GBs") for impl in impls}
    for impl in KEYS:
        bw.setdefault(impl, [None] * len(sizes))
    rt = per_size(runs["ronde"], "time_us")
    nc = per_size(runs["ronde"], "nocheck_time_us")
    r90 = per_size(runs["ronde"], "p90_time_us")
    mt = per_size(runs["mpi"], "time_us") if "mpi" in impls else None
    m90 = per_size(runs["mpi"], "p90_time_us") if "mpi" in impls else None
    # Matched by position in the sweep: allgather's and reducescatter's
    # bytes are rounded to a multiple of the rank count, memcpy's are not.
    mc = per_size(memcpy_runs, "busbw_GBs")

    def div(x, y):
        return x / y if x is not None and y else None

    p50 = {impl: per_size(runs[impl], "time_us") for impl in impls}
    p90 = {impl: per_size(runs[impl], "p90_time_us") for impl in impls}
    rows = []
    for i, size in enumerate(sizes):
        row = {"bytes": size}
        for impl in impls:
            row[KEYS[impl] + "_busbw_GBs"] = bw[impl][i]
            if impl != "torch":
                row[KEYS[impl] + "_p50_us"] = p50[impl][i]
                row[KEYS[impl] + "_p90_us"] = p90[impl][i]
        row.update(memcpy_GBs=mc[i],
                   ratio=div(bw["ronde"][i], bw["torch"][i]),
                   vs_gloo=div(bw["ronde"][i], bw["ronde-gloo"][i]),
                   of_memcpy=div(bw["ronde"][i], mc[i]),
                   ronde_time_us=rt[i], ronde_nocheck_time_us=nc[i],
                   ronde_p90_us=r90[i],
                   check_cost=(rt[i] - nc[i]) / nc[i],
                   spread_ronde=spread("ronde", i),
                   spread_torch=spread("torch", i))
        if "baseline" in impls:
            row["vs_baseline"] = div(bw["ronde"][i], bw["baseline"][i])
        if "mpi" in impls:
            row["vs_mpi"] = div(bw["ronde"][i], bw["mpi"][i])
            row["mpi_time_us"] = mt[i]
            row["mpi_p90_us"] = m90[i]
        rows.append(row)
    return rows


def print_table(np_, op, rounds, rows, baseline, torch_note, mpi):
    def f(x, spec, width):
        return f"{'-':>{width}}" if x is None else f"{x:>{width}{spec}}"

    print(f"# {op}, {np_} ranks, float32; median over {rounds} alternating "
          f"rounds; busbw and memcpy in GB/s" +
          (f"; torch: {torch_note}" if torch_note else ""))
    print(f"{'bytes':>11} {'ronde':>8} {'ronde-gloo':>10} {'torch':>8} "
          f"{'memcpy':>8} {'ratio':>6} {'vs_gloo':>7} {'of_mcpy':>7} "
          f"{'time_us':>9} {'p90_us':>8} {'spread_r':>8} {'spread_t':>8} "
          f"{'check_cost':>10}"
          + (f" {'baseline':>8} {'vs_base':>7}" if baseline else "")
          + (f" {'mpi':>8} {'mpi_us':>8} {'mpi_p90':>8} {'vs_mpi':>6}"
             if mpi else ""))
    for x in rows:
        line = (f"{x['bytes']:>11} {f(x['ronde_busbw_GBs'], '.3f', 8)} "
                f"{f(x.get('ronde_gloo_busbw_GBs'), '.3f', 10)} "
                f"{f(x.get('torch_busbw_GBs'), '.3f', 8)} "
                f"{f(x['memcpy_GBs'], '.2f', 8)} {f(x.get('ratio'), '.2f', 6)} "
                f"{f(x.get('vs_gloo'), '.2f', 7)} {f(x['of_memcpy'], '.2%', 7)} "
                f"{x['ronde_time_us']:>9.1f} {f(x['ronde_p90_us'], '.1f', 8)} "
                f"{f(x['spread_ronde'], '.0%', 8)} "
                f"{f(x['spread_torch'], '.0%', 8)} {x['check_cost']:>10.0%}")
        if baseline:
            line += (f" {f(x['baseline_busbw_GBs'], '.3f', 8)} "
                     f"{f(x['vs_baseline'], '.2f', 7)}")
        if mpi:
            line += (f" {f(x['mpi_busbw_GBs'], '.3f', 8)} "
                     f"{f(x['mpi_time_us'], '.1f', 8)} "
                     f"{f(x['mpi_p90_us'], '.1f', 8)} "
                     f"{f(x['vs_mpi'], '.2f', 6)}")
        print(line)
    # One call's time: the median and the 90th percentile (the largest over
    # ranks, median over rounds), per program.
    timed = [k for k in ("ronde", "ronde_unbound", "baseline", "mpi")
             if rows[0].get(f"{k}_p50_us") is not None]
    print(f"{'bytes':>11} " + " ".join(f"{k + ' p50/p90 us':>24}"
                                        for k in timed))
    for x in rows:
        print(f"{x['bytes']:>11} " + " ".join(
            f"{f(x[k + '_p50_us'], '.1f', 11)} /"
            f"{f(x[k + '_p90_us'], '.1f', 11)}" for k in timed))
    sys.stdout.flush()


def plot(path, groups, memcpy_rows):
    """busbw against size for allreduce, one panel per rank count."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = [g for g in groups if g["op"] == "allreduce"]
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 5),
                             squeeze=False)
    for ax, g in zip(axes[0], groups):
        rows = g["summary"]
        sizes = [x["bytes"] for x in rows]
        for key, label, style in (
                ("ronde", "ronde (shared memory)", "o-C0"),
                ("ronde_gloo", "ronde, RONDE_SHM=0 (Gloo TCP)", "s-C2"),
                ("torch", "torch.distributed (gloo)", "^-C1"),
                ("mpi", "Open MPI (shared memory)", "d-C3"),
                ("baseline", "ronde, baseline build", "x:C7")):
            med = [x.get(key + "_busbw_GBs") for x in rows]
            if all(v is not None for v in med):
                ax.plot(sizes, med, style, label=label)
        ax.plot(sizes, [x["GBs"] for x in memcpy_rows][:len(sizes)], "--k",
                lw=1, label="memcpy, one thread (GB/s)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        step = max(1, (len(sizes) + 8) // 9)
        ax.set_xticks(sizes[::step], [size_label(s) for s in sizes[::step]])
        ax.minorticks_off()
        ax.set_xlabel("message size (bytes, log2 scale)")
        ax.set_ylabel("busbw (GB/s), log scale")
        ax.set_title(f"all-reduce, float32 sum, {g['ranks']} ranks")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


EXPECTED_BACKEND = {"ronde": "shm", "ronde-gloo": "gloo",
                    "ronde-unbound": "shm"}


def build_mpi_bench(tmp):
    """mpi_allreduce_bench built with mpicc into tmp, or None without MPI."""
    import shutil
    if not (shutil.which("mpirun") and shutil.which("mpicc")):
        return None
    exe = os.path.join(tmp, "mpi_allreduce_bench")
    subprocess.run(["mpicc", "-O2", "-o", exe,
                    os.path.join(ROOT, "benchmarks", "mpi_allreduce_bench.c")],
                   check=True)
    return exe


def mpirun(np_):
    """mpirun for np_ ranks on this host, as root too, more ranks than
    cores allowed."""
    cmd = ["mpirun", "-np", str(np_)]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    if np_ > (os.cpu_count() or 1):
        cmd.append("--oversubscribe")
    return cmd


BUSY = "while True: pass"
MATMUL = ("import sys, torch\n"
          "torch.set_num_threads(int(sys.argv[1]))\n"
          "a = torch.randn(512, 512)\n"
          "while True: a @ a\n")


class Background:
    """N busy processes (or one process of N matmul threads) for the
    duration of a `with`: shared cores."""

    def __init__(self, n, kind):
        self.n, self.kind, self.procs = n, kind, []

    def __enter__(self):
        if self.n > 0 and self.kind == "busy":
            self.procs = [subprocess.Popen([sys.executable, "-c", BUSY])
                          for _ in range(self.n)]
        elif self.n > 0:
            self.procs = [subprocess.Popen(
                [sys.executable, "-c", MATMUL, str(self.n)],
                env=dict(os.environ, OMP_NUM_THREADS=str(self.n)))]
        return self

    def __exit__(self, *exc):
        for p in self.procs:
            p.kill()
        for p in self.procs:
            p.wait()
        return False


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--bench",
                   help="allreduce_bench to run (default: BUILD/bin/"
                        "allreduce_bench); ronderun still comes from BUILD")
    p.add_argument("--np", default="2",
                   help="rank counts, comma-separated (e.g. 2,4)")
    p.add_argument("--ops", default="allreduce",
                   help="collectives, comma-separated, of " + ",".join(OPS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("-b", default="4K")
    p.add_argument("-e", default="256M")
    p.add_argument("-f", default="2")
    p.add_argument("--baseline-build",
                   help="also run ronde from this build, in every round")
    p.add_argument("--no-mpi", action="store_true",
                   help="leave Open MPI out even where mpirun is present")
    p.add_argument("--plot", metavar="FILE.png",
                   help="draw allreduce busbw against size, one panel per "
                        "rank count")
    p.add_argument("--background", type=int, default=0, metavar="N",
                   help="N busy processes beside every program's turn")
    p.add_argument("--background-kind", choices=("busy", "matmul"),
                   default="busy",
                   help="busy: N Python busy loops; matmul: one process of "
                        "N threads doing matmuls")
    p.add_argument("--impls", default="ronde,ronde-gloo,torch,mpi,baseline",
                   help="programs to run, comma-separated (ronde always)")
    p.add_argument("--out")
    a = p.parse_args()
    try:
        nps = [int(x) for x in comma_list(a.np)]
    except ValueError:
        p.error(f"--np: not a comma-separated list of integers: {a.np}")
    if not nps or min(nps) < 1:
        p.error(f"--np: rank counts must be at least 1: {a.np}")
    ops = comma_list(a.ops)
    unknown = [op for op in ops if op not in OPS]
    if unknown or not ops:
        p.error(f"--ops: unknown {', '.join(unknown) or '(empty)'}; choose "
                f"from {', '.join(OPS)}")
    if a.plot:
        if "allreduce" not in ops:
            p.error("--plot draws allreduce: add it to --ops")
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error(f"--plot needs matplotlib: {sys.executable} -m pip "
                    "install matplotlib")
    ronderun = os.path.join(a.build, "bin", "ronderun")
    bench = a.bench or os.path.join(a.build, "bin", "allreduce_bench")
    base_env = dict(os.environ, OMP_NUM_THREADS="1")
    base_env.pop("RONDE_SHM", None)  # ronde: the default, shared memory
    envs = {"ronde": base_env, "ronde-gloo": dict(base_env, RONDE_SHM="0"),
            "torch": base_env, "baseline": base_env}
    if a.baseline_build:
        # Its own libronde first, also when its binaries' run path names
        # the build they were copied from.
        lib = os.path.join(os.path.abspath(a.baseline_build), "lib")
        envs["baseline"] = dict(base_env, LD_LIBRARY_PATH=os.pathsep.join(
            filter(None, [lib, base_env.get("LD_LIBRARY_PATH")])))
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f]
    wanted = set(comma_list(a.impls)) | {"ronde"}
    impls = [i for i in ["ronde", "ronde-gloo", "torch", "ronde-unbound"]
             if i in wanted] + (
        ["baseline"] if a.baseline_build and "baseline" in wanted else [])
    groups = [(np_, op) for np_ in nps for op in ops]
    raw = {g: {impl: [] for impl in impls} for g in groups}
    memcpy_raw = []
    torch_bench = [sys.executable,
                   os.path.join(ROOT, "benchmarks", "torch_allreduce_bench.py")]
    with tempfile.TemporaryDirectory() as tmp:
        mpi_bench = (None if a.no_mpi or "mpi" not in wanted
                     else build_mpi_bench(tmp))
        if mpi_bench:
            impls.append("mpi")
            for g in groups:
                raw[g]["mpi"] = []
        else:
            print("no mpirun/mpicc (or --no-mpi): no Open MPI line",
                  file=sys.stderr)
        for r in range(a.rounds):
            out = os.path.join(tmp, f"memcpy{r}.json")
            print(f"round {r + 1}/{a.rounds}: memcpy", file=sys.stderr)
            run([bench, "--memcpy"] + sweep + ["--json", out], base_env)
            with open(out) as f:
                memcpy_raw.append(json.load(f))
            for np_, op in groups:
                # allreduce is the default: a baseline without --op runs it.
                op_args = [] if op == "allreduce" else ["--op", op]
                for impl in impls:
                    out = os.path.join(tmp, f"{impl}-{np_}-{op}-{r}.json")
                    launcher, prog = ronderun, [bench]
                    if impl == "torch":
                        prog = torch_bench
                    elif impl == "mpi":
                        launcher, prog = None, mpirun(np_) + [mpi_bench]
                    elif impl == "baseline":
                        launcher = os.path.join(a.baseline_build, "bin",
                                                "ronderun")
                        prog = [os.path.join(a.baseline_build, "bin",
                                             "allreduce_bench")]
                    print(f"round {r + 1}/{a.rounds}: {np_} ranks, {op}, "
                          f"{impl}", file=sys.stderr)
                    head = [launcher, "-np", str(np_)] + (
                        ["--bind-to", "none"] if impl == "ronde-unbound"
                        else []) + ["--"] if launcher else []
                    with Background(a.background, a.background_kind):
                        run(head + prog + sweep + op_args + ["--json", out],
                            envs.get(impl, base_env))
                    with open(out) as f:
                        result = json.load(f)
                    # A ronde line that silently ran on another backend
                    # (shared memory unavailable) would mislabel the figure.
                    want = EXPECTED_BACKEND.get(impl)
                    got = result.get("backend")
                    if want and got and got != want:
                        sys.exit(f"{impl} ran over {got}, not {want}: see "
                                 "its warning line above")
                    raw[(np_, op)][impl].append(result)

    memcpy_sizes = [row["bytes"] for row in memcpy_raw[0]["results"]]
    memcpy_rows = [
        {"bytes": size, "GBs": statistics.median(
            run["results"][i]["busbw_GBs"] for run in memcpy_raw)}
        for i, size in enumerate(memcpy_sizes)]
    out_groups = []
    for np_, op in groups:
        runs = raw[(np_, op)]
        torch_note = (runs["torch"][0].get("unsupported")
                      if "torch" in runs else None)
        rows = summarize(runs, memcpy_raw, impls)
        print_table(np_, op, a.rounds, rows, bool(a.baseline_build),
                    torch_note and "unsupported, " + torch_note,
                    "mpi" in impls)
        group = {"ranks": np_, "op": op, "summary": rows, "raw": runs}
        if torch_note:
            group["torch_unsupported"] = torch_note
        out_groups.append(group)
    out = a.out or os.path.join(
        ROOT, "benchmarks", "results",
        f"allreduce-{datetime.date.today().isoformat()}.json")
    first = out_groups[0]
    with open(out, "w") as f:
        # The first group's summary and raw runs at the top level too, as
        # before rank counts and collectives could be several (run_all.py
        # reads them there).
        json.dump({"benchmark": "allreduce", "ranks": first["ranks"],
                   "op": first["op"], "rounds": a.rounds, "nps": nps,
                   "background": a.background,
                   "background_kind": a.background_kind,
                   "ops": ops, "impls": impls, "summary": first["summary"],
                   "raw": first["raw"],
                   "memcpy": {"summary": memcpy_rows, "raw": memcpy_raw},
                   "groups": out_groups}, f, indent=1)
    print(f"wrote {out}", file=sys.stderr)
    if a.plot:
        plot(a.plot, out_groups, memcpy_rows)
        print(f"wrote {a.plot}", file=sys.stderr)


if __name__ == "__main__":
    main()
