"""Generated hostile configs (issue 24): every field of every config model, through YAML and flags.

Each property takes a minimal valid config of one model, replaces one field (found from the model itself,
nested specs of the pipeline config included) by a hostile value (empty, huge, negative, NaN, non-ASCII,
wrong type, wrong shape, deeply nested), writes it as YAML and loads it as the CLI does. The invariant:
a valid config (whose hash and, for a pipeline, whose plan can be computed) or one UserError line that
names the file or option; never another exception. Raw YAML texts cover what a mapping cannot spell:
duplicated keys, a top level that is a list or a scalar, deep nesting. Settings: tests/fuzz_settings.py.
"""
from __future__ import annotations

import math
import re
import tempfile
import typing
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import BaseModel

from bert_core.train_config import TrainConfig
from contracts.common import UserError, config_from_args, config_parser, load_config
from data_jobs.config import InstancesConfig, MixConfig, ShardConfig, VocabConfig
from evaluation.config import GlueConfig, IntrinsicConfig, NerConfig, SquadConfig
from flows.config import PipelineConfig, make_plan
from flows.continual import ContinualConfig
from flows.recipe import RecipeConfig, load_recipe
from fuzz_settings import fuzz

BASE = Path("/tmp/bertflow-fuzz-config")  # paths are only named, never touched: nothing is read or run
MINIMAL: dict[type[BaseModel], dict] = {
    ShardConfig: {"inputs": [f"{BASE}/corpus"], "output_dir": f"{BASE}/out"},
    VocabConfig: {"shards_dir": f"{BASE}/docs", "output_dir": f"{BASE}/out"},
    InstancesConfig: {"shards_dir": f"{BASE}/docs", "vocab_dir": f"{BASE}/vocab", "output_dir": f"{BASE}/out"},
    TrainConfig: {"data_dir": f"{BASE}/inst", "output_dir": f"{BASE}/out"},
    GlueConfig: {"model_path": f"{BASE}/m", "output_dir": f"{BASE}/out", "glue_dir": f"{BASE}/glue"},
    SquadConfig: {"model_path": f"{BASE}/m", "output_dir": f"{BASE}/out", "dev_file": f"{BASE}/dev.json"},
    NerConfig: {"model_path": f"{BASE}/m", "output_dir": f"{BASE}/out", "conll_dir": f"{BASE}/conll"},
    IntrinsicConfig: {"model_path": f"{BASE}/m", "output_dir": f"{BASE}/out", "instances_dir": f"{BASE}/i"},
    MixConfig: {"sources": [f"{BASE}/a", f"{BASE}/b"], "weights": [1.0, 0.25], "output_dir": f"{BASE}/out"},
    ContinualConfig: {"source": f"{BASE}/corpus", "output_root": f"{BASE}/runs", "train": {}},
    PipelineConfig: {"output_root": f"{BASE}/runs", "shard": {"inputs": [f"{BASE}/corpus"]},
                     "phases": [{"name": "p1", "instances": {}, "train": {}}],
                     "evaluation": {"intrinsic": {}, "glue": {}, "squad": {"dev_file": f"{BASE}/dev.json"},
                                    "ner": {"conll_dir": f"{BASE}/conll"}}},
}


def _nested_models(annotation) -> list[type[BaseModel]]:
    args = typing.get_args(annotation) or (annotation,)
    out = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    for a in args:
        if typing.get_origin(a) is list:
            out += _nested_models(typing.get_args(a)[0])
    return out


def field_paths(model: type[BaseModel], prefix: tuple = ()) -> list[tuple]:
    """Every field of ``model`` as a key path; nested models (the pipeline's specs) field by field."""
    paths = []
    for name, info in model.model_fields.items():
        path = prefix + (name,)
        paths.append(path)
        for sub in _nested_models(info.annotation):
            if sub.__name__ == "ModelConfig":
                continue  # TrainConfig.model: a preset name or a full mapping, covered by its own field
            inner = path + ((0,) if typing.get_origin(_unwrap(info.annotation)) is list else ())
            paths += field_paths(sub, inner)
    return paths


