/*
 * codec.c: the pure half of the client. Error table, key hash, buffers, the header frame,
 * every body schema, and record batches. No socket, no clock, no thread.
 *
 * All integers are read and written byte by byte as little-endian, so the code is right
 * on any host byte order and never makes an unaligned access.
 */
#include "../fabric.h"

#include <lz4frame.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* ---- Error table ------------------------------------------------------------------------ */
typedef struct {
    int code;
    const char *name;
    int retriable;
    const char *meaning;
} error_row_t;

/* Wire rows copied from docs/PROTOCOL.md section 7 (tests/interop checks they agree). */
static const error_row_t ERROR_ROWS[] = {
    {0, "NONE", 0, "no error"},
    {1, "UNKNOWN_SERVER_ERROR", 0, "the node failed in a way it could not classify"},
    {2, "CORRUPT_MESSAGE", 0, "record-batch CRC mismatch or inconsistent batch header"},
    {3, "MALFORMED_REQUEST", 0, "truncated or extra frames, bad lengths or bad strings"},
    {4, "UNSUPPORTED_VERSION", 0, "protocol or API version not supported by the receiver"},
    {5, "UNKNOWN_API", 0, "API key not known to the receiver"},
    {6, "INVALID_MAGIC", 0, "the header frame does not start with the magic FBR1"},
    {7, "UNKNOWN_TOPIC_OR_PARTITION", 0, "no such topic or partition"},
    {8, "NOT_LEADER", 1, "this node does not lead the partition; refresh the routing map"},
    {9, "LEADER_NOT_AVAILABLE", 1, "the partition has no leader right now"},
    {10, "OFFSET_OUT_OF_RANGE", 0, "offset below the log start or above the log end"},
    {11, "MESSAGE_TOO_LARGE", 0, "batch larger than the topic's message_bytes_max"},
    {12, "DECOMPRESSION_LIMIT", 0, "compressed frame claims a size above the limit or header"},
    {13, "REQUEST_TIMED_OUT", 1,
     "the request did not complete within its timeout (a PRODUCE batch answered so was "
     "written and may yet be committed: section 5.2)"},
    {14, "NOT_ENOUGH_REPLICAS", 1, "fewer in-sync replicas than min_insync; nothing written"},
    {15, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", 1,
     "written by the leader but ISR shrank below min_insync"},
    {16, "FENCED_LEADER_EPOCH", 1, "the request's leader epoch is older than the node's"},
    {17, "UNKNOWN_LEADER_EPOCH", 1, "the request's leader epoch is newer than the node's"},
    {18, "TOPIC_ALREADY_EXISTS", 0, "a topic with that name exists"},
    {19, "INVALID_TOPIC", 0,
     "topic name empty, too long, . or .., or with characters outside [A-Za-z0-9._-]; or an "
     "internal topic a client may not write (section 5.2)"},
    {20, "INVALID_PARTITIONS", 0, "partition count out of range"},
    {21, "INVALID_REPLICATION_FACTOR", 0,
     "replication factor above the live node count or out of range"},
    {22, "INVALID_CONFIG", 0, "unknown topic config key or bad value"},
    {23, "INVALID_REQUEST", 0, "well-formed request with values that make no sense (acks=7)"},
    {24, "UNSUPPORTED_COMPRESSION", 0, "compression codec not supported"},
    {25, "NODE_NOT_READY", 1, "the node is starting or stopping"},
    {26, "STORAGE_ERROR", 1, "the storage engine failed a read or write"},
    {27, "NOT_CONTROLLER", 1, "this node is not the controller"},
    {28, "OUT_OF_ORDER_SEQUENCE", 0, "idempotent producer sequence gap"},
    {29, "INVALID_PRODUCER_EPOCH", 0, "a newer producer with the same id fenced this one"},
    /* 40-49: the sequencer and strict-order topics */
    {40, "NOT_ACTIVE_SEQUENCER", 1, "this sequencer is standing by or was deposed; find the active one in ZooKeeper"},
    {41, "SEQUENCER_NOT_AVAILABLE", 1, "no active sequencer granted global IDs in time; nothing written"},
    {42, "INVALID_GLOBAL_ID", 0, "a producer set global_id_base (on any topic); only a strict-order topic's leader stamps it"},
    {43, "STALE_SEQUENCER_EPOCH", 1, "a grant from a sequencer epoch older than one already seen; refused"},
    {44, "GLOBAL_ID_REGRESSION", 1, "a grant at or below the last global ID of the partition; refused"},
    {45, "INVALID_ID_COUNT", 0, "an ID request for a count outside 0..SEQUENCER_GRANT_IDS_MAX or an unknown kind"},
    /* 50-59: the direct plane (docs/PROTOCOL.md section 10) */
    {50, "NO_SERVICE_AVAILABLE", 0, "no live instance of the service is registered or reachable"},
    {51, "REQUEST_TIMEOUT", 0, "no reply within timeout_ms; the handler may or may not have run"},
    {52, "REMOTE_ERROR", 0, "the service's handler raised; remote_type and remote_message say what"},
    {53, "SERVICE_OVERLOADED", 1, "the instance's request queue is full; the handler did not run"},
    {54, "SERVICE_STOPPING", 1, "the instance is draining before it stops; the handler did not run"},
    /* 60-69: consumer groups */
    {60, "UNKNOWN_MEMBER_ID", 0, "the group coordinator does not know this member; rejoin"},
    {61, "FENCED_MEMBER_EPOCH", 0, "the member epoch is not the current one; the member must treat its partitions as lost and rejoin"},
    {62, "GROUP_NOT_EMPTY", 0, "the group has live members; stop them first"},
    {63, "NOT_COORDINATOR", 1, "this node does not coordinate that group; find the coordinator again"},
    {64, "COORDINATOR_NOT_AVAILABLE", 1, "the group's coordinator partition has no leader right now"},
    {65, "COORDINATOR_LOAD_IN_PROGRESS", 1, "the coordinator is still reading the group's state"},
    {66, "INVALID_GROUP_ID", 0, "group id empty, too long or with characters outside [A-Za-z0-9._-]"},
    {67, "GROUP_ID_NOT_FOUND", 0, "no such group"},
    {68, "UNRELEASED_INSTANCE_ID", 0, "reserved: not sent by this version's nodes (a join with an instance id in use takes it over; the older member gets FENCED_INSTANCE_ID)"},
    {69, "GROUP_MAX_SIZE_REACHED", 0, "the group already has GROUP_MEMBERS_MAX members (a queue partition: QUEUE_GROUPS_MAX groups)"},
    {70, "INVALID_VISIBILITY_TIMEOUT", 0, "visibility/extend out of range: 0 < ms <= VISIBILITY_TIMEOUT_MS_MAX (12 h)"},
    {71, "LEASE_NOT_HELD", 0, "the message is not leased to this consumer (lease expired, acked or redelivered)"},
    {72, "QUEUE_FULL", 1, "the queue is at max_messages or max_bytes; retry once workers catch up"},
    {73, "INVALID_QUEUE_CONFIG", 0, "a queue setting is out of its documented bounds"},
    {74, "INVALID_DELAY", 0, "delay_ms or a nack's delay outside 0..DELAY_MS_MAX (7 days), deliver_at_ms negative or more than 7 days ahead, or both set"},
    {75, "INVALID_PRIORITY", 0, "priority outside PRIORITY_MIN..PRIORITY_MAX (0..9)"},
    {76, "INVALID_RECEIVE_WAIT", 0, "receive wait_ms outside 0..RECEIVE_WAIT_MS_MAX (20 s)"},
    {77, "ALREADY_SETTLED", 0, "the message is already finished in this group (acknowledged, purged, dead-lettered or "
                               "dropped): it is not delivered to the group again (an ack of an acknowledged or purged "
                               "one is not refused)"},
    {80, "AUTHORIZATION_FAILED", 0, "the principal may not perform that operation on that resource"},
    {81, "AUTHENTICATION_FAILED", 0, "the peer's CURVE key is not registered, or the server key is wrong"},
    {82, "THROTTLED", 1, "nothing was written, retry later: over its produce quota with the node's throttle queue full, "
                         "or a PRODUCE batch past the request's lz4 budget (section 4.5, step 7)"},
    {90, "REASSIGNMENT_IN_PROGRESS", 0, "the partition is already moving to other replicas; wait for it to finish"},
    /* consumer groups again (60-69 is full) */
    {91, "FENCED_INSTANCE_ID", 0, "another consumer joined the group with this member's instance id; this one is fenced for good: it must stop, not rejoin"},
    {-1, "INVALID_ARGUMENT", 0, "an argument is out of range (client-side)"},
    {-2, "NO_MEMORY", 0, "out of memory or a buffer limit reached (client-side)"},
    {-3, "TRANSPORT", 0, "a ZeroMQ call failed (client-side)"},
    {-4, "NO_NODES", 1, "no bootstrap or known node answered (client-side)"},
    {-5, "DELIVERY_TIMEOUT", 0, "not acknowledged within delivery_timeout_ms (client-side)"},
    {-6, "BUFFER_FULL", 0, "the producer buffer stayed full for max_block_ms (client-side)"},
    {-7, "CLOSED", 0, "the producer was destroyed before the record was acknowledged"},
};

