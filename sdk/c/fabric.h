/*
 * fabric.h: the C client of Fabric (wire protocol version 1, docs/PROTOCOL.md).
 *
 * Three layers, each usable alone:
 *
 *   1. Pure codecs (no socket, no clock, no thread): header frames, body frames of every
 *      API, record batches (encode, validate, decode with bounded decompression), the key
 *      hash, and the error table. Bytes in, values out. Used by the tests and the fuzzers.
 *   2. fabric_producer_t: batching per partition (linger and size limits), lz4 or none,
 *      acks 0/1/-1, retries of retriable errors with the same batch bytes, up to
 *      max_in_flight batches in flight per partition (default 5; a failed batch is resent
 *      alone and in order, but not idempotently: set max_in_flight = 1 for strict order
 *      under retries).
 *   3. fabric_consumer_t: assign partitions at an offset, poll records. No consumer groups:
 *      no subscribe, no rebalancing, no committed offsets (keep positions yourself and
 *      assign at them to resume; docs/C_CLIENT.md).
 *
 * Threading: an object is used from one thread at a time (ZeroMQ sockets are not
 * thread-safe). The producer has no background thread: the library does I/O inside
 * fabric_produce(), fabric_producer_poll() and fabric_producer_flush(), so an idle
 * application calls fabric_producer_poll() to let linger timers fire.
 *
 * Arguments: a NULL object, output pointer or required string gives
 * FABRIC_ERR_INVALID_ARGUMENT (the *_destroy functions accept NULL).
 *
 * Memory: every object is freed by its *_destroy / *_free function; nothing the library
 * returns needs free() by the caller. Every allocation driven by network input is
 * bounded by the limits below, checked before allocating.
 */
#ifndef FABRIC_H
#define FABRIC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FABRIC_VERSION_STRING "0.1.0"

/* ---- Limits (docs/PROTOCOL.md; same names as fabric/limits.py) ------------------------ */
#define FABRIC_PROTOCOL_MAGIC 0x31524246u /* the bytes "FBR1" read as a little-endian u32 */
#define FABRIC_PROTOCOL_VERSION 1
#define FABRIC_HEADER_BYTES 16
#define FABRIC_STRING_BYTES_MAX 65535
#define FABRIC_ARRAY_ITEMS_MAX 1000000u
#define FABRIC_REQUEST_FRAMES_MAX 4097 /* header + body + up to 4,095 batch frames */
#define FABRIC_RESPONSE_BYTES_MAX (256u * 1024u * 1024u) /* ZMQ_MAXMSGSIZE of our sockets */
#define FABRIC_BATCH_HEADER_BYTES 72
#define FABRIC_BATCH_RECORDS_MAX 1000000
#define FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX (64 * 1024 * 1024) /* 64 MiB */
#define FABRIC_RECORD_FIXED_BYTES 14 /* 3 x i32 + 1 x u16 per record in the columns */
#define FABRIC_NODES_MAX 1024        /* node addresses a client has sockets open to at once */

/* ---- Error codes ----------------------------------------------------------------------
 * 0..99 are the wire codes of docs/PROTOCOL.md section 7, with the same numbers. Negative
 * codes happen only inside this client. Functions return 0 or one of these. */
