/*
 * fabric_protocol.h: the pure codecs of the Fabric wire protocol (docs/PROTOCOL.md).
 *
 * Nothing here opens a socket, reads a clock or starts a thread: bytes in, values out.
 * Decoders refuse what the spec refuses (lengths past the frame, trailing bytes, bad
 * UTF-8, array counts above FABRIC_ARRAY_ITEMS_MAX or above the bytes left) and return a
 * fabric_err code plus, when err/err_len are given, a sentence saying what was wrong.
 *
 * Decoded bodies live in a fabric_arena_t: one free releases a whole message. Arena
 * growth is bounded by the frame size (every array count is checked against the bytes
 * left before anything is allocated), so a small frame cannot make a large allocation.
 */
#ifndef FABRIC_PROTOCOL_H
#define FABRIC_PROTOCOL_H

#include "fabric.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Growable byte buffer --------------------------------------------------------------- */
typedef struct fabric_buf {
    uint8_t *data;
    size_t len;
    size_t cap;
    int err; /* first error (FABRIC_ERR_NO_MEMORY, INVALID_ARGUMENT); writes stop after it */
} fabric_buf_t;

void fabric_buf_init(fabric_buf_t *b);
void fabric_buf_free(fabric_buf_t *b);
int fabric_buf_reserve(fabric_buf_t *b, size_t extra);
void fabric_buf_put(fabric_buf_t *b, const void *data, size_t len);
void fabric_buf_put_u8(fabric_buf_t *b, uint8_t v);
void fabric_buf_put_u16(fabric_buf_t *b, uint16_t v);
void fabric_buf_put_u32(fabric_buf_t *b, uint32_t v);
void fabric_buf_put_u64(fabric_buf_t *b, uint64_t v);
/* str: u16 length + bytes; more than FABRIC_STRING_BYTES_MAX sets err INVALID_ARGUMENT */
void fabric_buf_put_str(fabric_buf_t *b, const char *s, size_t len);

/* ---- Arena for decoded bodies ----------------------------------------------------------- */
typedef struct fabric_arena_chunk fabric_arena_chunk_t;
typedef struct fabric_arena {
    fabric_arena_chunk_t *head;
    size_t bytes;       /* allocated so far */
    size_t bytes_max;   /* 0 = no limit; set by the decoders from the frame size */
} fabric_arena_t;

void fabric_arena_init(fabric_arena_t *a);
void *fabric_arena_alloc(fabric_arena_t *a, size_t size);
void fabric_arena_free(fabric_arena_t *a);

/* A decoded string: NUL-terminated copy in the arena, with its length. */
typedef struct fabric_str {
    const char *data;
    size_t len;
} fabric_str_t;

/* ---- Header frame (section 2) ------------------------------------------------------------ */
#define FABRIC_FLAG_RESPONSE 0x01

enum fabric_api_key {
    FABRIC_API_VERSIONS = 0,
    FABRIC_API_METADATA = 1,
    FABRIC_API_PRODUCE = 2,
    FABRIC_API_FETCH = 3,
    FABRIC_API_LIST_OFFSETS = 4,
    FABRIC_API_CREATE_TOPIC = 5,
    FABRIC_API_DELETE_TOPIC = 6,
    FABRIC_API_DESCRIBE_TOPICS = 7,
    FABRIC_API_ALLOCATE_IDS = 20 /* to the active sequencer */
};

typedef struct fabric_frame_header {
    uint8_t protocol_version;
    uint8_t flags;
    uint16_t api_key;
    uint16_t api_version;
    int16_t error_code;
    uint32_t correlation_id;
} fabric_frame_header_t;

void fabric_header_encode(const fabric_frame_header_t *h, uint8_t out[FABRIC_HEADER_BYTES]);
/* INVALID_MAGIC, MALFORMED_REQUEST (length) or UNSUPPORTED_VERSION, checked in that order. */
int fabric_header_decode(const uint8_t *frame, size_t len, fabric_frame_header_t *out,
                         char *err, size_t err_len);

