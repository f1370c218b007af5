"""Tag filters: the grammar, exact matching, the batch bloom and the node's batch skipping."""

from __future__ import annotations

import pytest

from fabric import errors
from fabric.protocol import batch as batch_format
from fabric.protocol import tags as t
from nodes.tag_filter import read_filtered


@pytest.mark.parametrize(("text", "tags", "expected"), [
    ("paid", {"paid"}, True),
    ("paid", {"eu"}, False),
    ("paid || refunded", {"refunded"}, True),
    ("paid && eu", {"paid"}, False),
    ("paid && eu", {"paid", "eu"}, True),
    ("!paid", set(), True),
    ("!paid", {"paid"}, False),
    ("paid || refunded && eu", {"refunded"}, False),  # && binds tighter than ||
    ("(paid || refunded) && eu", {"refunded", "eu"}, True),
    ("!(paid || refunded)", {"eu"}, True),
    ("!!paid", {"paid"}, True),
    ("  paid||x:y/z-1.2  ", {"x:y/z-1.2"}, True),
    ("x" * 64, {"x" * 64}, True),  # the longest tag
])
def test_grammar_and_exact_match(text: str, tags: set[str], expected: bool) -> None:
    assert t.TagFilter(text).matches(frozenset(tags)) is expected


@pytest.mark.parametrize("text", ["", "paid ||", "&& paid", "(paid", "paid)", "paid eu", "pa$d", "!", "()",
                                  "x" * 65, "paid || !" + "x" * 65])  # a tag is 1 to 64 characters
def test_bad_filters_are_refused(text: str) -> None:
    with pytest.raises(errors.InvalidRequestError):
        t.TagFilter(text)


def test_bad_tags_are_refused() -> None:
    for tag in ["", "a,b", "x" * 65, "sp ace"]:
        with pytest.raises(ValueError):
            t.encode_tags([tag])
    assert t.encode_tags(["paid", "eu"]) == b"paid,eu"
    assert t.record_tags([("x", b"1"), (t.TAGS_HEADER, b"paid,eu")]) == {"paid", "eu"}


def test_bloom_never_skips_a_match() -> None:
    # Whatever the tags, a batch whose bloom came from records that match is never skipped.
    universe = [f"tag{i}" for i in range(200)]
    filters = [t.TagFilter(f) for f in ("tag1", "tag2 || tag77", "tag3 && tag4", "!tag5", "tag6 && !tag7")]
    for i in range(0, 200, 3):
        record = frozenset(universe[i : i + 3])
        bloom = t.bloom_of(record)
        for f in filters:
            if f.matches(record):
                assert f.may_match(bloom)
    # Positive terms do skip: most single-tag batches cannot match an unrelated tag.
    skipped = sum(not t.TagFilter("tag1").may_match(t.bloom_of([tag])) for tag in universe)
    assert skipped > 150
    assert t.TagFilter("!tag1").may_match(t.bloom_of(["tag1"]))
    assert t.TagFilter("tag1").may_match(None)  # no bloom: never skipped


def test_batch_carries_bloom_inside_crc() -> None:
    headers = [[(t.TAGS_HEADER, b"paid")], None, [(t.TAGS_HEADER, b"eu,paid")]]
    bloom = t.batch_bloom(headers)
    assert bloom == t.bloom_of(["paid", "eu"])
    buf = batch_format.encode_batch([1, 2, 3], [None] * 3, [b"a", b"b", b"c"], headers, tag_bloom=bloom)
    header = batch_format.validate(buf, 1 << 20)
    assert header.codec == batch_format.CODEC_LZ4
    assert batch_format.tag_bloom(buf) == bloom
    corrupted = bytearray(buf)
    corrupted[54] ^= 1
    with pytest.raises(errors.CorruptMessageError):
        batch_format.validate(bytes(corrupted), 1 << 20)
    plain = batch_format.encode_batch([1], [None], [b"a"])
    assert batch_format.tag_bloom(plain) is None
    assert t.batch_bloom([None, []]) is None


