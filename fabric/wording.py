"""How a count reads in a message a person sees: "1 message", "2 messages".

One helper for every such message (the CLI's output, the demo's summary, errors the
nodes send back), so none of them says "1 messages" and no copy of the rule drifts.
Core layer: it imports nothing, so nodes, the SDK and the CLI can all use it.
"""

from __future__ import annotations


def plural(count: int, noun: str, plural_noun: str | None = None) -> str:
    """``count`` and ``noun``, singular for exactly 1 and plural otherwise (0 included, as in
    English): ``plural(1, "record")`` is "1 record", ``plural(2_000, "entry", "entries")``
    is "2,000 entries". The plural is ``noun + "s"`` unless given. Thousands are grouped,
    as the CLI prints every other count."""
    word = noun if count == 1 else (plural_noun if plural_noun is not None else noun + "s")
    return f"{count:,} {word}"
