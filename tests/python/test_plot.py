"""python -m ronde.plot on metrics files like TrainingMonitor writes. Needs
matplotlib only: neither torch nor the built extension."""
import importlib
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
# The sources' copy, or, against a pip install (RONDE_TEST_INSTALLED=1),
# none: the installed one.
INSTALLED = os.environ.get("RONDE_TEST_INSTALLED") == "1"
PYTHONPATH = "" if INSTALLED else os.path.join(ROOT, "python")
PNG = b"\x89PNG\r\n\x1a\n"
FIGURES = ["loss.png", "throughput.png", "resources.png"]


def _import_plot():
    try:
        return importlib.import_module("ronde.plot")
    except ImportError:
        if INSTALLED:
            raise
    # conftest puts the build tree first, whose ronde may predate plot.py:
    # look for it in the sources too.
    sys.path.insert(0, PYTHONPATH)
    ronde = sys.modules.get("ronde")
    if ronde is not None:
        ronde.__path__.append(os.path.join(PYTHONPATH, "ronde"))
    return importlib.import_module("ronde.plot")


plot = _import_plot()


def _records(size, epochs=2, steps_per_epoch=40, log_every=10):
    """A run's step and epoch records, one of them with a diverged loss."""
    out, t = [], 1.7e9
    for epoch in range(1, epochs + 1):
        for step in range(log_every, steps_per_epoch + 1, log_every):
            g = (epoch - 1) * steps_per_epoch + step
            t += 0.5
            out.append({
                "event": "step", "rank": 0, "size": size, "epoch": epoch,
                "epochs": epochs, "step": step,
                "steps_per_epoch": steps_per_epoch, "global_step": g,
                "loss": 2.3 / (1 + 0.05 * g / size) + 0.05 * (step % 20 == 0),
                "samples_per_s": 900.0 * size ** 0.9 + 20 * (step % 30 == 0),
                "step_seconds": 0.05,
                "comm_wait_share": 0.02 * (size - 1) + 0.001 * step,
                "eta_seconds": 0.05 * (epochs * steps_per_epoch - g),
                "time": t, "cpu_percent": 150.0 + step,
                "cpu_percent_max": 170.0 + step * size,
                "rss_mb": 400.0 + g + 50 * size, "rss_mb_max": 420.0 + g
                + 60 * size, "peak_rss_mb": 430.0 + g + 60 * size,
                "some_future_field": [1, 2]})
        out.append({
            "event": "epoch", "rank": 0, "size": size, "epoch": epoch,
            "epochs": epochs, "steps": steps_per_epoch, "epoch_seconds": 2.0,
            "train_loss": 1.0 / epoch, "samples_per_s": 880.0 * size ** 0.9,
            "comm_wait_share": 0.02 * size, "cpu_percent": 160.0,
            "cpu_percent_max": 180.0, "rss_mb": 450.0, "rss_mb_max": 470.0,
            "peak_rss_mb": 480.0, "val_loss": 1.1 / epoch + 0.1 * size,
            "val_acc": 0.75 + 0.08 * epoch - 0.02 * size, "time": t + 1})
    out[2]["loss"] = None
    out.insert(1, {"event": "checkpoint", "path": "x.pt"})
    return out


def _write(path, records, tail=""):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
        f.write(tail)
    return str(path)


@pytest.fixture
def files(tmp_path):
    one = _write(tmp_path / "np1.jsonl", _records(1))
    # Killed while writing the last line.
    two = _write(tmp_path / "np2.jsonl", _records(2),
                 tail='{"event":"step","rank":0,"si')
    return one, two


def _check_images(out, names):
    for name in names:
        path = os.path.join(out, name)
        assert os.path.isfile(path), path
        with open(path, "rb") as f:
            head = f.read(8)
        assert os.path.getsize(path) > 1000 and head == PNG, path


