"""Figures of training runs from ronde's metrics files.

``TrainingMonitor`` (the examples' ``--metrics-out FILE``) writes JSON lines:
"step" records (progress lines) and "epoch" records. Usage::

    python -m ronde.plot [--out DIR] [--label TEXT ...] [--title TEXT]
                         [--format png|svg] [--x auto|step|epoch]
                         FILE.jsonl [FILE.jsonl ...]
    python -m ronde.plot --out figs --label "1 GPU" --label "4 GPUs" \\
        np1.jsonl np4.jsonl

One line per file (a run) in each figure, written into DIR (default: .),
each path printed: ``loss`` (training loss against the global step, epoch
``*loss`` metrics as markers at each epoch's end, ``*acc``/``*accuracy`` in a
second panel), ``throughput`` (samples/s of the job, share of time waiting on
communication), ``resources`` (CPU, resident and CUDA memory, when recorded)
and, given 2 or more files, ``scaling`` (mean samples/s per run, efficiency
against the run with the fewest ranks). The x axis is the global step, or
epochs (``--x epoch``, the default when the runs' steps per epoch differ, as
runs of 1 and 4 ranks at one batch per rank do). ``--label`` names the
runs, once per file; by default a run is named by its number of ranks. Needs only the
standard library and matplotlib. Exit status 2: bad usage, or a file that is
missing, malformed or without records.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass, field

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

FIGSIZE = (12, 8)  # inches; 1200x800 pixels at DPI
DPI = 100
COLORS = matplotlib.rcParams["axes.prop_cycle"].by_key()["color"]


class MetricsError(ValueError):
    """A metrics file that cannot be read: missing, malformed or empty."""


@dataclass
class Run:
    """One metrics file: its step and epoch records, in file order."""
    path: str
    size: int | None = None
    label: str = ""
    steps: list = field(default_factory=list)
    epochs: list = field(default_factory=list)
    # Global step at which each epoch ended, by epoch number.
    epoch_ends: dict = field(default_factory=dict)
    # The x axis: global steps times this (1, or 1 / steps per epoch when
    # drawn against epochs).
    x_scale: float = 1.0
    x_label: str = "global step"

    def step_x(self, record):
        g = _num(record.get("global_step"))
        return None if g is None else g * self.x_scale

    def epoch_x(self, record):
        g = self.epoch_ends.get(record.get("epoch"))
        return None if g is None else g * self.x_scale


def _num(value):
    """The value as a float; None for null, NaN, infinity and non-numbers."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def read_records(path):
    """The JSON objects of a metrics file, one a line.

    A truncated last line (the run was killed while writing it) is skipped
    with a warning; any other line that is not a JSON object is an error."""
    try:
        # Bad bytes then fail as bad JSON, with the line's number.
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise MetricsError(f"{path}: {e.strerror or e}") from e
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            if number == len(lines):
                print(f"warning: {path}:{number}: skipping a truncated last "
                      "line", file=sys.stderr)
                break
            raise MetricsError(f"{path}:{number}: not valid JSON: {e.msg}") \
                from e
        if not isinstance(record, dict):
            raise MetricsError(f"{path}:{number}: not a JSON object")
        records.append(record)
    return records


def _steps_per_epoch(steps):
    """What the step records say an epoch has; 0: unknown."""
    return next((int(s["steps_per_epoch"]) for s in steps
                 if _num(s.get("steps_per_epoch"))), 0)


def _epoch_ends(steps, epochs):
    spe = _steps_per_epoch(steps)
    last = {}
    for s in steps:
        g = _num(s.get("global_step"))
        if g is not None:
            last[s.get("epoch")] = g
    ends, total = {}, 0.0
    for r in epochs:
        total += _num(r.get("steps")) or 0
        e = r.get("epoch")
        if spe > 0 and isinstance(e, int):
            ends[e] = e * spe
        elif e in last:
            ends[e] = last[e]
        elif total > 0:
            # No progress line in the epoch: count the steps it reported.
            ends[e] = total
    return ends