enum fabric_err {
    FABRIC_OK = 0,
    FABRIC_ERR_UNKNOWN_SERVER_ERROR = 1,
    FABRIC_ERR_CORRUPT_MESSAGE = 2,
    FABRIC_ERR_MALFORMED_REQUEST = 3,
    FABRIC_ERR_UNSUPPORTED_VERSION = 4,
    FABRIC_ERR_UNKNOWN_API = 5,
    FABRIC_ERR_INVALID_MAGIC = 6,
    FABRIC_ERR_UNKNOWN_TOPIC_OR_PARTITION = 7,
    FABRIC_ERR_NOT_LEADER = 8,
    FABRIC_ERR_LEADER_NOT_AVAILABLE = 9,
    FABRIC_ERR_OFFSET_OUT_OF_RANGE = 10,
    FABRIC_ERR_MESSAGE_TOO_LARGE = 11,
    FABRIC_ERR_DECOMPRESSION_LIMIT = 12,
    FABRIC_ERR_REQUEST_TIMED_OUT = 13,
    FABRIC_ERR_NOT_ENOUGH_REPLICAS = 14,
    FABRIC_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND = 15,
    FABRIC_ERR_FENCED_LEADER_EPOCH = 16,
    FABRIC_ERR_UNKNOWN_LEADER_EPOCH = 17,
    FABRIC_ERR_TOPIC_ALREADY_EXISTS = 18,
    FABRIC_ERR_INVALID_TOPIC = 19,
    FABRIC_ERR_INVALID_PARTITIONS = 20,
    FABRIC_ERR_INVALID_REPLICATION_FACTOR = 21,
    FABRIC_ERR_INVALID_CONFIG = 22,
    FABRIC_ERR_INVALID_REQUEST = 23,
    FABRIC_ERR_UNSUPPORTED_COMPRESSION = 24,
    FABRIC_ERR_NODE_NOT_READY = 25,
    FABRIC_ERR_STORAGE_ERROR = 26,
    FABRIC_ERR_NOT_CONTROLLER = 27,
    FABRIC_ERR_OUT_OF_ORDER_SEQUENCE = 28,
    FABRIC_ERR_INVALID_PRODUCER_EPOCH = 29,
    FABRIC_ERR_NOT_ACTIVE_SEQUENCER = 40,
    FABRIC_ERR_SEQUENCER_NOT_AVAILABLE = 41,
    FABRIC_ERR_INVALID_GLOBAL_ID = 42,
    FABRIC_ERR_STALE_SEQUENCER_EPOCH = 43,
    FABRIC_ERR_GLOBAL_ID_REGRESSION = 44,
    FABRIC_ERR_INVALID_ID_COUNT = 45,
    FABRIC_ERR_NO_SERVICE_AVAILABLE = 50,
    FABRIC_ERR_REQUEST_TIMEOUT = 51,
    FABRIC_ERR_REMOTE_ERROR = 52,
    FABRIC_ERR_SERVICE_OVERLOADED = 53,
    FABRIC_ERR_SERVICE_STOPPING = 54,
    /* consumer groups (docs/GROUPS.md) */
    FABRIC_ERR_UNKNOWN_MEMBER_ID = 60,
    FABRIC_ERR_FENCED_MEMBER_EPOCH = 61,
    FABRIC_ERR_GROUP_NOT_EMPTY = 62,
    FABRIC_ERR_NOT_COORDINATOR = 63,
    FABRIC_ERR_COORDINATOR_NOT_AVAILABLE = 64,
    FABRIC_ERR_COORDINATOR_LOAD_IN_PROGRESS = 65,
    FABRIC_ERR_INVALID_GROUP_ID = 66,
    FABRIC_ERR_GROUP_ID_NOT_FOUND = 67,
    FABRIC_ERR_UNRELEASED_INSTANCE_ID = 68,
    FABRIC_ERR_GROUP_MAX_SIZE_REACHED = 69,
    FABRIC_ERR_INVALID_VISIBILITY_TIMEOUT = 70, /* queues (docs/QUEUES.md): 70-77 */
    FABRIC_ERR_LEASE_NOT_HELD = 71,
    FABRIC_ERR_QUEUE_FULL = 72, /* retriable: backpressure */
    FABRIC_ERR_INVALID_QUEUE_CONFIG = 73,
    FABRIC_ERR_INVALID_DELAY = 74,
    FABRIC_ERR_INVALID_PRIORITY = 75,
    FABRIC_ERR_INVALID_RECEIVE_WAIT = 76,
    FABRIC_ERR_ALREADY_SETTLED = 77, /* finished in the group (acked, purged, dead-lettered): not delivered again */
    FABRIC_ERR_AUTHORIZATION_FAILED = 80,  /* an ACL does not allow the operation */
    FABRIC_ERR_AUTHENTICATION_FAILED = 81, /* CURVE key not registered, or wrong server key */
    FABRIC_ERR_THROTTLED = 82,             /* nothing written, retry: over quota, or past a request's lz4 budget */
    FABRIC_ERR_REASSIGNMENT_IN_PROGRESS = 90, /* the partition is already moving (fabric topic reassign) */
    FABRIC_ERR_FENCED_INSTANCE_ID = 91, /* consumer groups (60-69 is full): another consumer took this one's instance id */
    /* client-side only */
    FABRIC_ERR_INVALID_ARGUMENT = -1, /* a caller's argument is out of range */
    FABRIC_ERR_NO_MEMORY = -2,        /* malloc failed or a buffer limit was reached */
    FABRIC_ERR_TRANSPORT = -3,        /* a ZeroMQ call failed */
    FABRIC_ERR_NO_NODES = -4,         /* no bootstrap or known node answered METADATA */
    FABRIC_ERR_DELIVERY_TIMEOUT = -5, /* not acknowledged within delivery_timeout_ms */
    FABRIC_ERR_BUFFER_FULL = -6,      /* buffer_bytes_max stayed full for max_block_ms */
    FABRIC_ERR_CLOSED = -7            /* destroyed with records still unsent */
};
#define FABRIC_WIRE_ERROR_MAX 99 /* wire codes are 0..99; unassigned ones print UNKNOWN */

