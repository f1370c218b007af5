"""Record tags and tag filters: the header, the per-batch bloom, and the filter grammar.

A record's tags travel in one record header, ``fabric.tags``, whose value is the tags
joined by commas (UTF-8). A tag is 1 to ``TAG_BYTES_MAX`` characters of
``[A-Za-z0-9._:/-]``. A producer also ORs every tag of a batch into a 32-bit bloom and
stores it in the batch header's tag_bloom fields (docs/PROTOCOL.md 4.1, 4.6), with attribute bit
5 saying it is there. Both live inside the CRC, so nobody can change them in transit, and
the node reads them without decompressing.

Filter grammar (``!`` binds tighter than ``&&``, which binds tighter than ``||``)::

    filter := or
    or     := and ( "||" and )*
    and    := unary ( "&&" unary )*
    unary  := "!" unary | "(" filter ")" | TAG

``!`` and ``(`` nest at most ``FILTER_NESTING_MAX`` deep (each ``!`` and each open
parenthesis is one level): the parser and the evaluators recurse once per level, and a
1,000-byte filter could otherwise nest 999 deep, past Python's recursion limit.

The client applies the filter exactly to every record. The node can only skip a whole
batch whose bloom proves that no record in it can match: it treats every negation as
"may match", so it skips on positive terms only (``paid`` or ``paid && eu`` skip batches;
``!paid`` never does). A batch without a bloom (no tags at all, or a producer that writes
none; the Python SDK and the C client both write one) is never skipped by the node: it may
still hold tagged records.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence
from typing import Any, Final

from fabric.errors import InvalidRequestError

TAGS_HEADER: Final[str] = "fabric.tags"
TAG_BYTES_MAX: Final[int] = 64
TAGS_PER_RECORD_MAX: Final[int] = 32
FILTER_BYTES_MAX: Final[int] = 1_000
# Nesting of "!" and "(" in one filter. Real filters nest a few levels; 32 keeps the
# parser's recursion (three frames per parenthesis) and the evaluators' far below
# Python's limit of 1,000 frames, wherever a filter is parsed from.
FILTER_NESTING_MAX: Final[int] = 32
BLOOM_BITS: Final[int] = 32
_TAG = re.compile(r"^[A-Za-z0-9._:/-]+$")
_TOKEN = re.compile(r"\s*(\|\||&&|!|\(|\)|[A-Za-z0-9._:/-]+)")

# ("tag", name) | ("not", node) | ("and"|"or", (node, node, ...)): a chain of one operator
# is one node, so a tree is as deep as the filter's nesting, not as long as the filter.
Node = tuple[Any, ...]


def check_tags(tags: Iterable[str]) -> list[str]:
    out = []
    for tag in tags:
        if not isinstance(tag, str) or not _TAG.match(tag) or len(tag.encode()) > TAG_BYTES_MAX:
            raise ValueError(f"tag {tag!r} must be 1 to {TAG_BYTES_MAX} characters of [A-Za-z0-9._:/-]")
        out.append(tag)
    if len(out) > TAGS_PER_RECORD_MAX:
        raise ValueError(f"{len(out)} tags on one record exceed TAGS_PER_RECORD_MAX={TAGS_PER_RECORD_MAX}")
    return out


def encode_tags(tags: Iterable[str]) -> bytes:
    return ",".join(check_tags(tags)).encode("utf-8")


def record_tags(headers: Sequence[tuple[str, bytes | None]] | None) -> frozenset[str]:
    """The tags of one record, from its ``fabric.tags`` header (empty if none)."""
    if headers:
        for name, value in headers:
            if name == TAGS_HEADER and value:
                return frozenset(value.decode("utf-8", "replace").split(","))
    return frozenset()


def tag_bits(tag: str) -> int:
    """Two bits of the 32-bit bloom for one tag, from its CRC-32 (k = 2)."""
    h = zlib.crc32(tag.encode("utf-8")) & 0xFFFFFFFF
    return (1 << (h & 31)) | (1 << ((h >> 5) & 31))


def bloom_of(tags: Iterable[str]) -> int:
    bloom = 0
    for tag in tags:
        bloom |= tag_bits(tag)
    return bloom


def batch_bloom(headers: Sequence[Sequence[tuple[str, bytes | None]] | None] | None) -> int | None:
    """The bloom of a batch's records (None when no record has tags: no bloom is written)."""
    if not headers:
        return None
    bloom = 0
    found = False
    for record_headers in headers:
        tags = record_tags(record_headers)
        if tags:
            found = True
            bloom |= bloom_of(tags)
    return bloom if found else None


