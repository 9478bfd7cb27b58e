"""Stage "specs": a stage config minus the fields the pipeline fills in (its input and output paths).

The pipeline derives every output directory from the config that produces it, so a user never writes
paths between stages. Rather than writing each stage's options out a second time (and letting the two
copies drift), a spec model is generated from the stage config by dropping the wiring fields: field
types, defaults and descriptions stay defined once, in the stage's own config module.
"""
from __future__ import annotations

from typing import Any, Iterable

from pydantic import BaseModel, create_model

from contracts.common import StrictModel, build_config


def spec_of(model: type[BaseModel], drop: Iterable[str], name: str, doc: str | None = None) -> type[StrictModel]:
    """A frozen, strict model with ``model``'s fields except ``drop`` (same types, defaults, docs)."""
    drop = set(drop)
    missing = drop - set(model.model_fields)
    if missing:
        raise TypeError(f"{model.__name__} has no fields {sorted(missing)}")
    fields: dict[str, Any] = {
        key: (info.annotation, info) for key, info in model.model_fields.items() if key not in drop
    }
    spec = create_model(name, __base__=StrictModel, __module__=__name__, **fields)
    spec.run_fields = frozenset(getattr(model, "run_fields", frozenset()) - drop)
    spec.__doc__ = doc or f"{model.__name__} without the paths the pipeline derives ({', '.join(sorted(drop))})."
    return spec


def complete(model: type[BaseModel], spec: BaseModel, source: str, **wiring: Any) -> Any:
    """Build the full stage config from a spec plus the derived paths; one-line UserError if invalid."""
    data = spec.model_dump(mode="python")
    data.update(wiring)
    return build_config(model, data, source)
