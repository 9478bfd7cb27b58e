"""Run Google's original ``create_pretraining_data.py`` (PyPI ``bert-tensorflow`` 1.0.4) without
TensorFlow: a minimal stand-in for the few ``tensorflow.compat.v1`` / ``absl.flags`` calls it makes.
TFRecords are not written: the stand-in writer counts records (the original still builds every
``tf.train.Example`` feature list, so its per-instance work is all there).

    python bench/run_original.py --script .../bert/create_pretraining_data.py \\
        --input_file=corpus.txt --vocab_file=vocab.txt --output_file=/dev/null \\
        --max_seq_length=128 --dupe_factor=5 [... any flag of the original]

Prints one line of JSON: {"records": N, "seconds": wall time inside the original}. Google's file is
not part of this repository: install it with
    python3 -m venv /tmp/bert-original && /tmp/bert-original/bin/pip install --no-deps bert-tensorflow==1.0.4
"""
from __future__ import annotations

import glob
import importlib.util
import json
import sys
import time
import types
from pathlib import Path

RECORDS = [0]


class _Flags:
    """absl-style FLAGS: definitions with defaults, values parsed from --name=value / --name value."""

    def __init__(self) -> None:
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "_kinds", {})

    def define(self, kind, name, default, *_args, **_kw) -> None:
        self._values.setdefault(name, default)
        self._kinds[name] = kind

    def parse(self, argv: list[str]) -> None:
        i = 0
        while i < len(argv):
            arg = argv[i].lstrip("-")
            if "=" in arg:
                name, value = arg.split("=", 1)
            elif self._kinds.get(arg) is bool:
                name, value = arg, "true"
            elif arg.startswith("no") and self._kinds.get(arg[2:]) is bool:
                name, value = arg[2:], "false"
            else:
                name, value = arg, argv[i + 1]
                i += 1
            kind = self._kinds.get(name)
            if kind is None:
                raise SystemExit(f"run_original: unknown flag --{name}")
            self._values[name] = value.lower() in ("1", "true", "yes") if kind is bool else kind(value)
            i += 1

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(name) from None


FLAGS = _Flags()


def _flags_module() -> types.ModuleType:
    m = types.ModuleType("absl.flags")
    m.FLAGS = FLAGS
    m.DEFINE_string = lambda n, d, *a, **k: FLAGS.define(str, n, d)
    m.DEFINE_integer = lambda n, d, *a, **k: FLAGS.define(int, n, d)
    m.DEFINE_float = lambda n, d, *a, **k: FLAGS.define(float, n, d)
    m.DEFINE_bool = m.DEFINE_boolean = lambda n, d, *a, **k: FLAGS.define(bool, n, d)
    m.mark_flag_as_required = lambda name: None
    return m


class _Writer:
    def __init__(self, path: str) -> None:
        self.path = path

    def write(self, record: bytes) -> None:
        RECORDS[0] += 1

    def close(self) -> None:
        pass


class _Proto:
    """tf.train.Example / Features / Feature / Int64List / FloatList: keep the fields, serialize to b""."""

    def __init__(self, **fields) -> None:
        self.__dict__.update(fields)

    def SerializeToString(self) -> bytes:
        return b""


class _Feature(_Proto):
    def __init__(self, int64_list=None, float_list=None) -> None:
        super().__init__(int64_list=int64_list or _Proto(value=[]), float_list=float_list or _Proto(value=[]))


def _tf_module(flags: types.ModuleType) -> types.ModuleType:
    tf = types.ModuleType("tensorflow.compat.v1")
    tf.flags = flags
    tf.gfile = types.SimpleNamespace(GFile=lambda path, mode="r": open(path, mode, encoding="utf-8"),
                                     Glob=lambda pattern: sorted(glob.glob(pattern)))
    tf.logging = types.SimpleNamespace(info=lambda *a, **k: None, set_verbosity=lambda *a: None, INFO=20)
    tf.python_io = types.SimpleNamespace(TFRecordWriter=_Writer)
    tf.train = types.SimpleNamespace(Example=_Proto, Features=_Proto, Feature=_Feature, Int64List=_Proto,
                                     FloatList=_Proto)
    return tf


def _install_standins() -> None:
    flags = _flags_module()
    absl = types.ModuleType("absl")
    absl.flags = flags
    tf = _tf_module(flags)
    compat = types.ModuleType("tensorflow.compat")
    compat.v1 = tf
    root = types.ModuleType("tensorflow")
    root.compat = compat
    sys.modules.update({"absl": absl, "absl.flags": flags, "tensorflow": root, "tensorflow.compat": compat,
                        "tensorflow.compat.v1": tf})
    if importlib.util.find_spec("six") is None:
        sys.modules["six"] = types.SimpleNamespace(PY2=False, PY3=True, text_type=str, binary_type=bytes)


def load_original(script: Path) -> types.ModuleType:
    """Google's create_pretraining_data module (and its ``bert.tokenization``), imported on the stand-ins."""
    _install_standins()
    # `from bert import tokenization` must find the installed package beside the script.
    pkg = types.ModuleType("bert")
    pkg.__path__ = [str(script.parent)]
    sys.modules["bert"] = pkg
    spec = importlib.util.spec_from_file_location("bert.create_pretraining_data", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "--script":
        raise SystemExit(__doc__)
    module = load_original(Path(argv[1]))
    FLAGS.parse(argv[2:])
    t0 = time.perf_counter()
    module.main(None)
    print(json.dumps({"records": RECORDS[0], "seconds": round(time.perf_counter() - t0, 3)}))


if __name__ == "__main__":
    main(sys.argv[1:])
