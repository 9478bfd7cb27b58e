"""Every published figure is backed by a committed result (issue 26).

The rules this test enforces on README.md and docs/**/*.md (docs/results/ holds result files, not
documents):

- **Blocks.** A document is cut into blocks: a paragraph, a list item, a table row, a heading (fenced
  code is skipped). A block *cites* a result file when it links or names (in backticks) a path under
  ``bench/results/`` or ``docs/results/`` (a folder cites every file in it). A table row also cites
  what the paragraph or list item right before its table cites (the caption); a list item also cites
  what the paragraph right before its list cites (the lead-in), and an indented paragraph inside a
  list item what its item cites. A heading ends all three.
- **Figures.** A figure is a decimal number as printed, ``12.9`` in ``12.9×``, ``−0.2``, ``81.0 %``
  (integers, ``1e-4`` and version numbers such as ``ray 2.60`` are not figures here).
- **Each figure appears in its file as printed.** Every figure of a block that cites result files must
  appear in one of them as the same digits: a number token of a text/markdown file with exactly those
  digits (``13.9`` matches ``+13.9`` and ``13.9``, never ``13.87`` or ``13.90``); a signed figure
  (``+0.2``, ``−0.2``) needs the same sign in the file (unsigned there counts as ``+``). In a JSON file
  a figure with k decimals matches a numeric value v when v, or 100·v, rounded half up to k decimals
  prints those digits: that is the one rounding rule a document may apply itself. A duration with
  minutes or hours (``7 min 50 s``, ``1 h 20 min``, ``12 min``, ``0:23:08``) must appear as printed, or the file
  must print a number of seconds (``470.4 s``) or an ``h:mm:ss`` whose whole seconds (truncated) are
  the same total. Integers and seconds-only durations are not checked.
- **No figure without a file.** A figure in a block that cites no result file fails, unless it is
  listed in ``NOT_MEASURED`` (published numbers, configuration values) with its reason, or its document
  is listed in ``UNCITED_DEBT`` with the exact count of such figures still to back (a count that may
  only go down: a new uncited figure fails).
- **No two documents state different values for the same measurement.** A measurement is a (result
  file, label) pair in ``MEASUREMENTS``: the label's printed value is read from the file by a pattern,
  and every statement of it in any block that cites that file (found by the label's document pattern)
  must print that value. So two documents (or two places in one) cannot give different values for it,
  whether or not each value occurs somewhere in the file.
"""
from __future__ import annotations

import json
import re
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULT_ROOTS = ("bench/results/", "docs/results/")

# A figure: a decimal number, optionally signed, bare or with a unit or "x"/"×"/"%" after it; not part
# of a longer dotted token (a version, an address, a file name), not glued to a letter before it (v1.1)
# or after it (17.0k: a figure written in thousands is not compared).
FIGURE = re.compile(r"(?<![\w.\-−+])([+\-−]?)(\d+\.\d+)(?![\d.]*\d)(?!\.\d)(?!x\w)(?![A-Za-wyz0-9_])")
# Numbers in result files: any signed decimal or integer token.
FILE_NUMBER = re.compile(r"(?<![\w.])([+\-−]?)(\d+(?:\.\d+)?)(?![\d])")
# A duration: "7 min 50 s", "1 h 20 min", "61 s" (integer parts). It matches its file when the file
# prints the same text, or prints a number of seconds whose whole part (truncated) is the same total.
CLOCK = re.compile(r"(?<![\d:.])(\d+):([0-5]\d):([0-5]\d)(?![\d:])")  # h:mm:ss
DURATION = re.compile(r"(?<![\d.,:])(?:(\d+) h )?(?:(\d+) min)?(?: ?(?<![\d])(\d+) s)?(?![\w/])")
VERSION_WORDS = {"python", "ray", "torch", "deepspeed", "prefect", "transformers", "pyarrow", "tokenizers",
                 "cuda", "v", "version", "pip", "moto", "syntok", "numpy", "pandas", "pydantic", "sqlite"}

