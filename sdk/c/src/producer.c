/*
 * producer.c: records -> per-partition batches -> PRODUCE requests, with retries.
 *
 * Shape (as in aiokafka's accumulator and the Python SDK): every partition has one open
 * batch builder and a FIFO of closed, encoded batches. A batch closes when the next
 * record would push it past batch_bytes_max, or linger_ms after its first record. Ready
 * batches are grouped by leader into one PRODUCE request per node (up to
 * REQUEST_BATCHES_MAX). Up to max_in_flight batches per partition are in flight; a retry
 * (same bytes, after a METADATA refresh and retry_backoff_ms) is resent alone once nothing
 * else of its partition is in flight, in creation order. Without idempotence a later batch
 * that succeeded while an earlier one failed lands first: max_in_flight = 1 keeps order.
 *
 * No background thread: I/O happens inside fabric_produce (when a batch closed, a timer
 * is due, or every IO_EVERY_RECORDS records while requests are in flight),
 * fabric_producer_poll and fabric_producer_flush.
 *
 * Delivery callbacks run inside those calls (and fabric_producer_destroy), in the middle of
 * a turn of the state machine. So a callback may queue records (fabric_produce only queues
 * there: the running call sends them) but not start a turn of its own: flush and poll
 * there are refused (flush waited for the call running it, its whole timeout), and destroy
 * is ignored (it freed the producer under that call). See in_callback.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>
#include <unistd.h>

#define REQUEST_BATCHES_MAX 64      /* batches per PRODUCE request to one node */
#define IO_EVERY_RECORDS 64         /* fabric_produce checks for answers this often */
#define PRODUCE_TIMEOUT_MS_MAX 300000 /* the node refuses a larger timeout_ms */
#define POLL_SLICE_MS_MAX 100        /* the longest single wait inside poll/flush */

typedef struct pqueue pqueue_t;

typedef struct pbatch {
    struct pbatch *next;
    pqueue_t *queue;
    fabric_buf_t bytes; /* the encoded batch frame, resent as is on retry */
    uint32_t record_count;
    size_t buffered_bytes; /* what this batch counts against buffer_bytes_max */
    int64_t created_ms;
    int64_t retry_after_ms;
    int attempts;
    uint64_t order; /* creation order: a failed batch is requeued by it */
    int slots;      /* in-flight slots of its partition it holds while sent */
    /* Its last retriable failure (0 and NULL: none), said when it expires or is destroyed
     * unsent. A send's own failure, such as a leader's data socket refusing the handshake
     * ("node ... refused the connection: ..."), was otherwise lost: the batch was failed later
     * with "not sent within delivery_timeout_ms" and no reason. */
    int last_error;
    char *last_message;
} pbatch_t;

typedef struct ptopic ptopic_t;

struct pqueue {
    ptopic_t *topic;
    int32_t partition;
    fabric_batch_builder_t open;
    int64_t open_since_ms;
    size_t open_buffered_bytes;
    pbatch_t *head, *tail; /* closed batches, oldest first */
    int in_flight; /* slots in flight: up to max_in_flight batches, or one resend alone */
};

struct ptopic {
    char *name;
    int32_t partition_count;
    pqueue_t **queues; /* partition_count of them */
    int32_t sticky;    /* the partition keyless records go to now */
    size_t sticky_bytes; /* keyless bytes the sticky partition took since it became sticky */
};

/* A conn read_answers polls: where its data socket and monitor are in the poll set. */
typedef struct polled {
    size_t conn_index;
    size_t data_item;
    size_t monitor_item; /* NO_MONITOR when the conn has none */
} polled_t;
#define NO_MONITOR ((size_t)-1)

typedef struct inflight {
    uint32_t correlation_id;
    size_t conn_index;
    int64_t sent_ms;
    uint32_t drops; /* its conn's drops when sent: once they are more, the answer is lost */
    pbatch_t *batches[REQUEST_BATCHES_MAX];
    size_t count;
} inflight_t;

struct fabric_producer {
    client_t client;
    uint32_t sticky_start; /* where each topic's keyless records start: random per producer */
    fabric_producer_config_t cfg;
    fabric_batch_options_t batch_options;
    ptopic_t **topics;
    size_t topic_count;
    inflight_t *inflight;
    size_t inflight_count, inflight_cap;
    /* read_answers' poll set, kept between turns (on the stack, two items for each of
     * FABRIC_NODES_MAX conns took 48 KiB): busy conns' data sockets and monitors. */
    zmq_pollitem_t *poll_items;
    polled_t *polled;
    size_t poll_cap; /* conns both have room for */
    size_t buffered_bytes;
    size_t batches_pending; /* closed and not yet acknowledged or failed */
    size_t open_records;    /* records in open builders */
    int refresh_needed;
    int64_t refresh_after_ms;
    int64_t next_timer_ms; /* earliest linger, retry or request deadline; INT64_MAX = none */
    int flushing;
    unsigned records_since_io;
    uint64_t next_order;
    /* Until when the sends of this turn may wait for a connection (service: CONNECT_WAIT_MS
     * from its start, for all of them together). Each send to a node with no connection
     * waited CONNECT_WAIT_MS of its own, twice a turn: with three stopped leaders a turn took
     * 6 s, and a batch past delivery_timeout_ms was failed seconds late (send_group). */
    int64_t send_wait_until;
    int callback_depth; /* delivery callbacks running now: see in_callback */
    int destroying;     /* fabric_producer_destroy is reporting what it fails: refuse records */
};

void fabric_producer_config_init(fabric_producer_config_t *c) {
    memset(c, 0, sizeof *c);
    c->acks = -1; /* all in-sync replicas: the same default as the Python SDK and `fabric produce` */
    c->linger_ms = 5;
    c->batch_bytes_max = 256 * 1024;
    c->compression = FABRIC_CODEC_LZ4;
    c->buffer_bytes_max = 64 * 1024 * 1024;
    c->max_block_ms = 60000;
    c->request_timeout_ms = 30000;
    c->delivery_timeout_ms = 120000;
    c->retry_backoff_ms = 100;
    c->max_in_flight = FABRIC_MAX_IN_FLIGHT_DEFAULT;
}

