"""Shared plumbing for every layer: user errors, strict configs, atomic files, hashes.

The bottom of the import graph (flows -> evaluation -> bert_core -> data_jobs -> contracts): it imports
nothing of the project and neither torch nor ray, so Ray workers, model code and the CLI load it cheaply.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import types
import typing
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator, Literal, Sequence, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from contracts.shutdown import Terminated, bounded_interrupt


class UserError(Exception):
    """An error the user can fix (bad path, bad config, malformed input).

    Entry points print ``bertflow: error: <message>`` on one line and exit non-zero, with no traceback.
    The message should name the file (or option) and the problem.
    """


class StrictModel(BaseModel):
    """Base for every config: immutable, unknown keys rejected, validated on assignment."""

    # allow_inf_nan=False: `--lr inf` once trained and saved a complete checkpoint of non-finite weights.
    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True, allow_inf_nan=False)

    # Fields naming the job's inputs (files, datasets, checkpoints). They do not enter the config hash
    # as paths: each stage's ``status`` compares its inputs by content identity instead (a dataset's
    # manifest identity, a file's size and checksum), so the same inputs addressed as ``out/docs`` or
    # ``/abs/out/docs``, or copied elsewhere, are recognised, and inputs edited in place are not.
    input_fields: ClassVar[frozenset[str]] = frozenset()
    # THE hashing rule, for every config: fields that say where or how widely a job runs, or how it
    # reports progress, never change what it produces, so they never enter a config hash (a rerun with
    # more workers, another cluster address or the output moved elsewhere is the same job). Each config
    # class names its own (a subclass adds to its base's); a name that is not one of its fields is refused
    # when the class is defined, so no list here speaks for other packages' configs.
    run_fields: ClassVar[frozenset[str]] = frozenset()
    # Options added after outputs were first named by this config's hash: left at these defaults they
    # are left out of the hash (and of a pipeline directory's name), so older outputs stay done.
    later_defaults: ClassVar[dict[str, Any]] = {}
    # A record the program writes and reads back (a registry entry, a gate row) may hold "" (no reason
    # given); a config a user writes may not.
    empty_strings: ClassVar[bool] = False

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        for kind in ("run_fields", "input_fields", "later_defaults"):
            unknown = set(getattr(cls, kind)) - set(cls.model_fields)
            if unknown:
                raise TypeError(f"{cls.__name__}.{kind} names no field of it: {sorted(unknown)}")

    @field_validator("*")
    @classmethod
    def _no_empty_strings(cls, value: Any) -> Any:
        """An empty string is never a value (`--text-column ""` once made a complete dataset of 0
        documents; an empty path names the working directory). Not pydantic's str_min_length: that
        refuses file names that are not UTF-8, which the readers skip and count."""
        if cls.empty_strings:
            return value
        if value == "" or (isinstance(value, (list, tuple)) and "" in value):
            raise ValueError("an empty string is not a value (leave the option out)")
        return value

    def config_hash(self) -> str:
        """Stable 16-hex-digit hash of what the config decides about its outputs (the one rule: no
        run fields, no input paths)."""
        data = self.model_dump(mode="json", exclude=set(self.run_fields | self.input_fields))
        return stable_hash(self.without_later_defaults(data))

    @classmethod
    def without_later_defaults(cls, data: dict) -> dict:
        """``data`` (fields of this config) without the ``later_defaults`` options holding their default."""
        later = cls.later_defaults
        return {k: v for k, v in data.items() if k not in later or v != later[k]}


NO_OUTPUT = "no output yet"


@dataclass(frozen=True)
class Status:
    """A stage's answer to "is my output already there for this config and these inputs?".

    done: complete and intact, skip it; partial: work of this very config and inputs is there to be
    continued; absent: nothing usable (nothing there, or made from another config or other inputs).
    ``reason`` is what the log says: "complete", "config differs", "inputs changed: 3 files", ...
    """

    state: Literal["done", "partial", "absent"]
    reason: str
    inputs: str = ""  # content identity of the inputs compared ("" where not computed)

    @property
    def done(self) -> bool:
        return self.state == "done"

    @property
    def fresh(self) -> bool:
        """Nothing there yet: a first run, with nothing to explain (the CLI then prints no status line,
        so that a bad input still gives exactly one line)."""
        return self.reason == NO_OUTPUT

    def line(self, stage: str) -> str:
        """The one log line saying why ``stage`` is skipped or (re)done."""
        if self.done:
            return f"stage {stage}: skipped ({self.reason})"
        verb = "resuming" if self.state == "partial" else "running"
        return f"stage {stage}: {verb} ({self.reason})"


M = TypeVar("M", bound=BaseModel)


def format_validation_error(err: ValidationError, source: str) -> str:
    """One line: where (file and key path) and what is wrong, for every problem pydantic found."""
    parts = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"]
        if e["type"] == "extra_forbidden":
            msg = "unknown key (typo?)"
        parts.append(f"{loc}: {msg}")
    return f"{source}: invalid config: " + "; ".join(parts)


MAX_CONFIG_DEPTH = 32  # far deeper than any config; deeper values overflow pydantic's and json's limits


def _too_deep(data: Any, limit: int = MAX_CONFIG_DEPTH) -> str | None:
    """The key path of the first value of ``data`` nested deeper than ``limit`` (iterative), else None."""
    stack: list[tuple[Any, tuple, int]] = [(data, (), 0)]
    while stack:
        node, path, depth = stack.pop()
        if depth > limit:
            return ".".join(str(p) for p in path[:4]) + (".…" if len(path) > 4 else "")
        if isinstance(node, dict):
            stack += [(v, path + (k,), depth + 1) for k, v in node.items()]
        elif isinstance(node, (list, tuple)):
            stack += [(v, path + (i,), depth + 1) for i, v in enumerate(node)]
    return None


def build_config(model: type[M], data: dict[str, Any], source: str = "config") -> M:
    """Validate ``data`` into ``model``, turning pydantic's report into a one-line UserError."""
    where = _too_deep(data)
    if where is not None:
        raise UserError(f"{source}: invalid config: {where or '<root>'}: nested deeper than {MAX_CONFIG_DEPTH} levels")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise UserError(format_validation_error(err, source)) from None