/* ---- Bodies (sections 3 and 5) ------------------------------------------------------------ */
typedef struct fabric_partition_state {
    int32_t partition;
    int16_t error;
    int32_t leader;
    int32_t leader_epoch;
    int32_t *replicas;
    uint32_t replica_count;
    int32_t *isr;
    uint32_t isr_count;
} fabric_partition_state_t;

typedef struct fabric_metadata_node {
    int32_t node_id;
    fabric_str_t address;
} fabric_metadata_node_t;

typedef struct fabric_metadata_topic {
    int16_t error;
    fabric_str_t name;
    uint8_t strict_order;
    int32_t message_bytes_max;
    fabric_partition_state_t *partitions;
    uint32_t partition_count;
} fabric_metadata_topic_t;

typedef struct fabric_metadata_request {
    fabric_str_t *topics;
    uint32_t topic_count;
} fabric_metadata_request_t;

typedef struct fabric_metadata_response {
    int32_t controller_id;
    fabric_metadata_node_t *nodes;
    uint32_t node_count;
    fabric_metadata_topic_t *topics;
    uint32_t topic_count;
} fabric_metadata_response_t;

typedef struct fabric_topic_partition {
    fabric_str_t topic;
    int32_t partition;
} fabric_topic_partition_t;

typedef struct fabric_produce_request {
    int8_t acks;
    int32_t timeout_ms;
    fabric_topic_partition_t *entries;
    uint32_t entry_count;
} fabric_produce_request_t;

typedef struct fabric_produce_result {
    fabric_str_t topic;
    int32_t partition;
    int16_t error;
    int64_t base_offset;
    int64_t log_start_offset;
    fabric_str_t message;
} fabric_produce_result_t;

typedef struct fabric_produce_response {
    fabric_produce_result_t *results;
    uint32_t result_count;
} fabric_produce_response_t;

typedef struct fabric_fetch_partition {
    fabric_str_t topic;
    int32_t partition;
    int64_t fetch_offset;
    int32_t partition_bytes_max;
    int32_t current_leader_epoch;
} fabric_fetch_partition_t;

typedef struct fabric_fetch_request {
    int32_t replica_id;
    int32_t max_wait_ms;
    int32_t min_bytes;
    int32_t max_bytes;
    fabric_fetch_partition_t *partitions;
    uint32_t partition_count;
} fabric_fetch_request_t;

typedef struct fabric_fetch_partition_result {
    fabric_str_t topic;
    int32_t partition;
    int16_t error;
    int64_t high_watermark;
    int64_t log_start_offset;
    int64_t log_end_offset;
    uint32_t batch_count;
} fabric_fetch_partition_result_t;

typedef struct fabric_fetch_response {
    fabric_fetch_partition_result_t *partitions;
    uint32_t partition_count;
} fabric_fetch_response_t;

typedef struct fabric_list_offsets_partition {
    fabric_str_t topic;
    int32_t partition;
    int64_t timestamp;
} fabric_list_offsets_partition_t;

typedef struct fabric_list_offsets_request {
    fabric_list_offsets_partition_t *partitions;
    uint32_t partition_count;
} fabric_list_offsets_request_t;

typedef struct fabric_list_offsets_result {
    fabric_str_t topic;
    int32_t partition;
    int16_t error;
    int64_t timestamp;
    int64_t offset;
} fabric_list_offsets_result_t;

typedef struct fabric_list_offsets_response {
    fabric_list_offsets_result_t *partitions;
    uint32_t partition_count;
} fabric_list_offsets_response_t;

typedef struct fabric_config_entry {
    fabric_str_t key;
    fabric_str_t value;
} fabric_config_entry_t;

typedef struct fabric_create_topic_request {
    fabric_str_t name;
    int32_t partitions;
    int16_t replication_factor;
    fabric_config_entry_t *configs;
    uint32_t config_count;
} fabric_create_topic_request_t;

/* CREATE_TOPIC and DELETE_TOPIC responses */
typedef struct fabric_result_response {
    int16_t error;
    fabric_str_t message;
} fabric_result_response_t;

