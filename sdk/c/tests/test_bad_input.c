/*
 * test_bad_input: hostile bytes into the decoders must give clean error codes, never a
 * crash, an over-read (run it under valgrind) or a large allocation.
 *
 *   build/test_bad_input [SEED]
 *
 * Covers truncated batches, every single-byte corruption (the CRC must catch it),
 * inconsistent headers, lz4 frames that lie about their size (64 GiB claims, claims that
 * differ from records_bytes, frames that decompress short or long, trailing garbage),
 * broken columns, hostile body frames, offsets and timestamps at the ends of the i64
 * range, and a seeded random mutation run (batches, and every body decoder) whose seed is
 * printed so a failure can be reproduced. `make sanitize-check` runs it under ASan+UBSan.
 */
#define _GNU_SOURCE /* memmem */
#include "../fabric.h"

#include <lz4frame.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures = 0;
static int checks = 0;

#define EXPECT(expr, want, ...)                                                                   \
    do {                                                                                          \
        int got_ = (expr);                                                                        \
        checks++;                                                                                 \
        if (got_ != (want)) {                                                                     \
            fprintf(stderr, "FAIL %s:%d: got %s (%d), want %s: ", __FILE__, __LINE__,             \
                    fabric_err_name(got_), got_, fabric_err_name(want));                          \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

static void put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static void fix_crc(uint8_t *buf, size_t len) { put32(buf + 16, fabric_batch_crc(buf, len)); }

/* decode, free, return the code */
static int decode(const uint8_t *buf, size_t len) {
    fabric_batch_t *b = NULL;
    char err[256];
    int rc = fabric_batch_decode(buf, len, &b, err, sizeof err);
    if (rc == 0 && b == NULL) return -100;
    if (rc != 0 && b != NULL) return -101;
    fabric_batch_free(b);
    return rc;
}

/* A batch of three records with keys, a null value and headers. */
static void make_batch(int codec, fabric_buf_t *out) {
    fabric_batch_builder_t b;
    fabric_batch_builder_init(&b);
    fabric_header_t h[2] = {{"trace", 5, "\x01\x02", 2}, {"empty", 5, NULL, -1}};
    fabric_batch_builder_add(&b, 1700000000000, "key-1", 5, "hello", 5, h, 2);
    fabric_batch_builder_add(&b, 1700000000005, NULL, -1, "world", 5, NULL, 0);
    fabric_batch_builder_add(&b, 1700000000003, "key", 3, NULL, -1, h, 1);
    fabric_batch_options_t o;
    fabric_batch_options_init(&o);
    o.codec = codec;
    fabric_buf_init(out);
    if (fabric_batch_builder_finish(&b, &o, out)) abort();
    fabric_batch_builder_free(&b);
}

/* XXH32, for re-sealing the header checksum of lz4 frames we tamper with. */
static uint32_t rotl(uint32_t x, int r) { return (x << r) | (x >> (32 - r)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint32_t xxh32(const uint8_t *p, size_t len) {
    const uint32_t P1 = 2654435761U, P2 = 2246822519U, P3 = 3266489917U, P4 = 668265263U,
                   P5 = 374761393U;
    const uint8_t *end = p + len;
    uint32_t h;
    if (len >= 16) {
        uint32_t v1 = P1 + P2, v2 = P2, v3 = 0, v4 = 0 - P1;
        while (end - p >= 16) {
            v1 = rotl(v1 + rd32(p) * P2, 13) * P1;
            v2 = rotl(v2 + rd32(p + 4) * P2, 13) * P1;
            v3 = rotl(v3 + rd32(p + 8) * P2, 13) * P1;
            v4 = rotl(v4 + rd32(p + 12) * P2, 13) * P1;
            p += 16;
        }
        h = rotl(v1, 1) + rotl(v2, 7) + rotl(v3, 12) + rotl(v4, 18);
    } else {
        h = P5;
    }
    h += (uint32_t)len;
    while (end - p >= 4) {
        h = rotl(h + rd32(p) * P3, 17) * P4;
        p += 4;
    }
    while (p < end) h = rotl(h + (*p++) * P5, 11) * P1;
    h ^= h >> 15;
    h *= P2;
    h ^= h >> 13;
    h *= P3;
    h ^= h >> 16;
    return h;
}

/* Make a batch whose records section is the lz4 frame of `section` (section_len bytes),
 * with the frame's content-size field set to `claim` and the header's records_bytes to
 * `records_bytes`, the frame header checksum and the batch CRC made valid. */
static size_t lz4_batch(const uint8_t *section, size_t section_len, uint64_t claim,
                        int32_t records_bytes, int32_t record_count, uint8_t *out, size_t cap) {
    LZ4F_preferences_t prefs;
    memset(&prefs, 0, sizeof prefs);
    prefs.frameInfo.contentSize = section_len;
    size_t n = LZ4F_compressFrame(out + FABRIC_BATCH_HEADER_BYTES, cap - FABRIC_BATCH_HEADER_BYTES,
                                  section, section_len, &prefs);
    if (LZ4F_isError(n)) abort();
    uint8_t *frame = out + FABRIC_BATCH_HEADER_BYTES;
    put64(frame + 6, claim);
    frame[14] = (uint8_t)(xxh32(frame + 4, 10) >> 8);
    memset(out, 0, FABRIC_BATCH_HEADER_BYTES);
    size_t len = FABRIC_BATCH_HEADER_BYTES + n;
    put32(out + 8, (uint32_t)len);
    put32(out + 12, 0xFFFFFFFFu);
    out[20] = 1;
    out[21] = FABRIC_CODEC_LZ4;
    put32(out + 24, (uint32_t)record_count);
    put32(out + 68, (uint32_t)records_bytes);
    fix_crc(out, len);
    return len;
}

static void test_truncation_and_crc(void) {
    for (int codec = 0; codec <= 1; codec++) {
        fabric_buf_t good;
        make_batch(codec, &good);
        EXPECT(decode(good.data, good.len), 0, "the good batch (codec %d)", codec);
        for (size_t cut = 0; cut < good.len; cut++)
            EXPECT(decode(good.data, cut), FABRIC_ERR_CORRUPT_MESSAGE, "codec %d cut at %zu", codec, cut);
        /* Every byte the CRC covers, and the CRC itself: any change is refused. */
        uint8_t *copy = malloc(good.len);
        for (size_t i = 16; i < good.len; i++) {
            memcpy(copy, good.data, good.len);
            copy[i] ^= 0x5A;
            int rc = decode(copy, good.len);
            checks++;
            if (rc == 0) {
                fprintf(stderr, "FAIL: codec %d: byte %zu flipped and accepted\n", codec, i);
                failures++;
            }
        }
        /* base_offset and leader_epoch are outside the CRC on purpose (the leader stamps them). */
        memcpy(copy, good.data, good.len);
        put64(copy, 12345);
        put32(copy + 12, 9);
        EXPECT(decode(copy, good.len), 0, "stamped base_offset/leader_epoch");
        /* A frame longer than batch_length is fine for decode (batches are read whole). */
        free(copy);
        fabric_buf_free(&good);
    }
}

static void test_headers_fields(void) {
    fabric_buf_t good;
    make_batch(FABRIC_CODEC_NONE, &good);
    uint8_t *b = malloc(good.len);
#define MUTATE(stmt, want, what)                                                                  \
    do {                                                                                          \
        memcpy(b, good.data, good.len);                                                           \
        stmt;                                                                                     \
        fix_crc(b, good.len);                                                                     \
        EXPECT(decode(b, good.len), want, what);                                                  \
    } while (0)
    MUTATE(b[20] = 2, FABRIC_ERR_CORRUPT_MESSAGE, "batch magic 2");
    MUTATE(b[21] = 5, FABRIC_ERR_UNSUPPORTED_COMPRESSION, "codec 5");
    MUTATE(b[21] = FABRIC_CODEC_LZ4, FABRIC_ERR_CORRUPT_MESSAGE, "codec lz4 on raw columns");
    MUTATE(put32(b + 24, 0), FABRIC_ERR_CORRUPT_MESSAGE, "record_count 0");
    MUTATE(put32(b + 24, 0xFFFFFFFFu), FABRIC_ERR_CORRUPT_MESSAGE, "record_count -1");
    MUTATE(put32(b + 24, 1000001), FABRIC_ERR_CORRUPT_MESSAGE, "record_count above the limit");
    MUTATE(put32(b + 24, 100), FABRIC_ERR_CORRUPT_MESSAGE, "records_bytes < 14 x record_count");
    MUTATE(put32(b + 24, 4), FABRIC_ERR_CORRUPT_MESSAGE, "one record more than the columns");
    MUTATE(put32(b + 68, 0x7FFFFFFF), FABRIC_ERR_DECOMPRESSION_LIMIT, "records_bytes 2 GiB");
    MUTATE(put32(b + 68, (uint32_t)(64 * 1024 * 1024 + 1)), FABRIC_ERR_DECOMPRESSION_LIMIT,
           "records_bytes 64 MiB + 1");
    MUTATE(put32(b + 68, 0xFFFFFFFFu), FABRIC_ERR_CORRUPT_MESSAGE, "records_bytes -1");
    MUTATE(put32(b + 8, (uint32_t)good.len + 1), FABRIC_ERR_CORRUPT_MESSAGE, "batch_length past the buffer");
    MUTATE(put32(b + 8, 10), FABRIC_ERR_CORRUPT_MESSAGE, "batch_length below the header");
    MUTATE(put32(b + 8, 0x80000000u), FABRIC_ERR_CORRUPT_MESSAGE, "batch_length negative");
    /* Columns: record 0's key length (offset 72 + 12) and value length, header counts. */
    size_t kl = FABRIC_BATCH_HEADER_BYTES + 12, vl = FABRIC_BATCH_HEADER_BYTES + 24,
           hc = FABRIC_BATCH_HEADER_BYTES + 36;
    MUTATE(put32(b + kl, 1000), FABRIC_ERR_CORRUPT_MESSAGE, "key length past the section");
    MUTATE(put32(b + kl, 0xFFFFFFFEu), FABRIC_ERR_CORRUPT_MESSAGE, "key length -2");
    MUTATE(put32(b + kl, 0x7FFFFFFF), FABRIC_ERR_CORRUPT_MESSAGE, "key length 2^31-1");
    MUTATE(put32(b + vl, 0x80000000u), FABRIC_ERR_CORRUPT_MESSAGE, "value length INT32_MIN");
    MUTATE(put32(b + kl, 4), FABRIC_ERR_CORRUPT_MESSAGE, "a key one byte short: trailing bytes");
    MUTATE((b[hc] = 0xFF, b[hc + 1] = 0xFF), FABRIC_ERR_CORRUPT_MESSAGE, "65535 headers");
    MUTATE(b[hc] = 0, FABRIC_ERR_CORRUPT_MESSAGE, "headers left over: trailing bytes");
    /* The first header name "trace": make it invalid UTF-8. */
    {
        const uint8_t *name = memmem(good.data, good.len, "trace", 5);
        if (name) {
            size_t at = (size_t)(name - good.data);
            MUTATE(b[at] = 0xFF, FABRIC_ERR_CORRUPT_MESSAGE, "header name not UTF-8");
            MUTATE(put32(b + at + 5, 0x7FFFFFF0u), FABRIC_ERR_CORRUPT_MESSAGE, "header value length huge");
            MUTATE((b[at - 2] = 0xFF, b[at - 1] = 0xFF), FABRIC_ERR_CORRUPT_MESSAGE, "header name length huge");
        } else {
            failures++;
        }
    }
    /* validate() on the produce path: sizes first, then CRC. */
    char err[256];
    EXPECT(fabric_batch_validate(good.data, good.len, (int32_t)good.len - 1, NULL, err, sizeof err),
           FABRIC_ERR_MESSAGE_TOO_LARGE, "above message_bytes_max");
    EXPECT(fabric_batch_validate(good.data, good.len, 1 << 20, NULL, err, sizeof err), 0, "valid");
    memcpy(b, good.data, good.len);
    b[good.len - 1] ^= 1;
    EXPECT(fabric_batch_validate(b, good.len, 1 << 20, NULL, err, sizeof err),
           FABRIC_ERR_CORRUPT_MESSAGE, "validate: CRC mismatch");
    free(b);
    fabric_buf_free(&good);
#undef MUTATE
}

static void test_lz4_lies(void) {
    enum { CAP = 16 << 20 }; /* LZ4F_compressFrame wants room for its worst-case bound */
    uint8_t *out = malloc(CAP);
    /* A real records section: one record, 10-byte value, no key, no headers. */
    uint8_t section[14 + 10];
    memset(section, 0, sizeof section);
    put32(section + 4, 0xFFFFFFFFu); /* key length -1 */
    put32(section + 8, 10);           /* value length */
    memcpy(section + 14, "0123456789", 10);
    size_t len = lz4_batch(section, sizeof section, sizeof section, sizeof section, 1, out, CAP);
    EXPECT(decode(out, len), 0, "an honest lz4 batch (checks the XXH32 re-sealing)");

    /* The bomb: a frame that claims 64 GiB. Refused before any allocation. */
    len = lz4_batch(section, sizeof section, 64ULL << 30, sizeof section, 1, out, CAP);
    EXPECT(decode(out, len), FABRIC_ERR_DECOMPRESSION_LIMIT, "frame claims 64 GiB");
    /* ...with records_bytes also claiming something huge. */
    len = lz4_batch(section, sizeof section, 64ULL << 30, 0x7FFFFFFF, 1, out, CAP);
    EXPECT(decode(out, len), FABRIC_ERR_DECOMPRESSION_LIMIT, "frame and header claim 2 GiB");
    /* Claim differs from records_bytes. */
    len = lz4_batch(section, sizeof section, sizeof section + 1, sizeof section, 1, out, CAP);
    EXPECT(decode(out, len), FABRIC_ERR_DECOMPRESSION_LIMIT, "claim = records_bytes + 1");
    /* Claim == records_bytes == 1 MiB, but the blocks hold 24 bytes: allocation is 1 MiB
     * (records_bytes, within the limit), and the short output is refused. */
    len = lz4_batch(section, sizeof section, 1 << 20, 1 << 20, 1, out, CAP);
    EXPECT(decode(out, len), FABRIC_ERR_CORRUPT_MESSAGE, "frame decompresses short");
    /* Claim == records_bytes smaller than the data: output bounded, refused. */
    len = lz4_batch(section, sizeof section, 20, 20, 1, out, CAP);
    EXPECT(decode(out, len), FABRIC_ERR_CORRUPT_MESSAGE, "frame decompresses long");
    /* No content size at all. */
    len = lz4_batch(section, sizeof section, sizeof section, sizeof section, 1, out, CAP);
    out[FABRIC_BATCH_HEADER_BYTES + 4] &= (uint8_t)~0x08;
    fix_crc(out, len);
    EXPECT(decode(out, len), FABRIC_ERR_DECOMPRESSION_LIMIT, "no content size field");
    /* Not an lz4 frame. */
    len = lz4_batch(section, sizeof section, sizeof section, sizeof section, 1, out, CAP);
    out[FABRIC_BATCH_HEADER_BYTES] = 0;
    fix_crc(out, len);
    EXPECT(decode(out, len), FABRIC_ERR_CORRUPT_MESSAGE, "bad lz4 magic");
    /* Truncated frame (the batch CRC made valid again). */
    len = lz4_batch(section, sizeof section, sizeof section, sizeof section, 1, out, CAP);
    for (size_t cut = FABRIC_BATCH_HEADER_BYTES; cut < len; cut++) {
        put32(out + 8, (uint32_t)cut);
        fix_crc(out, cut);
        int rc = decode(out, cut);
        checks++;
        if (rc != FABRIC_ERR_CORRUPT_MESSAGE && rc != FABRIC_ERR_DECOMPRESSION_LIMIT) {
            fprintf(stderr, "FAIL: lz4 frame cut at %zu: %s\n", cut, fabric_err_name(rc));
            failures++;
        }
    }
    /* Trailing garbage after the frame. */
    len = lz4_batch(section, sizeof section, sizeof section, sizeof section, 1, out, CAP);
    memcpy(out + len, "junk", 4);
    put32(out + 8, (uint32_t)len + 4);
    fix_crc(out, len + 4);
    EXPECT(decode(out, len + 4), FABRIC_ERR_CORRUPT_MESSAGE, "bytes after the lz4 frame");

    /* A real compression bomb within the limit is decoded into exactly records_bytes:
     * 8 MiB of zeros (one record, 8 MiB - 14 byte value) from a frame of ~32 KiB. */
    size_t big = 8u << 20;
    uint8_t *zeros = calloc(1, big);
    put32(zeros + 4, 0xFFFFFFFFu);
    put32(zeros + 8, (uint32_t)(big - 14));
    len = lz4_batch(zeros, big, big, (int32_t)big, 1, out, CAP);
    EXPECT(decode(out, len), 0, "8 MiB of zeros from %zu bytes", len);
    /* ...and the same frame claiming the 64 MiB + 1 it cannot have is refused. */
    len = lz4_batch(zeros, big, (64u << 20) + 1, (64 << 20) + 1, 1, out, CAP);
    EXPECT(decode(out, len), FABRIC_ERR_DECOMPRESSION_LIMIT, "claim 64 MiB + 1");
    free(zeros);
    free(out);
}

static void test_bodies_and_headers(void) {
    char err[256];
    fabric_arena_t arena;
    fabric_metadata_response_t m;
    uint8_t frame[64];
    memset(frame, 0, sizeof frame);
    /* controller_id, then nodes count 0xFFFFFFFF */
    put32(frame + 4, 0xFFFFFFFFu);
    fabric_arena_init(&arena);
    EXPECT(fabric_metadata_response_decode(frame, 8, &arena, &m, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "array count 2^32-1");
    fabric_arena_free(&arena);
    /* one million nodes in a 40-byte frame: refused before allocating */
    put32(frame + 4, 1000000);
    fabric_arena_init(&arena);
    EXPECT(fabric_metadata_response_decode(frame, 40, &arena, &m, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "1e6 items in 36 bytes");
    checks++;
    if (arena.bytes > 4096) {
        fprintf(stderr, "FAIL: arena grew to %zu bytes for a 40-byte frame\n", arena.bytes);
        failures++;
    }
    fabric_arena_free(&arena);
    /* invalid UTF-8 in a string: error body "\xc3\x28" */
    uint8_t bad_utf8[] = {2, 0, 0xC3, 0x28};
    fabric_error_body_t eb;
    fabric_arena_init(&arena);
    EXPECT(fabric_error_body_decode(bad_utf8, sizeof bad_utf8, &arena, &eb, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "invalid UTF-8");
    fabric_arena_free(&arena);
    uint8_t surrogate[] = {3, 0, 0xED, 0xA0, 0x80};
    fabric_arena_init(&arena);
    EXPECT(fabric_error_body_decode(surrogate, sizeof surrogate, &arena, &eb, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "UTF-8 surrogate");
    fabric_arena_free(&arena);
    uint8_t trailing[] = {1, 0, 'x', 0};
    fabric_arena_init(&arena);
    EXPECT(fabric_error_body_decode(trailing, sizeof trailing, &arena, &eb, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "trailing byte");
    fabric_arena_free(&arena);
    uint8_t long_str[] = {0xFF, 0xFF, 'x'};
    fabric_arena_init(&arena);
    EXPECT(fabric_error_body_decode(long_str, sizeof long_str, &arena, &eb, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "string length past the frame");
    fabric_arena_free(&arena);
    fabric_arena_init(&arena);
    EXPECT(fabric_error_body_decode(NULL, 0, &arena, &eb, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "empty frame");
    fabric_arena_free(&arena);

    /* Header frames. */
    fabric_frame_header_t h = {1, 0, 2, 0, 0, 7}, out;
    uint8_t hb[FABRIC_HEADER_BYTES + 1];
    fabric_header_encode(&h, hb);
    EXPECT(fabric_header_decode(hb, FABRIC_HEADER_BYTES, &out, err, sizeof err), 0, "good header");
    EXPECT(fabric_header_decode(hb, FABRIC_HEADER_BYTES - 1, &out, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "short header");
    EXPECT(fabric_header_decode(hb, FABRIC_HEADER_BYTES + 1, &out, err, sizeof err),
           FABRIC_ERR_MALFORMED_REQUEST, "long header");
    EXPECT(fabric_header_decode(hb, 2, &out, err, sizeof err), FABRIC_ERR_MALFORMED_REQUEST,
           "2-byte header");
    hb[4] = 2;
    EXPECT(fabric_header_decode(hb, FABRIC_HEADER_BYTES, &out, err, sizeof err),
           FABRIC_ERR_UNSUPPORTED_VERSION, "protocol version 2");
    hb[0] = 'X';
    EXPECT(fabric_header_decode(hb, FABRIC_HEADER_BYTES, &out, err, sizeof err),
           FABRIC_ERR_INVALID_MAGIC, "bad magic");
    EXPECT(fabric_header_decode(hb, 7, &out, err, sizeof err), FABRIC_ERR_INVALID_MAGIC,
           "bad magic wins over length");
}

/* Offsets and timestamps at the ends of the i64 range. base_offset (outside the CRC, the
 * leader stamps it) + record index and first_timestamp + delta overflowed in the decoder
 * (UBSan: signed integer overflow): such batches are refused, the last representable
 * ones still decode. */
static void test_i64_ends(void) {
    fabric_buf_t good;
    make_batch(FABRIC_CODEC_NONE, &good); /* 3 records, timestamp deltas 0, +5, +3 */
    uint8_t *b = malloc(good.len);
    fabric_batch_t *batch = NULL;
    char err[256];
    memcpy(b, good.data, good.len);
    put64(b, (uint64_t)INT64_MAX);
    EXPECT(decode(b, good.len), FABRIC_ERR_CORRUPT_MESSAGE, "base_offset 2^63-1");
    put64(b, (uint64_t)(INT64_MAX - 2));
    EXPECT(decode(b, good.len), FABRIC_ERR_CORRUPT_MESSAGE, "next offset 2^63");
    put64(b, (uint64_t)(INT64_MAX - 3)); /* offsets up to 2^63-2, the next one 2^63-1 */
    EXPECT(fabric_batch_decode(b, good.len, &batch, err, sizeof err), 0, "base_offset 2^63-4: %s", err);
    if (batch) EXPECT(batch->records[2].offset == INT64_MAX - 1, 1, "last offset 2^63-2");
    fabric_batch_free(batch);

    /* Timestamps: the CRC covers them, so re-seal after each change. */
    memcpy(b, good.data, good.len);
    put64(b + 28, (uint64_t)INT64_MAX);
    fix_crc(b, good.len);
    EXPECT(decode(b, good.len), FABRIC_ERR_CORRUPT_MESSAGE, "first_timestamp 2^63-1, delta +5");
    put64(b + 28, (uint64_t)(INT64_MAX - 5));
    fix_crc(b, good.len);
    EXPECT(decode(b, good.len), 0, "first_timestamp 2^63-6, largest timestamp 2^63-1");
    put32(b + FABRIC_BATCH_HEADER_BYTES + 4, (uint32_t)-1); /* record 1's delta: -1 */
    put64(b + 28, (uint64_t)INT64_MIN);
    fix_crc(b, good.len);
    EXPECT(decode(b, good.len), FABRIC_ERR_CORRUPT_MESSAGE, "first_timestamp -2^63, delta -1");
    put64(b + 28, (uint64_t)(INT64_MIN + 1));
    fix_crc(b, good.len);
    EXPECT(decode(b, good.len), 0, "first_timestamp -2^63+1, delta -1");
    free(b);
    fabric_buf_free(&good);

    /* The builder: the delta check subtracted first (overflow for timestamps far apart). */
    fabric_batch_builder_t builder;
    fabric_batch_builder_init(&builder);
    EXPECT(fabric_batch_builder_add(&builder, INT64_MIN, NULL, -1, "a", 1, NULL, 0), 0, "ts -2^63");
    EXPECT(fabric_batch_builder_add(&builder, INT64_MAX, NULL, -1, "b", 1, NULL, 0),
           FABRIC_ERR_INVALID_ARGUMENT, "ts 2^63-1 after -2^63");
    EXPECT(fabric_batch_builder_add(&builder, INT64_MIN + INT32_MAX, NULL, -1, "c", 1, NULL, 0), 0,
           "delta INT32_MAX");
    EXPECT(fabric_batch_builder_add(&builder, INT64_MIN + INT32_MAX + 1LL, NULL, -1, "d", 1, NULL, 0),
           FABRIC_ERR_INVALID_ARGUMENT, "delta INT32_MAX + 1");
    fabric_batch_builder_reset(&builder);
    EXPECT(fabric_batch_builder_add(&builder, INT64_MAX, NULL, -1, "e", 1, NULL, 0), 0, "ts 2^63-1");
    EXPECT(fabric_batch_builder_add(&builder, INT64_MIN, NULL, -1, "f", 1, NULL, 0),
           FABRIC_ERR_INVALID_ARGUMENT, "ts -2^63 after 2^63-1");
    EXPECT(fabric_batch_builder_add(&builder, INT64_MAX + (int64_t)INT32_MIN, NULL, -1, "g", 1, NULL, 0),
           0, "delta INT32_MIN");
    EXPECT(fabric_batch_builder_add(&builder, INT64_MAX + (int64_t)INT32_MIN - 1, NULL, -1, "h", 1, NULL, 0),
           FABRIC_ERR_INVALID_ARGUMENT, "delta INT32_MIN - 1");
    fabric_batch_builder_free(&builder);
}

/* Every body decoder, behind one signature for the random run. */
#define ANY_DECODER(name)                                                                         \
    static int decode_any_##name(const uint8_t *frame, size_t len, fabric_arena_t *arena) {      \
        fabric_##name##_t out;                                                                    \
        return fabric_##name##_decode(frame, len, arena, &out, NULL, 0);                         \
    }
ANY_DECODER(metadata_request)
ANY_DECODER(metadata_response)
ANY_DECODER(produce_request)
ANY_DECODER(produce_response)
ANY_DECODER(fetch_request)
ANY_DECODER(fetch_response)
ANY_DECODER(list_offsets_request)
ANY_DECODER(list_offsets_response)
ANY_DECODER(create_topic_request)
ANY_DECODER(result_response)
ANY_DECODER(error_body)
ANY_DECODER(allocate_ids_request)
ANY_DECODER(allocate_ids_response)
#undef ANY_DECODER

static int (*const BODY_DECODERS[])(const uint8_t *, size_t, fabric_arena_t *) = {
    decode_any_metadata_request,     decode_any_metadata_response,  decode_any_produce_request,
    decode_any_produce_response,     decode_any_fetch_request,      decode_any_fetch_response,
    decode_any_list_offsets_request, decode_any_list_offsets_response,
    decode_any_create_topic_request, decode_any_result_response,    decode_any_error_body,
    decode_any_allocate_ids_request, decode_any_allocate_ids_response,
};
#define BODY_DECODER_COUNT (sizeof BODY_DECODERS / sizeof BODY_DECODERS[0])

/* One good encoding of each body, with strings, arrays and multi-byte UTF-8. */
static void make_bodies(fabric_buf_t *bodies) {
    for (size_t i = 0; i < BODY_DECODER_COUNT; i++) fabric_buf_init(&bodies[i]);
    fabric_str_t topics[2] = {fabric_str("events"), fabric_str("t\xc3\xa9")};
    fabric_metadata_request_t mreq = {topics, 2};
    fabric_metadata_request_encode(&mreq, &bodies[0]);
    int32_t replicas[3] = {1, 2, 3};
    fabric_partition_state_t parts[2] = {{0, 0, 1, 4, replicas, 3, replicas, 2},
                                         {1, 6, -1, 2, replicas, 1, NULL, 0}};
    fabric_metadata_node_t nodes[2] = {{1, fabric_str("tcp://127.0.0.1:9092")},
                                       {2, fabric_str("tcp://h:1")}};
    fabric_metadata_topic_t mtopics[1] = {{0, fabric_str("events"), 1, 1 << 20, parts, 2}};
    fabric_metadata_response_t mresp = {1, nodes, 2, mtopics, 1};
    fabric_metadata_response_encode(&mresp, &bodies[1]);
    fabric_topic_partition_t entries[2] = {{fabric_str("events"), 0}, {fabric_str("x"), 7}};
    fabric_produce_request_t preq = {-1, 30000, entries, 2};
    fabric_produce_request_encode(&preq, &bodies[2]);
    fabric_produce_result_t results[2] = {{fabric_str("events"), 0, 0, 42, 0, fabric_str("")},
                                          {fabric_str("x"), 7, 8, -1, -1, fabric_str("not leader")}};
    fabric_produce_response_t presp = {results, 2};
    fabric_produce_response_encode(&presp, &bodies[3]);
    fabric_fetch_partition_t fparts[2] = {{fabric_str("events"), 0, 5, 1 << 20, -1},
                                          {fabric_str("x"), 3, 0, 100, 2}};
    fabric_fetch_request_t freq = {-1, 500, 1, 1 << 24, fparts, 2};
    fabric_fetch_request_encode(&freq, &bodies[4]);
    fabric_fetch_partition_result_t fres[2] = {{fabric_str("events"), 0, 0, 100, 0, 100, 2},
                                               {fabric_str("x"), 3, 1, -1, -1, -1, 0}};
    fabric_fetch_response_t fresp = {fres, 2};
    fabric_fetch_response_encode(&fresp, &bodies[5]);
    fabric_list_offsets_partition_t lparts[2] = {{fabric_str("events"), 0, -2}, {fabric_str("x"), 1, -1}};
    fabric_list_offsets_request_t lreq = {lparts, 2};
    fabric_list_offsets_request_encode(&lreq, &bodies[6]);
    fabric_list_offsets_result_t lres[2] = {{fabric_str("events"), 0, 0, -1, 17}, {fabric_str("x"), 1, 3, -1, -1}};
    fabric_list_offsets_response_t lresp = {lres, 2};
    fabric_list_offsets_response_encode(&lresp, &bodies[7]);
    fabric_config_entry_t configs[2] = {{fabric_str("retention_ms"), fabric_str("1000")},
                                        {fabric_str("k"), fabric_str("")}};
    fabric_create_topic_request_t creq = {fabric_str("events"), 3, 2, configs, 2};
    fabric_create_topic_request_encode(&creq, &bodies[8]);
    fabric_result_response_t rres = {36, fabric_str("topic exists")};
    fabric_result_response_encode(&rres, &bodies[9]);
    fabric_error_body_t eb = {fabric_str("not the leader \xe2\x9c\x93")};
    fabric_error_body_encode(&eb, &bodies[10]);
    fabric_allocate_ids_request_t areq = {1000, 0};
    fabric_allocate_ids_request_encode(&areq, &bodies[11]);
    fabric_allocate_ids_response_t aresp = {3, 1 << 20, 1000, 1 << 21};
    fabric_allocate_ids_response_encode(&aresp, &bodies[12]);
    for (size_t i = 0; i < BODY_DECODER_COUNT; i++)
        if (bodies[i].err) abort();
}

/* Seeded random mutations of every good body, fed to every body decoder (a mutated
 * metadata response is also a hostile produce response): clean codes only, and decoding
 * the unmutated bodies must succeed. */
static void test_random_bodies(unsigned seed, int rounds) {
    srand(seed ^ 0x5eedu);
    fabric_buf_t bodies[BODY_DECODER_COUNT];
    make_bodies(bodies);
    uint8_t buf[1024];
    for (size_t i = 0; i < BODY_DECODER_COUNT; i++) {
        fabric_arena_t arena;
        fabric_arena_init(&arena);
        EXPECT(BODY_DECODERS[i](bodies[i].data, bodies[i].len, &arena), 0, "good body %zu", i);
        fabric_arena_free(&arena);
    }
    for (int round = 0; round < rounds; round++) {
        const fabric_buf_t *g = &bodies[(size_t)rand() % BODY_DECODER_COUNT];
        size_t len = g->len;
        if (len > sizeof buf) abort();
        memcpy(buf, g->data, len);
        int edits = rand() % 4;
        for (int e = 0; e < edits; e++) buf[(size_t)rand() % len] = (uint8_t)rand();
        if (rand() % 4 == 0) len = (size_t)rand() % (len + 1);
        /* Copied to an exact-size allocation, so that ASan sees a read one byte past it. */
        uint8_t *frame = malloc(len ? len : 1);
        memcpy(frame, buf, len);
        for (size_t d = 0; d < BODY_DECODER_COUNT; d++) {
            fabric_arena_t arena;
            fabric_arena_init(&arena);
            int rc = BODY_DECODERS[d](frame, len, &arena);
            checks++;
            if (rc != 0 && rc != FABRIC_ERR_MALFORMED_REQUEST && rc != FABRIC_ERR_NO_MEMORY) {
                fprintf(stderr, "FAIL: random body round %d, decoder %zu: %s (seed=%u)\n", round, d,
                        fabric_err_name(rc), seed);
                failures++;
            }
            fabric_arena_free(&arena);
        }
        free(frame);
    }
    for (size_t i = 0; i < BODY_DECODER_COUNT; i++) fabric_buf_free(&bodies[i]);
}

/* Seeded random mutations of good batches and bodies: only clean errors (or success). */
static void test_random(unsigned seed, int rounds) {
    srand(seed);
    fabric_buf_t batches[2];
    make_batch(FABRIC_CODEC_NONE, &batches[0]);
    make_batch(FABRIC_CODEC_LZ4, &batches[1]);
    uint8_t buf[4096];
    for (int i = 0; i < rounds; i++) {
        fabric_buf_t *g = &batches[i & 1];
        size_t len = g->len;
        memcpy(buf, g->data, len);
        int edits = 1 + rand() % 4;
        for (int e = 0; e < edits; e++) buf[(size_t)rand() % len] = (uint8_t)rand();
        if (rand() % 4 == 0) len = (size_t)rand() % (len + 1);
        if (rand() % 2) fix_crc(buf, len < 72 ? 72 : len); /* get past the CRC sometimes */
        /* Decoded from an exact-size allocation: in buf a read past len stays inside the
         * array, where ASan and valgrind cannot see it. */
        uint8_t *frame = malloc(len ? len : 1);
        memcpy(frame, buf, len);
        int rc = decode(frame, len);
        if (rc < -99) {
            fprintf(stderr, "FAIL: random round %d: inconsistent result (seed=%u)\n", i, seed);
            failures++;
        }
        fabric_arena_t arena;
        fabric_arena_init(&arena);
        fabric_metadata_response_t m;
        (void)fabric_metadata_response_decode(frame, len, &arena, &m, NULL, 0);
        fabric_arena_free(&arena);
        free(frame);
        checks++;
    }
    fabric_buf_free(&batches[0]);
    fabric_buf_free(&batches[1]);
}

/* A record's "fabric.tags" header puts the batch's tag bloom in the header, with the values
 * Python's fabric.protocol.tags.bloom_of gives: paid -> 0x03000000, eu+paid -> 0x03004020. */
static void test_tag_bloom(void) {
    fabric_batch_builder_t b;
    fabric_batch_builder_init(&b);
    fabric_batch_options_t o;
    fabric_batch_options_init(&o);
    fabric_header_t paid = {"fabric.tags", 11, "paid", 4};
    fabric_header_t eu_paid = {"fabric.tags", 11, "eu,paid", 7};
    fabric_header_t other = {"trace", 5, "eu", 2};
    fabric_buf_t out = {0};
    EXPECT(fabric_batch_builder_add(&b, 1, NULL, -1, "a", 1, NULL, 0), 0, "untagged record");
    EXPECT(fabric_batch_builder_add(&b, 1, NULL, -1, "b", 1, &paid, 1), 0, "tagged record");
    EXPECT(fabric_batch_builder_finish(&b, &o, &out), 0, "finish");
    uint32_t bloom = (uint32_t)out.data[22] | (uint32_t)out.data[23] << 8 |
                     (uint32_t)out.data[54] << 16 | (uint32_t)out.data[55] << 24;
    EXPECT((out.data[21] & FABRIC_BATCH_TAG_BLOOM) != 0, 1, "bloom attribute bit");
    EXPECT(bloom == 0x03000000u, 1, "bloom of paid: %08x", bloom);
    fabric_batch_t *batch = NULL;
    char err[256] = "";
    EXPECT(fabric_batch_decode(out.data, out.len, &batch, err, sizeof err), 0, "decodes: %s", err);
    fabric_batch_free(batch);
    fabric_batch_builder_reset(&b);
    out.len = 0;
    EXPECT(fabric_batch_builder_add(&b, 1, NULL, -1, "c", 1, &other, 1), 0, "no tags header");
    EXPECT(fabric_batch_builder_finish(&b, &o, &out), 0, "finish");
    EXPECT(out.data[21] & FABRIC_BATCH_TAG_BLOOM, 0, "no bloom without tags");
    fabric_batch_builder_reset(&b);
    out.len = 0;
    EXPECT(fabric_batch_builder_add(&b, 1, NULL, -1, "d", 1, &eu_paid, 1), 0, "two tags");
    EXPECT(fabric_batch_builder_finish(&b, &o, &out), 0, "finish");
    bloom = (uint32_t)out.data[22] | (uint32_t)out.data[23] << 8 | (uint32_t)out.data[54] << 16 |
            (uint32_t)out.data[55] << 24;
    EXPECT(bloom == 0x03004020u, 1, "bloom of eu,paid: %08x", bloom);
    fabric_buf_free(&out);
    fabric_batch_builder_free(&b);
}

int main(int argc, char **argv) {
    unsigned seed = argc > 1 ? (unsigned)strtoul(argv[1], NULL, 10) : (unsigned)time(NULL);
    int rounds = argc > 2 ? atoi(argv[2]) : 20000;
    test_truncation_and_crc();
    test_headers_fields();
    test_lz4_lies();
    test_bodies_and_headers();
    test_tag_bloom();
    test_i64_ends();
    test_random(seed, rounds);
    test_random_bodies(seed, rounds);
    if (failures) {
        fprintf(stderr, "%d of %d checks failed; reproduce with: test_bad_input %u %d\n", failures,
                checks, seed, rounds);
        return 1;
    }
    printf("ok: %d bad-input checks passed (random seed=%u, rounds=%d)\n", checks, seed, rounds);
    return 0;
}