_LOADER: Any = None


def _strict_loader() -> Any:
    """yaml.SafeLoader refusing a key given twice in one mapping (PyYAML keeps the last one silently).
    Merge keys (``<<``) are no duplicates: the explicit keys of a mapping override merged ones."""
    global _LOADER
    if _LOADER is None:
        import yaml

        class StrictLoader(yaml.SafeLoader):
            def construct_mapping(self, node, deep=False):
                if isinstance(node, yaml.MappingNode):
                    seen: set = set()
                    for key_node, _ in node.value:
                        if key_node.tag == "tag:yaml.org,2002:merge":
                            continue
                        key = self.construct_object(key_node, deep=True)
                        try:
                            duplicate = key in seen
                            seen.add(key)
                        except TypeError:  # an unhashable key: SafeLoader's own error follows
                            continue
                        if duplicate:
                            raise yaml.constructor.ConstructorError(
                                None, None, f"duplicate key {key!r} (line {key_node.start_mark.line + 1})",
                                key_node.start_mark)
                return super().construct_mapping(node, deep)

        _LOADER = StrictLoader
    return _LOADER


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    """Read a YAML mapping, with one-line errors for a missing file or bad YAML."""
    import yaml  # here: a CLI given only flags does not pay its import

    p = str(path) if "://" in str(path) else Path(path)
    raw = _config_bytes(p)
    if len(raw) > MAX_CONFIG_BYTES:  # PyYAML parses a 50 MB file for minutes
        raise UserError(f"{p}: {len(raw):,} bytes; a config is at most {MAX_CONFIG_BYTES:,} bytes (not a config file?)")
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=_strict_loader())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None and "line" not in first else ""
        raise UserError(f"{p}: not valid YAML: {first}{where}") from None
    except RecursionError:
        raise UserError(f"{p}: not valid YAML: nested too deeply") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{p}: expected a mapping of config keys at the top level")
    problem = _expansion_problem(data)
    if problem:
        raise UserError(f"{p}: not a usable config: {problem}")
    return data


MAX_CONFIG_BYTES = 4 << 20
MAX_CONFIG_VALUES = 100_000  # values once YAML's aliases are expanded; a real config has hundreds