static const error_row_t *error_row(int code) {
    for (size_t i = 0; i < sizeof ERROR_ROWS / sizeof ERROR_ROWS[0]; i++) {
        if (ERROR_ROWS[i].code == code) return &ERROR_ROWS[i];
    }
    return NULL;
}

const char *fabric_err_name(int code) {
    const error_row_t *row = error_row(code);
    return row ? row->name : "UNKNOWN";
}

const char *fabric_strerror(int code) {
    const error_row_t *row = error_row(code);
    return row ? row->meaning : "unknown error code";
}

int fabric_err_retriable(int code) {
    const error_row_t *row = error_row(code);
    return row ? row->retriable : 0;
}

/* ---- Key hash ----------------------------------------------------------------------------- */
static uint32_t crc32_bytes(uint32_t crc, const uint8_t *data, size_t len) {
    /* zlib's crc32 takes a uInt length; feed huge buffers in pieces. */
    while (len > 0) {
        uInt piece = len > (1u << 30) ? (1u << 30) : (uInt)len;
        crc = (uint32_t)crc32(crc, data, piece);
        data += piece;
        len -= piece;
    }
    return crc;
}

uint32_t fabric_key_hash(const void *key, size_t key_len) {
    return crc32_bytes((uint32_t)crc32(0L, Z_NULL, 0), (const uint8_t *)key, key_len);
}

int32_t fabric_partition_for_key(const void *key, size_t key_len, int32_t partition_count) {
    if (partition_count <= 0) return -1;
    return (int32_t)(fabric_key_hash(key, key_len) % (uint32_t)partition_count);
}

/* ---- Little-endian helpers ------------------------------------------------------------------- */
static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static void set_err(char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_err(char *err, size_t err_len, const char *fmt, ...) {
    if (err == NULL || err_len == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, err_len, fmt, ap);
    va_end(ap);
}

/* ---- Buffers ------------------------------------------------------------------------------- */
/* A buffer never grows past this: the largest frame we ever build is one batch (64 MiB of
 * records plus lz4 overhead) or a PRODUCE body; 1 GiB catches runaway growth. */
#define BUF_BYTES_MAX ((size_t)1 << 30)

void fabric_buf_init(fabric_buf_t *b) { memset(b, 0, sizeof *b); }

void fabric_buf_free(fabric_buf_t *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

int fabric_buf_reserve(fabric_buf_t *b, size_t extra) {
    if (b->err) return b->err;
    if (extra > BUF_BYTES_MAX - b->len) return b->err = FABRIC_ERR_NO_MEMORY;
    size_t need = b->len + extra;
    if (need <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need) cap = cap > BUF_BYTES_MAX / 2 ? BUF_BYTES_MAX : cap * 2;
    uint8_t *data = realloc(b->data, cap);
    if (data == NULL) return b->err = FABRIC_ERR_NO_MEMORY;
    b->data = data;
    b->cap = cap;
    return 0;
}

void fabric_buf_put(fabric_buf_t *b, const void *data, size_t len) {
    if (len == 0 || fabric_buf_reserve(b, len)) return;
    memcpy(b->data + b->len, data, len);
    b->len += len;
}

static void buf_put_le(fabric_buf_t *b, uint64_t v, int bytes) {
    if (fabric_buf_reserve(b, (size_t)bytes)) return;
    put_le(b->data + b->len, v, bytes);
    b->len += (size_t)bytes;
}

void fabric_buf_put_u8(fabric_buf_t *b, uint8_t v) { buf_put_le(b, v, 1); }
void fabric_buf_put_u16(fabric_buf_t *b, uint16_t v) { buf_put_le(b, v, 2); }
void fabric_buf_put_u32(fabric_buf_t *b, uint32_t v) { buf_put_le(b, v, 4); }
void fabric_buf_put_u64(fabric_buf_t *b, uint64_t v) { buf_put_le(b, v, 8); }

void fabric_buf_put_str(fabric_buf_t *b, const char *s, size_t len) {
    if (len > FABRIC_STRING_BYTES_MAX) {
        if (!b->err) b->err = FABRIC_ERR_INVALID_ARGUMENT;
        return;
    }
    fabric_buf_put_u16(b, (uint16_t)len);
    fabric_buf_put(b, s, len);
}

fabric_str_t fabric_str(const char *s) {
    fabric_str_t out = {s, s ? strlen(s) : 0};
    return out;
}

/* ---- Arena ---------------------------------------------------------------------------------- */
#define ARENA_CHUNK_BYTES 4096
/* Decoders cap an arena at this many bytes per byte of frame (plus a constant): the
 * largest expansion is an array of empty strings, 2 wire bytes -> 24 bytes decoded. */
#define ARENA_BYTES_PER_FRAME_BYTE 16
#define ARENA_BYTES_SLACK 65536

struct fabric_arena_chunk {
    fabric_arena_chunk_t *next;
    size_t used;
    size_t cap;
    _Alignas(16) uint8_t data[];
};

void fabric_arena_init(fabric_arena_t *a) { memset(a, 0, sizeof *a); }

void *fabric_arena_alloc(fabric_arena_t *a, size_t size) {
    size = (size + 15) & ~(size_t)15;
    if (size == 0) size = 16;
    if (a->bytes_max && (size > a->bytes_max || a->bytes > a->bytes_max - size)) return NULL;
    fabric_arena_chunk_t *c = a->head;
    if (c == NULL || c->cap - c->used < size) {
        size_t cap = size > ARENA_CHUNK_BYTES ? size : ARENA_CHUNK_BYTES;
        c = malloc(sizeof *c + cap);
        if (c == NULL) return NULL;
        c->next = a->head;
        c->used = 0;
        c->cap = cap;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += size;
    a->bytes += size;
    return p;
}

void fabric_arena_free(fabric_arena_t *a) {
    fabric_arena_chunk_t *c = a->head;
    while (c) {
        fabric_arena_chunk_t *next = c->next;
        free(c);
        c = next;
    }
    memset(a, 0, sizeof *a);
}

/* ---- UTF-8 ----------------------------------------------------------------------------------- */
/* Strict UTF-8 as Python's decoder accepts it: no overlongs, no surrogates, <= U+10FFFF. */
static int utf8_valid(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t n;
        uint32_t cp;
        if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return 0;
        }
        if (len - i <= n) return 0;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return 0;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return 0;
        i += n + 1;
    }
    return 1;
}

/* For the producer's argument checks (declared in src/internal.h). */
int codec_utf8_valid(const void *s, size_t len);
int codec_utf8_valid(const void *s, size_t len) { return utf8_valid((const uint8_t *)s, len); }

/* ---- Body reader ------------------------------------------------------------------------------- */
typedef struct {
    const uint8_t *p;
    size_t len;
    size_t pos;
    int err;
    char *msg;
    size_t msg_len;
    fabric_arena_t *arena;
} rd_t;

static void rd_fail(rd_t *r, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rd_fail(rd_t *r, int code, const char *fmt, ...) {
    if (r->err) return;
    r->err = code;
    if (r->msg && r->msg_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->msg, r->msg_len, fmt, ap);
        va_end(ap);
    }
}

static int rd_need(rd_t *r, size_t n, const char *what) {
    if (r->err) return 0;
    if (n > r->len - r->pos) {
        rd_fail(r, FABRIC_ERR_MALFORMED_REQUEST,
                "truncated frame: %s needs %zu bytes at offset %zu, frame has %zu", what, n, r->pos,
                r->len);
        return 0;
    }
    return 1;
}

static uint64_t rd_le(rd_t *r, int bytes, const char *what) {
    if (!rd_need(r, (size_t)bytes, what)) return 0;
    uint64_t v = get_le(r->p + r->pos, bytes);
    r->pos += (size_t)bytes;
    return v;
}

#define RD_I8(r, w) ((int8_t)(uint8_t)rd_le((r), 1, (w)))
#define RD_U8(r, w) ((uint8_t)rd_le((r), 1, (w)))
#define RD_I16(r, w) ((int16_t)(uint16_t)rd_le((r), 2, (w)))
#define RD_U16(r, w) ((uint16_t)rd_le((r), 2, (w)))
#define RD_I32(r, w) ((int32_t)(uint32_t)rd_le((r), 4, (w)))
#define RD_U32(r, w) ((uint32_t)rd_le((r), 4, (w)))
#define RD_I64(r, w) ((int64_t)rd_le((r), 8, (w)))

static void *rd_alloc(rd_t *r, size_t size) {
    if (r->err) return NULL;
    void *p = fabric_arena_alloc(r->arena, size);
    if (p == NULL)
        rd_fail(r, FABRIC_ERR_NO_MEMORY, "decoder arena limit of %zu bytes reached",
                r->arena->bytes_max);
    return p;
}

static fabric_str_t rd_str(rd_t *r, const char *what) {
    fabric_str_t out = {"", 0};
    uint16_t len = RD_U16(r, what);
    if (!rd_need(r, len, what)) return out;
    if (!utf8_valid(r->p + r->pos, len)) {
        rd_fail(r, FABRIC_ERR_MALFORMED_REQUEST, "field %s is not valid UTF-8", what);
        return out;
    }
    char *copy = rd_alloc(r, (size_t)len + 1);
    if (copy == NULL) return out;
    memcpy(copy, r->p + r->pos, len);
    copy[len] = '\0';
    r->pos += len;
    out.data = copy;
    out.len = len;
    return out;
}

/* An array count, refused above FABRIC_ARRAY_ITEMS_MAX or when count items of at least
 * item_min_bytes cannot fit in what is left: a tiny frame cannot make us allocate much. */
static uint32_t rd_count(rd_t *r, size_t item_min_bytes, const char *what) {
    uint32_t count = RD_U32(r, what);
    if (r->err) return 0;
    if (count > FABRIC_ARRAY_ITEMS_MAX) {
        rd_fail(r, FABRIC_ERR_MALFORMED_REQUEST, "array %s claims %u items, above ARRAY_ITEMS_MAX=%u",
                what, count, FABRIC_ARRAY_ITEMS_MAX);
        return 0;
    }
    if ((uint64_t)count * item_min_bytes > r->len - r->pos) {
        rd_fail(r, FABRIC_ERR_MALFORMED_REQUEST, "array %s claims %u items in %zu bytes", what,
                count, r->len - r->pos);
        return 0;
    }
    return count;
}

static void *rd_array(rd_t *r, uint32_t count, size_t item_size) {
    if (r->err || count == 0) return NULL;
    return rd_alloc(r, (size_t)count * item_size);
}

static void rd_begin(rd_t *r, const uint8_t *frame, size_t len, fabric_arena_t *arena, char *err,
                     size_t err_len) {
    r->p = frame;
    r->len = frame ? len : 0;
    r->pos = 0;
    r->err = 0;
    r->msg = err;
    r->msg_len = err_len;
    r->arena = arena;
    if (arena->bytes_max == 0)
        arena->bytes_max = arena->bytes + len * ARENA_BYTES_PER_FRAME_BYTE + ARENA_BYTES_SLACK;
    if (err && err_len) err[0] = '\0';
}

static int rd_end(rd_t *r) {
    if (!r->err && r->pos != r->len)
        rd_fail(r, FABRIC_ERR_MALFORMED_REQUEST, "%zu unexpected trailing bytes in body frame",
                r->len - r->pos);
    return r->err;
}

/* Minimum wire sizes of array items, for rd_count. */
#define MIN_STR 2
#define MIN_PARTITION_STATE (4 + 2 + 4 + 4 + 4 + 4)
#define MIN_NODE (4 + MIN_STR)
#define MIN_TOPIC (2 + MIN_STR + 1 + 4 + 4)
#define MIN_TOPIC_PARTITION (MIN_STR + 4)
#define MIN_PRODUCE_RESULT (MIN_STR + 4 + 2 + 8 + 8 + MIN_STR)
#define MIN_FETCH_PARTITION (MIN_STR + 4 + 8 + 4 + 4)
#define MIN_FETCH_RESULT (MIN_STR + 4 + 2 + 8 + 8 + 8 + 4)
#define MIN_LIST_OFFSETS_PARTITION (MIN_STR + 4 + 8)
#define MIN_LIST_OFFSETS_RESULT (MIN_STR + 4 + 2 + 8 + 8)
#define MIN_CONFIG (MIN_STR + MIN_STR)

static int32_t *rd_i32_array(rd_t *r, uint32_t *count, const char *what) {
    *count = rd_count(r, 4, what);
    int32_t *items = rd_array(r, *count, sizeof(int32_t));
    for (uint32_t i = 0; i < *count && !r->err; i++) items[i] = RD_I32(r, what);
    return items;
}

static void put_i32_array(fabric_buf_t *b, const int32_t *items, uint32_t count) {
    fabric_buf_put_u32(b, count);
    for (uint32_t i = 0; i < count; i++) fabric_buf_put_u32(b, (uint32_t)items[i]);
}

#define PUT_STR(b, s) fabric_buf_put_str((b), (s).data, (s).len)
#define PUT_I8(b, v) fabric_buf_put_u8((b), (uint8_t)(v))
#define PUT_I16(b, v) fabric_buf_put_u16((b), (uint16_t)(v))
#define PUT_I32(b, v) fabric_buf_put_u32((b), (uint32_t)(v))
#define PUT_I64(b, v) fabric_buf_put_u64((b), (uint64_t)(v))

/* ---- PartitionState ---------------------------------------------------------------------------- */
static void put_partition_state(fabric_buf_t *b, const fabric_partition_state_t *p) {
    PUT_I32(b, p->partition);
    PUT_I16(b, p->error);
    PUT_I32(b, p->leader);
    PUT_I32(b, p->leader_epoch);
    put_i32_array(b, p->replicas, p->replica_count);
    put_i32_array(b, p->isr, p->isr_count);
}

static void rd_partition_state(rd_t *r, fabric_partition_state_t *p) {
    p->partition = RD_I32(r, "partition");
    p->error = RD_I16(r, "error");
    p->leader = RD_I32(r, "leader");
    p->leader_epoch = RD_I32(r, "leader_epoch");
    p->replicas = rd_i32_array(r, &p->replica_count, "replicas");
    p->isr = rd_i32_array(r, &p->isr_count, "isr");
}

/* ---- METADATA ------------------------------------------------------------------------------------ */
void fabric_metadata_request_encode(const fabric_metadata_request_t *v, fabric_buf_t *out) {
    fabric_buf_put_u32(out, v->topic_count);
    for (uint32_t i = 0; i < v->topic_count; i++) PUT_STR(out, v->topics[i]);
}

int fabric_metadata_request_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                   fabric_metadata_request_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->topic_count = rd_count(&r, MIN_STR, "topics");
    out->topics = rd_array(&r, out->topic_count, sizeof(fabric_str_t));
    for (uint32_t i = 0; i < out->topic_count && !r.err; i++) out->topics[i] = rd_str(&r, "topics");
    return rd_end(&r);
}

