"""Document lengths of the training data, packed into ``seq_len``-token packs (THD layout, one
attention mask per document): a histogram of length → share, from a named preset or a small
YAML / CSV file, and the expectations the estimators need from it.

Packing model (stated once, used by every expectation below):

* A document of length L ≤ S (S = seq_len) is kept whole; a document longer than S is split into
  ⌊L/S⌋ pieces of S tokens and one piece of L mod S (when non-zero). This is what offline
  packing does with documents truncated at ``max_single_sequence_length`` = S (Bridge's
  ``PackedSequenceSpecs``), and the split a per-document mask sees in a long document.
* Packs are filled with whole pieces (bin packing: Bridge's offline packing, first-fit). A pack
  of S tokens then holds, in expectation, S·t_ℓ/ℓ pieces of each length ℓ whose token share is
  t_ℓ, so E[Σ dᵢ²] = Σ_ℓ (S·t_ℓ/ℓ)·ℓ² = S·Σ_ℓ t_ℓ·ℓ: the attention length per pack token
  ŝ = E[Σ dᵢ²]/S is the token-weighted mean piece length. Stream packing (concatenate, then cut
  at every S tokens, Megatron's GPTDataset) also cuts one piece per pack boundary; a piece of
  length ℓ cut at a uniform point loses ℓ²/3 of its Σd² on average, so stream packing lowers
  E[Σ dᵢ²] by at most E_t[ℓ²]/3 per pack (ŝ by E_t[ℓ²]/(3S)), which lcmoe leaves out.
* Under context parallelism each document is cut into 2·CP chunks (THD load balance), so its
  length must be a multiple of 2·CP (and of CP·TP with sequence parallelism, Bridge's collate
  multiple): each piece shorter than S gets (m − 1)/2 padding tokens on average (document
  lengths are not aligned to m; the residue is taken as uniform), which takes pack slots that
  real tokens would have filled.

A fixed-length workload (every sample one S-token document, lcmoe's default) is ``None``
wherever a ``DocLengths`` is expected, and every estimate then is exactly the fixed-length one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from lcmoe.errors import LcmoeError

ShareOf = Literal["tokens", "documents"]
MAX_BINS = 10_000
MAX_LENGTH = 2**40
# A histogram file is a few hundred bytes; 1 MiB is far above any real one.
MAX_FILE_BYTES = 1024 * 1024
FIELD = "--doc-lengths"


@dataclass(frozen=True, slots=True, kw_only=True)
class DocLengths:
    """A document-length histogram: ``lengths`` (tokens, ascending, distinct) and the share of
    all training *tokens* in documents of each length (``token_shares``, summing to 1). ``name``
    is the preset name or the file it was read from (what plan JSON records); ``source`` says
    where the shape comes from."""

    name: str
    lengths: tuple[int, ...]
    token_shares: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        if not self.lengths or len(self.lengths) != len(self.token_shares):
            raise LcmoeError(
                FIELD, self.name, "needs one share per length and at least one length", "list length: share"
            )
        if len(self.lengths) > MAX_BINS:
            raise LcmoeError(FIELD, self.name, f"has more than {MAX_BINS:,} lengths", "merge them into fewer bins")
        for length in self.lengths:
            if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_LENGTH:
                raise LcmoeError(
                    f"{FIELD} length", length, "must be a whole number of tokens from 1 to 2^40", "e.g. 2048"
                )
        if any(b <= a for a, b in zip(self.lengths, self.lengths[1:], strict=False)):
            raise LcmoeError(FIELD, self.name, "lengths must be distinct and ascending", "merge repeated lengths")
        for share in self.token_shares:
            if isinstance(share, bool) or not isinstance(share, float) or not math.isfinite(share) or share < 0:
                raise LcmoeError(f"{FIELD} share", share, "must be a finite number ≥ 0", "e.g. 0.25")
        if abs(sum(self.token_shares) - 1.0) > 1e-9:
            raise LcmoeError(FIELD, self.name, "token shares must sum to 1", "build it with doc_lengths_from_shares")

    # ----- expectations over a pack of ``seq_len`` tokens ------------------------------------
    def pieces(self, seq_len: int) -> tuple[tuple[int, float], ...]:
        """(piece length, token share) after splitting documents longer than ``seq_len`` into
        ⌊L/S⌋ pieces of S and a remainder of L mod S; shares still sum to 1."""
        out: dict[int, float] = {}
        for length, share in zip(self.lengths, self.token_shares, strict=True):
            if share == 0:
                continue
            if length <= seq_len:
                out[length] = out.get(length, 0.0) + share
                continue
            whole, rest = divmod(length, seq_len)
            out[seq_len] = out.get(seq_len, 0.0) + share * whole * seq_len / length
            if rest:
                out[rest] = out.get(rest, 0.0) + share * rest / length
        return tuple(sorted(out.items()))

    def attention_length(self, seq_len: int) -> float:
        """ŝ = E[Σ dᵢ²]/S = Σ_ℓ t_ℓ·ℓ, the token-weighted mean piece length (module docstring);
        S itself for documents all ≥ S."""
        return sum(share * length for length, share in self.pieces(seq_len))

    def window_context(self, seq_len: int, window: int) -> float:
        """2·c̄: twice the mean keys a query attends under a causal window of W tokens, per
        piece c(ℓ) = W − W(W−1)/(2ℓ) for W < ℓ, else ℓ/2 (Bridge's per-sequence formula,
        flop_utils.py sliding-window branch, applied to each piece), token-weighted."""
        total = 0.0
        for length, share in self.pieces(seq_len):
            c = window - window * (window - 1) / (2 * length) if window < length else length / 2
            total += share * 2 * c
        return total

    def docs_per_pack(self, seq_len: int) -> float:
        """Expected pieces (documents) in one pack of S tokens: S·Σ_ℓ t_ℓ/ℓ."""
        return seq_len * sum(share / length for length, share in self.pieces(seq_len))

    def padding_per_token(self, seq_len: int, multiple: int) -> float:
        """Padding tokens per real token when every piece shorter than S is padded to a multiple
        of ``multiple``: Σ_{ℓ<S} t_ℓ·(m − 1)/(2ℓ) (uniform residue; S-long pieces need none, S is
        a multiple of 2·CP by L-SEQ-CP)."""
        if multiple <= 1:
            return 0.0
        return sum(share * (multiple - 1) / (2 * length) for length, share in self.pieces(seq_len) if length < seq_len)

    def summary(self, seq_len: int) -> dict[str, object]:
        """The JSON record of the distribution at ``seq_len`` (plan JSON ``inputs.doc_lengths``)."""
        return {
            "name": self.name,
            "source": self.source,
            "lengths": list(self.lengths),
            "token_shares": list(self.token_shares),
            "attention_length": round(self.attention_length(seq_len), 3),
            "attention_share_of_fixed": round(self.attention_length(seq_len) / seq_len, 6),
            "docs_per_pack": round(self.docs_per_pack(seq_len), 3),
        }


def doc_lengths_from_shares(
    name: str, shares: dict[int, float], *, share_of: ShareOf = "tokens", source: str = ""
) -> DocLengths:
    """A DocLengths from length → share (of tokens, or of documents: then weighted by length),
    normalised to sum 1. Every value is checked first, so hostile input is one sentence."""
    if not isinstance(shares, dict) or not shares:
        raise LcmoeError(FIELD, name, "has no lengths", "give at least one 'length: share' entry")
    if len(shares) > MAX_BINS:
        raise LcmoeError(FIELD, name, f"has more than {MAX_BINS:,} lengths", "merge them into fewer bins")
    weights: dict[int, float] = {}
    for key, share in shares.items():
        # JSON (and quoted YAML) keys are text: "2048" is the length 2048.
        length = int(key) if isinstance(key, str) and re.fullmatch(r"\d{1,13}", key.strip()) else key
        if isinstance(length, bool) or not isinstance(length, int) or not 1 <= length <= MAX_LENGTH:
            raise LcmoeError(f"{FIELD} length", length, "must be a whole number of tokens from 1 to 2^40", "e.g. 2048")
        if isinstance(share, bool) or not isinstance(share, int | float) or not math.isfinite(share) or share < 0:
            raise LcmoeError(f"{FIELD} share of length {length}", share, "must be a finite number ≥ 0", "e.g. 0.25")
        if length in weights:
            raise LcmoeError(f"{FIELD} length", length, "is listed twice", "merge the entries")
        weights[length] = float(share) * (length if share_of == "documents" else 1)
    total = sum(weights.values())
    if not total > 0 or not math.isfinite(total):
        raise LcmoeError(FIELD, name, "shares must add up to a positive finite number", "give some length a share > 0")
    ordered = sorted(weights)
    return DocLengths(
        name=name, lengths=tuple(ordered), token_shares=tuple(weights[k] / total for k in ordered), source=source
    )


# ----- presets ---------------------------------------------------------------------------------
# No public source gives a document-length histogram lcmoe could copy for these mixes, so every
# preset is ILLUSTRATIVE: its shape follows what the cited work describes, its numbers are lcmoe's.
_PRESETS: dict[str, tuple[ShareOf, dict[int, float], str]] = {
    "pretrain-web": (
        "tokens",
        {
            256: 0.10,
            512: 0.12,
            1024: 0.18,
            2048: 0.20,
            4096: 0.15,
            8192: 0.10,
            16384: 0.07,
            32768: 0.04,
            65536: 0.02,
            131072: 0.02,
        },
        "illustrative web-crawl pretraining mix: most documents well under 2K tokens and a long tail of "
        "long ones (the shape Ding et al. 2024, 'Fewer Truncations Improve Language Modeling', ICML, and "
        "Pouransari et al. 2024, 'Dataset Decomposition', arXiv 2405.13226, describe for web corpora); "
        "the shares are lcmoe's",
    ),
    "pretrain-long": (
        "tokens",
        {4096: 0.2, 16384: 0.2, 65536: 0.2, 131072: 0.2, 262144: 0.2},
        "illustrative long-context continued-pretraining mix with long documents (books, code "
        "repositories) upsampled to most of the tokens, as Fu et al. 2024, 'Data Engineering for "
        "Scaling Language Models to 128K Context' (arXiv 2402.10171) recommend; the shares are lcmoe's",
    ),
    "sft-chat": (
        "documents",
        {128: 0.20, 256: 0.25, 512: 0.25, 1024: 0.15, 2048: 0.10, 4096: 0.04, 8192: 0.01},
        "illustrative SFT mix of short samples: 'many short sequences and a few long ones, following "
        "Zipf's Law' (Megatron Bridge docs, training/packed-sequences.md); the shares are lcmoe's, by "
        "documents",
    ),
}
PRESETS: tuple[str, ...] = tuple(_PRESETS)
FIXED = "fixed"


def preset(name: str) -> DocLengths:
    """A named preset (PRESETS)."""
    if name not in _PRESETS:
        raise LcmoeError(
            FIELD,
            name,
            f"is not a preset ({', '.join((FIXED, *PRESETS))}) or a file",
            "pass a preset or a .yaml/.csv file",
        )
    share_of, shares, source = _PRESETS[name]
    return doc_lengths_from_shares(name, shares, share_of=share_of, source=source)


UNKNOWN = "unknown"


def unknown_lengths(seq_len: int) -> DocLengths:
    """What ``check`` assumes of a config that packs documents without saying their lengths: one
    S-token document per pack, the fixed-length cost (an upper bound on attention), with the
    packing rules (MBS 1, no CUDA graphs) still applied."""
    return DocLengths(
        name=UNKNOWN,
        lengths=(seq_len,),
        token_shares=(1.0,),
        source="the config packs documents but does not say their lengths: costed as one seq_len document "
        "per pack (pass --doc-lengths)",
    )


# ----- files -----------------------------------------------------------------------------------
_KEYS = frozenset({"share_of", "lengths", "source"})


def doc_lengths_from_mapping(doc: Any, *, name: str) -> DocLengths:
    """A DocLengths from a YAML/JSON document ``{share_of: tokens|documents, lengths: {L: share},
    source: text}`` (share_of defaults to tokens)."""
    if not isinstance(doc, dict):
        raise LcmoeError(FIELD, name, "must be a mapping with 'lengths' (length: share)", "see docs/commands.md")
    unknown = sorted(str(k) for k in doc if k not in _KEYS)
    if unknown:
        raise LcmoeError(f"{FIELD} key", unknown[0], f"is not one of {', '.join(sorted(_KEYS))}", "remove it")
    share_of = doc.get("share_of", "tokens")
    if share_of not in ("tokens", "documents"):
        raise LcmoeError(f"{FIELD} share_of", share_of, "must be tokens or documents", "e.g. share_of: tokens")
    source = doc.get("source", "")
    if not isinstance(source, str):
        raise LcmoeError(f"{FIELD} source", source, "must be text", "quote it")
    lengths = doc.get("lengths")
    if not isinstance(lengths, dict):
        raise LcmoeError(
            f"{FIELD} lengths", lengths, "must be a mapping of length: share", "e.g. lengths: {512: 0.4, 4096: 0.6}"
        )
    return doc_lengths_from_shares(name, lengths, share_of=share_of, source=source[:400] or f"user file {name}")


_CSV_HEADER = re.compile(r"^\s*length\s*,\s*(tokens|documents)\s*$", re.IGNORECASE)


def doc_lengths_from_csv(text: str, *, name: str) -> DocLengths:
    """A DocLengths from CSV text: a header ``length,tokens`` or ``length,documents`` (which share
    the second column is), then one ``length,share`` row per bin; ``#`` starts a comment line."""
    rows = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not rows:
        raise LcmoeError(FIELD, name, "is empty", "write a header 'length,tokens' and rows 'length,share'")
    header = _CSV_HEADER.match(rows[0])
    if not header:
        raise LcmoeError(
            f"{FIELD} header", rows[0][:80], "must be 'length,tokens' or 'length,documents'", "fix the first line"
        )
    if len(rows) - 1 > MAX_BINS:
        raise LcmoeError(FIELD, name, f"has more than {MAX_BINS:,} lengths", "merge them into fewer bins")
    shares: dict[int, float] = {}
    for number, row in enumerate(rows[1:], start=2):
        cells = [c.strip() for c in row.split(",")]
        if len(cells) != 2 or not re.fullmatch(r"\d{1,13}", cells[0]):
            raise LcmoeError(
                f"{FIELD} row {number}", row[:80], "must be 'length,share' with a whole-number length", "e.g. 2048,0.25"
            )
        try:
            share = float(cells[1])
        except ValueError:
            raise LcmoeError(f"{FIELD} row {number} share", cells[1][:40], "is not a number", "e.g. 0.25") from None
        length = int(cells[0])
        if length in shares:
            raise LcmoeError(f"{FIELD} row {number} length", length, "is listed twice", "merge the rows")
        shares[length] = share
    share_of: ShareOf = "documents" if header.group(1).lower() == "documents" else "tokens"
    return doc_lengths_from_shares(name, shares, share_of=share_of, source=f"user file {name}")


def load_doc_lengths(text: str) -> DocLengths | None:
    """``--doc-lengths`` as typed: ``fixed`` (None: every sample one S-token document), a preset
    name, or a .yaml/.yml/.json/.csv histogram file read with the bounded readers."""
    from lcmoe.safe_io import load_json, load_yaml, read_text_capped

    if text == FIXED:
        return None
    if text in _PRESETS:
        return preset(text)
    path = Path(text)
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json", ".csv"):
        raise LcmoeError(
            FIELD,
            text,
            f"is not a preset ({', '.join((FIXED, *PRESETS))}) or a .yaml/.json/.csv file",
            "pass one of those",
        )
    body = read_text_capped(path, field=FIELD, max_bytes=MAX_FILE_BYTES)
    if suffix == ".csv":
        return doc_lengths_from_csv(body, name=path.name)
    doc = load_json(body, origin=FIELD) if suffix == ".json" else load_yaml(body, origin=FIELD)
    return doc_lengths_from_mapping(doc, name=path.name)