/* "NOT_LEADER"-style name; "NONE" for 0 (FABRIC_OK); "UNKNOWN" for codes outside the
 * table. Never NULL. */
const char *fabric_err_name(int code);
/* A sentence describing the code (the "meaning" column of PROTOCOL.md). Never NULL. */
const char *fabric_strerror(int code);
/* 1 if the same request may succeed later (refresh metadata, back off, retry). */
int fabric_err_retriable(int code);

/* ---- Records --------------------------------------------------------------------------- */
typedef struct fabric_header {
    const char *name; /* UTF-8, NOT NUL-terminated in decoded records: use name_len */
    size_t name_len;
    const void *value; /* NULL with value_len -1 = null value */
    int32_t value_len;
} fabric_header_t;

typedef struct fabric_record {
    const char *topic; /* set by the consumer; NULL from fabric_batch_decode */
    int32_t partition; /* set by the consumer; -1 from fabric_batch_decode */
    int64_t offset;
    int64_t timestamp_ms;
    const uint8_t *key; /* NULL and key_len -1 = null key */
    int32_t key_len;
    const uint8_t *value; /* NULL and value_len -1 = null value */
    int32_t value_len;
    const fabric_header_t *headers;
    uint32_t header_count;
} fabric_record_t;

#define FABRIC_CODEC_NONE 0
#define FABRIC_CODEC_LZ4 1

/* ---- Producer -------------------------------------------------------------------------- */
/* A delivery report, valid only during the callback: topic and message (and the struct
 * itself) may be freed as soon as the callback returns, so copy what you keep. */
typedef struct fabric_delivery {
    const char *topic;
    int32_t partition;
    int64_t base_offset; /* offset of the batch's first record; -1 on error or acks = 0 */
    uint32_t record_count;
    int error;           /* 0 or a fabric_err */
    const char *message; /* the node's explanation of error, or "" */
} fabric_delivery_t;

/* Called once per batch, inside the call that settles it: fabric_produce,
 * fabric_producer_poll, fabric_producer_flush or fabric_producer_destroy (CLOSED). From
 * the callback you may call fabric_produce (it only queues: the running call, or the next
 * one, sends the record; BUFFER_FULL at once instead of waiting for room),
 * fabric_producer_partition_count, _next_timeout_ms and _last_error (during destroy,
 * fabric_produce and fabric_producer_partition_count return FABRIC_ERR_CLOSED).
 * fabric_producer_flush and fabric_producer_poll return FABRIC_ERR_INVALID_ARGUMENT at once
 * (they would wait for the call that runs the callback), and fabric_producer_destroy does
 * nothing (it would free the producer under that call): set a flag, act after the call
 * returns. last_error says which call was refused. */