# Figures that are not measurements of this project (so cite no result file), by (document, the text
# around the figure as printed in one block). Each has its reason.
NOT_MEASURED: dict[str, list[tuple[str, str]]] = {
    "README.md": [
        ("SST-2 83.2, against", "Turc et al.'s published BERT-Tiny (GLUE test)"),
    ],
    "docs/data-instances.md": [
        ("| `masked_lm_prob` | 0.15 |", "configuration default (BERT's)"),
        ("| `short_seq_prob` | 0.1 |", "configuration default (BERT's)"),
        ("< 0.5, B is random-next", "the algorithm's coin (Google's create_pretraining_data.py)"),
        ("swapped with probability 0.5", "the algorithm's coin (ALBERT's SOP)"),
    ],
    "docs/training.md": [
        ("MLM loss 10.2 → < 8.2", "a test's thresholds, not measurements"),
        ("| 1e-4, (0.9, 0.999), 1e-6, 0.01 |", "configuration defaults"),
        ("| 0.1, linear, 0.5 |", "configuration defaults"),
        ("| 100, 1.0, 42 |", "configuration defaults"),
        ("warmup 28.43 %", "a generated config's value (NVIDIA's recipe)"),
        ("warmup 12.8 %", "a generated config's value (NVIDIA's recipe)"),
        ("(power 0.5)", "a generated config's value (NVIDIA's recipe)"),
    ],
    "docs/model.md": [
        ("mlm_fraction=0.15)", "a function's default argument"),
        ("`mlm_fraction=1.0`", "an argument value"),
        ("| 2.1 M | 2.6 M |", "computed from the preset's shape (bert_core/flops.py), not measured"),
        ("| 11.3 M | 27.5 M |", "computed from the preset's shape"),
        ("| 29.1 M |", "computed from the preset's shape"),
        ("| 110.1 M |", "computed from the preset's shape"),
        ("| 336.2 M | 1.88 G |", "computed from the preset's shape"),
        ("1.88 GFLOP per token", "arithmetic: BERT-large's FLOPs per token from its shape"),
        ("| 1.00× |", "computed: the row's sequences/s over the baseline row's, both in the cited JSON"),
        ("| 0.82× |", "computed: the row's sequences/s over the baseline row's, both in the cited JSON"),
        ("| 0.88× |", "computed: the row's sequences/s over the baseline row's, both in the cited JSON"),
    ],
    "docs/scaling.md": [
        ("264/693 = 0.38", "arithmetic on NVIDIA's published A100 throughputs"),
        ("1.92× on 2 nodes", "NVIDIA's published DGX A100 multi-node scaling"),
        ("(~0.8 B words)", "BooksCorpus's published size"),
        ("~1.1 h time-to-train", "NVIDIA's published time-to-train on 32 DGX A100"),
        ("(~2.5 B words)", "English Wikipedia's published size (the BERT paper)"),
        ("3.86× on 4", "NVIDIA's published DGX A100 multi-node scaling"),
        ("7.52× on 8", "NVIDIA's published DGX A100 multi-node scaling"),
        ("14.3× on 16", "NVIDIA's published DGX A100 multi-node scaling"),
        ("28.5× on 32", "NVIDIA's published DGX A100 multi-node scaling"),
    ],
    "docs/evaluation.md": [
        ("gradient clipping at 1.0", "configuration default (the BERT recipe's)"),
        ("(paper section 5.3)", "a section number of the BERT paper"),
        ("0.62 for MiniLM and at least 0.08 above", "a test's thresholds, not measurements"),
    ],
    "docs/recipe.md": [
        ("SST-2 83.2, MRPC F1 81.1, CoLA 0.0, STS-B 73.6, RTE 57.2", "Turc et al.'s published BERT-Tiny (GLUE test)"),
        ("average 59.0", "Turc et al.'s published BERT-Tiny average"),
        ("89.7 / 83.4 / 27.8 / 77.0 / 61.8 (67.9)", "Turc et al.'s published BERT-Small"),
        ("SST-2 83.2, against", "Turc et al.'s published BERT-Tiny"),
        ("4.4 M parameters", "the model's parameter count, from its shape"),
        ("a point is 2.8 of", "arithmetic: RTE's dev set has 277 examples"),
    ],
}