def _expansion_problem(data: Any) -> str | None:
    """Why ``data`` (as YAML built it: aliases are shared objects) cannot be used as a config: a value that
    contains itself, or aliases that expand to more than MAX_CONFIG_VALUES values (a "billion laughs").
    Iterative, each shared object sized once."""
    sizes: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(data, False)]
    open_ids: set[int] = set()
    while stack:
        node, done = stack.pop()
        if not isinstance(node, (dict, list)):
            continue
        key = id(node)
        children = list(node.values()) if isinstance(node, dict) else node
        if done:
            open_ids.discard(key)
            sizes[key] = 1 + sum(sizes.get(id(c), 1) for c in children)
            if sizes[key] > MAX_CONFIG_VALUES:
                return (f"its aliases expand to more than {MAX_CONFIG_VALUES:,} values "
                        "(a 'billion laughs' document?)")
            continue
        if key in sizes:
            continue
        if key in open_ids:
            return "a value refers to itself through a YAML alias"
        open_ids.add(key)
        stack.append((node, True))
        stack += [(c, False) for c in children if isinstance(c, (dict, list))]
    return None


def _config_bytes(path: str | Path) -> bytes:
    """A config file's bytes: a local path, or an object-store URI (a Ray job's config on a cluster
    with no shared file system)."""
    if isinstance(path, Path):
        if not path.is_file():
            raise UserError(f"{path}: config file not found")
        return path.read_bytes()
    from contracts.storage import location

    try:
        return location(path).read("")
    except (FileNotFoundError, IsADirectoryError):
        raise UserError(f"{path}: config file not found") from None


def load_config(model: type[M], path: str | os.PathLike, overrides: dict[str, Any] | None = None) -> M:
    """Load ``model`` from a YAML file, applying ``overrides`` (e.g. from CLI flags) on top."""
    data = load_yaml(path)
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return build_config(model, data, str(path))


def stable_hash(obj: Any) -> str:
    """SHA-256 (first 16 hex digits) of a JSON-serialisable object with sorted keys."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: str | os.PathLike) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextmanager
def atomic_path(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``final``; on success fsync and rename it into place.

    A crash (or exception) leaves only a ``.tmp-*`` file, never something that looks finished.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{final.name}.", dir=final.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as f:
            os.fsync(f.fileno())
        # mkstemp creates 0600; finished outputs get the usual umask-based mode so others can read them.
        os.chmod(tmp_path, 0o666 & ~_UMASK)
        os.replace(tmp_path, final)
        fsync_dir(final.parent)
    except BaseException:
        tmp_path.unlink(missing_ok=True)
        raise


def json_record(obj: Any) -> bytes:
    """The one serialisation of a record the program writes (same bytes on local disk and a store)."""
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(json_record(obj))


def read_json_object(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The JSON object in ``path`` (a record the program wrote and reads back, or a model's config.json);
    a one-line UserError naming the file for anything else: unreadable, not UTF-8, not JSON, nested too
    deeply, or a list or scalar where an object belongs."""
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except RecursionError:
        raise UserError(f"{path}: corrupt {what}: JSON nested too deeply") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path}: corrupt {what}: not valid JSON: {err}") from None
    except (OSError, ValueError) as err:  # ValueError: UnicodeDecodeError, an integer too long to read
        raise UserError(f"{path}: corrupt {what}: {one_line(str(err))}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: corrupt {what}: a JSON {type(data).__name__}, not an object")
    return data


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped: an error quoting the user's value stays one line."""
    return text.rstrip("\n").replace("\r", "\\r").replace("\n", "\\n")