typedef void (*fabric_delivery_cb)(const fabric_delivery_t *delivery, void *opaque);

#define FABRIC_MAX_IN_FLIGHT_DEFAULT 5
#define FABRIC_MAX_IN_FLIGHT_MAX 100

typedef struct fabric_producer_config {
    int acks;                /* 0, 1 or -1 (all in-sync replicas); default -1, as the Python SDK */
    int linger_ms;           /* how long an open batch waits to fill; default 5 */
    size_t batch_bytes_max;  /* a batch closes at this many record bytes; default 256 KiB */
    int compression;         /* FABRIC_CODEC_NONE or FABRIC_CODEC_LZ4 (default) */
    size_t buffer_bytes_max; /* memory for unacknowledged records; default 64 MiB */
    int max_block_ms;        /* fabric_produce waits this long for buffer room; default 60000 */
    /* A request unanswered this long is retried (and a leader answers acks = -1 writes not
     * replicated by then with REQUEST_TIMED_OUT): default 30000. Keep it above the cluster's
     * session_timeout_ms + 1.6 s (7.6 s by default): shorter, a failover makes resends that
     * duplicate records (docs/C_CLIENT.md, "request_timeout_ms and failovers"). A request
     * whose connection drops first (the node died, shut down or restarted) is failed then, not
     * after this timeout (its answer cannot come), and retried as NODE_NOT_READY: METADATA
     * refresh, retry_backoff_ms, the same batch bytes in order. */
    int request_timeout_ms;
    int delivery_timeout_ms; /* give up on a batch after this long; default 120000 */
    int retry_backoff_ms;    /* wait between retries of a batch; default 100 */
    fabric_delivery_cb on_delivery; /* called once per batch, from the producer's calls (above) */
    void *opaque;                   /* passed to on_delivery */
    /* Secure clusters (docs/SECURITY.md): the client's NAME.key_secret file and the
     * cluster's public key (40 Z85 characters, or a cluster.key file). Both NULL: taken
     * from $FABRIC_KEY_FILE and $FABRIC_SERVER_KEY, else plaintext. */
    const char *curve_key_file;
    const char *curve_server_key;
    /* Batches of one partition sent before the first is answered (pipelining, as Kafka's
     * max.in.flight.requests.per.connection); default 5, at most FABRIC_MAX_IN_FLIGHT_MAX.
     * A failed batch is resent alone and in order; without idempotence (this client has
     * none) a resend may still duplicate what the node had written. */
    int max_in_flight;
} fabric_producer_config_t;

typedef struct fabric_producer fabric_producer_t;

void fabric_producer_config_init(fabric_producer_config_t *config);
/* bootstrap: "tcp://host:port[,tcp://host:port...]" (the "tcp://" may be left out; an
 * address that is not HOST:PORT, or zk://, is INVALID_ARGUMENT). config NULL: the defaults.
 * Connects lazily; the first METADATA happens at the first fabric_produce of a topic. */
int fabric_producer_new(fabric_producer_t **out, const char *bootstrap,
                        const fabric_producer_config_t *config);
/* Queue one record. partition -1 = by key (crc32(key) % partitions) or, without a key,
 * sticky round robin. key_len/value_len -1 = null. timestamp_ms -1 (any negative) = now.
 * Header names must be UTF-8 of at most 65535 bytes. The bytes are copied. Returns 0 or:
 *   INVALID_ARGUMENT   a NULL pointer, a length below -1, partition below -1, a header name
 *                      not UTF-8 or over 65535 bytes, a topic name over 65535 bytes;
 *   NO_NODES           no node answered METADATA within max_block_ms (the first record of
 *                      a topic, or a partition past the known count, asks for it);
 *   UNKNOWN_TOPIC_OR_PARTITION  no such topic; or a partition past the topic's count, after
 *                      asking METADATA again for up to 3 s (PARTITION_LEARN_WAIT_MS, within
 *                      max_block_ms) in case it was just added;
 *   the topic's error  for a topic not known before, as METADATA listed it: LEADER_NOT_AVAILABLE,
 *                      AUTHORIZATION_FAILED, ... (a negative code as UNKNOWN_SERVER_ERROR);
 *   MESSAGE_TOO_LARGE  the record plus the 72-byte batch header is above the topic's
 *                      message_bytes_max (or the record above 64 MiB);
 *   BUFFER_FULL        buffer_bytes_max stayed full for max_block_ms (at once from a callback);
 *   NO_MEMORY;
 *   CLOSED             called from a delivery callback of fabric_producer_destroy.
 * A failure after queueing (a node's error, a timeout) goes to the delivery callback. */
