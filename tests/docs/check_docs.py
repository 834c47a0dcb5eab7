#!/usr/bin/env python3
"""Docs that check themselves: each check names what the docs leave out.

    check_docs.py architecture   every file under plugin/src is named in
                                 docs/architecture.md (by its name, its path
                                 under plugin/src or, as its file tables do,
                                 its stem in backquotes; a header counts as
                                 named with its .cpp)
    check_docs.py workers        every test worker file (tests/multirank/
                                 worker_*, tests/python/worker*.py) is named
                                 in CONTRIBUTING.md
    check_docs.py links          every page under docs/ (docs/guide/ too)
                                 is linked from README.md
    check_docs.py anchors        every relative link of README.md, CONTRIBUTING.md
                                 and docs/**/*.md reaches a file, and its
                                 #anchor a heading there

    check_docs.py selftest       breaks a copy of the tree once per check
                                 (and one Python block of the guide) and
                                 fails unless each check then names the
                                 break

--root DIR checks another tree. Exits 1 with one line per omission.
"""
import argparse
import os
import re
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def read(root, rel):
    with open(os.path.join(root, rel), encoding="utf-8") as f:
        return f.read()


def named(text, name):
    return re.search(r"(?<![\w.-])" + re.escape(name) + r"(?![\w-])", text)


def check_architecture(root):
    text = read(root, "docs/architecture.md")
    src = os.path.join(root, "plugin", "src")
    missing = []
    for dirpath, _, files in os.walk(src):
        for f in sorted(files):
            stem, ext = os.path.splitext(f)
            if ext not in (".cpp", ".h", ".cu"):
                continue
            rel = os.path.relpath(os.path.join(dirpath, f), src)
            # The file tables name a .cpp and its .h by their stem: `auth`.
            if named(text, f) or named(text, rel) or f"`{stem}`" in text:
                continue
            if ext == ".h" and (os.path.exists(os.path.join(dirpath, stem + ".cpp"))
                                and named(text, stem + ".cpp")):
                continue
            missing.append(f"docs/architecture.md does not name plugin/src/{rel}")
    return missing


def check_workers(root):
    text = read(root, "CONTRIBUTING.md")
    missing = []
    for folder, pattern in (("tests/multirank", r"^worker_.*\.(cpp|h)$"),
                            ("tests/python", r"^worker.*\.py$")):
        for f in sorted(os.listdir(os.path.join(root, folder))):
            if re.match(pattern, f) and not named(text, f):
                missing.append(f"CONTRIBUTING.md does not name the test worker {folder}/{f}")
    return missing


def doc_pages(root):
    pages = []
    for dirpath, _, files in os.walk(os.path.join(root, "docs")):
        for f in files:
            if f.endswith(".md"):
                pages.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(pages)


def links_of(text):
    # [text](target) outside code blocks; the target without its title.
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return [m.group(1).split()[0] for m in re.finditer(r"\]\(([^)]+)\)", text)]


def check_links(root):
    linked = set()
    for target in links_of(read(root, "README.md")):
        path = target.split("#")[0]
        if path and "://" not in path:
            linked.add(os.path.normpath(path))
    return [f"README.md does not link {p}" for p in doc_pages(root) if p not in linked]


def slug(heading):
    # GitHub's anchors: lower case, punctuation other than - and _ dropped,
    # spaces to dashes.
    s = heading.strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(text):
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}


def check_anchors(root):
    bad = []
    sources = ["README.md", "CONTRIBUTING.md"] + doc_pages(root)
    for rel in sources:
        text = read(root, rel)
        for target in links_of(text):
            if "://" in target or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
            if not os.path.exists(os.path.join(root, dest)):
                bad.append(f"{rel}: the link {target} reaches no file")
                continue
            if anchor and dest.endswith(".md") and anchor not in anchors(read(root, dest)):
                bad.append(f"{rel}: the link {target} reaches no heading of {dest}")
    return bad


CHECKS = {"architecture": check_architecture, "workers": check_workers,
          "links": check_links, "anchors": check_anchors}