def test_main_draws_every_figure(files, tmp_path, capsys):
    out = str(tmp_path / "figs")
    assert plot.main(["--out", out, "--title", "test", *files]) == 0
    captured = capsys.readouterr()
    names = FIGURES + ["scaling.png"]
    assert sorted(captured.out.split()) == sorted(
        os.path.join(out, n) for n in names)
    assert "np2.jsonl:" in captured.err and "truncated" in captured.err
    _check_images(out, names)


def test_one_file_has_no_scaling_figure(files, tmp_path):
    out = str(tmp_path / "one")
    assert plot.main(["--out", out, "--label", "alone", files[0]]) == 0
    _check_images(out, FIGURES)
    assert not os.path.exists(os.path.join(out, "scaling.png"))


def test_load_runs(files):
    runs = plot.load_runs(list(files))
    assert [r.label for r in runs] == ["1 rank", "2 ranks"]
    assert [len(r.steps) for r in runs] == [8, 8]
    assert runs[0].epoch_ends == {1: 40, 2: 80}
    assert plot.load_runs(list(files), ["a", "b"])[1].label == "b"


def test_x_axis_in_epochs_when_steps_per_epoch_differ(files, tmp_path):
    # Same steps per epoch: global steps. A run with half the steps per
    # epoch (twice the ranks at one batch per rank): epochs, so that both
    # runs' epoch ends line up at 1 and 2.
    assert {r.x_label for r in plot.load_runs(list(files))} == {"global step"}
    half = _write(tmp_path / "np4.jsonl", _records(4, steps_per_epoch=20))
    runs = plot.load_runs([files[0], half])
    assert [r.x_label for r in runs] == ["epoch", "epoch"]
    for run in runs:
        assert [run.epoch_x(e) for e in run.epochs] == [1.0, 2.0]
        assert run.step_x(run.steps[-1]) == 2.0
    assert plot.load_runs([files[0], half], x="step")[1].x_label == \
        "global step"
    assert plot.main(["--out", str(tmp_path / "e"), "--x", "epoch",
                      files[0], half]) == 0


def test_older_files_without_resources(tmp_path):
    keys = ("cpu_percent", "cpu_percent_max", "rss_mb", "rss_mb_max",
            "peak_rss_mb")
    old = [{k: v for k, v in r.items() if k not in keys}
           for r in _records(1)]
    out = str(tmp_path / "old")
    runs = plot.load_runs([_write(tmp_path / "o.jsonl", old)])
    paths = plot.plot_runs(runs, out)
    names = [os.path.basename(p) for p in paths]
    assert names == ["loss.png", "throughput.png"]


def test_malformed_middle_line(tmp_path, capsys):
    lines = [json.dumps(r) for r in _records(1)]
    lines[3] = lines[3][:20]
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert plot.main(["--out", str(tmp_path), str(bad)]) == 2
    assert f"{bad}:4:" in capsys.readouterr().err


def test_missing_and_empty_files(tmp_path, capsys):
    assert plot.main([str(tmp_path / "nope.jsonl")]) == 2
    assert "nope.jsonl" in capsys.readouterr().err
    empty = _write(tmp_path / "empty.jsonl", [{"event": "other"}])
    assert plot.main([empty]) == 2


@pytest.mark.installed
def test_command_line(files, tmp_path):
    out = str(tmp_path / "cli")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if PYTHONPATH:
        env["PYTHONPATH"] = PYTHONPATH
    p = subprocess.run(
        [sys.executable, "-m", "ronde.plot", "--out", out,
         "--label", "one", "--label", "two", *files],
        env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    _check_images(out, FIGURES + ["scaling.png"])
    p = subprocess.run(
        [sys.executable, "-m", "ronde.plot", str(tmp_path / "nope.jsonl")],
        env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "nope.jsonl" in p.stderr
    p = subprocess.run(
        [sys.executable, "-m", "ronde.plot", "--label", "x", *files],
        env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
