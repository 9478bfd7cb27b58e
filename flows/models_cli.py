"""``bertflow models list|show|promote|rollback``: the model registry (flows.registry) from the shell.

Every subcommand takes ``--registry PATH_OR_URI`` (default: ``$BERTFLOW_REGISTRY``); a problem (no such
model, a corrupt entry, a promotion that lost a race) is one ``bertflow: error:`` line and exit 2.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

from contracts.common import ArgParser, UserError, run_main
from flows.registry import ANY, ModelEntry, Registry

ENV = "BERTFLOW_REGISTRY"


def _parser(sub: str, description: str) -> ArgParser:
    p = ArgParser(prog=f"bertflow models {sub}", description=description)
    p.add_argument("--registry", metavar="PATH_OR_URI", default=None,
                   help=f"the registry: a directory or an object-store prefix such as s3://bucket/registry "
                        f"(default: ${ENV})")
    return p


def _registry(args) -> Registry:
    root = args.registry or os.environ.get(ENV)
    if not root:
        raise UserError(f"--registry: missing (or set {ENV})")
    return Registry(root)


def _metrics_brief(e: ModelEntry, limit: int = 3) -> str:
    items = [f"{k}={v:.4g}" if v is not None else f"{k}=null" for k, v in sorted(e.metrics.items())]
    return " ".join(items[:limit]) + (f" (+{len(items) - limit})" if len(items) > limit else "")


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


def _add_expect(p: ArgParser) -> None:
    p.add_argument("--expect", metavar="ID", default=None,
                   help="refuse unless ID is the promoted model now ('none': no model promoted yet), as a script "
                        "that decided against the current model needs")


def _expect(args):
    if args.expect is None:
        return ANY
    return None if args.expect == "none" else args.expect


def _entry_json(e: ModelEntry, promoted: Optional[str]) -> dict:
    return {**e.model_dump(mode="json"), "promoted": e.id == promoted}


def main_list(argv: Sequence[str] | None = None) -> int:
    return run_main(_list, argv)


def _list(argv: Sequence[str] | None) -> int:
    p = _parser("list", "List the registered models, oldest first; * marks the promoted one.")
    p.add_argument("--json", action="store_true", help="print a JSON list of the entries instead of a table")
    p.add_argument("--history", action="store_true", help="print the promotion history (every promotion and "
                   "rollback: when, by whom, why) instead")
    args = p.parse_args(argv)
    reg = _registry(args)
    if args.history:
        return _history(reg, args.json)
    entries, promoted = reg.list(), reg.promoted_id()
    if args.json:
        print(json.dumps([_entry_json(e, promoted) for e in entries], indent=2))
        return 0
    if not entries:
        print(f"no models registered in {reg}")
        return 0
    rows = [["", "ID", "PARENT", "CREATED", "SNAPSHOTS", "GATE", "METRICS"]]
    for e in entries:
        rows.append(["*" if e.id == promoted else "", e.id, e.parent or "-", e.created[:19].replace("T", " "),
                     ",".join(e.snapshots) or "-", e.gate.decision if e.gate else "-", _metrics_brief(e)])
    print(_table(rows))
    if promoted is None:
        print("(no model promoted yet)")
    return 0


def _history(reg: Registry, as_json: bool) -> int:
    ptr, _ = reg.pointer()
    events = ptr.history if ptr else []
    if as_json:
        print(json.dumps([e.model_dump(mode="json") for e in events], indent=2))
        return 0
    if not events:
        print(f"no model promoted yet in {reg}")
        return 0
    rows = [["AT", "ACTION", "MODEL", "PREVIOUS", "BY", "REASON"]]
    rows += [[e.at[:19].replace("T", " "), e.action, e.model, e.previous or "-", e.by, e.reason or "-"] for e in events]
    print(_table(rows))
    return 0


def main_show(argv: Sequence[str] | None = None) -> int:
    return run_main(_show, argv)


def _show(argv: Sequence[str] | None) -> int:
    p = _parser("show", "Show one model: lineage, snapshots, config hashes, metrics, gate decision, export.")
    p.add_argument("id", metavar="ID", help="model id (or a prefix matching one model), or 'promoted'")
    p.add_argument("--json", action="store_true", help="print the entry (and its lineage ids) as JSON")
    args = p.parse_args(argv)
    reg = _registry(args)
    promoted = reg.promoted_id()
    if args.id == "promoted":
        if promoted is None:
            raise UserError(f"{reg}: no model promoted yet")
        args.id = promoted
    chain = reg.lineage(args.id)
    e = chain[0]
    if args.json:
        print(json.dumps({**_entry_json(e, promoted), "lineage": [x.id for x in chain]}, indent=2))
        return 0
    out = [f"id:         {e.id}{'  (promoted)' if e.id == promoted else ''}",
           f"lineage:    {' <- '.join(x.id for x in chain)}",
           f"created:    {e.created}",
           f"export:     {e.export}",
           f"snapshots:  {', '.join(e.snapshots) or '-'}",
           "config hashes:" + ("" if e.config_hashes else " -")]
    out += [f"  {k}: {v}" for k, v in sorted(e.config_hashes.items())]
    out.append("metrics:" + ("" if e.metrics else " -"))
    out += [f"  {k}: {'null' if v is None else f'{v:.6g}'}" for k, v in sorted(e.metrics.items())]
    out.append(f"gate:       {e.gate.decision}: {e.gate.reason}" if e.gate else "gate:       - (not gated)")
    for c in e.gate.checks if e.gate else []:
        nums = "missing" if c.change is None else f"{c.candidate:.6g} vs {c.promoted:.6g} ({c.change:+.4g})"
        out.append(f"  {'ok' if c.ok else 'FAIL':<4} {c.metric}: {nums}, rule {c.limit}")
    out += [f"info:       {json.dumps(e.info, sort_keys=True)}"] if e.info else []
    print("\n".join(out))
    return 0


def main_promote(argv: Sequence[str] | None = None) -> int:
    return run_main(_promote, argv)


def _promote(argv: Sequence[str] | None) -> int:
    p = _parser("promote", "Make a model the promoted one (a compare-and-swap: refused if another promotion "
                "or rollback changed the pointer meanwhile).")
    p.add_argument("id", metavar="ID", help="model id (or a prefix matching one model)")
    p.add_argument("--reason", default="", help="why, recorded in the promotion history")
    p.add_argument("--force", action="store_true", help="promote even though its gate decided keep")
    _add_expect(p)
    args = p.parse_args(argv)
    reg = _registry(args)
    ptr = reg.promote(args.id, reason=args.reason, force=args.force, expect=_expect(args))
    previous = ptr.history[-1].previous
    print(f"promoted {ptr.promoted} (was {previous or 'none'}) in {reg}")
    return 0


def main_rollback(argv: Sequence[str] | None = None) -> int:
    return run_main(_rollback, argv)


def _rollback(argv: Sequence[str] | None) -> int:
    p = _parser("rollback", "Return to the model promoted before the current one.")
    p.add_argument("--reason", default="", help="why, recorded in the promotion history")
    _add_expect(p)
    args = p.parse_args(argv)
    reg = _registry(args)
    ptr = reg.rollback(reason=args.reason, expect=_expect(args))
    print(f"rolled back: promoted {ptr.promoted} (was {ptr.history[-1].previous}) in {reg}")
    return 0
