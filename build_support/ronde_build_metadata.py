"""The package metadata the build decides (a dynamic-metadata provider of
scikit-build-core, named in pyproject.toml):

- version: the VERSION of project() in CMakeLists.txt, the one source of it;
- dependencies: torch at the release the build compiles against, the torch
  of the Python running the build (pip install --no-build-isolation). The
  extension links that LibTorch's C++ ABI, which changes between releases.
"""
import os
import re

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cmake_version():
    with open(os.path.join(_ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
        m = re.search(r"project\(\s*ronde\s+VERSION\s+([0-9][0-9.]*)", f.read())
    if not m:
        raise RuntimeError("no 'project(ronde VERSION x.y.z' in CMakeLists.txt")
    return m.group(1)


def _torch_requirement():
    try:
        import torch
    except ImportError as e:
        raise RuntimeError(
            "ronde compiles against the torch of the Python that builds it, "
            "and this build's Python has none (pip builds in an isolated "
            "environment unless told not to): install torch, then run "
            "'pip install --no-build-isolation .'") from e
    release = torch.__version__.split("+")[0]
    return f"torch=={release}"


def dynamic_metadata(settings, project):
    del settings, project
    return {"version": _cmake_version(),
            "dependencies": [_torch_requirement()]}


def dynamic_wheel(settings):
    # The torch pin is the building machine's: a source distribution leaves
    # it to the wheel built from it.
    del settings
    return {"dependencies": True}