class TagFilter:
    """A parsed filter: ``matches(tags)`` exactly, ``may_match(bloom)`` conservatively."""

    def __init__(self, text: str) -> None:
        if len(text.encode("utf-8")) > FILTER_BYTES_MAX:
            raise InvalidRequestError(f"tag filter longer than FILTER_BYTES_MAX={FILTER_BYTES_MAX} bytes")
        self.text = text
        self._tokens = _tokenize(text)
        self._pos = 0
        self._depth = 0  # "!" and "(" open around the token being parsed
        self.tree = self._or()
        if self._pos != len(self._tokens):
            raise InvalidRequestError(f"tag filter {text!r}: unexpected {self._tokens[self._pos]!r}")

    def __repr__(self) -> str:
        return f"TagFilter({self.text!r})"

    # -- parser (recursive descent, depth bounded by FILTER_NESTING_MAX) ----------------------
    def _peek(self) -> str | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise InvalidRequestError(f"tag filter {self.text!r} ends too early")
        self._pos += 1
        return token

    def _or(self) -> Node:
        terms = [self._and()]
        while self._peek() == "||":
            self._take()
            terms.append(self._and())
        return terms[0] if len(terms) == 1 else ("or", tuple(terms))

    def _and(self) -> Node:
        terms = [self._unary()]
        while self._peek() == "&&":
            self._take()
            terms.append(self._unary())
        return terms[0] if len(terms) == 1 else ("and", tuple(terms))

    def _unary(self) -> Node:
        token = self._take()
        if token in ("!", "("):
            if self._depth == FILTER_NESTING_MAX:
                raise InvalidRequestError(
                    f"tag filter nests '!' and '(' more than FILTER_NESTING_MAX={FILTER_NESTING_MAX} deep")
            self._depth += 1
            if token == "!":
                node: Node = ("not", self._unary())
            else:
                node = self._or()
                if self._take() != ")":
                    raise InvalidRequestError(f"tag filter {self.text!r}: missing ')'")
            self._depth -= 1
            return node
        if token in ("||", "&&", ")"):
            raise InvalidRequestError(f"tag filter {self.text!r}: expected a tag, '!' or '(' before {token!r}")
        if len(token) > TAG_BYTES_MAX:
            # No record can carry it (check_tags refuses it): a filter naming it would
            # silently match nothing, or everything under a '!'.
            raise InvalidRequestError(
                f"tag filter {self.text!r}: tag {token[:20]!r}... is longer than TAG_BYTES_MAX={TAG_BYTES_MAX} "
                "characters")
        return ("tag", token)

    # -- evaluation ---------------------------------------------------------------------------
    def matches(self, tags: frozenset[str]) -> bool:
        return _eval(self.tree, tags)

    def may_match(self, bloom: int | None) -> bool:
        """False only if no record of a batch with this bloom can match (None: no tags at all)."""
        if bloom is None:
            return True  # a producer that writes no bloom may still have tagged its records
        return _maybe(self.tree, bloom)


def _tokenize(text: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise InvalidRequestError(f"tag filter {text!r}: cannot read {text[pos:pos + 10]!r}")
        tokens.append(m.group(1))
        pos = m.end()
    if not tokens:
        raise InvalidRequestError("tag filter is empty")
    return tokens


def _eval(node: Node, tags: frozenset[str]) -> bool:
    kind = node[0]
    if kind == "tag":
        return node[1] in tags
    if kind == "not":
        return not _eval(node[1], tags)
    # Loops, not all()/any() over a generator: this runs for every record a consumer
    # filters, and the generator doubles its time.
    if kind == "and":
        for term in node[1]:  # noqa: SIM110
            if not _eval(term, tags):
                return False
        return True
    for term in node[1]:  # noqa: SIM110
        if _eval(term, tags):
            return True
    return False


def _maybe(node: Node, bloom: int) -> bool:
    """An over-approximation: could some record of the batch satisfy ``node``?"""
    kind = node[0]
    if kind == "tag":
        bits = tag_bits(node[1])
        return bloom & bits == bits
    if kind == "not":
        return True  # the bloom cannot prove a tag absent from every record
    if kind == "and":
        return all(_maybe(term, bloom) for term in node[1])
    return any(_maybe(term, bloom) for term in node[1])