# Documents whose figures are not all backed yet: the exact number of figures in blocks that cite
# no result file. Backing (or removing) one lowers the count; a new unbacked figure raises it and fails.
UNCITED_DEBT: dict[str, int] = {
    # none: every figure of README.md and docs/ names its file (2026-12-05). Keep it so.
}

# (result file, label) -> how the file prints it, and how a document states it (group 1 = the figure).
MEASUREMENTS = {
    ("docs/results/cpu-tiny/comparison.md", "STS-B, pretrained − random init"): (
        r"\| pretrained \(this pipeline\) − random init \(same shape\) \|(?:[^|]*\|){4}\s*([+\-]?\d+\.\d)",
        r"STS-B (?:gain )?([+\-−]\d+\.\d)"),
    ("docs/results/cpu-tiny-2026-12-05/comparison.md", "STS-B, pretrained − random init"): (
        r"\| pretrained \(this pipeline\) − random init \(same shape\) \|(?:[^|]*\|){4}\s*([+\-]?\d+\.\d)",
        r"(?<!zero-shot )STS-B \d+\.\d vs \d+\.\d \(([+\-−]\d+\.\d)"),
    ("docs/results/cpu-tiny-2026-12-05/comparison.md", "GLUE average, pretrained"): (
        r"\| pretrained \(this pipeline\) \|(?:[^|]*\|){5}\s*(\d+\.\d) ±",
        r"GLUE average (\d+\.\d) vs"),
    ("docs/results/cpu-tiny-2026-12-05/comparison.md", "SST-2 at 2,000 examples, pretrained"): (
        r"\| \*\*2000\*\* \| (\d+\.\d) ±",
        r"2,000 examples\)?\s+SST-2 (\d+\.\d) vs"),
    ("docs/results/cpu-tiny-2026-12-05/comparison.md", "zero-shot STS-B, pretrained"): (
        r"\| pretrained \(this pipeline\) \| (\d+\.\d) \|\n",
        r"zero-shot STS-B (\d+\.\d) vs"),
    ("docs/results/cpu-tiny-2026-12-05_0720/comparison.md", "STS-B, pretrained − random init"): (
        r"\| pretrained \(this pipeline\) − random init \(same shape\) \|(?:[^|]*\|){4}\s*([+\-]?\d+\.\d)",
        r"(?<!zero-shot )STS-B \d+\.\d vs \d+\.\d \(([+\-−]\d+\.\d)"),
    ("docs/results/cpu-tiny-2026-12-05_0720/comparison.md", "GLUE average, pretrained"): (
        r"\| pretrained \(this pipeline\) \|(?:[^|]*\|){5}\s*(\d+\.\d) ±",
        r"GLUE average (\d+\.\d) vs"),
    ("docs/results/cpu-tiny-2026-12-05_0720/comparison.md", "SST-2 at 2,000 examples, pretrained"): (
        r"\| \*\*2000\*\* \| (\d+\.\d) ±",
        r"2,000 examples\)?\s+SST-2 (\d+\.\d) vs"),
    ("docs/results/cpu-tiny-2026-12-05_0720/comparison.md", "zero-shot STS-B, pretrained"): (
        r"\| pretrained \(this pipeline\) \| (\d+\.\d) \|\n",
        r"zero-shot STS-B (\d+\.\d) vs"),
    ("docs/results/cpu-tiny/comparison.md", "held-out NSP accuracy, pretrained"): (
        r"\| pretrained \(this pipeline\) \|(?:[^|]*\|){7}\s*(\d+\.\d)",
        r"(\d+\.\d) % on held-out NSP pairs"),
    ("bench/results/bench_data_prep_2026-12-01_2030.txt", "instances only, 5 MB, wall ratio"): (
        r"P1 5MB: original wall / ours wall: (\d+\.\d+)",
        r"(?<!\d)5 MB: (?:wall \|[^|]*\|[^|]*\| \*\*)?(\d+\.\d+)×\*{0,2} faster|(\d+\.\d+)× faster on 5 MB"),
    ("bench/results/bench_data_prep_2026-12-01_2030.txt", "instances only, 52 MB, wall ratio"): (
        r"P1 50MB: original wall / ours wall: (\d+\.\d+)",
        r"52 MB: (?:wall \|[^|]*\|[^|]*\| \*\*)?(\d+\.\d+)×\*{0,2} faster|(\d+\.\d+)× on 52 MB"),
    ("bench/results/glue_minilm_cpu_8k/bench.md", "SST-2 dev acc, MiniLM, CPU 8k"): (
        r"\| MiniLM \(real weights\) \| (\d+\.\d+)%",
        r"MiniLM \(real weights\) \| \*{0,2}(\d+\.\d+)%|(\d+\.\d+)% vs \d+\.\d+% \(CPU"),
}


