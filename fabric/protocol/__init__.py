"""The Fabric wire protocol: pure codecs, no sockets, threads or clocks.

See docs/PROTOCOL.md for the byte-level specification these modules implement.
"""

from fabric.protocol.apis import (
    ApiKey,
    Message,
    decode_request,
    decode_response,
    encode_error_response,
    encode_request,
    encode_response,
)
from fabric.protocol.batch import (
    CODEC_LZ4,
    CODEC_NONE,
    BatchHeader,
    DecodedBatch,
    decode_batch,
    encode_batch,
    read_header,
    stamped,
    validate,
)
from fabric.protocol.header import Header, decode_header, encode_header
from fabric.protocol.keyhash import key_hash, partition_for_key

__all__ = [
    "CODEC_LZ4",
    "CODEC_NONE",
    "ApiKey",
    "BatchHeader",
    "DecodedBatch",
    "Header",
    "Message",
    "decode_batch",
    "decode_header",
    "decode_request",
    "decode_response",
    "encode_batch",
    "encode_error_response",
    "encode_header",
    "encode_request",
    "encode_response",
    "key_hash",
    "partition_for_key",
    "read_header",
    "stamped",
    "validate",
]
