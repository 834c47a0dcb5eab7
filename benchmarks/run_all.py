"""The benchmark report in one command: runs the all-reduce sweep, the fusion
benchmark and the training benchmark (each beside its PyTorch baseline,
through their own drivers), then writes one JSON with the machine it ran on
and the PNG figures that benchmarks/README.md explains.

    .venv/bin/python benchmarks/run_all.py            # full report
    .venv/bin/python benchmarks/run_all.py --quick    # smoke run, a minute or two
    .venv/bin/python benchmarks/run_all.py --only allreduce,train
    .venv/bin/python benchmarks/run_all.py --replot benchmarks/results/DATE.json

Writes benchmarks/results/<date>.json and benchmarks/results/<date>/*.png
(<date>-quick with --quick).
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "benchmarks")
BENCHMARKS = ("allreduce", "fusion", "train")

# Driver arguments: the drivers' own defaults (3 rounds each), but 5 timed
# training steps per run instead of 6: training is most of the report's time.
FULL = {"allreduce": [], "fusion": [], "train": ["--steps", "5"]}
QUICK = {
    "allreduce": ["-b", "4K", "-e", "4M", "-f", "4"],
    "fusion": ["--steps", "1"],
    "train": ["--steps", "2", "--compression", ""],
}


def rel(path):
    """A path as the report records it: relative to the project when inside."""
    path = os.path.abspath(path)
    inside = os.path.commonpath([path, ROOT]) == ROOT
    return os.path.relpath(path, ROOT) if inside else path


def capture(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True,
                              cwd=ROOT).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def machine_info(build):
    info = {"cpu_count": os.cpu_count(),
            "cpus_usable": len(os.sched_getaffinity(0)),
            "cpu_model": None, "mem_total_gib": None,
            "platform": platform.platform(),
            "python": platform.python_version(),
            "load_avg_at_start": list(os.getloadavg())}
    try:
        with open("/proc/cpuinfo") as f:
            models = [l.split(":", 1)[1].strip() for l in f
                      if l.startswith("model name")]
        info["cpu_model"] = models[0] if models else None
        with open("/proc/meminfo") as f:
            kib = int(next(l for l in f if l.startswith("MemTotal")).split()[1])
        info["mem_total_gib"] = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    # In a child: importing torch here would hold its memory during the runs.
    info["torch"] = capture([sys.executable, "-c",
                             "import torch; print(torch.__version__)"])
    info["git_commit"] = capture(["git", "rev-parse", "HEAD"])
    status = capture(["git", "status", "--porcelain", "--untracked-files=no"])
    info["git_dirty"] = bool(status) if status is not None else None
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            m = re.search(r"^CMAKE_BUILD_TYPE:\w+=(.*)$", f.read(), re.M)
        info["build_type"] = m.group(1) if m else None
    except OSError:
        info["build_type"] = None
    return info


def run_driver(name, a, extra, tmp):
    """Runs one benchmark's driver; returns its JSON and the table it printed."""
    out = os.path.join(tmp, name + ".json")
    common = ["--build", a.build, "--np", str(a.np), "--out", out]
    if a.rounds:
        extra = extra + ["--rounds", str(a.rounds)]
    if name == "allreduce":
        cmd = [sys.executable, os.path.join(HERE, "run_allreduce.py")] + common + extra
    elif name == "train":
        cmd = [sys.executable, os.path.join(HERE, "run_train.py")] + common + extra
    else:
        b = os.path.join(a.build, "bin")
        cmd = ([os.path.join(b, "ronderun"), "-np", str(a.np), "--",
                os.path.join(b, "fusion_bench"), "--json", out] + extra)
    print(f"== {name}", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    # stdout (the driver's table) is kept for the report; progress on stderr
    # goes straight to the terminal.
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    sys.stdout.write(p.stdout)
    sys.stdout.flush()
    if p.returncode != 0:
        raise SystemExit(f"the {name} benchmark failed (exit {p.returncode}): "
                         + " ".join(rel(c) if os.path.isabs(c) else c for c in cmd))
    with open(out) as f:
        result = json.load(f)
    return result, p.stdout, time.monotonic() - t0


# ---------------------------------------------------------------- headline

BANDS = (("up to 64 KiB", 0, 64 << 10), ("128 KiB to 4 MiB", 64 << 10, 4 << 20),
         ("8 MiB and up", 4 << 20, float("inf")))


def headline(report):
    """The few numbers worth quoting, recomputed from the medians."""
    h = {}
    if "allreduce" in report:
        rows = report["allreduce"]["summary"]
        h["allreduce_ratio"] = {}
        for band, lo, hi in BANDS:
            r = [x["ratio"] for x in rows if lo < x["bytes"] <= hi]
            if r:
                h["allreduce_ratio"][band] = {"median": statistics.median(r),
                                              "min": min(r), "max": max(r)}
    if "fusion" in report:
        res = {x["mode"]: x["step_ms"] for x in report["fusion"]["results"]}
        buckets = {k: v for k, v in res.items() if k.startswith("buckets_")}
        best = min(buckets, key=buckets.get)
        h["fusion"] = {"best": best, "best_step_ms": buckets[best],
                       "per_tensor_step_ms": res.get("per_tensor"),
                       "flat_buffer_step_ms": res.get("flat_buffer"),
                       "backward_only_ms": res.get("backward_only"),
                       "default_vs_best": report["fusion"].get("default_vs_best"),
                       "best_mode": report["fusion"].get("best_mode")}
    if "train" in report:
        h["train"] = {}
        for row in report["train"]["rows"]:
            h["train"][row["workload"]] = {
                k: row[k] for k in ("ronde_over_ddp", "ronde_eff_local",
                                    "ronde_eff_local2", "ddp_eff_local",
                                    "ddp_eff_local2")}
    return h


def print_headline(h):
    print("\n# headline")
    for band, r in h.get("allreduce_ratio", {}).items():
        print(f"all-reduce busbw ronde/torch, {band}: median {r['median']:.2f} "
              f"({r['min']:.2f}..{r['max']:.2f})")
    if "fusion" in h:
        f = h["fusion"]
        print(f"fusion: best {f['best']} {f['best_step_ms']:.0f} ms per step; "
              f"per tensor {f['per_tensor_step_ms']:.0f} ms, flat buffer "
              f"{f['flat_buffer_step_ms']:.0f} ms, backward alone "
              f"{f['backward_only_ms']:.0f} ms")
        if f.get("default_vs_best"):
            print(f"fusion: the default size is {f['default_vs_best']:.3f}x the "
                  f"best mode ({f['best_mode']}), step by step")
    for wl, t in h.get("train", {}).items():
        print(f"train {wl}: ronde/ddp step {t['ronde_over_ddp']:.3f}; efficiency "
              f"vs local ronde {t['ronde_eff_local']:.0%} ddp "
              f"{t['ddp_eff_local']:.0%}, vs local2 ronde "
              f"{t['ronde_eff_local2']:.0%} ddp {t['ddp_eff_local2']:.0%}")


# ------------------------------------------------------------------ figures

def size_label(n):
    for unit, shift in (("G", 30), ("M", 20), ("K", 10)):
        if n >= 1 << shift:
            return f"{n >> shift}{unit}"
    return str(n)


def plot_allreduce(plt, d, path):
    rows = d["summary"]
    sizes = [x["bytes"] for x in rows]
    raw, n = d["raw"], len(d["raw"]["ronde"])
    fig, (ax, ax2) = plt.subplots(2, 1, sharex=True, figsize=(8, 7),
                                  gridspec_kw={"height_ratios": [2, 1]})
    for impl, label, color in (("ronde", "ronde", "C0"),
                               ("torch", "torch.distributed (gloo)", "C1")):
        med = [x[impl + "_busbw_GBs"] for x in rows]
        per = [[run["results"][i]["busbw_GBs"] for run in raw[impl]]
               for i in range(len(sizes))]
        ax.plot(sizes, med, "o-", color=color, label=label)
        if n > 1:
            ax.fill_between(sizes, [min(v) for v in per], [max(v) for v in per],
                            color=color, alpha=0.2, lw=0)
    ax.set_yscale("log")
    ax.set_ylabel("busbw (GB/s), log scale")
    ax.set_title(f"all-reduce, float32 sum, {d['ranks']} ranks: median of "
                 f"{n} round(s)" + (", band min-max" if n > 1 else ""))
    ax.legend(loc="upper left")
    ratio = [x["ratio"] for x in rows]
    ax2.plot(sizes, ratio, "o-", color="C2", label="median ronde / median torch")
    if n > 1:
        per = [[r["results"][i]["busbw_GBs"] / t["results"][i]["busbw_GBs"]
                for r, t in zip(raw["ronde"], raw["torch"])]
               for i in range(len(sizes))]
        ax2.fill_between(sizes, [min(v) for v in per], [max(v) for v in per],
                         color="C2", alpha=0.2, lw=0, label="per round, min-max")
    ax2.axhline(1, color="gray", ls="--", lw=1)
    ax2.set_ylim(bottom=0)
    ax2.set_ylabel("ronde / torch busbw\n(above 1: ronde faster)")
    ax2.set_xlabel("message size (bytes, log2 scale)")
    ax2.legend(loc="best", fontsize="small")
    ax2.set_xscale("log", base=2)
    step = max(1, (len(sizes) + 8) // 9)
    ax2.set_xticks(sizes[::step], [size_label(s) for s in sizes[::step]])
    ax2.minorticks_off()
    for a in (ax, ax2):
        a.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train_modes(row):
    """(label, median s, per-round s, colour, hatch) for each bar of a workload."""
    modes = [("local", row["local_step_s"], row.get("local_steps_s"), "0.55", ""),
             ("local2", row["local2_step_s"], row.get("local2_steps_s"), "0.8", ""),
             ("ronde", row["ronde_step_s"], row.get("ronde_steps_s"), "C0", ""),
             ("DDP", row["ddp_step_s"], row.get("ddp_steps_s"), "C1", "")]
    for c, info in row.get("compression", {}).items():
        modes.append((f"ronde\n{c}", info["step_s"], info.get("steps_s"),
                      "C0", "//"))
    return [(l, m, per or [m], col, h) for l, m, per, col, h in modes]


def plot_train_steps(plt, d, path):
    rows = d["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4.8),
                             squeeze=False)
    for ax, row in zip(axes[0], rows):
        modes = train_modes(row)
        x = range(len(modes))
        med = [m * 1e3 for _, m, _, _, _ in modes]
        err = [[(m - min(p)) * 1e3 for _, m, p, _, _ in modes],
               [(max(p) - m) * 1e3 for _, m, p, _, _ in modes]]
        bars = ax.bar(x, med, yerr=err, capsize=4,
                      color=[c for *_, c, _ in modes],
                      hatch=[h for *_, h in modes], edgecolor="white")
        ax.bar_label(bars, fmt="%.0f", padding=2, fontsize="small")
        ax.set_xticks(list(x), [l for l, *_ in modes])
        ax.set_ylabel("step time (ms), lower is better")
        ax.set_title(f"{row['workload']}: batch {row['batch_per_rank']} per rank, "
                     f"{row['ranks']} ranks")
        ax.grid(True, axis="y", alpha=0.3)
        ax.margins(y=0.12)
    fig.suptitle(f"training step: median of {d['rounds']} round(s), "
                 "whiskers min-max over rounds")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def efficiencies(row, impl, base):
    """The efficiency from the medians, and one per round (round r's baseline
    over round r's mode: they ran back to back)."""
    med = row[f"{impl}_eff_{base}"] if impl != "local2" else (
        row["local_step_s"] / row["local2_step_s"])
    b = row.get(f"{base}_steps_s")
    m = row.get(f"{impl}_steps_s")
    per = [x / y for x, y in zip(b, m)] if b and m else [med]
    return med, per


def plot_scaling(plt, d, path):
    rows = d["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(5.5 * len(rows), 4.8),
                             squeeze=False)
    for ax, row in zip(axes[0], rows):
        # (mode, baseline, colour): dark bars against one process alone, light
        # ones against local2, the ceiling when ranks share the machine.
        bars = (("local2", "local", "0.55"),
                ("ronde", "local", "C0"), ("ronde", "local2", "#9ecae1"),
                ("ddp", "local", "C1"), ("ddp", "local2", "#fdd0a2"))
        xs = [0, 1.2, 2, 3.2, 4]
        top = 100
        for xpos, (impl, base, color) in zip(xs, bars):
            med, per = efficiencies(row, impl, base)
            # The ratio of medians need not lie between the per-round ratios.
            lo, hi = min(per + [med]), max(per + [med])
            b = ax.bar(xpos, med * 100, width=0.75, color=color,
                       yerr=[[(med - lo) * 100], [(hi - med) * 100]], capsize=4)
            ax.bar_label(b, fmt="%.0f%%", padding=2, fontsize="small")
            top = max(top, max(per) * 100)
        names = {"local2": "local2", "ronde": "ronde", "ddp": "DDP"}
        ax.set_xticks(xs, [f"{names[i]}\nvs {b}" for i, b, _ in bars])
        ax.axhline(100, color="gray", ls="--", lw=1)
        ax.set_ylabel("scaling efficiency (%), higher is better")
        ax.set_title(f"{row['workload']}: {row['ranks']} ranks")
        ax.grid(True, axis="y", alpha=0.3)
        ax.set_ylim(0, top * 1.12)
    fig.suptitle("throughput of N ranks / (N x one process's); vs local2: "
                 "/ N processes side by side")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def default_threshold_mb():
    try:
        with open(os.path.join(ROOT, "plugin", "include", "ronde",
                               "optimizer_options.h")) as f:
            m = re.search(r"kDefaultFusionThresholdMb\s*=\s*([\d.]+)", f.read())
        return float(m.group(1)) if m else None
    except OSError:
        return None


def plot_fusion(plt, d, path):
    res = {x["mode"]: x["step_ms"] for x in d["results"]}
    pts = sorted((float(k[len("buckets_"):-2]), v) for k, v in res.items()
                 if k.startswith("buckets_"))
    fig, ax = plt.subplots(figsize=(8, 5.6))
    th, ms = [p[0] for p in pts], [p[1] for p in pts]
    ax.plot(th, ms, "o-", color="C0", label="DistributedOptimizer buckets")
    best = min(pts, key=lambda p: p[1])
    ax.plot([best[0]], [best[1]], "*", ms=16, color="C0")
    ax.annotate(f"best: {best[0]:g} MB, {best[1]:.0f} ms", best,
                textcoords="offset points", xytext=(0, -14), ha="center", va="top",
                fontsize="small")
    for mode, label, color, ls in (
            ("per_tensor", "one all-reduce per tensor", "C3", "--"),
            ("flat_buffer", "one flat buffer (pack, reduce, unpack)", "C4", "-."),
            ("backward_only", "backward alone (no communication)", "gray", ":")):
        if mode in res:
            ax.axhline(res[mode], color=color, ls=ls,
                       label=f"{label}: {res[mode]:.0f} ms")
    dflt = d.get("default_mb") or default_threshold_mb()
    if dflt:
        ax.axvline(dflt, color="C2", lw=1, alpha=0.6,
                   label=f"default fusion_threshold_mb ({dflt:g})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(th, [f"{t:g}" for t in th])
    ax.minorticks_off()
    ax.set_ylim(0, max(res.values()) * 1.1)
    ax.set_xlabel("bucket threshold (MB, log2 scale)")
    ax.set_ylabel("step time (ms), lower is better")
    ax.set_title(f"fusion: ResNet-50 gradients ({d['tensors']} tensors, "
                 f"{d['params'] / 1e6:.1f}M params), {d['ranks']} ranks")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2,
              fontsize="small")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_all(report, fig_dir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(fig_dir, exist_ok=True)
    jobs = (("allreduce", "allreduce_busbw.png", plot_allreduce),
            ("train", "train_step_time.png", plot_train_steps),
            ("train", "train_scaling_efficiency.png", plot_scaling),
            ("fusion", "fusion_threshold.png", plot_fusion))
    written = []
    for bench, name, fn in jobs:
        if bench in report:
            path = os.path.join(fig_dir, name)
            fn(plt, report[bench], path)
            written.append(path)
    return written


def check_outputs(json_path, figures, benches):
    """Reads back what was written: the report fails rather than leave a
    broken file behind."""
    import matplotlib.image
    with open(json_path) as f:
        report = json.load(f)
    missing = [b for b in benches if b not in report]
    if missing:
        raise SystemExit(f"{json_path}: no results for {', '.join(missing)}")
    for path in figures:
        with open(path, "rb") as f:
            if f.read(8) != b"\x89PNG\r\n\x1a\n":
                raise SystemExit(f"{path}: not a PNG")
        h, w = matplotlib.image.imread(path).shape[:2]
        if h < 100 or w < 100:
            raise SystemExit(f"{path}: {w}x{h} pixels, too small to be a figure")


def need_matplotlib():
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit(
            f"matplotlib is not installed for {sys.executable}, and the report "
            "draws its figures with it. Install it with\n"
            f"  {sys.executable} -m pip install matplotlib\n"
            "(scripts/dev.sh setup does so in the project venv), or pass "
            "--no-plots for the JSON alone.")


def main():
    p = argparse.ArgumentParser(
        description="Runs every benchmark beside its PyTorch baseline and "
                    "writes one JSON and its figures.")
    p.add_argument("--build", default=os.path.join(ROOT, "build"),
                   help="build directory holding bin/ (default: build)")
    p.add_argument("--only", default=",".join(BENCHMARKS),
                   help="comma-separated subset of " + ",".join(BENCHMARKS))
    p.add_argument("--quick", action="store_true",
                   help="few sizes, one round, few steps: a smoke run")
    p.add_argument("--rounds", type=int,
                   help="rounds for every benchmark (default: 3, 1 with --quick)")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--out-dir", help="where the JSON and the figure folder go "
                   "(default: benchmarks/results; with --replot, the JSON's folder)")
    p.add_argument("--name", help="file name stem (default: the date, "
                   "<date>-quick with --quick)")
    p.add_argument("--no-plots", action="store_true", help="JSON only")
    p.add_argument("--replot", metavar="JSON",
                   help="draw the figures of an existing report; run nothing")
    a = p.parse_args()
    if not a.no_plots:
        need_matplotlib()

    if a.replot:
        with open(a.replot) as f:
            report = json.load(f)
        out_dir = a.out_dir or os.path.dirname(os.path.abspath(a.replot))
        name = a.name or os.path.splitext(os.path.basename(a.replot))[0]
        figures = plot_all(report, os.path.join(out_dir, name))
        check_outputs(a.replot, figures, [b for b in BENCHMARKS if b in report])
        print_headline(headline(report))
        for path in figures:
            print(f"wrote {rel(path)}", file=sys.stderr)
        return

    benches = [b.strip() for b in a.only.split(",") if b.strip()]
    unknown = sorted(set(benches) - set(BENCHMARKS))
    if unknown or not benches:
        p.error(f"--only: unknown {', '.join(unknown) or '(empty)'}; "
                f"choose from {', '.join(BENCHMARKS)}")
    a.build = os.path.abspath(a.build)
    needed = {"allreduce": ["allreduce_bench"], "fusion": ["fusion_bench"],
              "train": ["train_bench"]}
    for exe in ["ronderun"] + [e for b in benches for e in needed[b]]:
        if not os.access(os.path.join(a.build, "bin", exe), os.X_OK):
            raise SystemExit(f"{rel(os.path.join(a.build, 'bin', exe))} not found: "
                             "build first (scripts/dev.sh build) or pass --build DIR")
    if a.quick and a.rounds is None:
        a.rounds = 1
    settings = QUICK if a.quick else FULL
    today = datetime.date.today().isoformat()
    name = a.name or (today + ("-quick" if a.quick else ""))
    out_dir = os.path.abspath(a.out_dir or os.path.join(HERE, "results"))
    os.makedirs(out_dir, exist_ok=True)

    report = {"report": "ronde benchmarks", "date": today, "quick": a.quick,
              "command": [rel(sys.argv[0])] + sys.argv[1:],
              "build": rel(a.build), "machine": machine_info(a.build),
              "settings": {b: settings[b] + (["--rounds", str(a.rounds)]
                                             if a.rounds else [])
                           for b in benches},
              "wall_s": {}, "tables": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for b in sorted(benches, key=BENCHMARKS.index):
            report[b], report["tables"][b], report["wall_s"][b] = run_driver(
                b, a, settings[b], tmp)
    report["machine"]["load_avg_at_end"] = list(os.getloadavg())
    report["headline"] = headline(report)
    json_path = os.path.join(out_dir, name + ".json")
    figures = [] if a.no_plots else plot_all(report, os.path.join(out_dir, name))
    report["figures"] = [os.path.relpath(f, out_dir) for f in figures]
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    check_outputs(json_path, figures, benches)
    print_headline(report["headline"])
    print(f"wrote {rel(json_path)}", file=sys.stderr)
    for path in figures:
        print(f"wrote {rel(path)}", file=sys.stderr)


if __name__ == "__main__":
    main()