def _unwrap(annotation):
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if typing.get_origin(annotation) in (typing.Union,) and len(args) == 1 else annotation


FIELDS = [(m, p) for m in MINIMAL for p in field_paths(m)]


def deep(n: int):
    value: typing.Any = 1
    for _ in range(n):
        value = [value]
    return value


SCALARS = st.one_of(
    st.just(""), st.just(" "), st.just("x" * 100_000), st.just(-1), st.just(0), st.just(-(10**30)),
    st.just(10**30), st.just(math.nan), st.just(math.inf), st.just(-math.inf), st.just(1e308), st.just(1.5),
    st.just(True), st.just(None), st.just("é漢🙂\u202e"), st.just("\x00"), st.just("builtin:"),
    st.just("../../etc"), st.just("~nobody/x"), st.just("auto"), st.just("NaN"), st.just("1e999"),
    st.text(max_size=20), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
)
HOSTILE = st.one_of(
    SCALARS,
    st.lists(SCALARS, max_size=3),
    st.dictionaries(st.text(max_size=5), SCALARS, max_size=3),
    st.sampled_from([[], {}, [[]], [{}], {"a": {"b": {}}}, deep(50), deep(400), {"": 1}, {1: 2}]),
)


def set_path(data: typing.Any, path: tuple, value: typing.Any) -> dict:
    """A copy of ``data`` with ``value`` at ``path`` (missing mappings on the way are created)."""
    import copy

    data = copy.deepcopy(data)
    node = data
    for key in path[:-1]:
        if isinstance(key, int):
            node = node[key]
        else:
            node = node.setdefault(key, {})
    node[path[-1]] = value
    return data


def check_loads(model: type[BaseModel], path: Path) -> BaseModel | None:
    """The invariant: a usable config, or one UserError line naming the file; nothing else escapes."""
    try:
        config = PipelineConfig.from_yaml(path) if model is PipelineConfig else load_config(model, path)
        config.config_hash()
        if isinstance(config, PipelineConfig):
            plan = make_plan(config)
            for stage in [plan.shard, plan.vocab, *plan.instances.values(), *plan.train.values()]:
                stage.config_hash()
    except UserError as err:
        message = str(err)
        assert "\n" not in message, message
        assert message.startswith(str(path)) or message.split(":")[0] in {"model_overrides"}, message
        return None
    return config