# ---------------------------------------------------------------- parsing

def documents() -> list[Path]:
    docs = [REPO / "README.md"] + sorted(p for p in (REPO / "docs").rglob("*.md")
                                        if "results" not in p.relative_to(REPO / "docs").parts)
    return docs


def rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


class Block:
    def __init__(self, doc: str, line: int, text: str, kind: str):
        self.doc, self.line, self.text, self.kind = doc, line, text, kind
        self.cites: set[str] = set()

    def __repr__(self) -> str:
        return f"{self.doc}:{self.line}"


def split_blocks(doc: str, text: str) -> list[Block]:
    blocks: list[Block] = []
    cur: Block | None = None
    fenced = False
    in_list = False

    def close():
        nonlocal cur
        if cur is not None:
            blocks.append(cur)
        cur = None

    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced:
            continue
        if not s:
            close()
            blocks.append(Block(doc, n, "", "blank"))
            continue
        if s.startswith("|"):
            close()
            blocks.append(Block(doc, n, s, "row"))
            continue
        if s.startswith("#"):
            close()
            in_list = False
            blocks.append(Block(doc, n, s, "heading"))
            continue
        if re.match(r"^\s*([-*]|\d+\.)\s", line) and not line.startswith("    " * 2):
            close()
            in_list = True
            cur = Block(doc, n, s, "item")
            continue
        if cur is None and not line.startswith("  "):
            in_list = False
        if cur is None:
            # an indented paragraph inside a list continues its item
            cur = Block(doc, n, s, "cont" if line.startswith("  ") and in_list else "para")
        else:
            cur.text += " " + s
    close()
    return blocks


def cited_files(doc_path: Path, text: str) -> set[str]:
    found: set[str] = set()
    targets = [(doc_path.parent / m) for m in re.findall(r"\]\(([^)#\s]+)", text)]
    targets += [REPO / m for m in re.findall(r"`([^`\s]+)`", text)]
    targets += [REPO / m for m in re.findall(r"(?<![\w/.])((?:bench|docs)/results/[\w./\-]+\w/?)", text)]
    for t in targets:
        try:
            r = t.resolve().relative_to(REPO).as_posix()
        except ValueError:
            continue
        if not r.startswith(RESULT_ROOTS) and not (r.startswith("bench/results") and r.endswith(".json")):
            continue
        p = REPO / r
        if p.is_dir():
            found |= {rel(f) for f in p.rglob("*") if f.is_file() and f.suffix in (".md", ".txt", ".json")}
        elif p.is_file():
            found.add(r)
        else:
            found.add(r)  # a citation of a missing file: reported by test_cited_files_exist
    return found