int fabric_producer_new(fabric_producer_t **out, const char *bootstrap,
                        const fabric_producer_config_t *config) {
    if (out == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    *out = NULL;
    fabric_producer_config_t cfg;
    if (config) cfg = *config;
    else fabric_producer_config_init(&cfg);
    if ((cfg.acks != 0 && cfg.acks != 1 && cfg.acks != -1) || cfg.linger_ms < 0 ||
        cfg.batch_bytes_max == 0 || cfg.batch_bytes_max > FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX ||
        (cfg.compression != FABRIC_CODEC_NONE && cfg.compression != FABRIC_CODEC_LZ4) ||
        cfg.buffer_bytes_max < cfg.batch_bytes_max || cfg.max_block_ms < 0 ||
        cfg.request_timeout_ms <= 0 || cfg.delivery_timeout_ms < cfg.request_timeout_ms ||
        cfg.retry_backoff_ms < 0 || cfg.max_in_flight < 1 || cfg.max_in_flight > FABRIC_MAX_IN_FLIGHT_MAX)
        return FABRIC_ERR_INVALID_ARGUMENT;
    fabric_producer_t *p = calloc(1, sizeof *p);
    if (p == NULL) return FABRIC_ERR_NO_MEMORY;
    int rc = client_init(&p->client, bootstrap);
    if (rc) {
        free(p);
        return rc;
    }
    rc = client_set_curve(&p->client, cfg.curve_key_file, cfg.curve_server_key);
    if (rc) {
        client_close(&p->client);
        free(p);
        return rc;
    }
    p->client.data_linger_ms = cfg.acks == 0 ? ACKS0_CLOSE_LINGER_MS : 0;
    p->cfg = cfg;
    fabric_batch_options_init(&p->batch_options);
    p->batch_options.codec = cfg.compression;
    p->batch_options.adaptive = 1; /* incompressible records go uncompressed, as the Python producer */
    p->next_timer_ms = INT64_MAX;
    /* Random, as Kafka's sticky partitioner and the Python producer: many producers (a
     * batch job's tasks, short-lived tools) spread over the partitions instead of all
     * opening on partition 0. */
    if (getrandom(&p->sticky_start, sizeof p->sticky_start, GRND_NONBLOCK) != (ssize_t)sizeof p->sticky_start)
        p->sticky_start = (uint32_t)now_ms() ^ (uint32_t)getpid() * 2654435761u;
    *out = p;
    return 0;
}

const char *fabric_producer_last_error(const fabric_producer_t *p) { return p ? p->client.error : ""; }

/* ---- topics and queues ---------------------------------------------------------------------- */
static ptopic_t *find_topic(fabric_producer_t *p, const char *name) {
    for (size_t i = 0; i < p->topic_count; i++) {
        if (strcmp(p->topics[i]->name, name) == 0) return p->topics[i];
    }
    return NULL;
}

/* Grow a topic's queues to the partition count in the routing map. Out of memory part of
 * the way, the topic keeps the queues made so far (partition_count says how many). */
static int sync_partitions(ptopic_t *t, int32_t count) {
    if (count <= t->partition_count) return 0;
    pqueue_t **queues = realloc(t->queues, sizeof *queues * (size_t)count);
    if (queues == NULL) return FABRIC_ERR_NO_MEMORY;
    t->queues = queues;
    for (int32_t i = t->partition_count; i < count; i++) {
        pqueue_t *q = calloc(1, sizeof *q);
        if (q == NULL) return FABRIC_ERR_NO_MEMORY;
        q->topic = t;
        q->partition = i;
        fabric_batch_builder_init(&q->open);
        t->queues[i] = q;
        t->partition_count = i + 1;
    }
    return 0;
}

/* A topic's queues, builders and name; its batches must be gone (delivered or failed). */
static void free_topic(ptopic_t *t) {
    for (int32_t i = 0; i < t->partition_count; i++) {
        fabric_batch_builder_free(&t->queues[i]->open);
        free(t->queues[i]);
    }
    free(t->queues);
    free(t->name);
    free(t);
}

static int refresh(fabric_producer_t *p, const char *extra_topic, int64_t deadline_ms) {
    const char **names = malloc(sizeof(char *) * (p->topic_count + 1));
    if (names == NULL) return FABRIC_ERR_NO_MEMORY;
    size_t n = 0;
    for (size_t i = 0; i < p->topic_count; i++) names[n++] = p->topics[i]->name;
    if (extra_topic) names[n++] = extra_topic;
    int rc = client_refresh_metadata(&p->client, names, n, deadline_ms);
    free(names);
    if (rc) return rc;
    /* Requests in flight hold their conn by index (inflight_t.conn_index): those stay open.
     * So does every conn while a delivery callback runs (a fabric_produce there asking about
     * a new topic): the turn it interrupts may hold a conn for a request it has yet to send. */
    if (p->callback_depth == 0) {
        uint8_t busy[FABRIC_NODES_MAX] = {0};
        for (size_t i = 0; i < p->inflight_count; i++) busy[p->inflight[i].conn_index] = 1;
        client_close_unused_conns(&p->client, busy);
    }
    for (size_t i = 0; i < p->topic_count; i++) {
        const topic_meta_t *m = client_topic(&p->client, p->topics[i]->name);
        if (m && m->error == 0 && (rc = sync_partitions(p->topics[i], m->partition_count))) return rc;
    }
    return 0;
}

static int topic_for_send(fabric_producer_t *p, const char *name, ptopic_t **out) {
    ptopic_t *t = find_topic(p, name);
    if (t) {
        *out = t;
        return 0;
    }
    const topic_meta_t *m = client_topic(&p->client, name);
    if (m == NULL || m->error) {
        int rc = refresh(p, name, now_ms() + p->cfg.max_block_ms);
        if (rc) return rc;
        m = client_topic(&p->client, name);
    }
    if (m == NULL || m->error || m->partition_count == 0) {
        int code = m && m->error ? m->error : FABRIC_ERR_UNKNOWN_TOPIC_OR_PARTITION;
        client_set_error(&p->client, "topic %s: %s", name, fabric_err_name(code));
        return code;
    }
    ptopic_t **topics = realloc(p->topics, sizeof *topics * (p->topic_count + 1));
    if (topics == NULL) return FABRIC_ERR_NO_MEMORY;
    p->topics = topics;
    t = calloc(1, sizeof *t);
    if (t == NULL) return FABRIC_ERR_NO_MEMORY;
    t->name = malloc(strlen(name) + 1);
    /* Registered only with all its queues: every use of a topic (the key hash, the sticky
     * partition, queues[partition]) takes partition_count >= 1 for granted, and a topic
     * left with none divided by zero on its next keyless record. */
    int rc = t->name ? sync_partitions(t, m->partition_count) : FABRIC_ERR_NO_MEMORY;
    if (rc) {
        free_topic(t);
        client_set_error(&p->client, "topic %s: out of memory registering its %d partitions", name,
                         (int)m->partition_count);
        return rc;
    }
    strcpy(t->name, name);
    t->sticky = (int32_t)(p->sticky_start % (uint32_t)t->partition_count);
    p->topics[p->topic_count++] = t;
    *out = t;
    return 0;
}

/* ``partition`` is past the cached count: it may have been added since (the cache learns of
 * added partitions only on a refresh), so ask again, every PARTITION_LEARN_PAUSE_MS for up
 * to PARTITION_LEARN_WAIT_MS within max_block_ms, before calling it unknown. */
static int learn_partition(fabric_producer_t *p, ptopic_t *t, int32_t partition) {
    int64_t wait_ms = p->cfg.max_block_ms < PARTITION_LEARN_WAIT_MS ? p->cfg.max_block_ms : PARTITION_LEARN_WAIT_MS;
    int64_t deadline = now_ms() + wait_ms;
    int rc = 0;
    for (;;) {
        rc = refresh(p, NULL, deadline);
        if (rc == 0 && partition < t->partition_count) return 0;
        if (now_ms() >= deadline) break;
        struct timespec pause = {0, PARTITION_LEARN_PAUSE_MS * 1000000L};
        nanosleep(&pause, NULL);
    }
    if (rc) return rc; /* no answer at all: say that, not "no such partition" */
    client_set_error(&p->client, "topic %s has no partition %d (it has %d)", t->name, partition,
                     t->partition_count);
    return FABRIC_ERR_UNKNOWN_TOPIC_OR_PARTITION;
}

/* From a callback of fabric_producer_destroy: its topics are being freed. */
static int refuse_while_destroying(fabric_producer_t *p, const char *call) {
    if (!p->destroying) return 0;
    client_set_error(&p->client, "%s from a delivery callback of fabric_producer_destroy: the producer is closed",
                     call);
    return 1;
}

int fabric_producer_partition_count(fabric_producer_t *p, const char *topic, int32_t *count) {
    if (p == NULL || topic == NULL || count == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    if (refuse_while_destroying(p, "fabric_producer_partition_count")) return FABRIC_ERR_CLOSED;
    ptopic_t *t;
    int rc = topic_for_send(p, topic, &t);
    if (rc == 0) *count = t->partition_count;
    return rc;
}

/* ---- batches -------------------------------------------------------------------------------- */
static void timer_at(fabric_producer_t *p, int64_t when_ms) {
    if (when_ms < p->next_timer_ms) p->next_timer_ms = when_ms;
}

/* A delivery callback, with callback_depth counting it (see in_callback). */
static void report(fabric_producer_t *p, const fabric_delivery_t *d) {
    p->callback_depth++;
    p->cfg.on_delivery(d, p->cfg.opaque);
    p->callback_depth--;
}

/* Called from the library's own calls only: with a delivery callback running, a flush or
 * poll would start a turn inside the turn that runs the callback (flush waited for itself,
 * as long as its timeout), and destroy would free what that turn goes on using. The Python
 * producer raises RuntimeError for flush() from a callback for the same reason. */
static int in_callback(fabric_producer_t *p, const char *call) {
    if (p->callback_depth == 0) return 0;
    client_set_error(&p->client,
                     "%s from a delivery callback %s: the callback runs inside the fabric_produce, "
                     "fabric_producer_poll, fabric_producer_flush or fabric_producer_destroy that "
                     "delivers the batch; call it after that call returns",
                     call, strcmp(call, "fabric_producer_destroy") == 0 ? "ignored" : "refused");
    return 1;
}

static void deliver(fabric_producer_t *p, pbatch_t *b, int64_t base_offset, int error,
                    const char *message) {
    /* Accounted before the callback: a record it produces finds the batch's room free. */
    p->buffered_bytes -= b->buffered_bytes;
    p->batches_pending--;
    if (p->cfg.on_delivery) {
        fabric_delivery_t d = {b->queue->topic->name, b->queue->partition, base_offset,
                               b->record_count,       error,             message ? message : ""};
        report(p, &d);
    }
    fabric_buf_free(&b->bytes);
    free(b->last_message);
    free(b);
}

/* Report records that never made it into a closed batch (encoding failed). */
static void fail_open(fabric_producer_t *p, pqueue_t *q, int error, const char *message) {
    /* The builder is emptied before the callback: a record the callback produces to this
     * partition opens a new batch instead of being dropped with the failed ones. */
    uint32_t record_count = (uint32_t)q->open.record_count;
    p->open_records -= (size_t)record_count;
    p->buffered_bytes -= q->open_buffered_bytes;
    q->open_buffered_bytes = 0;
    fabric_batch_builder_reset(&q->open);
    if (p->cfg.on_delivery && record_count) {
        fabric_delivery_t d = {q->topic->name, q->partition, -1, record_count, error, message};
        report(p, &d);
    }
}

static void close_open_batch(fabric_producer_t *p, pqueue_t *q, int64_t now) {
    if (q->open.record_count == 0) return;
    pbatch_t *b = calloc(1, sizeof *b);
    if (b == NULL) {
        fail_open(p, q, FABRIC_ERR_NO_MEMORY, "out of memory closing the batch");
        return;
    }
    fabric_buf_init(&b->bytes);
    int rc = fabric_batch_builder_finish(&q->open, &p->batch_options, &b->bytes);
    if (rc) {
        fabric_buf_free(&b->bytes);
        free(b);
        fail_open(p, q, rc, "the batch could not be encoded");
        return;
    }
    b->queue = q;
    b->record_count = (uint32_t)q->open.record_count;
    b->buffered_bytes = q->open_buffered_bytes;
    b->created_ms = q->open_since_ms;
    b->retry_after_ms = now;
    b->order = p->next_order++;
    p->open_records -= (size_t)q->open.record_count;
    q->open_buffered_bytes = 0;
    fabric_batch_builder_reset(&q->open);
    if (q->tail) q->tail->next = b;
    else q->head = b;
    q->tail = b;
    p->batches_pending++;
    timer_at(p, now);
}

/* Back into its queue in creation order: batches of a partition that failed together (several
 * were in flight) are resent in the order they were first sent. */
static void requeue_in_order(pqueue_t *q, pbatch_t *b) {
    pbatch_t **at = &q->head;
    while (*at != NULL && (*at)->order < b->order) at = &(*at)->next;
    b->next = *at;
    *at = b;
    if (b->next == NULL) q->tail = b;
}

/* A sent batch's answer came (or never will): its partition may send again. */
static void release_slots(pbatch_t *b) {
    b->queue->in_flight -= b->slots;
    b->slots = 0;
}

/* b is past delivery_timeout_ms: fail it with the last error it had (error 0: none). */
static void expire(fabric_producer_t *p, pbatch_t *b, int error, const char *message) {
    if (error == 0) {
        deliver(p, b, -1, FABRIC_ERR_DELIVERY_TIMEOUT, "not sent within delivery_timeout_ms");
        return;
    }
    char text[ERROR_TEXT_BYTES];
    snprintf(text, sizeof text,
             "not acknowledged within delivery_timeout_ms=%d after %d attempts; last "
             "error %s: %s",
             p->cfg.delivery_timeout_ms, b->attempts, fabric_err_name(error), message ? message : "");
    deliver(p, b, -1, FABRIC_ERR_DELIVERY_TIMEOUT, text);
}

static void retry_or_fail(fabric_producer_t *p, pbatch_t *b, int error, const char *message,
                          int64_t now) {
    if (fabric_err_retriable(error)) {
        if (now - b->created_ms >= p->cfg.delivery_timeout_ms) {
            expire(p, b, error, message);
            return;
        }
        /* Kept for expire and destroy; without memory for the text, the code alone. */
        free(b->last_message);
        b->last_error = error;
        b->last_message = strdup(message ? message : "");
        p->refresh_needed = 1;
        b->retry_after_ms = now + p->cfg.retry_backoff_ms;
        timer_at(p, b->retry_after_ms);
        requeue_in_order(b->queue, b);
        return;
    }
    /* The topic's limit may have been lowered (ALTER_TOPIC_CONFIGS): ask again, so that the
     * next batches close at the new one instead of being refused too (as the Python producer). */
    if (error == FABRIC_ERR_MESSAGE_TOO_LARGE) p->refresh_needed = 1;
    deliver(p, b, -1, error, message);
}

/* ---- sending --------------------------------------------------------------------------------- */
static size_t conn_index(fabric_producer_t *p, conn_t *conn) {
    return (size_t)(conn - p->client.conns);
}

static inflight_t *new_inflight(fabric_producer_t *p) {
    if (p->inflight_count == p->inflight_cap) {
        size_t cap = p->inflight_cap ? p->inflight_cap * 2 : 16;
        inflight_t *grown = realloc(p->inflight, cap * sizeof *grown);
        if (grown == NULL) return NULL;
        p->inflight = grown;
        p->inflight_cap = cap;
    }
    inflight_t *f = &p->inflight[p->inflight_count++];
    memset(f, 0, sizeof *f);
    return f;
}

/* Whether a request in flight on conns[ci] went out before the connection dropped (its answer
 * will not come: conn_t.drops), as far as the conn's monitor has been read. */
static int lost_on(const fabric_producer_t *p, size_t ci) {
    for (size_t i = 0; i < p->inflight_count; i++)
        if (p->inflight[i].conn_index == ci && p->inflight[i].drops != p->client.conns[ci].drops) return 1;
    return 0;
}

static void send_group(fabric_producer_t *p, conn_t *conn, pbatch_t **batches, size_t count,
                       int64_t now) {
    fabric_buf_t body;
    fabric_buf_init(&body);
    int32_t timeout_ms = p->cfg.request_timeout_ms > PRODUCE_TIMEOUT_MS_MAX ? PRODUCE_TIMEOUT_MS_MAX
                                                                            : p->cfg.request_timeout_ms;
    fabric_buf_put_u8(&body, (uint8_t)(int8_t)p->cfg.acks);
    fabric_buf_put_u32(&body, (uint32_t)timeout_ms);
    fabric_buf_put_u32(&body, (uint32_t)count);
    const fabric_buf_t *frames[REQUEST_BATCHES_MAX];
    for (size_t i = 0; i < count; i++) {
        const char *name = batches[i]->queue->topic->name;
        fabric_buf_put_str(&body, name, strlen(name));
        fabric_buf_put_u32(&body, (uint32_t)batches[i]->queue->partition);
        frames[i] = &batches[i]->bytes;
    }
    uint32_t id = client_next_id(&p->client);
    size_t ci = conn_index(p, conn);
    /* Read just before the send, so that a drop before it is not taken for one after it. */
    uint32_t drops = client_drops(conn);
    int rc = body.err;
    if (rc == 0 && lost_on(p, ci)) {
        /* Requests went out on this node's connection before it dropped: they are resent first,
         * in their order (check_timeouts), and these wait behind them rather than overtake them
         * on the new connection. */
        client_set_error(&p->client, "the connection to %.300s dropped with requests in flight",
                         conn->address);
        rc = FABRIC_ERR_NODE_NOT_READY;
    }
    if (rc == 0) {
        /* The wait for a connection is bounded by what is left of the turn's (send_wait_until)
         * and by the earliest delivery deadline of these batches, so that a batch that cannot
         * be sent is failed at delivery_timeout_ms, not a wait later. */
        int64_t until = p->send_wait_until;
        for (size_t i = 0; i < count; i++)
            if (batches[i]->created_ms + p->cfg.delivery_timeout_ms < until)
                until = batches[i]->created_ms + p->cfg.delivery_timeout_ms;
        int64_t wait_ms = until - now_ms();
        rc = client_send_within(&p->client, conn->data, conn->address, FABRIC_API_PRODUCE, id, &body,
                                frames, count, wait_ms <= 0 ? 0 : wait_ms > CONNECT_WAIT_MS ? CONNECT_WAIT_MS : (int)wait_ms);
    }
    fabric_buf_free(&body);
    if (rc) {
        p->refresh_needed = 1;
        /* The time now, not the turn's: the send may have waited, and a batch past its
         * delivery deadline by then is failed here rather than requeued for another turn. */
        now = now_ms();
        for (size_t i = 0; i < count; i++) {
            release_slots(batches[i]);
            retry_or_fail(p, batches[i], rc == FABRIC_ERR_TRANSPORT ? FABRIC_ERR_NODE_NOT_READY : rc,
                          p->client.error, now);
        }
        return;
    }
    for (size_t i = 0; i < count; i++) batches[i]->attempts++;
    if (p->cfg.acks == 0) {
        /* No answer will come: the records are done once ZeroMQ has them. */
        for (size_t i = 0; i < count; i++) {
            release_slots(batches[i]);
            deliver(p, batches[i], -1, 0, "");
        }
        return;
    }
    inflight_t *f = new_inflight(p);
    if (f == NULL) {
        /* Sent, but we cannot track it: treat as a timeout so the batches are retried. */
        for (size_t i = 0; i < count; i++) {
            release_slots(batches[i]);
            retry_or_fail(p, batches[i], FABRIC_ERR_REQUEST_TIMED_OUT, "out of memory", now);
        }
        return;
    }
    f->correlation_id = id;
    f->conn_index = ci;
    f->sent_ms = now;
    f->drops = drops;
    f->count = count;
    memcpy(f->batches, batches, count * sizeof *batches);
    timer_at(p, now + p->cfg.request_timeout_ms);
}

/* Send the oldest closed batches of every partition, up to max_in_flight per partition
 * (pipelining). A resend (attempts > 0) goes only when nothing of its partition is in
 * flight, and alone, as Kafka's producer does, so that resends keep their order. */
static void send_ready(fabric_producer_t *p, int64_t now) {
    /* Collected per node: groups[i] holds the ready batches for conns[i]. */
    static const size_t NONE = (size_t)-1;
    size_t group_of_conn[FABRIC_NODES_MAX];
    for (size_t i = 0; i < FABRIC_NODES_MAX; i++) group_of_conn[i] = NONE;
    typedef struct {
        conn_t *conn;
        pbatch_t *batches[REQUEST_BATCHES_MAX];
        size_t count;
    } group_t;
    group_t *groups = NULL;
    size_t group_count = 0, group_cap = 0;
    for (size_t ti = 0; ti < p->topic_count; ti++) {
        ptopic_t *t = p->topics[ti];
        for (int32_t pi = 0; pi < t->partition_count; pi++) {
            pqueue_t *q = t->queues[pi];
            for (pbatch_t *b = q->head; b != NULL && q->in_flight < p->cfg.max_in_flight; b = q->head) {
                if (b->attempts && q->in_flight) break;
                if (b->retry_after_ms > now) {
                    timer_at(p, b->retry_after_ms);
                    break;
                }
                q->head = b->next;
                if (q->head == NULL) q->tail = NULL;
                b->next = NULL;
                if (now - b->created_ms >= p->cfg.delivery_timeout_ms) {
                    expire(p, b, b->last_error, b->last_message);
                    continue;
                }
                const char *address = client_leader(&p->client, t->name, pi);
                conn_t *conn = address ? client_conn(&p->client, address) : NULL;
                if (conn == NULL) {
                    char text[ERROR_TEXT_BYTES];
                    /* With a leader, why its socket could not be opened (out of sockets or
                     * file descriptors, an address ZeroMQ refuses): what a delivery timeout says. */
                    if (address == NULL)
                        snprintf(text, sizeof text, "no leader known for %s/%d", t->name, pi);
                    else
                        snprintf(text, sizeof text, "leader of %s/%d: %.300s", t->name, pi, p->client.error);
                    retry_or_fail(p, b, FABRIC_ERR_LEADER_NOT_AVAILABLE, text, now);
                    break;
                }
                size_t ci = conn_index(p, conn);
                if (group_of_conn[ci] != NONE && groups[group_of_conn[ci]].count == REQUEST_BATCHES_MAX) {
                    send_group(p, conn, groups[group_of_conn[ci]].batches, REQUEST_BATCHES_MAX, now);
                    groups[group_of_conn[ci]].count = 0;
                }
                if (group_of_conn[ci] == NONE) {
                    if (group_count == group_cap) {
                        size_t cap = group_cap ? group_cap * 2 : 4;
                        group_t *grown = realloc(groups, cap * sizeof *grown);
                        if (grown == NULL) {
                            requeue_in_order(q, b);
                            break;
                        }
                        groups = grown;
                        group_cap = cap;
                    }
                    group_of_conn[ci] = group_count;
                    groups[group_count].conn = conn;
                    groups[group_count].count = 0;
                    group_count++;
                }
                group_t *g = &groups[group_of_conn[ci]];
                g->batches[g->count++] = b;
                b->slots = b->attempts ? p->cfg.max_in_flight : 1;
                q->in_flight += b->slots;
            }
        }
    }
    for (size_t i = 0; i < group_count; i++) {
        if (groups[i].count) send_group(p, groups[i].conn, groups[i].batches, groups[i].count, now);
    }
    free(groups);
}

/* ---- answers ---------------------------------------------------------------------------------- */
static void remove_inflight(fabric_producer_t *p, size_t index) {
    p->inflight[index] = p->inflight[--p->inflight_count];
}

static void handle_response(fabric_producer_t *p, response_t *r, int64_t now) {
    size_t index = p->inflight_count;
    for (size_t i = 0; i < p->inflight_count; i++) {
        if (p->inflight[i].correlation_id == r->header.correlation_id) {
            index = i;
            break;
        }
    }
    if (index == p->inflight_count) return; /* an answer to a request we already retried */
    inflight_t f = p->inflight[index];
    remove_inflight(p, index);
    for (size_t i = 0; i < f.count; i++) release_slots(f.batches[i]);

    fabric_arena_t arena;
    fabric_arena_init(&arena);
    const uint8_t *body = zmq_msg_data(&r->frames[1]);
    size_t body_len = zmq_msg_size(&r->frames[1]);
    if (r->header.error_code != 0) {
        fabric_error_body_t eb;
        const char *text = "";
        if (fabric_error_body_decode(body, body_len, &arena, &eb, NULL, 0) == 0) text = eb.message.data;
        client_set_error(&p->client, "%s", text);
        for (size_t i = 0; i < f.count; i++) retry_or_fail(p, f.batches[i], r->header.error_code, text, now);
        fabric_arena_free(&arena);
        return;
    }
    fabric_produce_response_t resp;
    char err[ERROR_TEXT_BYTES];
    int rc = fabric_produce_response_decode(body, body_len, &arena, &resp, err, sizeof err);
    if (rc == 0 && r->count != 2) {
        snprintf(err, sizeof err, "PRODUCE response has %zu batch frames, expected 0", r->count - 2);
        rc = FABRIC_ERR_MALFORMED_REQUEST;
    }
    if (rc) {
        /* We cannot tell what the node did; a retry may duplicate, so fail the batches. */
        client_set_error(&p->client, "undecodable PRODUCE answer: %s", err);
        for (size_t i = 0; i < f.count; i++) deliver(p, f.batches[i], -1, rc, err);
        fabric_arena_free(&arena);
        return;
    }
    for (size_t i = 0; i < f.count; i++) {
        pbatch_t *b = f.batches[i];
        /* One result per entry, in the request's order: a partition may have several
         * batches in one request. */
        const fabric_produce_result_t *res = NULL;
        if (i < resp.result_count && resp.results[i].partition == b->queue->partition &&
            strcmp(resp.results[i].topic.data, b->queue->topic->name) == 0)
            res = &resp.results[i];
        int error = res ? node_error(res->error) : 0;
        if (res == NULL) {
            deliver(p, b, -1, FABRIC_ERR_UNKNOWN_SERVER_ERROR, "the node's answer left this batch out");
        } else if (error) {
            client_set_error(&p->client, "%s/%d: %s: %s", b->queue->topic->name,
                     b->queue->partition, fabric_err_name(error), res->message.data);
            retry_or_fail(p, b, error, res->message.data, now);
        } else if (res->base_offset < 0 ||
                   res->base_offset > INT64_MAX - (int64_t)(b->record_count ? b->record_count - 1 : 0)) {
            /* Written, the answer says, at offsets no log has (below 0, this producer sends
             * no sequence numbers; or past 2^63 - 1): failed as an answer that left the
             * batch out, not resent (it may be stored), as the Python producer does. */
            char text[ERROR_TEXT_BYTES];
            snprintf(text, sizeof text,
                     "the node's answer gave this batch of %u records base offset %lld: offsets "
                     "outside [0, 2^63-1] (its records may have been written)",
                     b->record_count, (long long)res->base_offset);
            deliver(p, b, -1, FABRIC_ERR_UNKNOWN_SERVER_ERROR, text);
        } else {
            deliver(p, b, res->base_offset, 0, "");
        }
    }
    fabric_arena_free(&arena);
}

/* Give up on every request in flight on conns[ci]: close the node's data socket (late answers
 * would be orphans) and retry their batches, which go back to their queues in their order. */
static void fail_requests_on(fabric_producer_t *p, size_t ci, int error, const char *message, int64_t now) {
    client_drop_data(&p->client, &p->client.conns[ci]);
    for (size_t k = 0; k < p->inflight_count;) {
        if (p->inflight[k].conn_index != ci) {
            k++;
            continue;
        }
        inflight_t f = p->inflight[k];
        remove_inflight(p, k);
        for (size_t j = 0; j < f.count; j++) {
            release_slots(f.batches[j]);
            retry_or_fail(p, f.batches[j], error, message, now);
        }
    }
}

/* Requests unanswered for request_timeout_ms, or sent on a connection that dropped since (the
 * node died, shut down or restarted: its answer cannot come, so waiting out the timeout only
 * delays the resend, as the Python producer and librdkafka see it): everything in flight to
 * that node is retried, after a METADATA refresh that finds where its partitions are led now
 * (retry_or_fail). A drop is known from the conn's monitor, read in read_answers and before
 * each send. */
static void check_timeouts(fabric_producer_t *p, int64_t now) {
    for (size_t i = 0; i < p->inflight_count; i++) {
        const inflight_t *f = &p->inflight[i];
        size_t ci = f->conn_index;
        const conn_t *conn = &p->client.conns[ci];
        int timed_out = now - f->sent_ms >= p->cfg.request_timeout_ms;
        if (!timed_out && f->drops == conn->drops) {
            timer_at(p, f->sent_ms + p->cfg.request_timeout_ms);
            continue;
        }
        char text[ERROR_TEXT_BYTES] = "no answer within request_timeout_ms";
        if (!timed_out)
            snprintf(text, sizeof text, "the connection to %.300s dropped before the answer came (the node "
                     "died, shut down or restarted)", conn->address);
        fail_requests_on(p, ci, timed_out ? FABRIC_ERR_REQUEST_TIMED_OUT : FABRIC_ERR_NODE_NOT_READY, text, now);
        i = (size_t)-1; /* the array changed: start over */
    }
}

/* Read every answer already queued, waiting up to wait_ms for the first one, or for a
 * connection with requests in flight to drop (its monitor is polled with it). */
static int read_answers(fabric_producer_t *p, int wait_ms) {
    size_t n = 0, item_count = 0;
    if (p->inflight_count && p->poll_cap < p->client.conn_count) {
        size_t cap = p->client.conn_count;
        zmq_pollitem_t *items = realloc(p->poll_items, 2 * cap * sizeof *items);
        if (items) p->poll_items = items;
        polled_t *polled = items ? realloc(p->polled, cap * sizeof *polled) : NULL;
        if (polled) p->polled = polled;
        if (polled) p->poll_cap = cap; /* else nothing is polled: requests time out and are retried */
    }
    zmq_pollitem_t *items = p->poll_items;
    for (size_t i = 0; i < p->client.conn_count && i < p->poll_cap; i++) {
        conn_t *conn = &p->client.conns[i];
        if (conn->data == NULL) continue;
        int busy = 0;
        for (size_t k = 0; k < p->inflight_count && !busy; k++) busy = p->inflight[k].conn_index == i;
        if (!busy) continue;
        polled_t *polled = &p->polled[n++];
        zmq_pollitem_t data = {conn->data, 0, ZMQ_POLLIN, 0};
        polled->conn_index = i;
        polled->data_item = item_count;
        items[item_count++] = data;
        polled->monitor_item = NO_MONITOR;
        if (conn->monitor != NULL) {
            zmq_pollitem_t monitor = {conn->monitor, 0, ZMQ_POLLIN, 0};
            polled->monitor_item = item_count;
            items[item_count++] = monitor;
        }
    }
    if (n == 0) {
        if (wait_ms > 0) {
            struct timespec ts = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000L};
            nanosleep(&ts, NULL);
        }
        return 0;
    }
    int ready = zmq_poll(items, (int)item_count, wait_ms);
    if (ready <= 0) return 0;
    for (size_t i = 0; i < n; i++) {
        const polled_t *polled = &p->polled[i];
        int dropped = 0;
        if (polled->monitor_item != NO_MONITOR && (items[polled->monitor_item].revents & ZMQ_POLLIN)) {
            conn_t *conn = &p->client.conns[polled->conn_index];
            uint32_t drops = conn->drops;
            dropped = client_drops(conn) != drops; /* check_timeouts resends what is lost */
        }
        /* Read after the monitor: libzmq queues what came on a connection before it reports the
         * connection dropped, so an answer that beat the drop is taken, not resent. */
        if (!dropped && !(items[polled->data_item].revents & ZMQ_POLLIN)) continue;
        for (;;) {
            conn_t *conn = &p->client.conns[polled->conn_index];
            if (conn->data == NULL) break;
            response_t r;
            int rc = client_recv(&p->client, conn->data, &r);
            if (rc == 1) break;
            if (rc) continue; /* refused or undecodable: it times out and is retried */
            if (r.header.api_key == FABRIC_API_PRODUCE && (r.header.flags & FABRIC_FLAG_RESPONSE))
                handle_response(p, &r, now_ms());
            response_free(&r);
        }
    }
    return 0;
}

/* When the oldest record not yet acknowledged or failed reaches delivery_timeout_ms
 * (NO_DEADLINE when there is none). */
static int64_t delivery_deadline(const fabric_producer_t *p) {
    int64_t oldest = INT64_MAX;
    for (size_t ti = 0; ti < p->topic_count; ti++) {
        const ptopic_t *t = p->topics[ti];
        for (int32_t pi = 0; pi < t->partition_count; pi++) {
            const pqueue_t *q = t->queues[pi];
            if (q->open.record_count && q->open_since_ms < oldest) oldest = q->open_since_ms;
            for (const pbatch_t *b = q->head; b != NULL; b = b->next)
                if (b->created_ms < oldest) oldest = b->created_ms;
        }
    }
    for (size_t i = 0; i < p->inflight_count; i++)
        for (size_t k = 0; k < p->inflight[i].count; k++)
            if (p->inflight[i].batches[k]->created_ms < oldest) oldest = p->inflight[i].batches[k]->created_ms;
    return oldest == INT64_MAX ? NO_DEADLINE : oldest + p->cfg.delivery_timeout_ms;
}

/* Ask for METADATA when an answer said to (a leader moved, a topic's limit was lowered)
 * and the backoff since the last try has passed. Bounded by the caller's time and by the
 * earliest delivery deadline (client_refresh_metadata), not 5 s per node: only a turn of
 * the state machine fails batches past delivery_timeout_ms, so a refresh must not outlast
 * that (every node stopped held it for 3 nodes x 5 s, as the Python producer's sender). */
static void refresh_if_due(fabric_producer_t *p, int64_t deadline_ms) {
    int64_t now = now_ms();
    if (!p->refresh_needed || now < p->refresh_after_ms) return;
    int64_t due = delivery_deadline(p);
    if (due < deadline_ms) deadline_ms = due < now ? now : due;
    if (refresh(p, NULL, deadline_ms) == 0) p->refresh_needed = 0;
    else p->refresh_after_ms = now + p->cfg.retry_backoff_ms;
}

/* One turn of the state machine: refresh if needed, close lingering batches, send, read
 * answers for up to wait_ms, expire requests. */
static void service(fabric_producer_t *p, int wait_ms, int64_t deadline_ms) {
    p->records_since_io = 0;
    refresh_if_due(p, deadline_ms);
    int64_t now = now_ms();
    p->send_wait_until = now + CONNECT_WAIT_MS;
    p->next_timer_ms = INT64_MAX;
    if (p->refresh_needed) timer_at(p, p->refresh_after_ms);
    for (size_t ti = 0; ti < p->topic_count; ti++) {
        ptopic_t *t = p->topics[ti];
        for (int32_t pi = 0; pi < t->partition_count; pi++) {
            pqueue_t *q = t->queues[pi];
            if (q->open.record_count == 0) continue;
            int64_t due = q->open_since_ms + p->cfg.linger_ms;
            if (p->flushing || now >= due) close_open_batch(p, q, now);
            else timer_at(p, due);
        }
    }
    send_ready(p, now);
    check_timeouts(p, now);
    if (wait_ms > 0) {
        int64_t until_timer = p->next_timer_ms == INT64_MAX ? wait_ms : p->next_timer_ms - now_ms();
        if (until_timer < wait_ms) wait_ms = until_timer < 0 ? 0 : (int)until_timer;
    }
    read_answers(p, wait_ms);
    now = now_ms();
    check_timeouts(p, now);
    /* Answers may have freed partitions whose next batch is waiting. */
    send_ready(p, now);
}

static int pending(const fabric_producer_t *p) {
    return p->batches_pending > 0 || p->open_records > 0;
}

int fabric_producer_next_timeout_ms(fabric_producer_t *p) {
    if (p == NULL || !pending(p)) return -1;
    if (p->inflight_count) return 0; /* answers may be waiting */
    int64_t left = p->next_timer_ms == INT64_MAX ? POLL_SLICE_MS_MAX : p->next_timer_ms - now_ms();
    if (left < 0) left = 0;
    return left > POLL_SLICE_MS_MAX ? POLL_SLICE_MS_MAX : (int)left;
}

int fabric_producer_poll(fabric_producer_t *p, int timeout_ms) {
    if (p == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    if (in_callback(p, "fabric_producer_poll")) return FABRIC_ERR_INVALID_ARGUMENT;
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    do {
        int64_t left = deadline - now_ms();
        service(p, left <= 0 ? 0 : (int)(left > POLL_SLICE_MS_MAX ? POLL_SLICE_MS_MAX : left), deadline);
    } while (now_ms() < deadline && pending(p));
    refresh_if_due(p, deadline); /* an answer of the last turn asked: before the next records */
    return 0;
}

int fabric_producer_flush(fabric_producer_t *p, int timeout_ms) {
    if (p == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    if (in_callback(p, "fabric_producer_flush")) return FABRIC_ERR_INVALID_ARGUMENT;
    int64_t deadline = timeout_ms < 0 ? INT64_MAX : now_ms() + timeout_ms;
    p->flushing = 1;
    while (pending(p)) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            p->flushing = 0;
            client_set_error(&p->client, "flush: %zu batches and %zu records still pending after %d ms",
                             p->batches_pending, p->open_records, timeout_ms);
            return FABRIC_ERR_REQUEST_TIMED_OUT;
        }
        service(p, left > POLL_SLICE_MS_MAX ? POLL_SLICE_MS_MAX : (int)left, deadline);
    }
    p->flushing = 0;
    /* A refusal among the last answers (MESSAGE_TOO_LARGE after the topic's limit was
     * lowered) asked for METADATA: ask now, so that records produced after the flush are
     * batched by the new limit rather than refused again. */
    refresh_if_due(p, deadline);
    return 0;
}

static int64_t wall_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The record's arguments, checked before anything is sized, queued or waited for. */
static int check_record(client_t *c, const char *topic, int32_t partition, const void *key,
                        int32_t key_len, const void *value, int32_t value_len,
                        const fabric_header_t *headers, size_t header_count) {
    const char *what = NULL;
    if (topic == NULL) what = "topic is NULL";
    else if (partition < -1) what = "partition is below -1";
    else if (key_len < -1 || (key_len > 0 && key == NULL)) what = "key_len below -1, or key NULL with key_len > 0";
    else if (value_len < -1 || (value_len > 0 && value == NULL)) what = "value_len below -1, or value NULL with value_len > 0";
    else if (header_count > UINT16_MAX) what = "more than 65535 headers";
    else if (header_count > 0 && headers == NULL) what = "headers is NULL with header_count > 0";
    for (size_t i = 0; what == NULL && i < header_count; i++) {
        const fabric_header_t *h = &headers[i];
        if (h->name_len > FABRIC_STRING_BYTES_MAX || (h->name_len > 0 && h->name == NULL))
            what = "a header name is NULL or longer than 65535 bytes";
        else if (h->name_len > 0 && !codec_utf8_valid(h->name, h->name_len))
            what = "a header name is not UTF-8";
        else if (h->value_len < -1 || (h->value_len > 0 && h->value == NULL))
            what = "a header value_len is below -1, or its value NULL with value_len > 0";
    }
    if (what == NULL) return 0;
    client_set_error(c, "fabric_produce: %s", what);
    return FABRIC_ERR_INVALID_ARGUMENT;
}

int fabric_produce(fabric_producer_t *p, const char *topic, int32_t partition, const void *key,
                   int32_t key_len, const void *value, int32_t value_len,
                   const fabric_header_t *headers, size_t header_count, int64_t timestamp_ms) {
    if (p == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    int rc = check_record(&p->client, topic, partition, key, key_len, value, value_len, headers,
                          header_count);
    if (rc) return rc;
    if (refuse_while_destroying(p, "fabric_produce")) return FABRIC_ERR_CLOSED;
    ptopic_t *t;
    rc = topic_for_send(p, topic, &t);
    if (rc) return rc;
    if (partition >= t->partition_count && (rc = learn_partition(p, t, partition))) return rc;
    int sticky = 0;
    if (partition < 0) {
        if (key_len >= 0) {
            partition = fabric_partition_for_key(key, (size_t)key_len, t->partition_count);
        } else {
            if (t->sticky >= t->partition_count) t->sticky = (int32_t)(p->sticky_start % (uint32_t)t->partition_count);
            partition = t->sticky;
            sticky = 1;
        }
    }
    size_t size = fabric_record_bytes(key_len, value_len, headers, header_count);
    if (size > (size_t)FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX) {
        client_set_error(&p->client, "record of %zu bytes exceeds BATCH_UNCOMPRESSED_BYTES_MAX=%d",
                         size, FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX);
        return FABRIC_ERR_MESSAGE_TOO_LARGE;
    }
    /* As the Python producer: a record that cannot fit the topic's message_bytes_max even in
     * a batch of its own is refused here, not sent to fail (with whatever shares its batch). */
    const topic_meta_t *meta = client_topic(&p->client, topic);
    if (meta && meta->message_bytes_max > 0 &&
        size + FABRIC_BATCH_HEADER_BYTES > (size_t)meta->message_bytes_max) {
        client_set_error(&p->client,
                         "record of %zu bytes (key, value, headers and %d bytes of lengths) does "
                         "not fit topic %s's message_bytes_max=%d with the %d-byte batch header",
                         size, FABRIC_RECORD_FIXED_BYTES, topic, meta->message_bytes_max,
                         FABRIC_BATCH_HEADER_BYTES);
        return FABRIC_ERR_MESSAGE_TOO_LARGE;
    }
    /* A batch frame is the header and at most its records bytes (a batch lz4 did not shrink
     * goes as it is): a topic whose message_bytes_max leaves less room than batch_bytes_max
     * closes its batches there, as the Python producer, instead of having each refused. */
    size_t batch_max = p->cfg.batch_bytes_max;
    if (meta && meta->message_bytes_max > FABRIC_BATCH_HEADER_BYTES &&
        (size_t)(meta->message_bytes_max - FABRIC_BATCH_HEADER_BYTES) < batch_max)
        batch_max = (size_t)(meta->message_bytes_max - FABRIC_BATCH_HEADER_BYTES);
    /* Backpressure: a bounded wait for acknowledgements, then BUFFER_FULL. */
    if (p->buffered_bytes + size > p->cfg.buffer_bytes_max && p->buffered_bytes > 0 && p->callback_depth) {
        /* Room comes from answers, which only the call running the callback reads. */
        client_set_error(&p->client,
                         "producer buffer of buffer_bytes_max=%zu is full, and fabric_produce from a "
                         "delivery callback does not wait for room",
                         p->cfg.buffer_bytes_max);
        return FABRIC_ERR_BUFFER_FULL;
    }
    if (p->buffered_bytes + size > p->cfg.buffer_bytes_max) {
        int64_t deadline = now_ms() + p->cfg.max_block_ms;
        p->flushing = 1; /* send what we have rather than linger while blocked */
        while (p->buffered_bytes + size > p->cfg.buffer_bytes_max && p->buffered_bytes > 0) {
            int64_t left = deadline - now_ms();
            if (left <= 0) {
                p->flushing = 0;
                client_set_error(&p->client,
                                 "producer buffer of buffer_bytes_max=%zu stayed full for "
                                 "max_block_ms=%d",
                                 p->cfg.buffer_bytes_max, p->cfg.max_block_ms);
                return FABRIC_ERR_BUFFER_FULL;
            }
            service(p, left > POLL_SLICE_MS_MAX ? POLL_SLICE_MS_MAX : (int)left, deadline);
        }
        p->flushing = 0;
    }
    int64_t now = now_ms();
    int64_t ts = timestamp_ms < 0 ? wall_ms() : timestamp_ms;
    pqueue_t *q = t->queues[partition];
    if (sticky && t->sticky_bytes + size > batch_max &&
        (q->open.record_count == 0 ||
         fabric_batch_builder_records_bytes(&q->open) + size > batch_max ||
         q->open.record_count == FABRIC_BATCH_RECORDS_MAX)) {
        /* Sticky partitioning (as the Python producer, and Kafka's KIP-794): a keyless
         * record that would open a batch goes to the next partition once the sticky one
         * has taken a batch's bytes; batches sent at their linger before they fill
         * no longer keep every keyless record on one partition. */
        t->sticky = (partition + 1) % t->partition_count;
        partition = t->sticky;
        t->sticky_bytes = 0;
        q = t->queues[partition];
    }
    int closed = 0;
    if (q->open.record_count > 0 &&
        (fabric_batch_builder_records_bytes(&q->open) + size > batch_max ||
         q->open.record_count == FABRIC_BATCH_RECORDS_MAX)) {
        close_open_batch(p, q, now);
        closed = 1;
    }
    if (q->open.record_count > 0 &&
        (ts - q->open.first_timestamp < INT32_MIN || ts - q->open.first_timestamp > INT32_MAX)) {
        /* The timestamp is too far from the batch's first one for an i32 delta. */
        close_open_batch(p, q, now);
        closed = 1;
    }
    rc = fabric_batch_builder_add(&q->open, ts, key, key_len, value, value_len, headers,
                                  header_count);
    if (rc) {
        if (rc == FABRIC_ERR_NO_MEMORY) fail_open(p, q, rc, "out of memory adding a record");
        return rc;
    }
    if (q->open.record_count == 1) {
        q->open_since_ms = now;
        timer_at(p, now + p->cfg.linger_ms);
    }
    q->open_buffered_bytes += size;
    p->buffered_bytes += size;
    if (sticky) t->sticky_bytes += size;
    p->open_records++;
    if (fabric_batch_builder_records_bytes(&q->open) >= batch_max) {
        close_open_batch(p, q, now);
        closed = 1;
    }
    /* Not from a delivery callback: the turn running it sends the record on its next step. */
    if (p->callback_depth == 0 &&
        (closed || now >= p->next_timer_ms || (p->inflight_count && ++p->records_since_io >= IO_EVERY_RECORDS)))
        service(p, 0, now + p->cfg.max_block_ms); /* as a send waits for room: max_block_ms */
    return 0;
}

void fabric_producer_destroy(fabric_producer_t *p) {
    if (p == NULL) return;
    if (in_callback(p, "fabric_producer_destroy")) return;
    p->destroying = 1;
    for (size_t i = 0; i < p->inflight_count; i++) {
        for (size_t k = 0; k < p->inflight[i].count; k++) {
            pbatch_t *b = p->inflight[i].batches[k];
            release_slots(b);
            deliver(p, b, -1, FABRIC_ERR_CLOSED, "producer destroyed before an answer came");
        }
    }
    p->inflight_count = 0;
    for (size_t ti = 0; ti < p->topic_count; ti++) {
        ptopic_t *t = p->topics[ti];
        for (int32_t pi = 0; pi < t->partition_count; pi++) {
            pqueue_t *q = t->queues[pi];
            while (q->head) {
                pbatch_t *b = q->head;
                q->head = b->next;
                char text[ERROR_TEXT_BYTES] = "producer destroyed before the batch was sent";
                if (b->last_error) /* why it was not sent yet, as a delivery timeout says */
                    snprintf(text, sizeof text, "producer destroyed before the batch was sent; last error %s: %s",
                             fabric_err_name(b->last_error), b->last_message ? b->last_message : "");
                deliver(p, b, -1, FABRIC_ERR_CLOSED, text);
            }
            if (q->open.record_count)
                fail_open(p, q, FABRIC_ERR_CLOSED, "producer destroyed before the batch was sent");
        }
        free_topic(t);
    }
    free(p->topics);
    free(p->inflight);
    free(p->poll_items);
    free(p->polled);
    client_close(&p->client);
    free(p);
}