/* The body of a response whose header error_code is not 0. */
typedef struct fabric_error_body {
    fabric_str_t message;
} fabric_error_body_t;

/* ALLOCATE_IDS (20), to the active sequencer: count IDs in, a consecutive range out. */
typedef struct fabric_allocate_ids_request {
    int32_t count; /* 0..1,000,000; 0 asks only for records_end */
    int8_t kind;   /* 0: IDs for records, 1: IDs for ticks */
} fabric_allocate_ids_request_t;

typedef struct fabric_allocate_ids_response {
    int32_t epoch;
    int64_t first_id;
    int32_t count;
    int64_t records_end; /* one past the highest ID granted for records */
} fabric_allocate_ids_response_t;

/* Encoders append to out (check out->err). Decoders take one whole body frame; trailing
 * bytes are MALFORMED_REQUEST. */
#define FABRIC_DECLARE_BODY(name)                                                              \
    void fabric_##name##_encode(const fabric_##name##_t *v, fabric_buf_t *out);                \
    int fabric_##name##_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,        \
                               fabric_##name##_t *out, char *err, size_t err_len);
FABRIC_DECLARE_BODY(metadata_request)
FABRIC_DECLARE_BODY(metadata_response)
FABRIC_DECLARE_BODY(produce_request)
FABRIC_DECLARE_BODY(produce_response)
FABRIC_DECLARE_BODY(fetch_request)
FABRIC_DECLARE_BODY(fetch_response)
FABRIC_DECLARE_BODY(list_offsets_request)
FABRIC_DECLARE_BODY(list_offsets_response)
FABRIC_DECLARE_BODY(create_topic_request)
FABRIC_DECLARE_BODY(result_response)
FABRIC_DECLARE_BODY(error_body)
FABRIC_DECLARE_BODY(allocate_ids_request)
FABRIC_DECLARE_BODY(allocate_ids_response)
#undef FABRIC_DECLARE_BODY

/* Build a fabric_str_t from a C string (no copy). */
fabric_str_t fabric_str(const char *s);

/* ---- Record batches (section 4) ------------------------------------------------------------ */
#define FABRIC_BATCH_MAGIC 1
#define FABRIC_CODEC_MASK 0x07
#define FABRIC_TIMESTAMP_LOG_APPEND 0x08
#define FABRIC_BATCH_CONTROL 0x10 /* a strict-order tick: takes an offset, holds no record */
#define FABRIC_BATCH_TAG_BLOOM 0x20 /* bytes 22-23 (low half) and 54-55 (high half): tag bloom */
#define FABRIC_TAGS_HEADER "fabric.tags"
#define FABRIC_BATCH_CRC_START 20

typedef struct fabric_batch_header {
    int64_t base_offset;
    int32_t batch_length;
    int32_t leader_epoch;
    uint32_t crc;
    uint8_t magic;
    uint8_t attributes;
    int32_t record_count;
    int64_t first_timestamp;
    int64_t max_timestamp;
    int64_t producer_id;
    int16_t producer_epoch;
    int32_t base_sequence;
    int64_t global_id_base;
    int32_t records_bytes;
} fabric_batch_header_t;

/* Parse the fixed 72-byte header only (CORRUPT_MESSAGE if shorter). */
int fabric_batch_read_header(const uint8_t *buf, size_t len, fabric_batch_header_t *out);
/* CRC-32 of bytes [20, len) (section 4.4). */
uint32_t fabric_batch_crc(const uint8_t *buf, size_t len);
/* What a node checks before appending (section 4.5), without decompressing. */
int fabric_batch_validate(const uint8_t *buf, size_t len, int32_t message_bytes_max,
                          fabric_batch_header_t *out, char *err, size_t err_len);

/* Collects records column by column; finish() writes one batch frame. Bounded by
 * FABRIC_BATCH_RECORDS_MAX records and FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX bytes. */
typedef struct fabric_batch_builder {
    int32_t record_count;
    int64_t first_timestamp;
    int64_t max_timestamp;
    fabric_buf_t timestamp_deltas, key_lengths, value_lengths, header_counts;
    fabric_buf_t keys, values, headers;
    /* OR of the tag bits of every record's "fabric.tags" header (fabric/protocol/tags.py);
     * written into the batch header only when some record had tags. */
    uint32_t tag_bloom;
    int has_tag_bloom;
} fabric_batch_builder_t;