def test_node_skips_batches_that_cannot_match() -> None:
    def make(base: int, tag: str, n: int = 5) -> bytes:
        headers = [[(t.TAGS_HEADER, tag.encode())]] * n
        return batch_format.stamped(batch_format.encode_batch([0] * n, [None] * n, [b"v"] * n, headers,
                                                              tag_bloom=t.batch_bloom(headers)), base, 0)

    log = [make(0, "refunded"), make(5, "other"), make(10, "paid"), make(15, "other")]

    def read(offset: int, bytes_max: int, limit: int) -> list[bytes]:
        return [b for b in log if batch_format.read_header(b).next_offset > offset][:1]

    kept, next_offset, filtered = read_filtered(read, 20, 0, 1 << 20, t.TagFilter("paid"))
    assert [batch_format.read_header(b).base_offset for b in kept] == [10]
    assert next_offset == 15 and filtered == len(log[0]) + len(log[1])
    kept, next_offset, filtered = read_filtered(read, 20, 15, 1 << 20, t.TagFilter("paid"))
    assert kept == [] and next_offset == 20 and filtered == len(log[3])


def test_producer_batch_with_some_tagged_records_keeps_their_headers() -> None:
    """A batch opened by untagged records (has_headers false) that later takes a tagged one
    must hand its headers to the encoder: without the bloom the node would skip the batch
    for any filter that needs a tag, and its tagged records would never arrive."""
    from sdk.accumulator import RecordAccumulator

    acc = RecordAccumulator(batch_bytes_max=1 << 16, linger_ms=5, buffer_bytes_max=1 << 20)
    acc.append("t", 0, 1, None, b"untagged", None, 0.0)
    acc.append("t", 0, 2, None, b"paid", [(t.TAGS_HEADER, b"paid")], 0.0)
    acc.append("t", 0, 3, None, b"untagged", None, 0.0)
    timestamps, keys, values, headers = acc.open[("t", 0)].columns()
    bloom = t.batch_bloom(headers)
    assert bloom == t.bloom_of(["paid"])
    buf = batch_format.encode_batch(timestamps, keys, values, headers, tag_bloom=bloom)
    assert batch_format.tag_bloom(buf) == bloom


@pytest.mark.parametrize("text", [
    "!" * 999 + "a",  # the audit's: both under FILTER_BYTES_MAX, both a RecursionError
    "(" * 400 + "a" + ")" * 400,
    "(" * 300 + "a" + ")" * 300,
    "!" * 300 + "a",
    "!(" * (t.FILTER_NESTING_MAX // 2) + "!a" + ")" * (t.FILTER_NESTING_MAX // 2),  # one level too deep
    "a && (" * (t.FILTER_NESTING_MAX + 1) + "b" + ")" * (t.FILTER_NESTING_MAX + 1) + " || c",
])
def test_nesting_deeper_than_the_limit_is_refused_by_name(text: str) -> None:
    assert len(text.encode()) <= t.FILTER_BYTES_MAX
    with pytest.raises(errors.InvalidRequestError, match=f"FILTER_NESTING_MAX={t.FILTER_NESTING_MAX}"):
        t.TagFilter(text)


def test_nesting_up_to_the_limit_parses_and_evaluates() -> None:
    depth = t.FILTER_NESTING_MAX
    parens = t.TagFilter("(" * depth + "paid" + ")" * depth)
    assert parens.matches(frozenset({"paid"})) and not parens.matches(frozenset())
    assert not parens.may_match(t.bloom_of(["eu"]))
    nots = t.TagFilter("!" * depth + "paid")  # an even number of negations
    assert nots.matches(frozenset({"paid"})) is (depth % 2 == 0)
    mixed = t.TagFilter("!(" * (depth // 2) + "paid" + ")" * (depth // 2))
    assert mixed.matches(frozenset({"paid"})) is (depth // 2 % 2 == 0)


@pytest.mark.parametrize("op", ["&&", "||"])
def test_a_long_chain_is_one_node_not_a_deep_tree(op: str) -> None:
    # 150 terms: a left-nested tree 149 deep before, which the evaluators walked recursively.
    text = op.join(f"t{i}" for i in range(150))
    assert len(text.encode()) <= t.FILTER_BYTES_MAX
    f = t.TagFilter(text)
    assert f.tree[0] == ("and" if op == "&&" else "or") and len(f.tree[1]) == 150
    every = frozenset(f"t{i}" for i in range(150))
    assert f.matches(every)
    assert f.matches(frozenset({"t149"})) is (op == "||")
    assert f.may_match(t.bloom_of(every))