def write_yaml(tmp: Path, data) -> Path:
    import yaml

    p = tmp / "config.yaml"
    p.write_text(yaml.safe_dump(data, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return p


@given(case=st.sampled_from(FIELDS), value=HOSTILE)
@fuzz(800)
@example(case=(ShardConfig, ("text_column",)), value="")  # a complete 0-document dataset (issue 24)
@example(case=(ShardConfig, ("inputs",)), value=[""])  # "" read as the working directory
@example(case=(TrainConfig, ("model_overrides",)), value={"vocab_size": deep(400)})
def test_every_field_hostile_value(tmp_path_factory, case, value):
    model, path = case
    tmp = tmp_path_factory.mktemp("cfg")
    config = check_loads(model, write_yaml(tmp, set_path(MINIMAL[model], path, value)))
    if config is not None and value == "":
        # An empty string is never a value: it must not pass as one silently.
        node = config
        for key in path:
            node = node[key] if isinstance(key, int) else getattr(node, key, None)
        assert node is None or node != value, f"{model.__name__}.{'.'.join(map(str, path))} accepted {value!r}"


def test_every_field_is_generated():
    """The generator covers every field of every model (a new field is fuzzed without anyone adding it)."""
    names = {p[-1] for _, p in FIELDS}
    for model in MINIMAL:
        assert set(model.model_fields) <= names
    assert ("phases", 0, "train", "lr") in {p for _, p in FIELDS}


DUPLICATE_TEXTS = [
    "num_shards: 4\nnum_shards: 8\n",
    "text_column: text\nnum_workers: 1\ntext_column: body\n",
    "dedup: true\n'dedup': false\n",
    "inputs: [a]\ninputs: [b]\n",
]


@given(text=st.sampled_from(DUPLICATE_TEXTS), indent=st.sampled_from(["", "  "]))
@fuzz(8)
def test_duplicate_keys_are_an_error(tmp_path_factory, text, indent):
    """Duplicated keys (top level or nested) are refused, naming the key; never "the last one wins"."""
    tmp = tmp_path_factory.mktemp("dup")
    body = text if not indent else "inputs: [a]\noutput_dir: out\nray:\n" + "".join(
        indent + line + "\n" for line in text.splitlines())
    p = tmp / "config.yaml"
    p.write_text(body, encoding="utf-8")
    with pytest.raises(UserError) as err:
        load_config(ShardConfig, p)
    assert str(err.value).startswith(str(p)) and "duplicate key" in str(err.value), err.value
    assert "\n" not in str(err.value)


def test_merge_keys_are_not_duplicates(tmp_path):
    """A YAML merge key (``<<``) overridden by an explicit key is no duplicate."""
    p = tmp_path / "c.yaml"
    p.write_text("inputs: [a]\noutput_dir: out\n<<: {text_column: body, num_shards: 2}\nnum_shards: 3\n")
    assert load_config(ShardConfig, p).num_shards == 3


DEPTHS = st.sampled_from([2, 33, 40, 1200, 100_000])
RAW = st.one_of(
    st.sampled_from(["- 1\n- 2\n", "42\n", "'text'\n", "[]\n", "~\n", "!!binary aGk=\n", "? [a, b]\n: 1\n",
                     "{[1]: 2}\n", "a: !!python/object:os.system {}\n", "&a [*a]\n", "\t\x00\n", "\xff\n"]),
    DEPTHS.map(lambda n: "[" * n + "]" * n),  # deep cases cost ~2 s each (PyYAML unwinding): few depths
    DEPTHS.map(lambda n: "a:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(min(n, 3000)))),
    DEPTHS.map(lambda n: "inputs: " + "{a: " * n + "1" + "}" * n),
    st.builds(lambda levels, width, key: laughs(levels, width, key), st.integers(1, 12), st.integers(1, 12),
              st.sampled_from(["inputs", "model_overrides", "extra", "phases"])),
    st.text(max_size=200),
)


def laughs(levels: int, width: int, key: str = "inputs") -> str:
    """A 'billion laughs' config: each level an anchored list of ``width`` aliases to the level below,
    the last one under ``key`` (width ** levels values once expanded, a few hundred bytes of YAML)."""
    lines = ["l0: &l0 [lol]"] + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines + [f"{key}: *l{levels - 1}", "output_dir: o", ""])


@given(text=RAW, model=st.sampled_from(list(MINIMAL)))
@fuzz(60)
@example(text="[" * 100_000 + "]" * 100_000, model=ShardConfig)  # RecursionError traceback (issue 24)
@example(text="inputs: " + "[" * 5000 + "]" * 5000 + "\noutput_dir: o\n", model=ShardConfig)
def test_raw_yaml_texts(tmp_path_factory, text, model):
    """Any text as a config file: deep nesting, non-mappings, tags and invalid bytes included."""
    p = tmp_path_factory.mktemp("raw") / "config.yaml"
    p.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff\n" else b"\xff\n")
    check_loads(model, p)


FLAG_VALUES = st.one_of(st.sampled_from(["", " ", "-1", "nan", "inf", "1e999", "é", "--", "-x", "0", "a,b,,"]),
                        st.text(max_size=10))


@given(model=st.sampled_from([ShardConfig, TrainConfig, GlueConfig, InstancesConfig]), data=st.data())
@fuzz(150)
@example(model=ShardConfig, data=None)  # --text-column "": a complete 0-document dataset (issue 24)
@example(model=TrainConfig, data="\n")  # found: argparse quoted the value "\n" into a two-line error
def test_flags_hostile_values(model, data):
    """The generated CLI of a config model: any value for any flag is a config or one error line."""
    parser = config_parser(model, "bertflow fuzz", "fuzz")
    required = [f"--{k.replace('_', '-')}={v[0] if isinstance(v, list) else v}" for k, v in MINIMAL[model].items()]
    if data is None:
        argv = required + ["--text-column", ""]
    elif isinstance(data, str):
        argv = required + ["--tensorboard", data]
    else:
        flags = [a.option_strings[0] for a in parser._actions if a.option_strings and a.dest not in ("help", "config")]
        flag = data.draw(st.sampled_from(flags))
        argv = required + [flag, data.draw(FLAG_VALUES)]
    try:
        config = config_from_args(model, parser.parse_args(argv))
        config.config_hash()
    except UserError as err:
        assert "\n" not in str(err) and str(err).strip(), err
        return
    assert data is not None, "--text-column '' accepted"
    assert not isinstance(data, str), f"{argv} accepted"


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "a:\n" + "".join(" " * (i + 1) + "a:\n" for i in range(1400)),
                                  "inputs: " + "{a: " * 100_000 + "1" + "}" * 100_000])
