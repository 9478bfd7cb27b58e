#!/usr/bin/env python3
"""Rewrite the absolute paths a run recorded in its result files as paths relative to the folder it ran in.

A report copied into ``docs/results/`` or ``bench/results/`` should not carry the folder layout of the
machine that made it (``/work/main/runs/...``): it means nothing to a reader and it changes with every
clone. Every absolute path under ``--base`` (default: the parent of ``--root``) is rewritten relative to
``--root`` (the folder the command ran in, the checkout): ``/work/main/runs/x`` -> ``runs/x``,
``/work/runs16/y`` -> ``../runs16/y``. Only paths that start a string (after a quote, a backtick, a space,
``(``, ``=`` or a line start) are touched; the files are rewritten in place, atomically, and only when
something changed.

    python bench/relative_paths.py --root /work/main docs/results/cpu-tiny/comparison.json ...
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

_START = r"(?:^|(?<=[\"'`\s(=]))"


def relativize(text: str, root: str, base: str) -> str:
    """``text`` with every absolute path at or under ``base`` written relative to ``root``."""
    root, base = root.rstrip("/") or "/", base.rstrip("/") or "/"
    pattern = re.compile(_START + re.escape(base) + r"(?=[/\"'`\s)]|$)([^\"'`\s)]*)", re.M)

    def one(m: re.Match) -> str:
        path = base + m.group(1)
        return os.path.relpath(path, root)
    return pattern.sub(one, text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path, help="result files (JSON, Markdown, text) rewritten in place")
    ap.add_argument("--root", required=True, help="the folder the run was made in; paths become relative to it")
    ap.add_argument("--base", help="rewrite absolute paths under this folder (default: the parent of --root)")
    args = ap.parse_args(argv)
    root = os.path.abspath(args.root)
    base = os.path.abspath(args.base) if args.base else os.path.dirname(root)
    changed = 0
    for f in args.files:
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            print(f"relative_paths: {f}: cannot read: {e}", file=sys.stderr)
            return 2
        new = relativize(text, root, base)
        if new != text:
            tmp = f.with_name(f".{f.name}.tmp")
            tmp.write_text(new, encoding="utf-8")
            os.replace(tmp, f)
            changed += 1
    print(f"relative_paths: {changed} of {len(args.files)} file(s) rewritten relative to {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
