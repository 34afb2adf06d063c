"""Real corpora from Debian packages, unpacked (never installed) by ``make corpora``.

- Jane Austen's six novels: ``r-cran-janeaustenr``. The package stores them as R lazy-load
  data (``data/Rdata.rdx`` index + ``Rdata.rdb``, zlib-compressed serialized R character
  vectors, one per novel); the ``rdata`` package parses the R serialization, so R is not needed.
- German-English sentence pairs: the Ding dictionary of ``trans-de-en``
  (``usr/share/trans/de-en``, ``German | ... :: English | ...`` lines). Only aligned entries
  that are whole sentences on both sides are kept.

Python never downloads anything: ``scripts/fetch-corpora.sh`` (``make corpora``) runs
``apt-get download`` + ``dpkg-deb -x`` into ``corpora/``. The folder is looked up in
``$HEADWISE_CORPORA``, then ``./corpora``, then the source checkout's ``corpora/``.
"""

from __future__ import annotations

import os
import re
import struct
import warnings
import zlib
from pathlib import Path

from headwise.errors import HeadwiseError

__all__ = ["AUSTEN_BOOKS", "CorpusMissingError", "austen_text", "corpora_dir", "ding_pairs"]

AUSTEN_BOOKS = ("sensesensibility", "prideprejudice", "mansfieldpark", "emma",
                "northangerabbey", "persuasion")
_AUSTEN = Path("janeaustenr/usr/lib/R/site-library/janeaustenr/data")
_DING = Path("trans-de-en/usr/share/trans/de-en")
_HOW = "run `make corpora` (or scripts/fetch-corpora.sh) to unpack the Debian packages into corpora/"


class CorpusMissingError(HeadwiseError, FileNotFoundError):
    """A corpus has not been fetched yet (the message says how)."""


def corpora_dir() -> Path:
    """The first existing corpora folder: $HEADWISE_CORPORA, ./corpora, <checkout>/corpora."""
    candidates = []
    if os.environ.get("HEADWISE_CORPORA"):
        candidates.append(Path(os.environ["HEADWISE_CORPORA"]))
    candidates += [Path.cwd() / "corpora", Path(__file__).resolve().parents[3] / "corpora"]
    for c in candidates:
        if c.is_dir():
            return c
    return candidates[0]


def _find(rel: Path, what: str) -> Path:
    path = corpora_dir() / rel
    if not path.exists():
        raise CorpusMissingError(f"{what} not found at {path}; {_HOW}")
    return path


def austen_text(books: tuple[str, ...] = AUSTEN_BOOKS) -> str:
    """The six novels (or ``books``), each a block of lines, joined by blank lines."""
    try:
        import rdata
    except ImportError:
        raise CorpusMissingError("reading the Austen corpus needs the `rdata` package: "
                                 "pip install 'headwise[data]'") from None
    folder = _find(_AUSTEN, "the Jane Austen corpus (r-cran-janeaustenr)")
    unknown = set(books) - set(AUSTEN_BOOKS)
    if unknown:
        raise ValueError(f"unknown Austen book(s) {sorted(unknown)}; expected {AUSTEN_BOOKS}")
    with warnings.catch_warnings():  # rdata warns that .rdx is not a usual extension
        warnings.simplefilter("ignore")
        index = rdata.conversion.convert(rdata.parser.parse_file(folder / "Rdata.rdx"))
        blob = (folder / "Rdata.rdb").read_bytes()
        texts = []
        for book in books:
            offset, length = (int(v) for v in index["variables"][book])
            record = blob[offset:offset + length]
            # R's lazyLoadDBfetch: 4-byte big-endian inflated size, then a zlib stream
            size = struct.unpack(">I", record[:4])[0]
            raw = zlib.decompress(record[4:])
            if len(raw) != size:
                raise HeadwiseError(f"{folder / 'Rdata.rdb'} is corrupted ({book}); {_HOW}")
            lines = rdata.conversion.convert(rdata.parser.parse_data(raw))
            texts.append("\n".join(str(line) for line in lines).strip())
    return "\n\n\n".join(texts) + "\n"


_SENTENCE = re.compile(r"^[A-ZÄÖÜ][^{}\[\]()/<>|;~…_=+*#@\d]*[.!?]$")


def ding_pairs() -> list[tuple[str, str]]:
    """(German, English) whole-sentence pairs from the Ding dictionary.

    Each line is ``de_1 | de_2 ... :: en_1 | en_2 ...`` with aligned alternatives; inside one,
    ``;`` separates synonyms (the first is kept). A pair is kept when both sides start with a
    capital letter, end in ``.``, ``!`` or ``?`` and carry no grammar annotations."""
    path = _find(_DING, "the Ding German-English dictionary (trans-de-en)")
    pairs, seen = [], set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#") or " :: " not in line:
            continue
        de_side, en_side = line.split(" :: ", 1)
        for de, en in zip(de_side.split(" | "), en_side.split(" | "), strict=False):
            de, en = de.split("; ")[0].strip(), en.split("; ")[0].strip()
            if _SENTENCE.match(de) and _SENTENCE.match(en) and (de, en) not in seen:
                seen.add((de, en))
                pairs.append((de, en))
    if not pairs:
        raise HeadwiseError(f"no sentence pairs found in {path}; is it the Ding dictionary?")
    return pairs