int fabric_produce(fabric_producer_t *p, const char *topic, int32_t partition,
                   const void *key, int32_t key_len, const void *value, int32_t value_len,
                   const fabric_header_t *headers, size_t header_count, int64_t timestamp_ms);
/* Do I/O: send ready batches, read answers, fire delivery callbacks. Returns 0 (or
 * INVALID_ARGUMENT from a delivery callback). It returns early, so it does not pace a loop:
 *   - nothing pending (no record buffered, unsent or unanswered) when called: after one
 *     wait of min(timeout_ms, 100) ms;
 *   - else as soon as nothing is pending any more (every record's callback has run),
 *     or at timeout_ms, whichever comes first.
 * While nodes are down it can end up to about 2 s late (docs/C_CLIENT.md, Blocking). */
int fabric_producer_poll(fabric_producer_t *p, int timeout_ms);
/* Milliseconds until the producer next needs fabric_producer_poll (-1 = nothing pending). */
int fabric_producer_next_timeout_ms(fabric_producer_t *p);
/* Send everything buffered and wait until each batch is acknowledged or failed (records
 * produced from callbacks meanwhile included). Returns 0, REQUEST_TIMED_OUT if timeout_ms
 * passed first (-1 = no limit), or INVALID_ARGUMENT at once from a delivery callback. */
int fabric_producer_flush(fabric_producer_t *p, int timeout_ms);
/* Partition count of a topic (fetching metadata if needed). */
int fabric_producer_partition_count(fabric_producer_t *p, const char *topic, int32_t *count);
/* The message of the last error this producer saw, for logs. Never NULL. */
const char *fabric_producer_last_error(const fabric_producer_t *p);
/* Frees everything. Records not yet acknowledged are reported with FABRIC_ERR_CLOSED:
 * call fabric_producer_flush first. From a delivery callback it does nothing (last_error
 * says so): destroy after the call that ran the callback returns. */
void fabric_producer_destroy(fabric_producer_t *p);

/* ---- Consumer -------------------------------------------------------------------------- */
#define FABRIC_OFFSET_END (-1)       /* the high watermark: only records produced from now */
#define FABRIC_OFFSET_BEGINNING (-2) /* the log start offset */

#define FABRIC_RESET_EARLIEST 0 /* on OFFSET_OUT_OF_RANGE jump to the log start */
#define FABRIC_RESET_LATEST 1   /* ... to the log end */
#define FABRIC_RESET_NONE 2     /* ... return the error to the caller */

typedef struct fabric_consumer_config {
    int max_wait_ms;            /* long-poll time of one FETCH; default 500 */
    int32_t max_bytes;          /* budget of one FETCH response; default 16 MiB */
    int32_t partition_bytes_max;/* budget per partition; default 4 MiB */
    int request_timeout_ms;     /* default 30000 */
    int retry_backoff_ms;       /* default 100 */
    int offset_reset;           /* FABRIC_RESET_*; default EARLIEST */
    const char *curve_key_file;   /* as in fabric_producer_config_t; NULL: $FABRIC_KEY_FILE */
    const char *curve_server_key; /* NULL: $FABRIC_SERVER_KEY */
    /* How long polls wait, counted across polls, for METADATA to map an assigned partition's
     * topic that the answers list with a retriable error (LEADER_NOT_AVAILABLE,
     * NODE_NOT_READY, ...) or leave without partitions; then a poll returns
     * FABRIC_ERR_REQUEST_TIMED_OUT and the next one waits anew. Default 60000 (as the
     * producer's max_block_ms); -1 = no limit. */
    int metadata_wait_ms;
} fabric_consumer_config_t;

