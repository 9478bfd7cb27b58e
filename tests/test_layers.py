"""Imports point one way: flows -> evaluation -> bert_core -> data_jobs -> contracts; each package may
import only the packages to its right. Checked on the source (ast), without importing it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LAYERS = ["flows", "evaluation", "bert_core", "data_jobs", "contracts"]  # each may import only those after it
# Modules Ray workers import (and the contracts under them) must not need torch or DeepSpeed.
TORCH_FREE = ["data_jobs", "contracts"]
# The contracts import no framework: the CLI, Ray workers and model code all load them cheaply.
FRAMEWORKS = {"torch", "deepspeed", "ray", "prefect"}


def _modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_nodes(path: Path, top_level_only: bool = False):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    nodes = tree.body if top_level_only else ast.walk(tree)
    return [n for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))]


def _imports(path: Path) -> set[str]:
    """Top-level package of every absolute import anywhere in the file (function-level ones included)."""
    names = set()
    for node in _import_nodes(path):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", LAYERS)
def test_imports_point_only_to_lower_layers(package):
    above = set(LAYERS[: LAYERS.index(package) + 1]) - {package}
    bad = []
    for path in _modules(package):
        hit = _imports(path) & above
        if hit:
            bad.append(f"{path.relative_to(REPO)} imports {sorted(hit)}, a layer above {package}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("package", TORCH_FREE)
def test_worker_modules_import_without_torch(package):
    bad = [str(p.relative_to(REPO)) for p in _modules(package) if {"torch", "deepspeed"} & _imports(p)]
    assert not bad, f"these modules import torch/deepspeed: {bad}"


def test_contracts_import_nothing_of_the_project_and_no_framework():
    bad = [f"{p.relative_to(REPO)}: {sorted(hit)}" for p in _modules("contracts")
           if (hit := _imports(p) & (set(LAYERS) - {"contracts"} | FRAMEWORKS))]
    assert not bad, bad


def test_evaluation_uses_only_bert_cores_public_names():
    bad = []
    for path in _modules("evaluation"):
        for node in _import_nodes(path):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "bert_core":
                private = [a.name for a in node.names if a.name.startswith("_")]
                if private or any(part.startswith("_") for part in node.module.split(".")):
                    bad.append(f"{path.relative_to(REPO)}: from {node.module} import {private}")
    assert not bad, bad


def _module_graph() -> dict[str, set[str]]:
    """Project module -> project modules it imports at module level (what runs on import)."""
    modules = {_module_name(p): p for pkg in LAYERS for p in _modules(pkg)}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in _import_nodes(path, top_level_only=True):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module] + [f"{node.module}.{a.name}" for a in node.names] if node.module and node.level == 0 else [])
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def test_no_import_cycle_between_modules():
    graph, state, cycles = _module_graph(), {}, []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep):] + [dep]))
            elif dep not in state:
                visit(dep, stack + [dep])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert len(graph) > 50 and not cycles, cycles


def test_cli_help_lists_commands(capsys):
    from flows.cli import main

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for name in ("data", "train", "export", "eval", "pipeline", "deploy", "serve"):
        assert name in out
    assert main(["no-such-command"]) == 2
