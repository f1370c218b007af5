/*
 * consumer.c: assigned partitions -> FETCH long-polls -> decoded batches -> records.
 *
 * Synchronous and single-threaded: fabric_consumer_poll hands out the records of the
 * current batch; when they run out it decodes the next batch frame of the current FETCH
 * answer; when those run out it sends one FETCH to the next leader (round robin over
 * the leaders of the assigned partitions) and waits for it until the poll's timeout (an
 * unanswered FETCH stays pending for the next poll). Positions advance per record
 * returned, so a record below the position (the first batch of a fetch may start before
 * fetch_offset) is skipped.
 */
#include "internal.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ASSIGNMENTS_MAX 10000   /* partitions one consumer reads */
#define LIST_OFFSETS_TIMEOUT_MS 5000
/* A poll waits this long past its timeout (at most) for the answer of a FETCH it has just
 * sent, so that poll(c, 0) still returns what a node answers at once. */
#define FETCH_ANSWER_GRACE_MS 100
/* resolve_position's "the answer holds no position": this file's own, never returned to a
 * caller; outside the i16 range, so no error code a node sends can be taken for it. */
#define NO_POSITION_IN_ANSWER (INT16_MIN - 1)
/* no_leader's "metadata_wait_ms ran out", returned to the caller as REQUEST_TIMED_OUT: its
 * own value, since a node may list a topic with REQUEST_TIMED_OUT, which is waited on. */
#define METADATA_WAIT_EXPIRED (INT16_MIN - 2)

typedef struct cpart {
    char *topic;
    int32_t partition;
    int64_t position;       /* >= 0, or FABRIC_OFFSET_BEGINNING/END until resolved */
    int64_t retry_after_ms; /* back off after a retriable error */
    int64_t missing_since_ms; /* when the map first lacked this partition (0: it has it) */
    int64_t unmapped_since_ms; /* when a METADATA answer first gave its topic no map (0: mapped) */
    uint32_t fetch_id;      /* the last FETCH that asked for it (0: none) */
} cpart_t;

struct fabric_consumer {
    client_t client;
    fabric_consumer_config_t cfg;
    cpart_t *parts;
    size_t part_count;
    int metadata_ready;
    size_t next_leader; /* round robin over conns */
    size_t next_first;  /* the partition a FETCH lists first, turning: see send_fetch */

    /* The FETCH answer being consumed. */
    response_t resp;
    fabric_arena_t arena;
    fabric_fetch_response_t body;
    size_t frame_index;  /* next batch frame in resp */
    uint32_t result_index; /* the partition result the next frame belongs to */
    uint32_t frames_left_in_result;
    int have_resp;

    /* A FETCH sent and not yet answered: it outlives a poll whose timeout ran out (the next
     * poll waits for the same answer), so that a poll returns within its timeout_ms even
     * when the leader is slow or dead. */
    int fetch_pending;
    uint32_t fetch_id;
    conn_t *fetch_conn;
    uint32_t fetch_drops; /* fetch_conn's drops when it was sent: once they are more, it is lost */
    int64_t fetch_answer_deadline;
    int64_t fetch_grace_until; /* sent + max_wait + FETCH_ANSWER_GRACE_MS */
    int fetch_answer_wait_ms; /* max_wait + request_timeout_ms, for the error text */

    /* The batch whose records are being handed out. */
    fabric_batch_t *batch;
    uint32_t record_index;
    cpart_t *batch_part;
};

void fabric_consumer_config_init(fabric_consumer_config_t *c) {
    memset(c, 0, sizeof *c);
    c->max_wait_ms = 500;
    c->max_bytes = 16 * 1024 * 1024;
    c->partition_bytes_max = 4 * 1024 * 1024;
    c->request_timeout_ms = 30000;
    c->retry_backoff_ms = 100;
    c->offset_reset = FABRIC_RESET_EARLIEST;
    c->metadata_wait_ms = 60000;
}