def load_runs(paths, labels=None, x="auto"):
    """A Run per metrics file; labels, when given, name them in order. x:
    "step" (global step), "epoch" (fractional epochs: runs of different
    batch sizes side by side), or "auto" (epochs when the runs' steps per
    epoch differ and all are known, else steps)."""
    if labels and len(labels) != len(paths):
        raise MetricsError(f"{len(labels)} labels for {len(paths)} files")
    runs = []
    for path in paths:
        records = [r for r in read_records(path)
                   if r.get("event") in ("step", "epoch")]
        if not records:
            raise MetricsError(f"{path}: no step or epoch records")
        # A file is one rank's; should several be concatenated, their
        # figures are reduced over ranks anyway: keep the lowest rank's.
        ranks = [r["rank"] for r in records if isinstance(r.get("rank"), int)]
        low = min(ranks, default=None)
        records = [r for r in records if r.get("rank") in (low, None)]
        sizes = [r["size"] for r in records if isinstance(r.get("size"), int)]
        run = Run(path, sizes[0] if sizes else None)
        run.steps = [r for r in records if r["event"] == "step"]
        run.epochs = [r for r in records if r["event"] == "epoch"]
        run.epoch_ends = _epoch_ends(run.steps, run.epochs)
        runs.append(run)
    spes = {_steps_per_epoch(r.steps) for r in runs}
    if x == "auto":
        x = "epoch" if len(spes) > 1 and 0 not in spes else "step"
    if x == "epoch":
        if 0 in spes:
            raise MetricsError("--x epoch: a file has no steps_per_epoch")
        for run in runs:
            run.x_scale = 1.0 / _steps_per_epoch(run.steps)
            run.x_label = "epoch"
    elif x != "step":
        raise MetricsError(f"x must be step, epoch or auto, not {x!r}")
    for i, run in enumerate(runs):
        if labels:
            run.label = labels[i]
        elif run.size is None:
            run.label = os.path.basename(run.path)
        else:
            run.label = f"{run.size} rank{'' if run.size == 1 else 's'}"
            if sum(r.size == run.size for r in runs) > 1:
                run.label += f" ({os.path.basename(run.path)})"
    return runs


def _points(records, x_of, name, scale=1.0):
    xs, ys = [], []
    for r in records:
        x, y = x_of(r), _num(r.get(name))
        if x is not None and y is not None:
            xs.append(x)
            ys.append(y * scale)
    return xs, ys


def _figure(title, heading, nrows, ncols=1, sharex=True):
    fig = Figure(figsize=FIGSIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)  # explicitly Agg: never a screen
    fig.suptitle(f"{title}: {heading}" if title else heading,
                 fontsize="x-large")
    axes = fig.subplots(nrows, ncols, sharex=sharex, squeeze=False)
    for ax in axes.flat:
        ax.grid(True, alpha=0.3)
    return fig, list(axes.flat)


def _line(ax, points, **style):
    # An empty series would still put its run in the legend.
    if points[0]:
        ax.plot(*points, **style)


def _zero_based(ax):
    # Room above the highest line, which autoscaling leaves on the frame.
    if ax.has_data():
        ax.set_ylim(0, max(ax.dataLim.ymax, 1e-9) * 1.08)


def _finish(ax, ylabel, xlabel="global step"):
    ax.set_ylabel(ylabel)
    # Panels sharing the x axis of the one below need no label of their own.
    if ax.get_subplotspec().is_last_row():
        ax.set_xlabel(xlabel)
    if ax.has_data():
        ax.legend(fontsize="small")


def _metric_names(runs, test):
    names = []
    for run in runs:
        for r in run.epochs:
            names += [k for k in r if test(k) and k not in names
                      and _num(r[k]) is not None]
    return names


