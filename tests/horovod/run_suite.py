#!/usr/bin/env python3
"""Runs Horovod's own PyTorch test suite (test/parallel/test_torch.py of a
Horovod checkout, unchanged) against ronde.torch, and counts what passes.

    python tests/horovod/run_suite.py --horovod ~/src/horovod --np 2 3 \\
        --mode both --json horovod-suite.json

A small package, written to a temporary directory, makes ``horovod.torch``
ronde.torch itself (``import horovod.torch as hvd`` gives the very module),
and gives the one helper of Horovod's runner that the suite's
``test/utils/common.py`` imports. Each rank runs pytest under ronderun with
the variables ``horovodrun --gloo`` would set (HOROVOD_RANK, HOROVOD_SIZE,
...), derived from ronderun's. A test passes when it passes on every rank.

--mode one-job runs the whole file in one job, as Horovod's CI does (a test
that leaves the ranks out of step fails the ones after it); --mode per-test
runs each test in a job of its own. Needs: a built ronde (RONDE_BUILD_DIR,
default ./build), pytest, mock and cloudpickle (Horovod's test helpers
import them). The suite is not part of the test command: it needs
Horovod's sources, which this repository does not carry.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

SHIM = {
    "horovod/__init__.py": '"""horovod, as ronde provides it."""\n'
                           '__version__ = "0.28.1"\n',
    # The module itself, not a copy of its names: the suite patches and
    # reads attributes of hvd, and those must be ronde.torch's.
    "horovod/torch/__init__.py": (
        "import sys\nimport ronde.torch\n"
        "sys.modules[__name__] = ronde.torch\n"),
    "horovod/runner/__init__.py": "",
    "horovod/runner/util/__init__.py": "",
    "horovod/runner/util/threads.py": (
        "import threading\n\n\n"
        "def in_thread(target, args=(), name=None, daemon=True,\n"
        "              silent=False):\n"
        "    t = threading.Thread(target=target, args=args, name=name,\n"
        "                         daemon=daemon)\n"
        "    t.start()\n"
        "    return t\n"),
    # Each rank: horovodrun --gloo's variables from ronderun's, then pytest.
    "rank.sh": (
        "#!/bin/sh\n"
        "export HOROVOD_RANK=$RONDE_RANK HOROVOD_SIZE=$RONDE_SIZE\n"
        "export HOROVOD_LOCAL_RANK=$RONDE_LOCAL_RANK\n"
        "export HOROVOD_LOCAL_SIZE=$RONDE_LOCAL_SIZE\n"
        "export HOROVOD_CROSS_RANK=${RONDE_CROSS_RANK:-0}\n"
        "export HOROVOD_CROSS_SIZE=${RONDE_CROSS_SIZE:-1}\n"
        "export HOROVOD_GLOO_RENDEZVOUS_ADDR=$RONDE_RENDEZVOUS_ADDR\n"
        "export HOROVOD_GLOO_RENDEZVOUS_PORT=$RONDE_RENDEZVOUS_PORT\n"
        "export HOROVOD_CONTROLLER=gloo HOROVOD_CPU_OPERATIONS=gloo\n"
        "out=$1; shift\n"
        # Failed tests must not end the rank's process with an error:
        # ronderun would stop the ranks still running theirs.
        "\"$PYTHON\" -m pytest -q -p no:cacheprovider --no-header \\\n"
        "  -o junit_family=xunit1 --junitxml=\"$out.$RONDE_RANK.xml\" \"$@\" \\\n"
        "  > \"$out.$RONDE_RANK.log\" 2>&1\n"
        "exit 0\n"),
}


def write_shim(root):
    for rel, text in SHIM.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    os.chmod(os.path.join(root, "rank.sh"), 0o755)


def outcomes(xml_path):
    """{test name: 'passed' | 'failed' | 'skipped'} of one rank's report."""
    got = {}
    if not os.path.exists(xml_path):
        return got
    try:
        tree = ET.parse(xml_path)
    except ET.ParseError:
        return got
    for case in tree.iter("testcase"):
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                kind = "failed"
            elif child.tag == "skipped" and kind == "passed":
                kind = "skipped"
        got[case.get("name")] = kind
    return got


def merge(per_rank, expected):
    """A test passes when every rank passed it, is skipped when every rank
    skipped it, and fails otherwise (a rank without a report fails)."""
    merged = {}
    for name in expected:
        kinds = [r.get(name, "failed") for r in per_rank]
        if all(k == "passed" for k in kinds):
            merged[name] = "passed"
        elif all(k == "skipped" for k in kinds):
            merged[name] = "skipped"
        else:
            merged[name] = "failed"
    return merged