void fabric_metadata_response_encode(const fabric_metadata_response_t *v, fabric_buf_t *out) {
    PUT_I32(out, v->controller_id);
    fabric_buf_put_u32(out, v->node_count);
    for (uint32_t i = 0; i < v->node_count; i++) {
        PUT_I32(out, v->nodes[i].node_id);
        PUT_STR(out, v->nodes[i].address);
    }
    fabric_buf_put_u32(out, v->topic_count);
    for (uint32_t i = 0; i < v->topic_count; i++) {
        const fabric_metadata_topic_t *t = &v->topics[i];
        PUT_I16(out, t->error);
        PUT_STR(out, t->name);
        fabric_buf_put_u8(out, t->strict_order);
        PUT_I32(out, t->message_bytes_max);
        fabric_buf_put_u32(out, t->partition_count);
        for (uint32_t k = 0; k < t->partition_count; k++) put_partition_state(out, &t->partitions[k]);
    }
}

int fabric_metadata_response_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                    fabric_metadata_response_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->controller_id = RD_I32(&r, "controller_id");
    out->node_count = rd_count(&r, MIN_NODE, "nodes");
    out->nodes = rd_array(&r, out->node_count, sizeof *out->nodes);
    for (uint32_t i = 0; i < out->node_count && !r.err; i++) {
        out->nodes[i].node_id = RD_I32(&r, "node_id");
        out->nodes[i].address = rd_str(&r, "address");
    }
    out->topic_count = rd_count(&r, MIN_TOPIC, "topics");
    out->topics = rd_array(&r, out->topic_count, sizeof *out->topics);
    for (uint32_t i = 0; i < out->topic_count && !r.err; i++) {
        fabric_metadata_topic_t *t = &out->topics[i];
        t->error = RD_I16(&r, "error");
        t->name = rd_str(&r, "name");
        t->strict_order = RD_U8(&r, "strict_order");
        t->message_bytes_max = RD_I32(&r, "message_bytes_max");
        t->partition_count = rd_count(&r, MIN_PARTITION_STATE, "partitions");
        t->partitions = rd_array(&r, t->partition_count, sizeof *t->partitions);
        for (uint32_t k = 0; k < t->partition_count && !r.err; k++)
            rd_partition_state(&r, &t->partitions[k]);
    }
    return rd_end(&r);
}

/* ---- PRODUCE -------------------------------------------------------------------------------------- */
void fabric_produce_request_encode(const fabric_produce_request_t *v, fabric_buf_t *out) {
    PUT_I8(out, v->acks);
    PUT_I32(out, v->timeout_ms);
    fabric_buf_put_u32(out, v->entry_count);
    for (uint32_t i = 0; i < v->entry_count; i++) {
        PUT_STR(out, v->entries[i].topic);
        PUT_I32(out, v->entries[i].partition);
    }
}