typedef struct fabric_batch_options {
    int codec; /* FABRIC_CODEC_NONE or FABRIC_CODEC_LZ4 */
    int64_t base_offset;    /* producers: 0 */
    int32_t leader_epoch;   /* producers: -1 */
    int64_t producer_id;    /* -1 unless idempotent */
    int16_t producer_epoch; /* -1 */
    int32_t base_sequence;  /* -1 */
    int64_t global_id_base; /* -1 */
    /* 1 (what the producers use): records lz4 would not shrink go uncompressed (codec 0),
     * decided exactly as Python's compress_records(adaptive=True): a 4 KiB probe from the
     * middle of a section of at least 16 KiB first, then the whole frame. 0 by default. */
    int adaptive;
} fabric_batch_options_t;

void fabric_batch_options_init(fabric_batch_options_t *o); /* the producer's defaults, lz4 */
void fabric_batch_builder_init(fabric_batch_builder_t *b);
void fabric_batch_builder_reset(fabric_batch_builder_t *b); /* keeps the buffers' memory */
void fabric_batch_builder_free(fabric_batch_builder_t *b);
/* Uncompressed records-section bytes so far. */
size_t fabric_batch_builder_records_bytes(const fabric_batch_builder_t *b);
/* Bytes one more record would add to the records section. */
size_t fabric_record_bytes(int32_t key_len, int32_t value_len, const fabric_header_t *headers,
                           size_t header_count);
/* INVALID_ARGUMENT when the record cannot go in this batch (timestamp delta outside i32,
 * more than FABRIC_BATCH_RECORDS_MAX records or a u16 of headers) or is malformed (a header
 * name that is not UTF-8 or longer than FABRIC_STRING_BYTES_MAX); MESSAGE_TOO_LARGE
 * when the records section would pass FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX. */
int fabric_batch_builder_add(fabric_batch_builder_t *b, int64_t timestamp_ms, const void *key,
                             int32_t key_len, const void *value, int32_t value_len,
                             const fabric_header_t *headers, size_t header_count);
/* Append the whole batch frame to out. lz4 uses the same frame settings as Python's
 * lz4.frame.compress(records, compression_level=0, store_size=True,
 * content_checksum=False), so both clients make the same bytes. */
int fabric_batch_builder_finish(const fabric_batch_builder_t *b,
                                const fabric_batch_options_t *options, fabric_buf_t *out);

/* A decoded batch. records[i].offset = base_offset + i. For codec none the key, value and
 * header pointers point into the input buffer (keep it alive); for lz4 into a buffer the
 * batch owns. */
typedef struct fabric_batch {
    fabric_batch_header_t header;
    fabric_record_t *records;
    uint32_t record_count;
    fabric_header_t *headers;
    uint8_t *owned_records; /* the decompressed records section, or NULL */
} fabric_batch_t;

/* Decode and check a whole batch: header, batch_length within len, CRC, bounded lz4
 * decompression (content size == records_bytes <= 64 MiB checked before allocating,
 * output exactly records_bytes), columns consuming the section exactly. Errors:
 * CORRUPT_MESSAGE, DECOMPRESSION_LIMIT, UNSUPPORTED_COMPRESSION, NO_MEMORY. */
int fabric_batch_decode(const uint8_t *buf, size_t len, fabric_batch_t **out, char *err,
                        size_t err_len);
void fabric_batch_free(fabric_batch_t *batch);

/* Hex helpers for tests and tools. */
void fabric_hex_encode(const uint8_t *data, size_t len, char *out /* 2*len+1 */);
/* Returns the byte count, or -1 on a bad digit or odd length. */
long fabric_hex_decode(const char *hex, size_t hex_len, uint8_t *out, size_t out_cap);

#ifdef __cplusplus
}
#endif

#endif /* FABRIC_PROTOCOL_H */