def blocks_of(doc_path: Path, text: str | None = None) -> list[Block]:
    text = doc_path.read_text(encoding="utf-8") if text is None else text
    doc = rel(doc_path) if doc_path.is_absolute() else str(doc_path)
    raw = split_blocks(doc, text)
    lead: set[str] = set()        # what the last paragraph cited (a list's lead-in)
    caption: set[str] = set()     # what the last paragraph or item before a table cited
    item: set[str] = set()        # what the current list item cites (its indented paragraphs too)
    prev_kind = "blank"
    out = []
    for b in raw:
        if b.kind == "blank":
            continue
        b.cites = cited_files(doc_path if doc_path.is_absolute() else REPO / doc_path, b.text)
        if b.kind == "row":
            b.cites |= caption
        elif b.kind == "item":
            b.cites |= lead
            caption = item = set(b.cites)
        elif b.kind == "cont":
            b.cites |= item
            caption = set(b.cites)
        elif b.kind == "para":
            lead = set(b.cites)
            caption = set(b.cites)
        else:  # heading
            lead, caption, item = set(), set(), set()
        prev_kind = b.kind
        out.append(b)
    return out


def figures(text: str) -> list[tuple[str, str, int]]:
    """(sign, digits, position) of every figure in ``text``."""
    out = []
    for m in FIGURE.finditer(text):
        before = text[:m.start()].rstrip(" (").split()
        word = re.sub(r"[^a-z]", "", before[-1].lower()) if before else ""
        if word in VERSION_WORDS or text[max(0, m.start() - 1):m.start()] == "v":
            continue
        sign = {"−": "-", "-": "-", "+": "+"}.get(m.group(1), "")
        out.append((sign, m.group(2), m.start()))
    return out


# ---------------------------------------------------------------- matching

_file_cache: dict[str, object] = {}


def _load(r: str):
    if r not in _file_cache:
        p = REPO / r
        if p.suffix == ".json":
            vals: list[float] = []

            def walk(x):
                if isinstance(x, bool):
                    return
                if isinstance(x, (int, float)):
                    vals.append(x)
                elif isinstance(x, dict):
                    for v in x.values():
                        walk(v)
                elif isinstance(x, list):
                    for v in x:
                        walk(v)
            walk(json.loads(p.read_text()))
            _file_cache[r] = ("json", vals)
        else:
            toks = {(({"−": "-"}.get(m.group(1), m.group(1)) or "+"), m.group(2))
                    for m in FILE_NUMBER.finditer(p.read_text(encoding="utf-8", errors="replace"))}
            _file_cache[r] = ("text", toks)
    return _file_cache[r]


def _round(v: float, k: int) -> str:
    return str(Decimal(repr(v)).quantize(Decimal(1).scaleb(-k), rounding=ROUND_HALF_UP))


def in_file(sign: str, digits: str, r: str) -> bool:
    if not (REPO / r).is_file():
        return False
    kind, data = _load(r)
    if kind == "text":
        if sign:
            return (sign, digits) in data
        return ("+", digits) in data or ("-", digits) in data
    k = len(digits.split(".")[1])
    want = ("-" if sign == "-" else "") + digits
    for v in data:
        for x in (v, v * 100):
            s = _round(x, k)
            if s == want or (not sign and s == "-" + digits):
                return True
    return False


def durations(text: str) -> list[tuple[str, int, int]]:
    """(as printed, total seconds, position) of every duration with minutes or hours in ``text``."""
    out = []
    for m in DURATION.finditer(text):
        h, mi, sec = m.group(1), m.group(2), m.group(3)
        if not (mi or h) or not m.group(0).strip():
            continue
        if h and not mi:
            continue
        total = int(h or 0) * 3600 + int(mi or 0) * 60 + int(sec or 0)
        out.append((m.group(0).strip(), total, m.start()))
    for m in CLOCK.finditer(text):  # "0:23:08", as the timing files print a wall time
        out.append((m.group(0), int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)), m.start()))
    return out


def duration_in_file(printed: str, total: int, r: str) -> bool:
    p = REPO / r
    if not p.is_file() or p.suffix == ".json":
        return False
    text = p.read_text(encoding="utf-8", errors="replace")
    if re.search(r"(?<![\d])" + re.escape(printed) + r"(?![\d])", text):
        return True
    for m in re.finditer(r"(?<![\d.])(\d+(?:,\d{3})*)(?:\.\d+)? s\b", text):
        if int(m.group(1).replace(",", "")) == total:
            return True
    for m in re.finditer(r"(?<![\d:])(\d+):(\d\d):(\d\d)(?![\d])", text):
        if int(m.group(1)) * 3600 + int(m.group(2)) * 60 + int(m.group(3)) == total:
            return True
    return False