def plot_loss(runs, title=""):
    losses = _metric_names(
        runs, lambda k: k.endswith("loss") and k != "train_loss")
    accs = _metric_names(runs, lambda k: k.endswith(("acc", "accuracy")))
    fig, axes = _figure(title, "Loss", 2 if accs else 1)
    markers = "osD^v<>p"
    for i, run in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        xs, ys = _points(run.steps, run.step_x, "loss")
        if not xs:
            # Progress lines off (log_every 0): the epochs' means instead.
            xs, ys = _points(run.epochs, run.epoch_x, "train_loss")
        _line(axes[0], (xs, ys), color=color, marker="o" if len(xs) < 30
              else "", markersize=3, label=f"{run.label}: training loss")
        for j, name in enumerate(losses):
            _line(axes[0], _points(run.epochs, run.epoch_x, name),
                  color=color, linestyle="none", markersize=8,
                  marker=markers[j % len(markers)], markeredgecolor="black",
                  label=f"{run.label}: {name}")
        for j, name in enumerate(accs):
            xs, ys = _points(run.epochs, run.epoch_x, name)
            # Accuracies come as fractions; show percent, but leave values
            # that already are percent alone.
            scale = 100.0 if ys and max(ys) <= 1.0 else 1.0
            _line(axes[1], (xs, [y * scale for y in ys]), color=color,
                  marker=markers[j % len(markers)], markersize=8,
                  label=f"{run.label}: {name}")
    axes[0].set_title("Training loss (mean over the steps of each progress "
                      "line); markers: epoch metrics at the epoch's end")
    _finish(axes[0], "loss", runs[0].x_label)
    if accs:
        axes[1].set_title("Accuracy after each epoch")
        _finish(axes[1], "accuracy (%)", runs[0].x_label)
    return fig


def _step_panel(ax, runs, name, heading, unit, peak=None, scale=1.0):
    for i, run in enumerate(runs):
        color = COLORS[i % len(COLORS)]
        _line(ax, _points(run.steps, run.step_x, name, scale), color=color,
              label=run.label)
        if peak:
            _line(ax, _points(run.steps, run.step_x, peak, scale), color=color,
                  linestyle="--", alpha=0.7)
    ax.set_title(heading)
    _finish(ax, unit, runs[0].x_label)
    _zero_based(ax)


def plot_throughput(runs, title=""):
    fig, (top, bottom) = _figure(title, "Throughput", 2)
    _step_panel(top, runs, "samples_per_s",
                "Training throughput of the whole job", "samples/s")
    _step_panel(bottom, runs, "comm_wait_share",
                "Time waiting on communication that backward did not hide",
                "comm wait (% of step time)", scale=100.0)
    return fig


RESOURCE_PANELS = [  # (mean field, max field, title, unit)
    ("cpu_percent", "cpu_percent_max", "Process CPU use", "CPU (% of a core)"),
    ("rss_mb", "rss_mb_max", "Resident memory", "RSS (MiB)"),
    ("cuda_allocated_mb", "cuda_allocated_mb_max",
     "CUDA memory in tensors", "allocated (MiB)"),
    ("cuda_reserved_mb", "cuda_reserved_mb_max",
     "CUDA memory held by the caching allocator", "reserved (MiB)"),
]


def plot_resources(runs, title=""):
    """The resources figure, or None when no run has any resource field."""
    panels = [p for p in RESOURCE_PANELS
              if any(_points(r.steps, r.step_x, p[0])[0] for r in runs)]
    if not panels:
        return None
    # Four panels stacked would leave each too flat to read.
    fig, axes = _figure(
        title, "Resources (solid: mean over ranks, dashed: largest rank)",
        *((2, 2) if len(panels) == 4 else (len(panels), 1)),
        sharex=len(panels) < 4)
    for ax, (mean, peak, heading, unit) in zip(axes, panels):
        _step_panel(ax, runs, mean, heading, unit, peak)
    return fig