int fabric_produce_request_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                  fabric_produce_request_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->acks = RD_I8(&r, "acks");
    out->timeout_ms = RD_I32(&r, "timeout_ms");
    out->entry_count = rd_count(&r, MIN_TOPIC_PARTITION, "entries");
    out->entries = rd_array(&r, out->entry_count, sizeof *out->entries);
    for (uint32_t i = 0; i < out->entry_count && !r.err; i++) {
        out->entries[i].topic = rd_str(&r, "topic");
        out->entries[i].partition = RD_I32(&r, "partition");
    }
    return rd_end(&r);
}

void fabric_produce_response_encode(const fabric_produce_response_t *v, fabric_buf_t *out) {
    fabric_buf_put_u32(out, v->result_count);
    for (uint32_t i = 0; i < v->result_count; i++) {
        const fabric_produce_result_t *x = &v->results[i];
        PUT_STR(out, x->topic);
        PUT_I32(out, x->partition);
        PUT_I16(out, x->error);
        PUT_I64(out, x->base_offset);
        PUT_I64(out, x->log_start_offset);
        PUT_STR(out, x->message);
    }
}

int fabric_produce_response_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                   fabric_produce_response_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->result_count = rd_count(&r, MIN_PRODUCE_RESULT, "results");
    out->results = rd_array(&r, out->result_count, sizeof *out->results);
    for (uint32_t i = 0; i < out->result_count && !r.err; i++) {
        fabric_produce_result_t *x = &out->results[i];
        x->topic = rd_str(&r, "topic");
        x->partition = RD_I32(&r, "partition");
        x->error = RD_I16(&r, "error");
        x->base_offset = RD_I64(&r, "base_offset");
        x->log_start_offset = RD_I64(&r, "log_start_offset");
        x->message = rd_str(&r, "message");
    }
    return rd_end(&r);
}

/* ---- FETCH ---------------------------------------------------------------------------------------- */
void fabric_fetch_request_encode(const fabric_fetch_request_t *v, fabric_buf_t *out) {
    PUT_I32(out, v->replica_id);
    PUT_I32(out, v->max_wait_ms);
    PUT_I32(out, v->min_bytes);
    PUT_I32(out, v->max_bytes);
    fabric_buf_put_u32(out, v->partition_count);
    for (uint32_t i = 0; i < v->partition_count; i++) {
        const fabric_fetch_partition_t *p = &v->partitions[i];
        PUT_STR(out, p->topic);
        PUT_I32(out, p->partition);
        PUT_I64(out, p->fetch_offset);
        PUT_I32(out, p->partition_bytes_max);
        PUT_I32(out, p->current_leader_epoch);
    }
}

int fabric_fetch_request_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                fabric_fetch_request_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->replica_id = RD_I32(&r, "replica_id");
    out->max_wait_ms = RD_I32(&r, "max_wait_ms");
    out->min_bytes = RD_I32(&r, "min_bytes");
    out->max_bytes = RD_I32(&r, "max_bytes");
    out->partition_count = rd_count(&r, MIN_FETCH_PARTITION, "partitions");
    out->partitions = rd_array(&r, out->partition_count, sizeof *out->partitions);
    for (uint32_t i = 0; i < out->partition_count && !r.err; i++) {
        fabric_fetch_partition_t *p = &out->partitions[i];
        p->topic = rd_str(&r, "topic");
        p->partition = RD_I32(&r, "partition");
        p->fetch_offset = RD_I64(&r, "fetch_offset");
        p->partition_bytes_max = RD_I32(&r, "partition_bytes_max");
        p->current_leader_epoch = RD_I32(&r, "current_leader_epoch");
    }
    return rd_end(&r);
}

void fabric_fetch_response_encode(const fabric_fetch_response_t *v, fabric_buf_t *out) {
    fabric_buf_put_u32(out, v->partition_count);
    for (uint32_t i = 0; i < v->partition_count; i++) {
        const fabric_fetch_partition_result_t *p = &v->partitions[i];
        PUT_STR(out, p->topic);
        PUT_I32(out, p->partition);
        PUT_I16(out, p->error);
        PUT_I64(out, p->high_watermark);
        PUT_I64(out, p->log_start_offset);
        PUT_I64(out, p->log_end_offset);
        fabric_buf_put_u32(out, p->batch_count);
    }
}

int fabric_fetch_response_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                 fabric_fetch_response_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->partition_count = rd_count(&r, MIN_FETCH_RESULT, "partitions");
    out->partitions = rd_array(&r, out->partition_count, sizeof *out->partitions);
    for (uint32_t i = 0; i < out->partition_count && !r.err; i++) {
        fabric_fetch_partition_result_t *p = &out->partitions[i];
        p->topic = rd_str(&r, "topic");
        p->partition = RD_I32(&r, "partition");
        p->error = RD_I16(&r, "error");
        p->high_watermark = RD_I64(&r, "high_watermark");
        p->log_start_offset = RD_I64(&r, "log_start_offset");
        p->log_end_offset = RD_I64(&r, "log_end_offset");
        p->batch_count = RD_U32(&r, "batch_count");
    }
    return rd_end(&r);
}

/* ---- LIST_OFFSETS ----------------------------------------------------------------------------------- */
void fabric_list_offsets_request_encode(const fabric_list_offsets_request_t *v, fabric_buf_t *out) {
    fabric_buf_put_u32(out, v->partition_count);
    for (uint32_t i = 0; i < v->partition_count; i++) {
        PUT_STR(out, v->partitions[i].topic);
        PUT_I32(out, v->partitions[i].partition);
        PUT_I64(out, v->partitions[i].timestamp);
    }
}

int fabric_list_offsets_request_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                       fabric_list_offsets_request_t *out, char *err,
                                       size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->partition_count = rd_count(&r, MIN_LIST_OFFSETS_PARTITION, "partitions");
    out->partitions = rd_array(&r, out->partition_count, sizeof *out->partitions);
    for (uint32_t i = 0; i < out->partition_count && !r.err; i++) {
        out->partitions[i].topic = rd_str(&r, "topic");
        out->partitions[i].partition = RD_I32(&r, "partition");
        out->partitions[i].timestamp = RD_I64(&r, "timestamp");
    }
    return rd_end(&r);
}

void fabric_list_offsets_response_encode(const fabric_list_offsets_response_t *v,
                                         fabric_buf_t *out) {
    fabric_buf_put_u32(out, v->partition_count);
    for (uint32_t i = 0; i < v->partition_count; i++) {
        const fabric_list_offsets_result_t *p = &v->partitions[i];
        PUT_STR(out, p->topic);
        PUT_I32(out, p->partition);
        PUT_I16(out, p->error);
        PUT_I64(out, p->timestamp);
        PUT_I64(out, p->offset);
    }
}

int fabric_list_offsets_response_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                        fabric_list_offsets_response_t *out, char *err,
                                        size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->partition_count = rd_count(&r, MIN_LIST_OFFSETS_RESULT, "partitions");
    out->partitions = rd_array(&r, out->partition_count, sizeof *out->partitions);
    for (uint32_t i = 0; i < out->partition_count && !r.err; i++) {
        fabric_list_offsets_result_t *p = &out->partitions[i];
        p->topic = rd_str(&r, "topic");
        p->partition = RD_I32(&r, "partition");
        p->error = RD_I16(&r, "error");
        p->timestamp = RD_I64(&r, "timestamp");
        p->offset = RD_I64(&r, "offset");
    }
    return rd_end(&r);
}

/* ---- CREATE_TOPIC, results, error bodies ---------------------------------------------------------- */
void fabric_create_topic_request_encode(const fabric_create_topic_request_t *v, fabric_buf_t *out) {
    PUT_STR(out, v->name);
    PUT_I32(out, v->partitions);
    PUT_I16(out, v->replication_factor);
    fabric_buf_put_u32(out, v->config_count);
    for (uint32_t i = 0; i < v->config_count; i++) {
        PUT_STR(out, v->configs[i].key);
        PUT_STR(out, v->configs[i].value);
    }
}

int fabric_create_topic_request_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                       fabric_create_topic_request_t *out, char *err,
                                       size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    memset(out, 0, sizeof *out);
    out->name = rd_str(&r, "name");
    out->partitions = RD_I32(&r, "partitions");
    out->replication_factor = RD_I16(&r, "replication_factor");
    out->config_count = rd_count(&r, MIN_CONFIG, "configs");
    out->configs = rd_array(&r, out->config_count, sizeof *out->configs);
    for (uint32_t i = 0; i < out->config_count && !r.err; i++) {
        out->configs[i].key = rd_str(&r, "key");
        out->configs[i].value = rd_str(&r, "value");
    }
    return rd_end(&r);
}