def test_found_deep_yaml_outside_hypothesis(tmp_path, text):
    """Deep YAML at the interpreter's default recursion limit (Hypothesis raises it while a property runs)."""
    p = tmp_path / "config.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match="nested too deeply"):
        load_config(ShardConfig, p)


@pytest.mark.parametrize("text, line", [
    (laughs(10, 9), "its aliases expand to more than 100,000 values (a 'billion laughs' document?)"),
    (laughs(10, 9, "model_overrides"), "its aliases expand to more than 100,000 values"),
    ("inputs: &a [x, *a]\noutput_dir: o\n", "a value refers to itself through a YAML alias"),
    ("inputs: [x]\noutput_dir: o\n# " + "x" * (5 << 20) + "\n", "a config is at most 4,194,304 bytes"),
])
def test_config_resource_limits(tmp_path, text, line):
    """Found by hand (issue 24): a billion-laughs config hung the CLI (the depth check walked 9 ** 9 values),
    a 50 MB one took PyYAML minutes. Each is one line now, in milliseconds, before any validation."""
    p = tmp_path / "config.yaml"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(UserError, match=re.escape(line)):
        load_config(ShardConfig, p)


RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "cpu-tiny.yaml"


def _recipe_paths() -> list[tuple]:
    import yaml

    data = yaml.safe_load(RECIPE.read_text(encoding="utf-8"))
    paths = [(k,) for k in data] + [(k, sub) for k, v in data.items() if isinstance(v, dict) for sub in v]
    return paths + [("phases", 0, k) for k in data["phases"][0]] + [("smoke", "phases")]


@given(path=st.sampled_from(_recipe_paths()), value=HOSTILE, smoke=st.booleans(),
       sentence_task=st.sampled_from([None, "sop", "none"]))
@fuzz(200)
@example(path=("smoke",), value=5, smoke=True, sentence_task=None)  # AttributeError (found): a scalar overlay
@example(path=("phases",), value=5, smoke=False, sentence_task="sop")  # TypeError (found): phases not a list
def test_recipe_sections_of_any_shape(tmp_path_factory, path, value, smoke, sentence_task):
    """A recipe (flows/recipe.py: a pipeline config plus comparison and smoke sections) with one section
    or key of any shape, loaded with and without --smoke and --sentence-task."""
    import yaml

    data = set_path(yaml.safe_load(RECIPE.read_text(encoding="utf-8")), path, value)
    p = write_yaml(tmp_path_factory.mktemp("recipe"), data)
    try:
        config = load_recipe(str(p), smoke=smoke, sentence_task=sentence_task)
        assert isinstance(config, RecipeConfig)
        make_plan(config.pipeline())
    except UserError as err:
        assert "\n" not in str(err) and str(err).startswith(str(p)), err


def test_non_utf8_file_names_stay_values():
    """The empty-string rule refuses "" only: a file name that is not UTF-8 (a surrogate escape) is still a
    path the readers skip and count (pydantic's str_min_length refused it, and broke the hostile battery)."""
    name = b"/tmp/bad\xffname.txt".decode("utf-8", "surrogateescape")
    assert ShardConfig(inputs=[name], output_dir="out").inputs == [name]
    with pytest.raises(UserError, match="inputs: .*empty string"):
        load_config(ShardConfig, write_yaml(Path(tempfile.mkdtemp()), {"inputs": ["a", ""], "output_dir": "o"}))
