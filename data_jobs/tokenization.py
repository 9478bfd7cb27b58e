"""WordPiece vocabularies and the BERT tokenizer, built on Hugging Face `tokenizers` (no torch).

The tokenizer reproduces Google BERT's ``FullTokenizer``: BasicTokenizer (clean text, split CJK
characters, lowercase + strip accents when uncased, split on whitespace and punctuation) followed by
greedy longest-match-first WordPiece with ``##`` continuation pieces and ``[UNK]`` for words longer than
100 characters or without a decomposition. Special tokens are *not* registered as added tokens: like
the original, a literal ``[SEP]`` in raw text is split into pieces, never read as a separator.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

from contracts.common import UserError
from contracts.schema import Manifest

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
VOCAB_FILE = "vocab.txt"


def read_vocab(path: str | Path) -> list[str]:
    """Tokens of a ``vocab.txt`` (line number = id), validated.

    Raises UserError for a missing, empty, binary or non-UTF-8 file, empty lines, duplicate tokens,
    or a vocab lacking any of [PAD] [UNK] [CLS] [SEP] [MASK].
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: vocab file not found")
    data = p.read_bytes()
    if not data.strip():
        raise UserError(f"{p}: vocab file is empty")
    if b"\x00" in data:
        raise UserError(f"{p}: binary file, expected one WordPiece token per line")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UserError(f"{p}: invalid UTF-8 at byte {err.start}") from None
    lines = text.split("\n")
    if lines and lines[-1].strip() == "":
        lines.pop()
    tokens = [line.strip() for line in lines]
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if not tok:
            raise UserError(f"{p}: line {i + 1} is empty (every line must hold one token)")
        if tok in seen:
            raise UserError(f"{p}: token {tok!r} appears twice (lines {seen[tok] + 1} and {i + 1})")
        seen[tok] = i
    missing = [s for s in SPECIAL_TOKENS if s not in seen]
    if missing:
        raise UserError(f"{p}: vocab lacks the special token(s) {' '.join(missing)}")
    return tokens


def _tokens_hash(tokens: list[str]) -> str:
    return hashlib.sha256("\n".join(tokens).encode("utf-8")).hexdigest()[:16]


def vocab_hash(path: str | Path) -> str:
    """Hash of the token list (not the bytes: CRLF or a missing final newline do not change it)."""
    return _tokens_hash(read_vocab(path))


def wordpiece_tokenizer(vocab_path: str | Path, lowercase: bool, with_post_processor: bool = False):
    """A fast ``tokenizers.Tokenizer`` equal to BERT's FullTokenizer for this vocab.

    ``with_post_processor`` adds the ``[CLS] A [SEP] (B [SEP])`` template with token types; the data
    jobs leave it off and place special tokens themselves.
    """
    tokens = read_vocab(vocab_path)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    # strip_accents=None follows `lowercase`, exactly as BERT's do_lower_case does both.
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##")
    if with_post_processor:
        cls_id, sep_id = vocab["[CLS]"], vocab["[SEP]"]
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
    return tok


@dataclass(frozen=True)
class VocabInfo:
    """What downstream steps need to know about a vocab dataset directory."""

    vocab_file: Path
    lowercase: bool
    vocab_hash: str
    vocab_size: int
    cls_id: int
    sep_id: int
    mask_id: int
    pad_id: int
    unk_id: int
    vocab_expect: tuple | None = None  # (bytes, sha256) where vocab_file is an object-store URI

    def tokenizer(self, with_post_processor: bool = False):
        return wordpiece_tokenizer(self.vocab_file, self.lowercase, with_post_processor)

    def tokens(self) -> list[str]:
        return read_vocab(self.vocab_file)


def vocab_info(vocab_file: str | Path, lowercase: bool) -> VocabInfo:
    """VocabInfo for a bare ``vocab.txt`` (no manifest)."""
    vocab_file = Path(vocab_file).resolve()
    tokens = read_vocab(vocab_file)
    ids = {t: i for i, t in enumerate(tokens)}
    return VocabInfo(
        vocab_file=vocab_file,
        lowercase=lowercase,
        vocab_hash=_tokens_hash(tokens),
        vocab_size=len(tokens),
        cls_id=ids["[CLS]"],
        sep_id=ids["[SEP]"],
        mask_id=ids["[MASK]"],
        pad_id=ids["[PAD]"],
        unk_id=ids["[UNK]"],
    )


def load_vocab_dir(vocab_dir: str | Path) -> VocabInfo:
    """Read a vocab dataset directory (``vocab.txt`` + manifest of kind "vocab"), checking its hash."""
    from contracts.storage import is_uri

    if is_uri(vocab_dir):
        return _load_remote_vocab(str(vocab_dir).rstrip("/"))
    d = Path(vocab_dir)
    manifest = Manifest.read(d, kind="vocab")
    info = vocab_info(d / VOCAB_FILE, bool(manifest.config.get("lowercase", True)))
    if manifest.vocab_hash and manifest.vocab_hash != info.vocab_hash:
        raise UserError(f"{d / VOCAB_FILE}: vocab changed since its manifest was written (hash mismatch)")
    return info


def _load_remote_vocab(uri: str) -> VocabInfo:
    """A vocab dataset on an object store: ``vocab.txt`` fetched, checked against its manifest (size,
    checksum, vocab hash); the VocabInfo names the object (``vocab_file`` = its URI, ``vocab_expect``
    what a worker checks its own copy against)."""
    import dataclasses

    from data_jobs.job_output import fetched

    manifest = Manifest.read(uri, kind="vocab")
    entry = next((f for f in manifest.files if f.name == VOCAB_FILE), None)
    if entry is None:
        raise UserError(f"{uri}: its manifest lists no {VOCAB_FILE}")
    expect = (entry.bytes, entry.sha256)
    with fetched(f"{uri}/{VOCAB_FILE}", expect) as local:
        info = vocab_info(local, bool(manifest.config.get("lowercase", True)))
    if manifest.vocab_hash and manifest.vocab_hash != info.vocab_hash:
        raise UserError(f"{uri}/{VOCAB_FILE}: vocab changed since its manifest was written (hash mismatch)")
    return dataclasses.replace(info, vocab_file=f"{uri}/{VOCAB_FILE}", vocab_expect=expect)  # type: ignore[arg-type]