int fabric_consumer_new(fabric_consumer_t **out, const char *bootstrap,
                        const fabric_consumer_config_t *config) {
    if (out == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    *out = NULL;
    fabric_consumer_config_t cfg;
    if (config) cfg = *config;
    else fabric_consumer_config_init(&cfg);
    if (cfg.max_wait_ms < 0 || cfg.max_wait_ms > 60000 || cfg.max_bytes <= 0 ||
        cfg.partition_bytes_max <= 0 || cfg.request_timeout_ms <= 0 || cfg.retry_backoff_ms < 0 ||
        cfg.offset_reset < FABRIC_RESET_EARLIEST || cfg.offset_reset > FABRIC_RESET_NONE ||
        cfg.metadata_wait_ms < -1)
        return FABRIC_ERR_INVALID_ARGUMENT;
    fabric_consumer_t *c = calloc(1, sizeof *c);
    if (c == NULL) return FABRIC_ERR_NO_MEMORY;
    int rc = client_init(&c->client, bootstrap);
    if (rc) {
        free(c);
        return rc;
    }
    rc = client_set_curve(&c->client, cfg.curve_key_file, cfg.curve_server_key);
    if (rc) {
        client_close(&c->client);
        free(c);
        return rc;
    }
    c->cfg = cfg;
    fabric_arena_init(&c->arena);
    *out = c;
    return 0;
}

const char *fabric_consumer_last_error(const fabric_consumer_t *c) { return c ? c->client.error : ""; }

static cpart_t *find_part(fabric_consumer_t *c, const char *topic, int32_t partition) {
    for (size_t i = 0; i < c->part_count; i++) {
        if (c->parts[i].partition == partition && strcmp(c->parts[i].topic, topic) == 0)
            return &c->parts[i];
    }
    return NULL;
}

static void drop_response(fabric_consumer_t *c) {
    fabric_batch_free(c->batch);
    c->batch = NULL;
    c->batch_part = NULL;
    if (c->have_resp) response_free(&c->resp);
    c->have_resp = 0;
    fabric_arena_free(&c->arena);
}

int fabric_consumer_assign(fabric_consumer_t *c, const char *topic, int32_t partition,
                           int64_t offset) {
    if (c == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    if (topic == NULL || partition < 0 || offset < FABRIC_OFFSET_BEGINNING) {
        client_set_error(&c->client, "assign: topic NULL, partition < 0 or offset < -2 (%d, %lld)",
                         (int)partition, (long long)offset);
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    cpart_t *existing = find_part(c, topic, partition);
    /* Re-assigning seeks: whatever was fetched for the old position is dropped, and the
     * answer of a FETCH in flight is ignored when it comes (its id no longer matches). */
    drop_response(c);
    c->fetch_pending = 0;
    if (existing) {
        existing->position = offset;
        return 0;
    }
    if (c->part_count == ASSIGNMENTS_MAX) {
        client_set_error(&c->client, "assign: more than %d partitions", ASSIGNMENTS_MAX);
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    cpart_t *parts = realloc(c->parts, (c->part_count + 1) * sizeof *parts);
    if (parts == NULL) return FABRIC_ERR_NO_MEMORY;
    c->parts = parts;
    cpart_t *p = &c->parts[c->part_count];
    p->topic = malloc(strlen(topic) + 1);
    if (p->topic == NULL) return FABRIC_ERR_NO_MEMORY;
    strcpy(p->topic, topic);
    p->partition = partition;
    p->position = offset;
    p->retry_after_ms = 0;
    p->missing_since_ms = 0;
    p->unmapped_since_ms = 0;
    p->fetch_id = 0;
    c->part_count++;
    c->metadata_ready = 0;
    return 0;
}

int fabric_consumer_position(fabric_consumer_t *c, const char *topic, int32_t partition,
                             int64_t *offset) {
    if (c == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    if (topic == NULL || offset == NULL) {
        client_set_error(&c->client, "position: topic or offset NULL");
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    cpart_t *p = find_part(c, topic, partition);
    if (p == NULL) {
        client_set_error(&c->client, "position: %s/%d is not assigned", topic, (int)partition);
        return FABRIC_ERR_UNKNOWN_TOPIC_OR_PARTITION;
    }
    *offset = p->position;
    return 0;
}

static int refresh(fabric_consumer_t *c, int64_t deadline_ms) {
    const char **names = malloc(sizeof(char *) * (c->part_count + 1));
    if (names == NULL) return FABRIC_ERR_NO_MEMORY;
    for (size_t i = 0; i < c->part_count; i++) names[i] = c->parts[i].topic;
    int rc = client_refresh_metadata(&c->client, names, c->part_count, deadline_ms);
    free(names);
    if (rc) return rc;
    c->metadata_ready = 1;
    /* A FETCH waiting for its answer holds its conn (fetch_conn): that one stays open. */
    uint8_t busy[FABRIC_NODES_MAX] = {0};
    if (c->fetch_pending) busy[c->fetch_conn - c->client.conns] = 1;
    client_close_unused_conns(&c->client, busy);
    return 0;
}

/* The routing map names no leader for p. A topic METADATA lists with an error (one the
 * client never had a map of: a known map is kept over it) takes that error: a retriable one
 * (LEADER_NOT_AVAILABLE in an election or while a node learns the topic, NODE_NOT_READY) is
 * waited on, as is a topic the answers leave without a map (not listed, or its partitions
 * not trusted: apply_metadata); any other is the caller's, as it came. All of those used to be
 * UNKNOWN_TOPIC_OR_PARTITION, which told a principal refused the topic (AUTHORIZATION_FAILED)
 * that it did not exist; the Python consumer raises AuthorizationFailedError. The wait is
 * bounded by metadata_wait_ms, counted across polls from the first answer that left the topic
 * without a map: then METADATA_WAIT_EXPIRED (the poll's REQUEST_TIMED_OUT), and the next
 * poll waits anew. It used to last for ever, each poll returning no record, so a caller could
 * not tell a node stuck in NODE_NOT_READY from a partition with nothing new (as Kafka's
 * max.block.ms and the Python producer's max_block_ms bound a wait for a topic's metadata).
 * A partition past the count of a topic with a map may have just been added: each node learns
 * of added partitions by its own ZooKeeper watch, so the node asked may not have heard yet.
 * Ask again for PARTITION_LEARN_WAIT_MS before calling it unknown, as the Python consumer's
 * assign() does. */
static int no_leader(fabric_consumer_t *c, cpart_t *p, int64_t now) {
    const topic_meta_t *t = client_topic(&c->client, p->topic);
    if (t == NULL || t->error) {
        if (t != NULL && !fabric_err_retriable(t->error)) {
            client_set_error(&c->client, "%s/%d: METADATA lists the topic with %s (%s)", p->topic,
                             p->partition, fabric_err_name(t->error), fabric_strerror(t->error));
            return t->error;
        }
        if (p->unmapped_since_ms == 0) p->unmapped_since_ms = now;
        int64_t waited_ms = now - p->unmapped_since_ms;
        int expired = c->cfg.metadata_wait_ms >= 0 && waited_ms >= c->cfg.metadata_wait_ms;
        /* Set while waiting too: a poll that returns no record can say why. */
        if (t == NULL)
            client_set_error(&c->client, "%s/%d: METADATA has given the topic no partitions for %lld ms%s",
                             p->topic, p->partition, (long long)waited_ms,
                             expired ? " (metadata_wait_ms)" : "; asking again");
        else
            client_set_error(&c->client, "%s/%d: METADATA has listed the topic with %s (%s) for %lld ms%s",
                             p->topic, p->partition, fabric_err_name(t->error), fabric_strerror(t->error),
                             (long long)waited_ms, expired ? " (metadata_wait_ms)" : "; asking again");
        if (!expired) return t == NULL ? FABRIC_ERR_LEADER_NOT_AVAILABLE : t->error;
        p->unmapped_since_ms = 0; /* the next poll waits anew */
        return METADATA_WAIT_EXPIRED;
    }
    p->unmapped_since_ms = 0;
    if (p->partition < t->partition_count) return FABRIC_ERR_LEADER_NOT_AVAILABLE;
    if (p->missing_since_ms == 0) p->missing_since_ms = now;
    if (now - p->missing_since_ms < PARTITION_LEARN_WAIT_MS) return FABRIC_ERR_LEADER_NOT_AVAILABLE;
    client_set_error(&c->client, "%s/%d: no such topic or partition", p->topic, p->partition);
    return FABRIC_ERR_UNKNOWN_TOPIC_OR_PARTITION;
}

/* Resolve FABRIC_OFFSET_BEGINNING/END with LIST_OFFSETS to the partition's leader. Returns
 * 0, an error, or NO_POSITION_IN_ANSWER (last_error says why): p is asked about again after
 * a backoff, as Kafka's consumer retries a reset that found no offset. */
static int resolve_position(fabric_consumer_t *c, cpart_t *p) {
    const char *address = client_leader(&c->client, p->topic, p->partition);
    if (address == NULL) return no_leader(c, p, now_ms());
    p->missing_since_ms = 0;
    p->unmapped_since_ms = 0;
    conn_t *conn = client_conn(&c->client, address);
    if (conn == NULL) return FABRIC_ERR_NODE_NOT_READY; /* see send_fetch */
    fabric_buf_t body;
    fabric_buf_init(&body);
    fabric_list_offsets_partition_t item = {fabric_str(p->topic), p->partition, p->position};
    fabric_list_offsets_request_t req = {&item, 1};
    fabric_list_offsets_request_encode(&req, &body);
    response_t resp;
    int rc = body.err ? body.err
                      : client_request(&c->client, conn, FABRIC_API_LIST_OFFSETS, &body,
                                       LIST_OFFSETS_TIMEOUT_MS, &resp);
    fabric_buf_free(&body);
    if (rc) return rc;
    fabric_arena_t arena;
    fabric_arena_init(&arena);
    fabric_list_offsets_response_t lo;
    rc = fabric_list_offsets_response_decode(zmq_msg_data(&resp.frames[1]),
                                             zmq_msg_size(&resp.frames[1]), &arena, &lo,
                                             c->client.error, sizeof c->client.error);
    /* Its row by topic and partition, not the first: an answer of more rows than asked
     * failed the poll with MALFORMED_REQUEST (and a stale error text), and a single row of
     * another partition gave this one its error. An answer without one is an answer
     * without a position. */
    const fabric_list_offsets_result_t *res = NULL;
    for (uint32_t i = 0; rc == 0 && res == NULL && i < lo.partition_count; i++) {
        if (lo.partitions[i].partition == p->partition && strcmp(lo.partitions[i].topic.data, p->topic) == 0)
            res = &lo.partitions[i];
    }
    if (rc == 0 && res != NULL && res->error) {
        rc = node_error(res->error);
        client_set_error(&c->client, "LIST_OFFSETS %s/%d: %s", p->topic, p->partition,
                         fabric_err_name(rc));
    }
    if (rc == 0) {
        /* Taken as the position only if it is one: a negative position means "not resolved
         * yet", and the next LIST_OFFSETS would send it as its timestamp (-1: the log end
         * instead of the start). */
        if (res != NULL && res->offset >= 0) {
            p->position = res->offset;
        } else if (res != NULL) {
            client_set_error(&c->client, "LIST_OFFSETS %s/%d: answered offset %lld, no position; asking again",
                             p->topic, p->partition, (long long)res->offset);
            rc = NO_POSITION_IN_ANSWER;
        } else {
            client_set_error(&c->client, "LIST_OFFSETS %s/%d: the answer's %u rows leave it out; asking again",
                             p->topic, p->partition, lo.partition_count);
            rc = NO_POSITION_IN_ANSWER;
        }
    }
    fabric_arena_free(&arena);
    response_free(&resp);
    return rc;
}

/* Retriable trouble with a partition: refresh the map later and back off. */
static void back_off(fabric_consumer_t *c, cpart_t *p, int64_t now) {
    c->metadata_ready = 0;
    p->retry_after_ms = now + c->cfg.retry_backoff_ms;
}

/* Nothing to send this turn: wait retry_backoff_ms before the next, bounded by the
 * caller's deadline (a turn that returned at once would spin, opening sockets each time). */
static void nap(const fabric_consumer_t *c, int64_t now, int64_t deadline) {
    int64_t ms = c->cfg.retry_backoff_ms;
    if (deadline - now < ms) ms = deadline - now;
    if (ms > 0) {
        struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* Send one FETCH to the next leader that has ready partitions (c->fetch_pending set when
 * one went out). Returns 0 or an error. */
static int send_fetch(fabric_consumer_t *c, int64_t deadline) {
    int64_t now = now_ms();
    if (!c->metadata_ready) {
        int rc = refresh(c, deadline);
        if (rc && !fabric_err_retriable(rc)) return rc;
        if (rc) { /* try again on the next turn */
            nap(c, now_ms(), deadline);
            return 0;
        }
    }
    for (size_t i = 0; i < c->part_count; i++) {
        cpart_t *p = &c->parts[i];
        if (p->position >= 0 || p->retry_after_ms > now) continue;
        int rc = resolve_position(c, p);
        if (rc == METADATA_WAIT_EXPIRED) return FABRIC_ERR_REQUEST_TIMED_OUT;
        if (rc && rc != NO_POSITION_IN_ANSWER && !fabric_err_retriable(rc)) return rc;
        if (rc) back_off(c, p, now);
    }
    /* Pick a leader round robin; collect its ready partitions. */
    const char *leader = NULL;
    for (size_t k = 0; k < c->part_count && leader == NULL; k++) {
        cpart_t *p = &c->parts[(c->next_leader + k) % c->part_count];
        if (p->position < 0 || p->retry_after_ms > now) continue;
        leader = client_leader(&c->client, p->topic, p->partition);
        if (leader == NULL) {
            int rc = no_leader(c, p, now);
            if (rc == METADATA_WAIT_EXPIRED) return FABRIC_ERR_REQUEST_TIMED_OUT;
            if (!fabric_err_retriable(rc)) return rc;
            back_off(c, p, now);
        } else {
            p->missing_since_ms = 0;
            p->unmapped_since_ms = 0;
        }
    }
    c->next_leader++;
    if (leader == NULL) { /* everything is backing off */
        nap(c, now, deadline);
        return 0;
    }
    conn_t *conn = client_conn(&c->client, leader);
    if (conn == NULL) {
        /* No socket for the leader's address (last_error says why): one ZeroMQ cannot
         * connect to ("garbage", udp://..., tcp://host with no port), as a METADATA node
         * list may hold, failed the poll for good with TRANSPORT. As a node that is down
         * (and as the producer and a METADATA refresh take it): back off, ask again. */
        for (size_t i = 0; i < c->part_count; i++) back_off(c, &c->parts[i], now);
        return 0;
    }
    fabric_fetch_partition_t *items = malloc(c->part_count * sizeof *items);
    if (items == NULL) return FABRIC_ERR_NO_MEMORY;
    uint32_t id = client_next_id(&c->client);
    uint32_t n = 0;
    /* A node fills a FETCH answer in the request's partition order until max_bytes
     * (docs/PROTOCOL.md 5.3): a fixed order would serve the first partitions with a
     * backlog and starve the rest, so each FETCH starts one partition further on. */
    size_t first = c->next_first++ % c->part_count;
    for (size_t k = 0; k < c->part_count; k++) {
        cpart_t *p = &c->parts[(first + k) % c->part_count];
        if (p->position < 0 || p->retry_after_ms > now) continue;
        const char *a = client_leader(&c->client, p->topic, p->partition);
        if (a == NULL || strcmp(a, leader) != 0) continue;
        fabric_fetch_partition_t item = {fabric_str(p->topic), p->partition, p->position,
                                         c->cfg.partition_bytes_max, -1};
        items[n++] = item;
        p->fetch_id = id;
    }
    int64_t left = deadline - now;
    int32_t max_wait = c->cfg.max_wait_ms;
    if (left < max_wait) max_wait = left < 0 ? 0 : (int32_t)left;
    fabric_fetch_request_t req = {-1, max_wait, 1, c->cfg.max_bytes, items, n};
    fabric_buf_t body;
    fabric_buf_init(&body);
    fabric_fetch_request_encode(&req, &body);
    free(items);
    /* Read just before the send, so that a drop before it is not taken for one after it. */
    uint32_t drops = client_drops(conn);
    int rc = body.err ? body.err
                      : client_send(&c->client, conn->data, conn->address, FABRIC_API_FETCH, id,
                                    &body, NULL, 0);
    fabric_buf_free(&body);
    if (rc) {
        if (!fabric_err_retriable(rc) && rc != FABRIC_ERR_TRANSPORT) return rc;
        for (size_t i = 0; i < c->part_count; i++) back_off(c, &c->parts[i], now);
        return 0;
    }
    /* The node holds the fetch up to max_wait; allow request_timeout_ms on top. */
    c->fetch_pending = 1;
    c->fetch_id = id;
    c->fetch_conn = conn;
    c->fetch_drops = drops;
    /* Capped: request_timeout_ms may be INT_MAX, and the int sum would overflow. */
    c->fetch_answer_wait_ms = c->cfg.request_timeout_ms > INT_MAX - max_wait
                                  ? INT_MAX
                                  : max_wait + c->cfg.request_timeout_ms;
    c->fetch_answer_deadline = now_ms() + c->fetch_answer_wait_ms;
    c->fetch_grace_until = now_ms() + max_wait + FETCH_ANSWER_GRACE_MS;
    return 0;
}

/* The partition a result of the current FETCH answer is for, or NULL when that FETCH did not
 * ask for it: a node's records or reset bounds for a partition we did not fetch (not
 * assigned, backing off, its start not known yet) would move its position from nothing. */
static cpart_t *asked_part(fabric_consumer_t *c, const fabric_fetch_partition_result_t *res) {
    cpart_t *p = find_part(c, res->topic.data, res->partition);
    return p != NULL && p->fetch_id == c->fetch_id ? p : NULL;
}

/* Read what the data socket has queued, up to the pending FETCH's answer: 0 = taken (in
 * c->resp), 1 = not there yet, else an error. */
static int take_fetch_answer(fabric_consumer_t *c, conn_t *conn) {
    for (;;) {
        response_t r;
        int rc = client_recv(&c->client, conn->data, &r);
        if (rc) return rc;
        if (is_answer_to(&r.header, c->fetch_id, FABRIC_API_FETCH)) {
            c->resp = r;
            c->have_resp = 1;
            return 0;
        }
        response_free(&r); /* the answer to a fetch we gave up on, or no answer at all */
    }
}

/* Wait for the pending FETCH's answer until the caller's deadline (it stays pending if that
 * comes first; a FETCH just sent gets FETCH_ANSWER_GRACE_MS past it), its own answer
 * deadline, or the drop of the connection it went out on (then it is given up: a node that
 * died, shut down or restarted will not answer it, so it is sent again after a METADATA
 * refresh, to a new leader if there is one, rather than after max_wait_ms +
 * request_timeout_ms). Returns 0 with c->have_resp set or not, or an error. */
static int await_fetch(fabric_consumer_t *c, int64_t deadline) {
    conn_t *conn = c->fetch_conn;
    int rc;
    if (deadline < c->fetch_grace_until) deadline = c->fetch_grace_until;
    for (;;) {
        int64_t now = now_ms();
        int dropped = 0;
        if (conn->data != NULL) {
            /* The monitor before the socket: libzmq queues what came on a connection before it
             * reports the connection dropped, so an answer that beat the drop is taken. */
            dropped = client_drops(conn) != c->fetch_drops;
            rc = take_fetch_answer(c, conn);
            if (rc == 0) break;
            if (rc != 1) {
                c->fetch_pending = 0;
                return rc;
            }
        }
        if (now >= c->fetch_answer_deadline || conn->data == NULL || dropped) {
            c->fetch_pending = 0;
            client_drop_data(&c->client, conn);
            if (dropped)
                client_set_error(&c->client, "FETCH to %s: the connection dropped before the answer came "
                                 "(the node died, shut down or restarted); fetching again", conn->address);
            else
                client_set_error(&c->client, "FETCH to %s: no answer within %d ms", conn->address,
                                 c->fetch_answer_wait_ms);
            for (size_t i = 0; i < c->part_count; i++) back_off(c, &c->parts[i], now);
            return 0;
        }
        int64_t until = deadline < c->fetch_answer_deadline ? deadline : c->fetch_answer_deadline;
        int64_t wait = until - now;
        /* The monitor too: a drop ends the wait at once. */
        zmq_pollitem_t items[2] = {{conn->data, 0, ZMQ_POLLIN, 0}, {conn->monitor, 0, ZMQ_POLLIN, 0}};
        int ready = zmq_poll(items, conn->monitor != NULL ? 2 : 1, wait > 0 ? (long)wait : 0);
        if (ready <= 0 && now_ms() >= deadline) return 0; /* still pending: the next poll waits on */
    }
    c->fetch_pending = 0;
    const uint8_t *frame = zmq_msg_data(&c->resp.frames[1]);
    size_t frame_len = zmq_msg_size(&c->resp.frames[1]);
    if (c->resp.header.error_code) {
        int code = c->resp.header.error_code;
        fabric_error_body_t eb;
        if (fabric_error_body_decode(frame, frame_len, &c->arena, &eb, NULL, 0) == 0)
            client_set_error(&c->client, "FETCH: %s: %s", fabric_err_name(code), eb.message.data);
        drop_response(c);
        if (fabric_err_retriable(code)) {
            for (size_t i = 0; i < c->part_count; i++) back_off(c, &c->parts[i], now_ms());
            return 0;
        }
        return code;
    }
    rc = fabric_fetch_response_decode(frame, frame_len, &c->arena, &c->body, c->client.error,
                                      sizeof c->client.error);
    uint64_t frames = 0;
    for (uint32_t i = 0; rc == 0 && i < c->body.partition_count; i++)
        frames += c->body.partitions[i].batch_count;
    if (rc == 0 && frames != c->resp.count - 2) {
        client_set_error(&c->client, "FETCH answer has %zu batch frames, body announces %llu",
                         c->resp.count - 2, (unsigned long long)frames);
        rc = FABRIC_ERR_MALFORMED_REQUEST;
    }
    if (rc) {
        drop_response(c);
        return rc;
    }
    /* Per-partition errors. */
    for (uint32_t i = 0; i < c->body.partition_count; i++) {
        const fabric_fetch_partition_result_t *res = &c->body.partitions[i];
        cpart_t *p = asked_part(c, res);
        int error = node_error(res->error);
        if (p == NULL || error == 0) continue;
        if (error == FABRIC_ERR_OFFSET_OUT_OF_RANGE) {
            if (c->cfg.offset_reset == FABRIC_RESET_NONE) {
                client_set_error(&c->client, "%s/%d: offset %lld outside [%lld, %lld]", p->topic,
                                 p->partition, (long long)p->position,
                                 (long long)res->log_start_offset, (long long)res->log_end_offset);
                drop_response(c);
                return FABRIC_ERR_OFFSET_OUT_OF_RANGE;
            }
            int earliest = c->cfg.offset_reset == FABRIC_RESET_EARLIEST;
            /* "latest" is the high watermark, as LIST_OFFSETS answers it (and the Python
             * consumer resets): the log end may hold records not yet committed, which a
             * position there would skip once they are. */
            if (0 <= res->log_start_offset && res->log_start_offset <= res->high_watermark &&
                res->high_watermark <= res->log_end_offset) {
                p->position = earliest ? res->log_start_offset : res->high_watermark;
            } else {
                /* Bounds that are no log's: a negative position would go out as a
                 * LIST_OFFSETS timestamp. Reset as the Python consumer always does. */
                client_set_error(&c->client,
                                 "%s/%d: OFFSET_OUT_OF_RANGE with log bounds [%lld, %lld]; "
                                 "resetting by LIST_OFFSETS",
                                 p->topic, p->partition, (long long)res->log_start_offset,
                                 (long long)res->log_end_offset);
                p->position = earliest ? FABRIC_OFFSET_BEGINNING : FABRIC_OFFSET_END;
            }
        } else if (fabric_err_retriable(error)) {
            back_off(c, p, now_ms());
        } else {
            client_set_error(&c->client, "FETCH %s/%d: %s", p->topic, p->partition,
                             fabric_err_name(error));
            drop_response(c);
            return error;
        }
    }
    c->frame_index = 2;
    c->result_index = 0;
    c->frames_left_in_result = c->body.partition_count ? c->body.partitions[0].batch_count : 0;
    return 0;
}

static int fetch(fabric_consumer_t *c, int64_t deadline) {
    if (!c->fetch_pending) {
        int rc = send_fetch(c, deadline);
        if (rc || !c->fetch_pending) return rc;
    }
    return await_fetch(c, deadline);
}

/* Decode the next batch frame of the current answer into c->batch. 1 = no frames left. */
static int next_batch(fabric_consumer_t *c) {
    if (!c->have_resp || c->frame_index >= c->resp.count) return 1;
    while (c->frames_left_in_result == 0) {
        c->result_index++;
        if (c->result_index >= c->body.partition_count) return 1;
        c->frames_left_in_result = c->body.partitions[c->result_index].batch_count;
    }
    const fabric_fetch_partition_result_t *res = &c->body.partitions[c->result_index];
    zmq_msg_t *frame = &c->resp.frames[c->frame_index++];
    c->frames_left_in_result--;
    cpart_t *p = asked_part(c, res);
    if (p == NULL) return 0; /* not asked for: skip the frame */
    char err[ERROR_TEXT_BYTES];
    int rc = fabric_batch_decode(zmq_msg_data(frame), zmq_msg_size(frame), &c->batch, err, sizeof err);
    if (rc) {
        client_set_error(&c->client, "%s/%d at offset %lld: %s", p->topic, p->partition,
                         (long long)p->position, err);
        return rc;
    }
    if (c->batch->header.attributes & FABRIC_BATCH_CONTROL) {
        /* A strict-order tick: consumers skip it, but it takes offsets. */
        int64_t next = c->batch->header.base_offset + c->batch->header.record_count;
        if (next > p->position) p->position = next;
        fabric_batch_free(c->batch);
        c->batch = NULL;
        return 0;
    }
    c->batch_part = p;
    c->record_index = 0;
    return 0;
}

int fabric_consumer_poll(fabric_consumer_t *c, int timeout_ms, const fabric_record_t **record) {
    if (record == NULL) {
        if (c != NULL) client_set_error(&c->client, "poll: record NULL");
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    *record = NULL;
    if (c == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    if (c->part_count == 0) {
        client_set_error(&c->client, "poll: nothing assigned (fabric_consumer_assign first)");
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    int64_t deadline = now_ms() + (timeout_ms > 0 ? timeout_ms : 0);
    int fetched = 0; /* poll(0) still makes one fetch (with max_wait 0), so it can progress */
    for (;;) {
        if (c->batch) {
            cpart_t *p = c->batch_part;
            while (c->record_index < c->batch->record_count) {
                fabric_record_t *r = &c->batch->records[c->record_index++];
                if (r->offset < p->position) continue; /* below what we asked for */
                p->position = r->offset + 1;
                r->topic = p->topic;
                r->partition = p->partition;
                *record = r;
                return 0;
            }
            fabric_batch_free(c->batch);
            c->batch = NULL;
        }
        int rc = next_batch(c);
        if (rc == 0) continue;
        drop_response(c);
        if (rc != 1) return rc;
        if (fetched && now_ms() >= deadline) return 0;
        rc = fetch(c, deadline);
        fetched = 1;
        if (rc) return rc;
    }
}

void fabric_consumer_destroy(fabric_consumer_t *c) {
    if (c == NULL) return;
    drop_response(c);
    for (size_t i = 0; i < c->part_count; i++) free(c->parts[i].topic);
    free(c->parts);
    client_close(&c->client);
    free(c);
}
