"""Opening a store written by an older Fabric: its index and metadata move to ``meta``.

A store written before the ``meta`` column family kept index (``b"i"``) and metadata
(``b"m"``) keys in the default family (docs/DESIGN.md, "Storage"). ``Store`` calls
``migrate_to_meta_family`` whenever it opens; on a current store it finds nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from nodes.log import Store

MIGRATE_BATCH_KEYS: Final[int] = 100_000  # keys copied per WriteBatch
_META_KEY_RANGES: Final = ((b"i", b"j"), (b"m", b"n"))  # every index and metadata key


def migrate_to_meta_family(store: Store) -> None:
    """Copy the old keys over, then delete them in the default family. The copies are
    idempotent and the delete comes last, so a crash in between copies again at the next
    start. Their batches stay where they are (an index entry without a sequence finds them)."""
    found = False
    for start, end in _META_KEY_RANGES:
        it = store.db.iter()
        it.seek(start)
        wb, staged = store.new_write_batch(), 0
        while it.valid() and it.key() < end:
            found = True
            wb.put(it.key(), it.value(), store.meta_cf)
            staged += 1
            if staged >= MIGRATE_BATCH_KEYS:
                store.write(wb)
                wb, staged = store.new_write_batch(), 0
            it.next()
        del it
        if staged:
            store.write(wb)
    if found:
        wb = store.new_write_batch()
        for start, end in _META_KEY_RANGES:
            wb.delete_range(start, end)
        store.write(wb)