def run_main(fn: Callable[[Sequence[str] | None], int], argv: Sequence[str] | None = None) -> int:
    """Run an entry point: UserError -> one line on stderr and exit code 2; Ctrl-C -> 130 (at the latest
    ``INTERRUPT_GRACE_S`` after it)."""
    try:
        with bounded_interrupt():
            return fn(argv)
    except UserError as err:
        print(f"bertflow: error: {one_line(str(err))}", file=sys.stderr)
        return 2
    except Terminated:
        print("bertflow: terminated (SIGTERM); rerun the same command to resume", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("bertflow: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `bertflow ... | head`: the reader left; nothing to report (the convention of cat, grep, git).
        # Point stdout at devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:
        # Disk full, permission denied, ...: the user's environment, not a bug.
        where = f"{err.filename}: " if getattr(err, "filename", None) else ""
        print(f"bertflow: error: {where}{err.strerror or err}", file=sys.stderr)
        return 2


# ---------------------------------------------------------------- CLIs generated from config models

class ArgParser(argparse.ArgumentParser):
    """argparse whose errors are the project's one line (``bertflow: error: <option>: <problem>``, exit 2
    through run_main) instead of a usage block and argparse's own message."""

    def error(self, message: str):  # type: ignore[override]
        if message.startswith("argument "):
            message = message[len("argument "):]  # "--num-shards: invalid int value: 'x'"
        raise UserError(one_line(message))


class _Extend(argparse.Action):
    """Repeatable list option: ``--x a b --x c`` and ``--x a,b`` (unless commas are kept) give [a, b, c]."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = list(getattr(namespace, self.dest) or [])
        for v in values:
            items.extend(v if isinstance(v, list) else [v])
        setattr(namespace, self.dest, items)


def _unwrap(annotation: Any) -> Any:
    """Optional[X] -> X (a None default says "unset"); other unions keep their first member."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if args else str
    return annotation


def _scalar(kind: Any, name: str, split: bool) -> Callable[[str], Any]:
    base = kind if kind in (int, float) else str

    def convert(text: str) -> Any:
        parts = [t.strip() for t in text.split(",") if t.strip()] if split else [text]
        try:
            values = [base(t) for t in parts]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {base.__name__} values, got {text!r}") from None
        return values if split else values[0]

    convert.__name__ = base.__name__
    return convert


def add_config_flags(parser: argparse.ArgumentParser, model: type[BaseModel], skip: Sequence[str] = (),
                     aliases: dict[str, Any] | None = None, keep_commas: Sequence[str] = ()) -> None:
    """One ``--field-name`` per field of ``model`` (help: the field's description and default): bools as
    ``--x/--no-x``, Literals with choices, lists repeatable or comma-separated, pairs as two values.
    Mappings and nested models are set in the YAML file. ``aliases``: ``{"--flag": "field"}`` for
    another name of a value flag, ``{"--flag": ("field", value)}`` for a flag storing that value."""
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        kind = _unwrap(field.annotation)
        origin = typing.get_origin(kind)
        if origin is dict or (isinstance(kind, type) and issubclass(kind, BaseModel)):
            continue
        default = "" if field.is_required() else f" (default: {field.get_default(call_default_factory=True)})"
        kw: dict[str, Any] = {"dest": name, "default": None, "help": (field.description + default).replace("%", "%%")}
        flag = "--" + name.replace("_", "-")
        if kind is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif origin is typing.Literal:
            kw.update(choices=list(typing.get_args(kind)), metavar="{" + ",".join(map(str, typing.get_args(kind))) + "}")
        elif origin is list:
            item = _unwrap(typing.get_args(kind)[0])
            kw.update(action=_Extend, nargs="+", type=_scalar(item, name, name not in keep_commas))
        elif origin is tuple:
            kw.update(nargs=len(typing.get_args(kind)), type=_scalar(typing.get_args(kind)[0], name, False))
        else:
            kw["type"] = _scalar(kind, name, False)
        parser.add_argument(flag, **kw)
    for alias, target in (aliases or {}).items():
        if isinstance(target, tuple):
            parser.add_argument(alias, dest=target[0], action="store_const", const=target[1], default=None,
                                help=f"same as --{'' if target[1] else 'no-'}{target[0].replace('_', '-')}")
        else:
            action = next(a for a in parser._actions if a.dest == target)
            action.option_strings.append(alias)
            parser._option_string_actions[alias] = action


def config_parser(model: type[BaseModel], prog: str, description: str, **flags: Any) -> ArgParser:
    """The CLI of a config model: ``--config FILE.yaml`` plus one flag per field (flags win)."""
    parser = ArgParser(prog=prog, description=description,
                       epilog="Flags override the keys of --config; every flag is a field of the config.")
    parser.add_argument("--config", help=f"YAML file with {model.__name__} keys (flags override it)")
    add_config_flags(parser, model, **flags)
    return parser


def config_from_args(model: type[M], args: argparse.Namespace, ignore: Sequence[str] = ()) -> M:
    """The config from ``--config`` (if given) with every flag that was set on top."""
    values = {k: v for k, v in vars(args).items() if k not in ("config", *ignore) and v is not None}
    if getattr(args, "config", None):
        return load_config(model, args.config, values)
    return build_config(model, values, "command line")
