"""The ``global_id`` column of strict-order topics (``includeGlobalId=true``), no cluster."""

from __future__ import annotations

import pytest

from fabric.protocol import batch as batch_format
from spark_connector._reader import FabricInputPartition, _ArrowBuilder, _Chunk, arrow_schema

pytestmark = pytest.mark.spark


def test_global_ids_follow_the_stamped_base_and_are_null_without_one() -> None:
    part = FabricInputPartition("t", 0, 0, 10**9, bootstrap="zk://h:1", node_addresses=(), include_headers=False,
                                fail_on_data_loss=True, poll_timeout_ms=1000, include_global_id=True)
    schema = arrow_schema(False, True)
    builder = _ArrowBuilder(part, schema)
    stamped = bytearray(batch_format.encode_batch([1, 2, 3], [None] * 3, [b"a", b"b", b"c"], base_offset=10))
    batch_format.stamp_global_id(stamped, 500)
    plain = batch_format.encode_batch([4], [None], [b"d"], base_offset=13)
    builder.add(_Chunk(batch_format.column_view(bytes(stamped)), 1, 3))  # records 11 and 12
    builder.add(_Chunk(batch_format.column_view(plain), 0, 1))
    out = builder.build()
    assert out.schema.equals(schema)
    assert out.column("global_id").to_pylist() == [501, 502, None]
    assert out.column("offset").to_pylist() == [11, 12, 13]
