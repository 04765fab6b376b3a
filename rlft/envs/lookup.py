r"""The ``lookup`` tool: a toy retrieval tool, BM25 over a local set of documents.

``<call>lookup: capital of France</call>`` is answered with the ``k`` documents that score best, each as
``[rank] title: text``, or ``no document matches 'capital of France'``.

The documents are one file (``path``), read when the tool is built:

- JSON lines (a name ending ``.jsonl`` or ``.ndjson``): one object per line with the strings ``title`` and
  ``text`` (other fields are ignored; blank lines are skipped; rows are numbered by line, from 1);
- any other file is plain text: one document per paragraph (paragraphs are separated by blank lines), with
  no title (it is answered as ``[rank] text``).

A bad file is a ``ValueError`` that names the file, the row and the field (``docs.jsonl, row 3: field 'text'
missing``). The index is built once per file and kept (:func:`index`, keyed by the resolved path, the
modification time and the size: a changed file is read again). Words are lower-cased ``\w+`` runs (Unicode
letters, digits and ``_``); a query's repeated words count once; documents that hold none of its words are
never returned; ties keep the file's order.

The answer has at most ``max_chars`` characters, shared equally by the documents returned (each one's text is
cut to its share, marked ``...``). Keep ``ToolEnv``'s own ``max_chars`` at least as large.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlft.envs.base import check_int
from rlft.envs.tools import MAX_CHARS, TOOLS, Tool, ToolError, short

K1, B = 1.2, 0.75  # BM25's term-frequency saturation and length normalisation (Lucene's and Elasticsearch's defaults)
JSON_LINES = (".jsonl", ".ndjson")
CACHED_FILES = 8
_WORD = re.compile(r"\w+")
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n")


def words(text: str) -> list[str]:
    """The lower-cased word tokens of ``text``.

    >>> words("The Eiffel-Tower's height: 330 m")
    ['the', 'eiffel', 'tower', 's', 'height', '330', 'm']
    """
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Document:
    title: str
    text: str


@dataclass(frozen=True)
class Index:
    """BM25 statistics of ``documents``: for each word, the documents holding it and how often; each document's
    length in words and their mean."""

    documents: tuple[Document, ...]
    postings: Mapping[str, tuple[tuple[int, int], ...]]  # word -> ((document, count in it), ...)
    lengths: tuple[int, ...]
    mean_length: float

    @classmethod
    def build(cls, documents: tuple[Document, ...]) -> "Index":
        postings: dict[str, list[tuple[int, int]]] = {}
        lengths = []
        for i, doc in enumerate(documents):
            counts = Counter(words(f"{doc.title}\n{doc.text}"))  # the title's words count as the text's
            lengths.append(sum(counts.values()))
            for word, n in counts.items():
                postings.setdefault(word, []).append((i, n))
        mean = sum(lengths) / len(lengths) if lengths else 0.0
        return cls(documents, {w: tuple(p) for w, p in postings.items()}, tuple(lengths), mean)

    def scores(self, query: str) -> dict[int, float]:
        """BM25 score of every document holding a word of ``query`` (Robertson et al., Okapi at TREC-3, 1994)::

            score(D, Q) = sum over distinct words q of Q of
                          idf(q) * f(q, D) * (K1 + 1) / (f(q, D) + K1 * (1 - B + B * |D| / avgdl))
            idf(q)      = ln(1 + (N - n(q) + 0.5) / (n(q) + 0.5))     (Lucene's BM25Similarity: always > 0)

        ``f(q, D)``: how often q occurs in D; ``|D|``: D's length in words, title included; ``avgdl``: the mean
        length; ``N``: documents; ``n(q)``: documents holding q.
        """
        n_docs, out = len(self.documents), {}
        for word in dict.fromkeys(words(query)):
            found = self.postings.get(word, ())
            idf = math.log(1 + (n_docs - len(found) + 0.5) / (len(found) + 0.5))
            for i, f in found:
                norm = K1 * (1 - B + B * self.lengths[i] / self.mean_length)
                out[i] = out.get(i, 0.0) + idf * f * (K1 + 1) / (f + norm)
        return out

    def top(self, query: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best ``(document, score)``, best first, ties in the file's order."""
        return sorted(self.scores(query).items(), key=lambda item: (-item[1], item[0]))[:k]


def read_documents(path: Path) -> tuple[Document, ...]:
    """The documents of ``path`` (JSON lines or paragraphs, by its name); a ``ValueError`` naming what is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path.name}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot be read ({e.strerror or e})") from None
    docs = _json_lines(path.name, text) if path.name.lower().endswith(JSON_LINES) else _paragraphs(text)
    if not docs:
        raise ValueError(f"{path.name}: no documents")
    return docs


def _json_lines(name: str, text: str) -> tuple[Document, ...]:
    docs = []
    for row, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as e:
            raise ValueError(f"{name}, row {row}: not JSON ({getattr(e, 'msg', type(e).__name__)})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{name}, row {row}: expected an object with 'title' and 'text', "
                             f"got {type(value).__name__}")
        for field in ("title", "text"):
            if field not in value:
                raise ValueError(f"{name}, row {row}: field {field!r} missing")
            if not isinstance(value[field], str):
                raise ValueError(f"{name}, row {row}: field {field!r} must be a string, "
                                 f"got {type(value[field]).__name__}")
        docs.append(Document(value["title"].strip(), value["text"].strip()))
    return tuple(docs)


def _paragraphs(text: str) -> tuple[Document, ...]:
    parts = [p.strip() for p in _PARAGRAPH.split(text.replace("\r\n", "\n"))]
    return tuple(Document("", p) for p in parts if p)


def index(path: str | os.PathLike) -> Index:
    """The index of the file at ``path``, built once per (resolved path, modification time, size)."""
    resolved = Path(path).expanduser().resolve()
    try:
        st = resolved.stat()
    except OSError as e:
        raise ValueError(f"path: {path}: {e.strerror or e}") from None
    if not resolved.is_file():
        raise ValueError(f"path: {path} is not a file")
    return _index(resolved, st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=CACHED_FILES)
def _index(resolved: Path, mtime_ns: int, size: int) -> Index:  # the stat is the cache key
    return Index.build(read_documents(resolved))


@dataclass(frozen=True)
class Lookup:
    """The tool's function (a plain picklable object): ``Lookup(...)(query) -> str``."""

    index: Index
    k: int
    max_chars: int

    def __call__(self, query: str) -> str:
        if not words(query):
            raise ToolError("empty query: write the words to look up")
        hits = self.index.top(query, self.k)
        if not hits:
            return f"no document matches {short(query, 60)}"
        share = (self.max_chars - (len(hits) - 1)) // len(hits)  # the newlines between documents
        return "\n".join(_entry(rank, self.index.documents[i], share) for rank, (i, _) in enumerate(hits, 1))


def _entry(rank: int, doc: Document, n: int) -> str:
    """``[rank] title: text`` in at most ``n`` characters, cut with ``...``.

    >>> _entry(2, Document("Paris", "The capital of France."), 20)
    '[2] Paris: The ca...'
    """
    entry = f"[{rank}] {doc.title}: {doc.text}" if doc.title else f"[{rank}] {doc.text}"
    return entry if len(entry) <= n else entry[:max(n - 3, 0)] + "..."


@TOOLS.register("lookup")
def lookup(path: str, k: int = 3, max_chars: int = MAX_CHARS) -> Tool:
    """The lookup tool over the documents at ``path``. ``k``: documents per answer, from 1 to 20;
    ``max_chars``: the longest answer, at least 16 per document (``16 * k``)."""
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise ValueError(f"path: expected the path of a file of documents, got {type(path).__name__} {path!r}")
    k = check_int("k", k, low=1, high=20)
    search = Lookup(index(path), k, check_int("max_chars", max_chars, low=16 * k))
    return Tool("lookup", f"Search {len(search.index.documents)} documents by words; "
                f"answers with the {k} best matches.",
                {"type": "object", "properties": {"query": {
                    "type": "string", "description": "words to look for, e.g. capital of France"}},
                 "required": ["query"]}, search)