def _copy_tree(root, dest):
    """The docs as they are, and the names (only) of the files the checks
    list: an empty file for each."""
    for rel in ("README.md", "CONTRIBUTING.md"):
        shutil.copy(os.path.join(root, rel), os.path.join(dest, rel))
    shutil.copytree(os.path.join(root, "docs"), os.path.join(dest, "docs"))
    for folder in ("plugin/src", "tests/multirank", "tests/python"):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            out = os.path.join(dest, os.path.relpath(dirpath, root))
            os.makedirs(out, exist_ok=True)
            for f in files:
                open(os.path.join(out, f), "w").close()
    # Every target of a relative link, so that the anchors check sees the
    # same files as in the tree.
    for rel in ["README.md", "CONTRIBUTING.md"] + doc_pages(root):
        for target in links_of(read(root, rel)):
            path = target.split("#")[0]
            if not path or "://" in path:
                continue
            src = os.path.normpath(os.path.join(root, os.path.dirname(rel), path))
            dst = os.path.normpath(os.path.join(dest, os.path.dirname(rel), path))
            if os.path.isfile(src) and not os.path.exists(dst):
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy(src, dst)
            elif os.path.isdir(src):
                os.makedirs(dst, exist_ok=True)


def _append(path, text):
    with open(path, "a", encoding="utf-8") as f:
        f.write(text)


def selftest(root):
    """Each check passes on a copy of the tree, then fails on its break,
    naming it."""
    sys.path.insert(0, HERE)
    import snippets
    breaks = {
        "architecture": (lambda d: open(os.path.join(
            d, "plugin/src/engine/unnamed_part.cpp"), "w").close(),
            "does not name plugin/src/engine/unnamed_part.cpp"),
        "workers": (lambda d: open(os.path.join(
            d, "tests/multirank/worker_unnamed.cpp"), "w").close(),
            "does not name the test worker tests/multirank/worker_unnamed.cpp"),
        "links": (lambda d: _append(os.path.join(d, "docs/guide/unlinked.md"),
                                    "# Unlinked\n"),
                  "README.md does not link docs/guide/unlinked.md"),
        "anchors": (lambda d: _append(os.path.join(d, "README.md"),
                                      "\n[gone](docs/guide/sharding.md#no-such-part)\n"),
                    "reaches no heading of docs/guide/sharding.md"),
    }
    failures = []
    for name, (brk, want) in breaks.items():
        with tempfile.TemporaryDirectory(prefix="ronde-docs-") as d:
            _copy_tree(root, d)
            before = CHECKS[name](d)
            if before:
                failures.append(f"{name}: fails on the unbroken copy: {before}")
                continue
            brk(d)
            after = CHECKS[name](d)
            if not any(want in line for line in after):
                failures.append(f"{name}: the break went unseen ({after})")
            else:
                print(f"{name}: the break is named: {after[0]}")
    with tempfile.TemporaryDirectory(prefix="ronde-docs-") as d:
        _copy_tree(root, d)
        page = os.path.join(d, "docs/guide/python.md")
        text = read(d, "docs/guide/python.md")
        at = text.index("```python")
        line = text[:at].count("\n") + 2
        with open(page, "w", encoding="utf-8") as f:
            eol = text.index("\n", at)
            f.write(text[:at] + "```python\nif broken" + text[eol:])
        got = snippets.check_python(d)
        want = f"docs/guide/python.md:{line}:"
        if not any(g.startswith(want) for g in got):
            failures.append(f"snippets: a broken Python block went unseen "
                            f"(wanted {want}, got {got})")
        else:
            print(f"snippets: the break is named: {got[0]}")
    return failures


CHECKS_AND_SELFTEST = dict(CHECKS, selftest=selftest)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=sorted(CHECKS_AND_SELFTEST))
    ap.add_argument("--root", default=os.path.dirname(os.path.dirname(HERE)))
    args = ap.parse_args()
    problems = CHECKS_AND_SELFTEST[args.check](args.root)
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"{args.check}: nothing left out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