typedef struct fabric_consumer fabric_consumer_t;

void fabric_consumer_config_init(fabric_consumer_config_t *config);
/* bootstrap as for fabric_producer_new; config NULL: the defaults. */
int fabric_consumer_new(fabric_consumer_t **out, const char *bootstrap,
                        const fabric_consumer_config_t *config);
/* Add a partition to read from offset (>= 0, FABRIC_OFFSET_BEGINNING or FABRIC_OFFSET_END).
 * Assigning a partition already assigned moves its position there: this is the seek.
 * There is no unassign (a consumer reads its partitions until destroyed; at most 10,000).
 * Any assign drops the records fetched and not yet returned (of every partition; they are
 * fetched again) and the record the last poll returned. No request is made here. */
int fabric_consumer_assign(fabric_consumer_t *c, const char *topic, int32_t partition,
                           int64_t offset);
/* The next record, waiting up to timeout_ms. *record is NULL when none came in time
 * (return value 0). The record and its bytes stay valid until the next poll, assign or
 * destroy. REQUEST_TIMED_OUT when an assigned partition's topic had no map for
 * metadata_wait_ms; UNKNOWN_TOPIC_OR_PARTITION for a topic no node knows, or for a
 * partition past the topic's count once METADATA has been asked again for 3 s
 * (PARTITION_LEARN_WAIT_MS; polls meanwhile return no record); a topic's other errors as
 * METADATA lists them; OFFSET_OUT_OF_RANGE with FABRIC_RESET_NONE; a FETCH's errors that
 * are not retriable (CORRUPT_MESSAGE, ...); INVALID_ARGUMENT with nothing assigned. One FETCH at a time goes to one leader, and its
 * answer's records are all handed out before the next FETCH (docs/C_CLIENT.md, Consumer).
 * A FETCH whose answer has not come when timeout_ms runs out stays pending for the next
 * poll (given up after max_wait_ms + request_timeout_ms, or as soon as its connection drops:
 * then fetched again after a METADATA refresh and retry_backoff_ms); a poll waits at most
 * 100 ms past timeout_ms for the answer of a FETCH it has just sent. */
int fabric_consumer_poll(fabric_consumer_t *c, int timeout_ms, const fabric_record_t **record);
/* The partition's position: the offset after the last record returned (or the offset
 * assigned), where the next fetch starts; the next record returned is at it or, past a
 * gap, above it. No request is made: after assign with FABRIC_OFFSET_BEGINNING or
 * FABRIC_OFFSET_END it is that constant (-2 or -1) until a poll has resolved it by
 * LIST_OFFSETS (the first poll, unless the leader could not be asked), and again after an
 * OFFSET_OUT_OF_RANGE reset that goes by LIST_OFFSETS. Returns 0, or
 * UNKNOWN_TOPIC_OR_PARTITION for a partition not assigned. */
int fabric_consumer_position(fabric_consumer_t *c, const char *topic, int32_t partition,
                             int64_t *offset);
const char *fabric_consumer_last_error(const fabric_consumer_t *c);
void fabric_consumer_destroy(fabric_consumer_t *c);

/* Partition count of a topic, via METADATA to the bootstrap nodes in turn (for tools),
 * ending by timeout_ms (-1: no limit; each node first for 0.5 s, then for at most 5 s; at
 * least one 250 ms attempt). */
int fabric_topic_partition_count(const char *bootstrap, const char *topic, int timeout_ms,
                                 int32_t *count);

/* ---- Key hash (PROTOCOL.md section 6) --------------------------------------------------- */
uint32_t fabric_key_hash(const void *key, size_t key_len);
int32_t fabric_partition_for_key(const void *key, size_t key_len, int32_t partition_count);

#ifdef __cplusplus
}
#endif

#include "fabric_protocol.h"

#endif /* FABRIC_H */
