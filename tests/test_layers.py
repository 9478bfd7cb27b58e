"""Imports point one way: flows -> bert_core -> data_jobs. Checked on the source, without importing it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = {"data_jobs": {"bert_core", "flows"}, "bert_core": {"flows"}}
# Modules Ray workers import must not need torch.
TORCH_FREE = ["data_jobs"]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_imports_point_downwards(package):
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        hit = _imports(path) & FORBIDDEN[package]
        if hit:
            bad.append(f"{path.relative_to(REPO)} imports {sorted(hit)}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", TORCH_FREE)
def test_worker_modules_import_without_torch(package):
    bad = [
        str(p.relative_to(REPO))
        for p in sorted((REPO / package).rglob("*.py"))
        if {"torch", "deepspeed"} & _imports(p)
    ]
    assert not bad, f"these modules import torch/deepspeed: {bad}"


def test_cli_help_lists_commands(capsys):
    from flows.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("data", "train", "export", "eval", "pipeline", "deploy", "serve"):
        assert name in out
    assert main(["no-such-command"]) == 2
