"""The Python blocks of README.md and docs/guide/*.md (tests/docs/
snippets.py): every block compiles, and each `python run` block runs on 2
ranks under ronderun and exits 0 on both. A failure names the block's file
and line."""
import os
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "docs"))
import snippets  # noqa: E402

BLOCKS = [b for b in snippets.blocks(ROOT) if b.lang == "python"]


def test_every_python_block_compiles():
    assert len(BLOCKS) >= 3, "the docs should have Python blocks"
    assert snippets.check_python(ROOT) == []


@pytest.mark.parametrize("block", [b for b in BLOCKS if "run" in b.tags],
                         ids=lambda b: b.where())
def test_block_runs_on_two_ranks(block, ranks, tmp_path):
    script = tmp_path / "snippet.py"
    # Line numbers in a traceback are the document's.
    script.write_text("\n" * (block.line - 1) + block.code + "\n")
    try:
        ranks.run(block.where(), worker=str(script))
    except AssertionError as e:
        raise AssertionError(
            f"the block at {block.where()} failed on 2 ranks (its line "
            f"numbers are the document's):\n{e}") from None