def _mean_throughput(run):
    ys = _points(run.epochs, lambda r: 0, "samples_per_s")[1] \
        or _points(run.steps, lambda r: 0, "samples_per_s")[1]
    return sum(ys) / len(ys) if ys else None


def plot_scaling(runs, title=""):
    fig, (ax,) = _figure(title, "Scaling", 1)
    means = [_mean_throughput(r) for r in runs]
    known = [i for i, r in enumerate(runs)
             if r.size and means[i] is not None and means[i] > 0]
    base = min(known, key=lambda i: runs[i].size) if known else None
    bars = ax.bar(range(len(runs)), [m or 0 for m in means],
                  color=[COLORS[i % len(COLORS)] for i in range(len(runs))])
    ideal = []
    for i, (bar, mean) in enumerate(zip(bars, means)):
        text = "no data" if mean is None else f"{mean:,.0f} samples/s"
        top = bar.get_height()
        if i == base:
            text += "\nbaseline"
        elif i in known and base is not None:
            speedup = mean / means[base]
            ratio = runs[i].size / runs[base].size
            text += f"\n{speedup:.2f}x on {ratio:g}x the ranks"
            text += f"\nefficiency {speedup / ratio:.0%}"
            ideal.append(means[base] * ratio)
            ax.hlines(ideal[-1], bar.get_x(), bar.get_x() + bar.get_width(),
                      colors="black", linestyles="--",
                      label="linear scaling" if len(ideal) == 1 else None)
            top = max(top, ideal[-1])  # the text must not cross that line
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, top),
                    xytext=(0, 4), textcoords="offset points", ha="center",
                    va="bottom")
    ax.set_xticks(range(len(runs)), [r.label for r in runs])
    ax.set_ylim(0, max([m or 0 for m in means] + ideal + [1]) * 1.25)
    ax.set_axisbelow(True)
    if ideal:
        ax.legend(loc="upper left")
    base_label = runs[base].label if base is not None else "?"
    ax.set_title("Mean training throughput; efficiency relative to "
                 f"{base_label}")
    ax.set_ylabel("samples/s (whole job)")
    ax.set_xlabel("run")
    return fig


def plot_runs(runs, out_dir=".", fmt="png", title=""):
    """Draws the figures of the runs into out_dir; returns the paths."""
    figures = [("loss", plot_loss(runs, title)),
               ("throughput", plot_throughput(runs, title)),
               ("resources", plot_resources(runs, title))]
    if len(runs) >= 2:
        figures.append(("scaling", plot_scaling(runs, title)))
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    for name, fig in figures:
        if fig is not None:
            path = os.path.join(out_dir, f"{name}.{fmt}")
            fig.savefig(path, format=fmt, dpi=DPI)
            paths.append(path)
    return paths


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m ronde.plot",
        description="Draw figures of training runs from ronde metrics files "
                    "(TrainingMonitor's --metrics-out).")
    parser.add_argument("files", nargs="+", metavar="FILE.jsonl")
    parser.add_argument("--out", default=".", metavar="DIR",
                        help="directory for the figures (default: .)")
    parser.add_argument("--label", action="append", default=[],
                        metavar="TEXT", help="name of a run, once per file")
    parser.add_argument("--title", default="", metavar="TEXT",
                        help="prefix of the figures' titles")
    parser.add_argument("--format", default="png", choices=("png", "svg"))
    parser.add_argument("--x", default="auto", choices=("auto", "step",
                                                        "epoch"),
                        help="x axis: global step, or epochs (default: "
                             "epochs when the runs' steps per epoch differ)")
    args = parser.parse_args(argv)
    if args.label and len(args.label) != len(args.files):
        parser.error(f"--label given {len(args.label)} times for "
                     f"{len(args.files)} files")
    try:
        runs = load_runs(args.files, args.label, args.x)
        for path in plot_runs(runs, args.out, args.format, args.title):
            print(path)
    except (MetricsError, OSError) as e:  # OSError: --out not writable
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
