"""Named limits with units. Every queue, buffer, batch and wait in Fabric has one.

Errors quote these names, so a user who hits a limit knows which knob it is.
"""

from typing import Final

# Wire level.
PROTOCOL_MAGIC: Final[int] = 0x31524246  # b"FBR1" read as a little-endian u32
PROTOCOL_VERSION: Final[int] = 1
HEADER_BYTES: Final[int] = 16
REQUEST_FRAMES_MAX: Final[int] = 4097  # header + body + up to 4,095 batches
REQUEST_BYTES_MAX: Final[int] = 128 * 1024 * 1024
STRING_BYTES_MAX: Final[int] = 65_535
# Error messages on the wire are cut to this (UTF-8 bytes), so an answer that quotes a
# client's 65,535-byte name still encodes.
MESSAGE_TEXT_BYTES_MAX: Final[int] = 1_024
ARRAY_ITEMS_MAX: Final[int] = 1_000_000
# Names in one METADATA, DESCRIBE_TOPICS, DESCRIBE_GROUPS or DELETE_GROUPS request (METADATA
# and DESCRIBE_TOPICS ask for every topic with an empty list). Each name costs the node's
# loop a few microseconds: a million distinct names (an 8.9 MB request) held it 5-6 s.
NAMES_PER_REQUEST_MAX: Final[int] = 10_000
# The integer widths of the wire (docs/PROTOCOL.md section 3): a value outside them cannot
# be encoded, so the SDK and the CLI refuse it by name instead of meeting a struct.error.
I16_MAX: Final[int] = 2**15 - 1
I32_MAX: Final[int] = 2**31 - 1
I64_MAX: Final[int] = 2**63 - 1

# Record batches.
BATCH_HEADER_BYTES: Final[int] = 72
BATCH_RECORDS_MAX: Final[int] = 1_000_000
# The largest records section a batch may decompress to, whatever its lz4 frame claims.
BATCH_UNCOMPRESSED_BYTES_MAX: Final[int] = 64 * 1024 * 1024
# Default per-topic limit on one batch as sent on the wire (compressed size), and the
# bounds of a topic's message_bytes_max.
MESSAGE_BYTES_MAX_DEFAULT: Final[int] = 8 * 1024 * 1024
TOPIC_MESSAGE_BYTES_MIN: Final[int] = 1024
TOPIC_MESSAGE_BYTES_MAX: Final[int] = 64 * 1024 * 1024
# The lz4 output one PRODUCE request may cost its node (the records_bytes of its lz4
# batches; the first is always taken). lz4 expands up to ~255x, so without it a request of
# REQUEST_BYTES_MAX could make the node's one loop decompress tens of GiB (found by
# fuzzing). As REQUEST_BYTES_MAX, so a request decompresses at most what it may carry.
PRODUCE_DECOMPRESSED_BYTES_MAX: Final[int] = 128 * 1024 * 1024

# Topics.
TOPIC_NAME_BYTES_MAX: Final[int] = 200
PARTITIONS_MAX: Final[int] = 10_000
REPLICATION_FACTOR_MAX: Final[int] = 16

# Reassignment: a catch-up throttle below this (bytes per second) would take forever, so
# it is refused as a typo (0 means no throttle).
REASSIGN_THROTTLE_BYTES_PER_S_MIN: Final[int] = 1024

# Fetch.
FETCH_WAIT_MS_MAX: Final[int] = 60_000
FETCH_BYTES_MAX: Final[int] = 64 * 1024 * 1024
PARKED_FETCHES_MAX: Final[int] = 10_000

# Node.
PRODUCE_TIMEOUT_MS_MAX: Final[int] = 300_000
RETENTION_CHECK_INTERVAL_MS_DEFAULT: Final[int] = 5_000
FSYNC_INTERVAL_MS_DEFAULT: Final[int] = 1_000
# A consumer group empty this long loses its offsets and goes (nodes/group_retention.py):
# 7 days, Kafka's offsets.retention.minutes.
OFFSETS_RETENTION_MS_DEFAULT: Final[int] = 7 * 24 * 3600 * 1000