def exempt(doc: str, block: Block, pos: int) -> bool:
    for ctx, _why in NOT_MEASURED.get(doc, []):
        i = block.text.find(ctx)
        while i >= 0:
            if i <= pos < i + len(ctx):
                return True
            i = block.text.find(ctx, i + 1)
    return False


def check(blocks: list[Block]) -> tuple[list[str], dict[str, int]]:
    """(figures not found in their cited files, uncited figures per document)."""
    wrong, uncited = [], {}
    for b in blocks:
        for sign, digits, pos in figures(b.text):
            if exempt(b.doc, b, pos):
                continue
            if not b.cites:
                uncited[b.doc] = uncited.get(b.doc, 0) + 1
                continue
            if not any(in_file(sign, digits, r) for r in b.cites):
                wrong.append(f"{b}: {sign}{digits} is in none of {sorted(b.cites)}: "
                             f"…{b.text[max(0, pos - 60):pos + 20]}…")
        if not b.cites:
            continue
        for printed, total, pos in durations(b.text):
            if exempt(b.doc, b, pos):
                continue
            if not any(duration_in_file(printed, total, r) for r in b.cites):
                wrong.append(f"{b}: duration {printed!r} is in none of {sorted(b.cites)}: "
                             f"…{b.text[max(0, pos - 60):pos + 30]}…")
    return wrong, uncited


def conflicts(all_blocks: list[Block]) -> list[str]:
    out = []
    for (r, label), (file_pat, doc_pat) in MEASUREMENTS.items():
        m = re.search(file_pat, (REPO / r).read_text(encoding="utf-8"))
        assert m, f"{r}: label {label!r} not found by {file_pat!r}"
        value = m.group(1).lstrip("+")
        stated = []
        for b in all_blocks:
            if r not in b.cites:
                continue
            for dm in re.finditer(doc_pat, b.text):
                figure = next(g for g in dm.groups() if g is not None)
                stated.append((str(b), figure.replace("−", "-").lstrip("+")))
        for where, v in stated:
            if v != value:
                out.append(f"{where}: {label} ({r}) stated as {v}, the file prints {value}")
    return out


# ---------------------------------------------------------------- tests

ALL = {rel(p): blocks_of(p) for p in documents()}


@pytest.mark.parametrize("doc", sorted(ALL))
def test_each_figure_appears_in_its_cited_file(doc):
    wrong, _ = check(ALL[doc])
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("doc", sorted(ALL))
def test_no_figure_without_a_file(doc):
    _, uncited = check(ALL[doc])
    n = uncited.get(doc, 0)
    allowed = UNCITED_DEBT.get(doc, 0)
    if n > allowed:
        lines = [f"{b}: {s}{d} …{b.text[max(0, p - 50):p + 15]}…" for b in ALL[doc] if not b.cites
                 for s, d, p in figures(b.text) if not exempt(doc, b, p)]
        pytest.fail(f"{doc}: {n} figures cite no result file (allowed {allowed}):\n" + "\n".join(lines))
    assert n == allowed, f"{doc}: {allowed - n} uncited figures were backed: lower UNCITED_DEBT to {n}"


def test_cited_files_exist():
    missing = sorted({f"{b}: {r}" for bs in ALL.values() for b in bs for r in b.cites
                      if not (REPO / r).is_file()})
    assert not missing, "\n".join(missing)


def test_no_two_statements_of_one_measurement_differ():
    assert not conflicts([b for bs in ALL.values() for b in bs])


# The rules can fail: a wrong figure, a hand-rounded one, an uncited one and a conflicting one are caught.

def _fake(text: str, name: str = "docs/fake.md") -> list[Block]:
    return blocks_of(Path(name), text)