def run_job(args, env, tmp, np, selection, tag, timeout):
    out = os.path.join(tmp, "out", f"{tag}")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    cmd = [args.ronderun, "-np", str(np), "--bind-to", "none",
           "--timeout", str(args.op_timeout), "--",
           os.path.join(tmp, "rank.sh"), out] + selection
    try:
        subprocess.run(cmd, env=env, timeout=timeout,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       cwd=os.path.dirname(args.suite))
    except subprocess.TimeoutExpired:
        pass
    return [outcomes(f"{out}.{r}.xml") for r in range(np)], out


def list_tests(args, env):
    got = subprocess.run(
        [args.python, "-m", "pytest", "-q", "-p", "no:cacheprovider",
         "--collect-only", args.suite], env=env, capture_output=True,
        text=True, cwd=os.path.dirname(args.suite))
    names = [line.rsplit("::", 1)[1] for line in got.stdout.splitlines()
             if "::" in line]
    if not names:
        sys.exit("could not list the suite's tests:\n" + got.stdout +
                 got.stderr)
    return names


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(os.path.dirname(here))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--horovod", required=True,
                   help="a Horovod checkout (tag v0.28.1)")
    p.add_argument("--np", type=int, nargs="+", default=[2, 3])
    p.add_argument("--mode", choices=["one-job", "per-test", "both"],
                   default="both")
    p.add_argument("-k", default=None, help="only tests matching (pytest -k)")
    p.add_argument("--op-timeout", type=int, default=30,
                   help="RONDE_TIMEOUT_SECONDS of the jobs")
    p.add_argument("--json", default=None, help="write the results here")
    p.add_argument("--keep", action="store_true",
                   help="keep each rank's log and report")
    args = p.parse_args()
    args.suite = os.path.join(os.path.abspath(args.horovod), "test",
                              "parallel", "test_torch.py")
    if not os.path.exists(args.suite):
        sys.exit(f"no {args.suite}: --horovod takes a Horovod checkout")
    build = os.path.abspath(os.environ.get("RONDE_BUILD_DIR",
                                           os.path.join(repo, "build")))
    args.ronderun = os.path.join(build, "bin", "ronderun")
    args.python = sys.executable

    tmp = tempfile.mkdtemp(prefix="ronde-horovod-suite-")
    try:
        write_shim(tmp)
        env = dict(os.environ)
        env["PYTHON"] = sys.executable
        env["PYTHONPATH"] = os.pathsep.join(
            [tmp, os.path.join(build, "python")] +
            ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        tests = list_tests(args, env)
        if args.k:
            tests = [t for t in tests if args.k in t]
        report = {"suite": args.suite, "tests": len(tests), "runs": []}
        modes = ["one-job", "per-test"] if args.mode == "both" else \
            [args.mode]
        for np in args.np:
            for mode in modes:
                started = time.time()
                if mode == "one-job":
                    sel = [args.suite] + (["-k", args.k] if args.k else [])
                    ranks, _ = run_job(args, env, tmp, np, sel,
                                       f"all-{np}", 60 * len(tests))
                    for r, got in enumerate(ranks):
                        if not got:
                            print(f"np={np} one-job: rank {r} wrote no "
                                  "report (it died, or was stopped)")
                    merged = merge(ranks, tests)
                else:
                    merged = {}
                    for t in tests:
                        ranks, _ = run_job(
                            args, env, tmp, np,
                            [f"{args.suite}::TorchTests::{t}"],
                            f"{t}-{np}", 120)
                        merged.update(merge(ranks, [t]))
                counts = {k: sum(1 for v in merged.values() if v == k)
                          for k in ("passed", "failed", "skipped")}
                run = {"np": np, "mode": mode, **counts,
                       "seconds": round(time.time() - started, 1),
                       "failed_tests": sorted(
                           t for t, v in merged.items() if v == "failed"),
                       "skipped_tests": sorted(
                           t for t, v in merged.items() if v == "skipped")}
                report["runs"].append(run)
                print(f"np={np} {mode}: {counts['passed']} passed, "
                      f"{counts['failed']} failed, {counts['skipped']} "
                      f"skipped of {len(tests)} ({run['seconds']} s)",
                      flush=True)
                for t in run["failed_tests"]:
                    print(f"  failed: {t}", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(report, f, indent=1)
        if args.keep:
            print(f"logs kept in {tmp}/out")
            tmp = None
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
