"""Launches workers on 2 local ranks through ronderun or torchrun. ronde comes
from the build tree, RONDE_BUILD_DIR (CTest sets it) or else ./build; with
RONDE_TEST_INSTALLED=1, from the Python running the tests (a pip install),
with the ronderun installed beside it."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
INSTALLED = os.environ.get("RONDE_TEST_INSTALLED") == "1"
BUILD = os.environ.get("RONDE_BUILD_DIR", os.path.join(ROOT, "build"))
PYDIR = None if INSTALLED else os.path.join(BUILD, "python")
RONDERUN = (os.path.join(os.path.dirname(sys.executable), "ronderun")
            if INSTALLED else os.path.join(BUILD, "bin", "ronderun"))
WORKER = os.path.join(HERE, "worker.py")
C10D_WORKER = os.path.join(HERE, "worker_c10d.py")

if PYDIR and PYDIR not in sys.path:
    sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in [PYDIR, HERE, env.get("PYTHONPATH")] if p])
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("RONDE_TIMEOUT_SECONDS", "30")
    return env


class Ranks:
    def __init__(self, tmp_path):
        self.out = str(tmp_path)

    def run(self, scenario, *args, np=2, launcher="ronderun", check=True,
            timeout=240, launcher_args=(), worker=WORKER):
        worker = [worker, scenario, self.out] + list(args)
        if launcher == "ronderun":
            cmd = [RONDERUN, "-np", str(np), *launcher_args,
                   "--", sys.executable] + worker
        elif launcher == "torchrun":
            torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
            cmd = [torchrun, "--nproc-per-node", str(np), "--master-port",
                   str(_free_port())] + worker
        else:
            raise ValueError(launcher)
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True,
                           timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(
                f"{' '.join(cmd)} exited {p.returncode}\n"
                f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
        return p

    def load(self, name, rank):
        import torch
        return torch.load(os.path.join(self.out, f"{name}.rank{rank}.pt"),
                          weights_only=False)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ranks(tmp_path):
    return Ranks(tmp_path)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "installed: also run against the pip-installed package "
        "(tests/install/check_pip_install.sh): one test per native library, "
        "entry point and launcher, which the build tree's run covers in full")