def test_a_wrong_figure_is_caught():
    ok = _fake("Per task: STS-B +13.9 ([report](results/cpu-tiny/comparison.md)).\n")
    assert check(ok)[0] == []
    for bad in ("STS-B +13.8", "STS-B +13.87", "STS-B −13.9", "STS-B 13.90"):
        wrong, _ = check(_fake(f"Per task: {bad} ([report](results/cpu-tiny/comparison.md)).\n"))
        assert len(wrong) == 1, bad


def test_json_rounding_rule():
    r = "docs/results/cpu-tiny/comparison.json"
    assert in_file("", "0.0765", r) and in_file("", "95.8", r)   # nsp_acc 0.958... ×100, rounded half up
    assert not in_file("", "99.1", r)
    assert in_file("", "0.07653", r) and not in_file("", "0.07654", r)   # 0.0765318...: half up


def test_a_table_row_inherits_its_caption_and_an_uncited_figure_is_counted():
    text = ("Caption ([report](results/cpu-tiny/comparison.md)):\n\n| a | b |\n|---|---|\n| x | 81.0 |\n"
            "| y | 99.9 |\n\nA paragraph with 12.3 and no file.\n")
    wrong, uncited = check(_fake(text))
    assert len(wrong) == 1 and "99.9" in wrong[0]
    assert uncited == {"docs/fake.md": 1}


def test_two_documents_stating_different_values_conflict():
    a = _fake("SST-2 81.0 vs 81.2 ([r](results/cpu-tiny/comparison.md))\n", "docs/a.md")
    b = _fake("STS-B +13.8 ([r](results/cpu-tiny/comparison.md))\n", "docs/b.md")
    found = conflicts(a + b)
    assert len(found) == 1 and "13.8" in found[0] and "13.9" in found[0]


def test_each_registered_measurement_is_stated_somewhere():
    """A label whose document pattern finds nothing checks nothing: catch patterns that rot."""
    blocks = [b for bs in ALL.values() for b in bs]
    for (r, label), (_file_pat, doc_pat) in MEASUREMENTS.items():
        assert any(r in b.cites and re.search(doc_pat, b.text) for b in blocks), (r, label)


def test_a_wrong_duration_is_caught():
    cite = "([result](results/timings/demo_2026-12-03_1444.txt))"
    ok = _fake(f"`make install` 7 min 50 s, then `make demo` 4 min 2 s {cite}.\n")
    assert check(ok)[0] == []                       # 470.405… s and 242.507… s, truncated
    for bad in ("7 min 51 s", "8 min", "1 h 20 min"):
        wrong, _ = check(_fake(f"`make install` {bad} {cite}.\n"))
        assert len(wrong) == 1, bad
    loaded = "([r](results/timings/make_test_loaded_2026-12-03_1358.txt))"
    assert check(_fake(f"pytest 1 h 9 min 42 s {loaded}\n"))[0] == []   # the file's 1:09:42
    assert len(check(_fake(f"pytest 1 h 10 min {loaded}\n"))[0]) == 1    # rounded by hand
    assert check(_fake(f"pytest 1:09:42 {loaded}\n"))[0] == []            # as the file prints it
    assert len(check(_fake(f"pytest 1:09:43 {loaded}\n"))[0]) == 1


def test_the_fresh_clone_runs_of_the_recipe_wrote_the_same_report():
    """docs/recipe.md and README state that the 10:55 run (every grid at once on Ray) and the 17:07 run
    (grids queued in cost order, the GLUE parse cache, heads without the encoder's discarded init) wrote a
    report byte-identical to the 07:20 run's (each grid on its own): the committed copies say so."""
    a = REPO / "docs/results/cpu-tiny-2026-12-05_0720"
    for b in (REPO / "docs/results/cpu-tiny-2026-12-05_1055", REPO / "docs/results/cpu-tiny-2026-12-05_1707"):
        for name in ("comparison.json", "comparison.md", "comparison.png"):
            assert (a / name).read_bytes() == (b / name).read_bytes(), (b.name, name)
    for doc in ("README.md", "docs/recipe.md"):
        assert "byte-identical" in (REPO / doc).read_text(encoding="utf-8"), doc