void fabric_result_response_encode(const fabric_result_response_t *v, fabric_buf_t *out) {
    PUT_I16(out, v->error);
    PUT_STR(out, v->message);
}

int fabric_result_response_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                  fabric_result_response_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    out->error = RD_I16(&r, "error");
    out->message = rd_str(&r, "message");
    return rd_end(&r);
}

void fabric_error_body_encode(const fabric_error_body_t *v, fabric_buf_t *out) {
    PUT_STR(out, v->message);
}

int fabric_error_body_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                             fabric_error_body_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    out->message = rd_str(&r, "message");
    return rd_end(&r);
}

/* ---- ALLOCATE_IDS (the sequencer) ------------------------------------------------------------------ */
void fabric_allocate_ids_request_encode(const fabric_allocate_ids_request_t *v, fabric_buf_t *out) {
    PUT_I32(out, v->count);
    PUT_I8(out, v->kind);
}

int fabric_allocate_ids_request_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                       fabric_allocate_ids_request_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    out->count = RD_I32(&r, "count");
    out->kind = RD_I8(&r, "kind");
    return rd_end(&r);
}

void fabric_allocate_ids_response_encode(const fabric_allocate_ids_response_t *v, fabric_buf_t *out) {
    PUT_I32(out, v->epoch);
    PUT_I64(out, v->first_id);
    PUT_I32(out, v->count);
    PUT_I64(out, v->records_end);
}

int fabric_allocate_ids_response_decode(const uint8_t *frame, size_t len, fabric_arena_t *arena,
                                        fabric_allocate_ids_response_t *out, char *err, size_t err_len) {
    rd_t r;
    rd_begin(&r, frame, len, arena, err, err_len);
    out->epoch = RD_I32(&r, "epoch");
    out->first_id = RD_I64(&r, "first_id");
    out->count = RD_I32(&r, "count");
    out->records_end = RD_I64(&r, "records_end");
    return rd_end(&r);
}

/* ---- Header frame ---------------------------------------------------------------------------------- */
void fabric_header_encode(const fabric_frame_header_t *h, uint8_t out[FABRIC_HEADER_BYTES]) {
    put_le(out + 0, FABRIC_PROTOCOL_MAGIC, 4);
    out[4] = h->protocol_version;
    out[5] = h->flags;
    put_le(out + 6, h->api_key, 2);
    put_le(out + 8, h->api_version, 2);
    put_le(out + 10, (uint16_t)h->error_code, 2);
    put_le(out + 12, h->correlation_id, 4);
}

int fabric_header_decode(const uint8_t *frame, size_t len, fabric_frame_header_t *out, char *err,
                         size_t err_len) {
    /* The magic comes first so that a non-Fabric peer gets INVALID_MAGIC, as in Python. */
    if (len >= 4 && get_le(frame, 4) != FABRIC_PROTOCOL_MAGIC) {
        set_err(err, err_len, "header magic 0x%08x, expected 0x%08x (FBR1)",
                (unsigned)get_le(frame, 4), FABRIC_PROTOCOL_MAGIC);
        return FABRIC_ERR_INVALID_MAGIC;
    }
    if (len != FABRIC_HEADER_BYTES) {
        set_err(err, err_len, "header frame is %zu bytes, expected %d", len, FABRIC_HEADER_BYTES);
        return FABRIC_ERR_MALFORMED_REQUEST;
    }
    out->protocol_version = frame[4];
    out->flags = frame[5];
    out->api_key = (uint16_t)get_le(frame + 6, 2);
    out->api_version = (uint16_t)get_le(frame + 8, 2);
    out->error_code = (int16_t)(uint16_t)get_le(frame + 10, 2);
    out->correlation_id = (uint32_t)get_le(frame + 12, 4);
    if (out->protocol_version != FABRIC_PROTOCOL_VERSION) {
        set_err(err, err_len, "protocol version %u, this peer speaks %d", out->protocol_version,
                FABRIC_PROTOCOL_VERSION);
        return FABRIC_ERR_UNSUPPORTED_VERSION;
    }
    return 0;
}

/* ---- Record batches ---------------------------------------------------------------------------------- */
int fabric_batch_read_header(const uint8_t *buf, size_t len, fabric_batch_header_t *h) {
    if (len < FABRIC_BATCH_HEADER_BYTES) return FABRIC_ERR_CORRUPT_MESSAGE;
    h->base_offset = (int64_t)get_le(buf + 0, 8);
    h->batch_length = (int32_t)(uint32_t)get_le(buf + 8, 4);
    h->leader_epoch = (int32_t)(uint32_t)get_le(buf + 12, 4);
    h->crc = (uint32_t)get_le(buf + 16, 4);
    h->magic = buf[20];
    h->attributes = buf[21];
    h->record_count = (int32_t)(uint32_t)get_le(buf + 24, 4);
    h->first_timestamp = (int64_t)get_le(buf + 28, 8);
    h->max_timestamp = (int64_t)get_le(buf + 36, 8);
    h->producer_id = (int64_t)get_le(buf + 44, 8);
    h->producer_epoch = (int16_t)(uint16_t)get_le(buf + 52, 2);
    h->base_sequence = (int32_t)(uint32_t)get_le(buf + 56, 4);
    h->global_id_base = (int64_t)get_le(buf + 60, 8);
    h->records_bytes = (int32_t)(uint32_t)get_le(buf + 68, 4);
    return 0;
}

uint32_t fabric_batch_crc(const uint8_t *buf, size_t len) {
    if (len <= FABRIC_BATCH_CRC_START) return fabric_key_hash(buf, 0);
    return fabric_key_hash(buf + FABRIC_BATCH_CRC_START, len - FABRIC_BATCH_CRC_START);
}

/* LZ4 frame format: magic, FLG, BD, [content size u64], [dict id u32], HC. */
#define LZ4_FRAME_MAGIC 0x184D2204u
#define LZ4_FLG_CONTENT_SIZE 0x08
#define LZ4_FLG_DICT_ID 0x01
#define LZ4_FRAME_HEADER_BYTES_MIN 7

/* The content size an lz4 frame claims, read from its header without decompressing.
 * Returns CORRUPT_MESSAGE when this is not an lz4 frame, DECOMPRESSION_LIMIT when the
 * claim is absent or differs from records_bytes. */
static int lz4_check_claim(const uint8_t *payload, size_t len, int32_t records_bytes, char *err,
                           size_t err_len) {
    if (len < LZ4_FRAME_HEADER_BYTES_MIN || get_le(payload, 4) != LZ4_FRAME_MAGIC) {
        set_err(err, err_len, "records section is not an lz4 frame (no 04 22 4d 18 magic)");
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    uint8_t flg = payload[4];
    if ((flg >> 6) != 1) {
        set_err(err, err_len, "lz4 frame version %u, expected 1", (unsigned)(flg >> 6));
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    if (!(flg & LZ4_FLG_CONTENT_SIZE)) {
        set_err(err, err_len, "lz4 frame has no content size, batch header says %d",
                records_bytes);
        return FABRIC_ERR_DECOMPRESSION_LIMIT;
    }
    if (len < 6 + 8 + 1) {
        set_err(err, err_len, "lz4 frame header truncated");
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    uint64_t claimed = get_le(payload + 6, 8);
    if (claimed != (uint64_t)(int64_t)records_bytes) {
        set_err(err, err_len,
                "lz4 frame claims %llu bytes of content, batch header says records_bytes=%d",
                (unsigned long long)claimed, records_bytes);
        return FABRIC_ERR_DECOMPRESSION_LIMIT;
    }
    return 0;
}

/* Header checks shared by validate and decode: magic, counts, size limits. */
static int check_header(const fabric_batch_header_t *h, size_t len, char *err, size_t err_len) {
    if (h->magic != FABRIC_BATCH_MAGIC) {
        set_err(err, err_len, "batch magic %u, expected %d", h->magic, FABRIC_BATCH_MAGIC);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    if (h->batch_length < FABRIC_BATCH_HEADER_BYTES || (size_t)h->batch_length > len) {
        set_err(err, err_len, "batch_length %d does not fit a %zu-byte buffer", h->batch_length,
                len);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    if (h->record_count < 1 || h->record_count > FABRIC_BATCH_RECORDS_MAX) {
        set_err(err, err_len, "record_count %d outside [1, %d]", h->record_count,
                FABRIC_BATCH_RECORDS_MAX);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    if (h->records_bytes > FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX) {
        set_err(err, err_len, "records_bytes %d exceeds BATCH_UNCOMPRESSED_BYTES_MAX=%d",
                h->records_bytes, FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX);
        return FABRIC_ERR_DECOMPRESSION_LIMIT;
    }
    if ((int64_t)h->records_bytes < (int64_t)FABRIC_RECORD_FIXED_BYTES * h->record_count) {
        set_err(err, err_len, "records_bytes %d too small for %d records", h->records_bytes,
                h->record_count);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    return 0;
}

int fabric_batch_validate(const uint8_t *buf, size_t len, int32_t message_bytes_max,
                          fabric_batch_header_t *out, char *err, size_t err_len) {
    fabric_batch_header_t h;
    if (message_bytes_max >= 0 && len > (size_t)message_bytes_max) {
        set_err(err, err_len, "batch of %zu bytes exceeds the topic's message_bytes_max=%d", len,
                message_bytes_max);
        return FABRIC_ERR_MESSAGE_TOO_LARGE;
    }
    if (fabric_batch_read_header(buf, len, &h)) {
        set_err(err, err_len, "batch of %zu bytes is shorter than its %d-byte header", len,
                FABRIC_BATCH_HEADER_BYTES);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    if (h.magic == FABRIC_BATCH_MAGIC && (size_t)(uint32_t)h.batch_length != len) {
        set_err(err, err_len, "batch_length says %d bytes, frame has %zu", h.batch_length, len);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    int rc = check_header(&h, len, err, err_len);
    if (rc) return rc;
    uint32_t crc = fabric_batch_crc(buf, len);
    if (crc != h.crc) {
        set_err(err, err_len, "batch CRC 0x%08x does not match header 0x%08x", crc, h.crc);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    size_t payload = len - FABRIC_BATCH_HEADER_BYTES;
    int codec = h.attributes & FABRIC_CODEC_MASK;
    if (codec == FABRIC_CODEC_NONE) {
        if (payload != (size_t)h.records_bytes) {
            set_err(err, err_len, "uncompressed batch carries %zu record bytes, header says %d",
                    payload, h.records_bytes);
            return FABRIC_ERR_CORRUPT_MESSAGE;
        }
    } else if (codec == FABRIC_CODEC_LZ4) {
        rc = lz4_check_claim(buf + FABRIC_BATCH_HEADER_BYTES, payload, h.records_bytes, err,
                             err_len);
        if (rc) return rc;
    } else {
        set_err(err, err_len, "compression codec %d is not supported (0 none, 1 lz4)", codec);
        return FABRIC_ERR_UNSUPPORTED_COMPRESSION;
    }
    if (out) *out = h;
    return 0;
}

void fabric_batch_options_init(fabric_batch_options_t *o) {
    o->codec = FABRIC_CODEC_LZ4;
    o->base_offset = 0;
    o->leader_epoch = -1;
    o->producer_id = -1;
    o->producer_epoch = -1;
    o->base_sequence = -1;
    o->global_id_base = -1;
    o->adaptive = 0;
}

void fabric_batch_builder_init(fabric_batch_builder_t *b) { memset(b, 0, sizeof *b); }

void fabric_batch_builder_reset(fabric_batch_builder_t *b) {
    b->record_count = 0;
    b->first_timestamp = 0;
    b->max_timestamp = 0;
    b->tag_bloom = 0;
    b->has_tag_bloom = 0;
    fabric_buf_t *bufs[] = {&b->timestamp_deltas, &b->key_lengths, &b->value_lengths,
                            &b->header_counts,    &b->keys,        &b->values,
                            &b->headers};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        bufs[i]->len = 0;
        bufs[i]->err = 0;
    }
}

void fabric_batch_builder_free(fabric_batch_builder_t *b) {
    fabric_buf_free(&b->timestamp_deltas);
    fabric_buf_free(&b->key_lengths);
    fabric_buf_free(&b->value_lengths);
    fabric_buf_free(&b->header_counts);
    fabric_buf_free(&b->keys);
    fabric_buf_free(&b->values);
    fabric_buf_free(&b->headers);
    memset(b, 0, sizeof *b);
}

size_t fabric_batch_builder_records_bytes(const fabric_batch_builder_t *b) {
    return (size_t)b->record_count * FABRIC_RECORD_FIXED_BYTES + b->keys.len + b->values.len +
           b->headers.len;
}

size_t fabric_record_bytes(int32_t key_len, int32_t value_len, const fabric_header_t *headers,
                           size_t header_count) {
    size_t n = FABRIC_RECORD_FIXED_BYTES;
    if (key_len > 0) n += (size_t)key_len;
    if (value_len > 0) n += (size_t)value_len;
    for (size_t i = 0; i < header_count; i++) {
        n += 2 + headers[i].name_len + 4;
        if (headers[i].value_len > 0) n += (size_t)headers[i].value_len;
    }
    return n;
}

/* The tag bloom, as fabric/protocol/tags.py computes it: each comma-separated tag of the
 * "fabric.tags" header sets two bits of 32, from the low 10 bits of its CRC-32. Without it
 * the node can never skip a batch for a consumer's tag filter. */
static void add_tag_bits(fabric_batch_builder_t *b, const fabric_header_t *header) {
    size_t name_len = sizeof FABRIC_TAGS_HEADER - 1;
    if (header->name_len != name_len || memcmp(header->name, FABRIC_TAGS_HEADER, name_len) != 0 ||
        header->value_len <= 0)
        return;
    const uint8_t *value = (const uint8_t *)header->value;
    size_t len = (size_t)header->value_len, start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && value[i] != ',') continue;
        if (i > start) {
            uint32_t h = crc32_bytes((uint32_t)crc32(0L, Z_NULL, 0), value + start, i - start);
            b->tag_bloom |= (1u << (h & 31)) | (1u << ((h >> 5) & 31));
            b->has_tag_bloom = 1;
        }
        start = i + 1;
    }
}

int fabric_batch_builder_add(fabric_batch_builder_t *b, int64_t timestamp_ms, const void *key,
                             int32_t key_len, const void *value, int32_t value_len,
                             const fabric_header_t *headers, size_t header_count) {
    if (key_len < -1 || value_len < -1 || (key_len > 0 && key == NULL) ||
        (value_len > 0 && value == NULL) || header_count > UINT16_MAX ||
        (header_count > 0 && headers == NULL))
        return FABRIC_ERR_INVALID_ARGUMENT;
    if (b->record_count >= FABRIC_BATCH_RECORDS_MAX) return FABRIC_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < header_count; i++) {
        if (headers[i].name_len > FABRIC_STRING_BYTES_MAX || headers[i].value_len < -1 ||
            (headers[i].name_len > 0 && headers[i].name == NULL) ||
            (headers[i].value_len > 0 && headers[i].value == NULL))
            return FABRIC_ERR_INVALID_ARGUMENT;
        /* The node refuses a batch with a non-UTF-8 header name (CORRUPT_MESSAGE), which
         * would fail every record batched with this one: refuse the record alone here. */
        if (headers[i].name_len > 0 && !utf8_valid((const uint8_t *)headers[i].name, headers[i].name_len))
            return FABRIC_ERR_INVALID_ARGUMENT;
    }
    int64_t first = b->record_count ? b->first_timestamp : timestamp_ms;
    /* The gap is taken in unsigned arithmetic, where it is exact: the signed subtraction
     * overflows (undefined behaviour) for timestamps far apart, INT64_MIN then INT64_MAX. */
    uint64_t gap = timestamp_ms > first ? (uint64_t)timestamp_ms - (uint64_t)first
                                        : (uint64_t)first - (uint64_t)timestamp_ms;
    if (gap > (timestamp_ms > first ? (uint64_t)INT32_MAX : (uint64_t)INT32_MAX + 1))
        return FABRIC_ERR_INVALID_ARGUMENT;
    int64_t delta = timestamp_ms - first;
    size_t add = fabric_record_bytes(key_len, value_len, headers, header_count);
    /* The builder never holds more than the limit, so the subtraction cannot wrap. */
    if (add > (size_t)FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX - fabric_batch_builder_records_bytes(b))
        return FABRIC_ERR_MESSAGE_TOO_LARGE;
    if (b->record_count == 0) {
        b->first_timestamp = timestamp_ms;
        b->max_timestamp = timestamp_ms;
    } else if (timestamp_ms > b->max_timestamp) {
        b->max_timestamp = timestamp_ms;
    }
    fabric_buf_put_u32(&b->timestamp_deltas, (uint32_t)(int32_t)delta);
    fabric_buf_put_u32(&b->key_lengths, (uint32_t)key_len);
    fabric_buf_put_u32(&b->value_lengths, (uint32_t)value_len);
    fabric_buf_put_u16(&b->header_counts, (uint16_t)header_count);
    if (key_len > 0) fabric_buf_put(&b->keys, key, (size_t)key_len);
    if (value_len > 0) fabric_buf_put(&b->values, value, (size_t)value_len);
    for (size_t i = 0; i < header_count; i++) {
        fabric_buf_put_str(&b->headers, headers[i].name, headers[i].name_len);
        fabric_buf_put_u32(&b->headers, (uint32_t)headers[i].value_len);
        if (headers[i].value_len > 0)
            fabric_buf_put(&b->headers, headers[i].value, (size_t)headers[i].value_len);
        add_tag_bits(b, &headers[i]);
    }
    const fabric_buf_t *bufs[] = {&b->timestamp_deltas, &b->key_lengths, &b->value_lengths,
                                  &b->header_counts,    &b->keys,        &b->values,
                                  &b->headers};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        if (bufs[i]->err) return FABRIC_ERR_NO_MEMORY; /* the builder is now unusable: reset it */
    }
    b->record_count++;
    return 0;
}

static void put_records_section(const fabric_batch_builder_t *b, uint8_t *out) {
    const fabric_buf_t *parts[] = {&b->timestamp_deltas, &b->key_lengths, &b->value_lengths,
                                   &b->header_counts,    &b->keys,        &b->values,
                                   &b->headers};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        if (parts[i]->len) memcpy(out, parts[i]->data, parts[i]->len);
        out += parts[i]->len;
    }
}

/* The preferences python-lz4 4.x passes to LZ4F_compressFrame for
 * lz4.frame.compress(data, compression_level=0, store_size=True, content_checksum=False):
 * zeroed, then block_linked=True, the default block size (64 KiB), no checksums, no
 * autoflush, content size stored. LZ4F_compressFrame itself switches a single-block frame
 * to independent blocks, so the flag byte of small batches reads 0x68. */
static void lz4_python_preferences(LZ4F_preferences_t *prefs, size_t content_size) {
    memset(prefs, 0, sizeof *prefs);
    prefs->compressionLevel = 0;
    prefs->frameInfo.blockSizeID = LZ4F_default;
    prefs->frameInfo.blockMode = LZ4F_blockLinked;
    prefs->frameInfo.contentChecksumFlag = LZ4F_noContentChecksum;
    prefs->frameInfo.blockChecksumFlag = LZ4F_noBlockChecksum;
    prefs->frameInfo.contentSize = content_size;
    prefs->autoFlush = 0;
}

#define INCOMPRESSIBLE_PROBE_BYTES 4096

/* Python's compress_records(adaptive=True): lz4 on 4 KiB from the middle kept more than
 * 90 % of it. The frame settings are Python's defaults, so both decide alike. */
static int incompressible_probe(const uint8_t *records, size_t records_bytes) {
    if (records_bytes < 4 * INCOMPRESSIBLE_PROBE_BYTES) return 0;
    const uint8_t *probe = records + records_bytes / 2;
    LZ4F_preferences_t prefs;
    lz4_python_preferences(&prefs, INCOMPRESSIBLE_PROBE_BYTES);
    uint8_t out[LZ4F_HEADER_SIZE_MAX + 2 * INCOMPRESSIBLE_PROBE_BYTES];
    size_t bound = LZ4F_compressFrameBound(INCOMPRESSIBLE_PROBE_BYTES, &prefs);
    if (bound > sizeof out) return 0;
    size_t n = LZ4F_compressFrame(out, bound, probe, INCOMPRESSIBLE_PROBE_BYTES, &prefs);
    if (LZ4F_isError(n)) return 0;
    return n * 10 > (size_t)INCOMPRESSIBLE_PROBE_BYTES * 9;
}

int fabric_batch_builder_finish(const fabric_batch_builder_t *b,
                                const fabric_batch_options_t *o, fabric_buf_t *out) {
    if (b->record_count < 1) return FABRIC_ERR_INVALID_ARGUMENT;
    if (o->codec != FABRIC_CODEC_NONE && o->codec != FABRIC_CODEC_LZ4)
        return FABRIC_ERR_UNSUPPORTED_COMPRESSION;
    size_t records_bytes = fabric_batch_builder_records_bytes(b);
    if (records_bytes > (size_t)FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX)
        return FABRIC_ERR_MESSAGE_TOO_LARGE;
    size_t start = out->len;
    int codec = o->codec;
    if (fabric_buf_reserve(out, FABRIC_BATCH_HEADER_BYTES)) return out->err;
    out->len += FABRIC_BATCH_HEADER_BYTES;
    if (o->codec == FABRIC_CODEC_NONE) {
        if (fabric_buf_reserve(out, records_bytes)) return out->err;
        put_records_section(b, out->data + out->len);
        out->len += records_bytes;
    } else {
        uint8_t *records = malloc(records_bytes);
        if (records == NULL) return FABRIC_ERR_NO_MEMORY;
        put_records_section(b, records);
        int compress = !o->adaptive || !incompressible_probe(records, records_bytes);
        size_t n = 0;
        LZ4F_preferences_t prefs;
        lz4_python_preferences(&prefs, records_bytes);
        size_t bound = LZ4F_compressFrameBound(records_bytes, &prefs);
        if (fabric_buf_reserve(out, bound > records_bytes ? bound : records_bytes)) {
            free(records);
            return out->err;
        }
        if (compress) {
            n = LZ4F_compressFrame(out->data + out->len, bound, records, records_bytes, &prefs);
            if (LZ4F_isError(n)) {
                free(records);
                return FABRIC_ERR_UNKNOWN_SERVER_ERROR;
            }
            if (o->adaptive && n >= records_bytes) compress = 0;
        }
        if (!compress) { /* sent as it is: codec 0 in the header */
            memcpy(out->data + out->len, records, records_bytes);
            n = records_bytes;
        }
        free(records);
        out->len += n;
        codec = compress ? FABRIC_CODEC_LZ4 : FABRIC_CODEC_NONE;
    }
    size_t length = out->len - start;
    if (length > INT32_MAX) return FABRIC_ERR_MESSAGE_TOO_LARGE;
    uint8_t *h = out->data + start;
    memset(h, 0, FABRIC_BATCH_HEADER_BYTES);
    put_le(h + 0, (uint64_t)o->base_offset, 8);
    put_le(h + 8, (uint64_t)length, 4);
    put_le(h + 12, (uint32_t)o->leader_epoch, 4);
    h[20] = FABRIC_BATCH_MAGIC;
    h[21] = (uint8_t)codec;
    put_le(h + 24, (uint32_t)b->record_count, 4);
    put_le(h + 28, (uint64_t)b->first_timestamp, 8);
    put_le(h + 36, (uint64_t)b->max_timestamp, 8);
    put_le(h + 44, (uint64_t)o->producer_id, 8);
    put_le(h + 52, (uint16_t)o->producer_epoch, 2);
    put_le(h + 56, (uint32_t)o->base_sequence, 4);
    put_le(h + 60, (uint64_t)o->global_id_base, 8);
    put_le(h + 68, (uint32_t)records_bytes, 4);
    if (b->has_tag_bloom) {
        h[21] |= FABRIC_BATCH_TAG_BLOOM;
        put_le(h + 22, b->tag_bloom & 0xFFFFu, 2);
        put_le(h + 54, b->tag_bloom >> 16, 2);
    }
    put_le(h + 16, fabric_batch_crc(h, length), 4);
    return 0;
}

/* Decompress an lz4 frame into exactly `want` bytes. The caller has checked the frame's
 * content-size claim against want and want against the 64 MiB limit. */
static int lz4_decompress_exact(const uint8_t *src, size_t src_len, uint8_t *dst, size_t want,
                                char *err, size_t err_len) {
    LZ4F_dctx *dctx = NULL;
    if (LZ4F_isError(LZ4F_createDecompressionContext(&dctx, LZ4F_VERSION)))
        return FABRIC_ERR_NO_MEMORY;
    size_t in_pos = 0, out_pos = 0;
    int rc = 0;
    for (;;) {
        size_t in_size = src_len - in_pos;
        size_t out_size = want - out_pos;
        size_t hint = LZ4F_decompress(dctx, dst + out_pos, &out_size, src + in_pos, &in_size, NULL);
        if (LZ4F_isError(hint)) {
            set_err(err, err_len, "lz4 frame does not decompress: %s", LZ4F_getErrorName(hint));
            rc = FABRIC_ERR_CORRUPT_MESSAGE;
            break;
        }
        in_pos += in_size;
        out_pos += out_size;
        if (hint == 0) break; /* the frame is complete */
        if (in_size == 0 && out_size == 0) {
            /* No progress: input ran out, or output is full and the frame wants more. */
            set_err(err, err_len, "lz4 frame is truncated or longer than records_bytes=%zu", want);
            rc = FABRIC_ERR_CORRUPT_MESSAGE;
            break;
        }
    }
    LZ4F_freeDecompressionContext(dctx);
    if (rc == 0 && (out_pos != want || in_pos != src_len)) {
        set_err(err, err_len,
                "lz4 frame decompressed to %zu bytes using %zu of %zu input bytes, expected %zu",
                out_pos, in_pos, src_len, want);
        rc = FABRIC_ERR_CORRUPT_MESSAGE;
    }
    return rc;
}

/* Slice a key or value column. lengths points at n little-endian i32s. */
static int slice_column(const uint8_t *lengths, int32_t n, const uint8_t *section, size_t size,
                        size_t *pos, fabric_record_t *records, int is_key, char *err,
                        size_t err_len) {
    for (int32_t i = 0; i < n; i++) {
        int32_t len = (int32_t)(uint32_t)get_le(lengths + 4 * (size_t)i, 4);
        const uint8_t *ptr = NULL;
        if (len < -1 || (len >= 0 && (size_t)len > size - *pos)) {
            set_err(err, err_len, "bad %s length %d of record %d", is_key ? "key" : "value", len, i);
            return FABRIC_ERR_CORRUPT_MESSAGE;
        }
        if (len >= 0) {
            ptr = section + *pos;
            *pos += (size_t)len;
        }
        if (is_key) {
            records[i].key = ptr;
            records[i].key_len = len;
        } else {
            records[i].value = ptr;
            records[i].value_len = len;
        }
    }
    return 0;
}

static int decode_records(fabric_batch_t *batch, const uint8_t *section, size_t size, char *err,
                          size_t err_len) {
    const fabric_batch_header_t *h = &batch->header;
    int32_t n = h->record_count;
    size_t arrays = (size_t)n * FABRIC_RECORD_FIXED_BYTES;
    if (size < arrays) {
        set_err(err, err_len, "records section of %zu bytes too short for %d records", size, n);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    const uint8_t *deltas = section;
    const uint8_t *key_lengths = section + 4 * (size_t)n;
    const uint8_t *value_lengths = section + 8 * (size_t)n;
    const uint8_t *header_counts = section + 12 * (size_t)n;
    /* base_offset is outside the CRC and first_timestamp any i64: the sums below would
     * overflow (undefined behaviour) for offsets or timestamps no i64 can hold, which
     * Python's check_records refuses too. The offset after the batch must fit as well: a
     * consumer's position moves there. */
    if (h->base_offset > INT64_MAX - n) {
        set_err(err, err_len, "base_offset %lld: the offsets of %d records pass 2^63-1",
                (long long)h->base_offset, n);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    fabric_record_t *records = batch->records;
    uint64_t header_total = 0;
    for (int32_t i = 0; i < n; i++) {
        int32_t delta = (int32_t)(uint32_t)get_le(deltas + 4 * (size_t)i, 4);
        if ((delta > 0 && h->first_timestamp > INT64_MAX - delta) ||
            (delta < 0 && h->first_timestamp < INT64_MIN - delta)) {
            set_err(err, err_len, "record %d: timestamp %lld%+d is outside the i64 range", i,
                    (long long)h->first_timestamp, delta);
            return FABRIC_ERR_CORRUPT_MESSAGE;
        }
        records[i].topic = NULL;
        records[i].partition = -1;
        records[i].offset = h->base_offset + i;
        records[i].timestamp_ms = h->first_timestamp + delta;
        records[i].header_count = (uint32_t)get_le(header_counts + 2 * (size_t)i, 2);
        records[i].headers = NULL;
        header_total += records[i].header_count;
    }
    size_t pos = arrays;
    int rc = slice_column(key_lengths, n, section, size, &pos, records, 1, err, err_len);
    if (rc == 0) rc = slice_column(value_lengths, n, section, size, &pos, records, 0, err, err_len);
    if (rc) return rc;
    if (header_total > 0) {
        /* Each header takes at least 6 bytes (u16 name length + i32 value length), so the
         * count is checked against what is left before the array is allocated. */
        if (header_total > (size - pos) / 6) {
            set_err(err, err_len, "%llu headers cannot fit in %zu bytes",
                    (unsigned long long)header_total, size - pos);
            return FABRIC_ERR_CORRUPT_MESSAGE;
        }
        batch->headers = malloc((size_t)header_total * sizeof(fabric_header_t));
        if (batch->headers == NULL) return FABRIC_ERR_NO_MEMORY;
        fabric_header_t *hp = batch->headers;
        for (int32_t i = 0; i < n; i++) {
            records[i].headers = records[i].header_count ? hp : NULL;
            for (uint32_t k = 0; k < records[i].header_count; k++, hp++) {
                if (size - pos < 2) goto truncated;
                size_t name_len = (size_t)get_le(section + pos, 2);
                pos += 2;
                if (size - pos < name_len + 4) goto truncated;
                if (!utf8_valid(section + pos, name_len)) {
                    set_err(err, err_len, "header name of record %d is not UTF-8", i);
                    return FABRIC_ERR_CORRUPT_MESSAGE;
                }
                hp->name = (const char *)(section + pos);
                hp->name_len = name_len;
                pos += name_len;
                int32_t vlen = (int32_t)(uint32_t)get_le(section + pos, 4);
                pos += 4;
                if (vlen < -1 || (vlen >= 0 && (size_t)vlen > size - pos)) {
                    set_err(err, err_len, "bad header value length %d of record %d", vlen, i);
                    return FABRIC_ERR_CORRUPT_MESSAGE;
                }
                hp->value_len = vlen;
                hp->value = vlen >= 0 ? section + pos : NULL;
                if (vlen > 0) pos += (size_t)vlen;
            }
        }
    }
    if (pos != size) {
        set_err(err, err_len, "records section has %zu trailing bytes", size - pos);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    return 0;
truncated:
    set_err(err, err_len, "a header runs past the records section");
    return FABRIC_ERR_CORRUPT_MESSAGE;
}

int fabric_batch_decode(const uint8_t *buf, size_t len, fabric_batch_t **out, char *err,
                        size_t err_len) {
    *out = NULL;
    if (err && err_len) err[0] = '\0';
    fabric_batch_header_t h;
    if (buf == NULL || fabric_batch_read_header(buf, len, &h)) {
        set_err(err, err_len, "batch of %zu bytes is shorter than its %d-byte header", len,
                FABRIC_BATCH_HEADER_BYTES);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    int rc = check_header(&h, len, err, err_len);
    if (rc) return rc;
    size_t batch_len = (size_t)h.batch_length;
    uint32_t crc = fabric_batch_crc(buf, batch_len);
    if (crc != h.crc) {
        set_err(err, err_len, "batch at offset %lld: CRC 0x%08x does not match header 0x%08x",
                (long long)h.base_offset, crc, h.crc);
        return FABRIC_ERR_CORRUPT_MESSAGE;
    }
    const uint8_t *payload = buf + FABRIC_BATCH_HEADER_BYTES;
    size_t payload_len = batch_len - FABRIC_BATCH_HEADER_BYTES;
    int codec = h.attributes & FABRIC_CODEC_MASK;
    if (codec == FABRIC_CODEC_NONE) {
        if (payload_len != (size_t)h.records_bytes) {
            set_err(err, err_len, "uncompressed batch carries %zu record bytes, header says %d",
                    payload_len, h.records_bytes);
            return FABRIC_ERR_CORRUPT_MESSAGE;
        }
    } else if (codec == FABRIC_CODEC_LZ4) {
        rc = lz4_check_claim(payload, payload_len, h.records_bytes, err, err_len);
        if (rc) return rc;
    } else {
        set_err(err, err_len, "compression codec %d is not supported (0 none, 1 lz4)", codec);
        return FABRIC_ERR_UNSUPPORTED_COMPRESSION;
    }
    /* records_bytes >= 14 x record_count was checked, so the records array is bounded by
     * the (checked) records section size. */
    fabric_batch_t *batch = calloc(1, sizeof *batch);
    if (batch == NULL) return FABRIC_ERR_NO_MEMORY;
    batch->header = h;
    batch->record_count = (uint32_t)h.record_count;
    batch->records = malloc((size_t)h.record_count * sizeof(fabric_record_t));
    if (batch->records == NULL) {
        fabric_batch_free(batch);
        return FABRIC_ERR_NO_MEMORY;
    }
    const uint8_t *section = payload;
    if (codec == FABRIC_CODEC_LZ4) {
        batch->owned_records = malloc((size_t)h.records_bytes);
        if (batch->owned_records == NULL) {
            fabric_batch_free(batch);
            return FABRIC_ERR_NO_MEMORY;
        }
        rc = lz4_decompress_exact(payload, payload_len, batch->owned_records,
                                  (size_t)h.records_bytes, err, err_len);
        if (rc) {
            fabric_batch_free(batch);
            return rc;
        }
        section = batch->owned_records;
    }
    rc = decode_records(batch, section, (size_t)h.records_bytes, err, err_len);
    if (rc) {
        fabric_batch_free(batch);
        return rc;
    }
    *out = batch;
    return 0;
}

void fabric_batch_free(fabric_batch_t *batch) {
    if (batch == NULL) return;
    free(batch->records);
    free(batch->headers);
    free(batch->owned_records);
    free(batch);
}

/* ---- Hex --------------------------------------------------------------------------------------------- */
void fabric_hex_encode(const uint8_t *data, size_t len, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < len; i++) {
        out[2 * i] = digits[data[i] >> 4];
        out[2 * i + 1] = digits[data[i] & 15];
    }
    out[2 * len] = '\0';
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

long fabric_hex_decode(const char *hex, size_t hex_len, uint8_t *out, size_t out_cap) {
    if (hex_len % 2 || hex_len / 2 > out_cap) return -1;
    for (size_t i = 0; i < hex_len / 2; i++) {
        int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return (long)(hex_len / 2);
}
