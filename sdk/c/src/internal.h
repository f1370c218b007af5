/*
 * internal.h: what the producer and the consumer share: sockets by node address, the
 * routing map from METADATA, received messages, a monotonic clock. Not installed.
 */
#ifndef FABRIC_INTERNAL_H
#define FABRIC_INTERNAL_H

#include "../fabric.h"

#include <stdint.h>
#include <zmq.h>

/* Timing and sizing constants, with their units. */
#define CONNECT_WAIT_MS 1000       /* a send to a node we cannot reach fails after this */
#define METADATA_TIMEOUT_MS 5000   /* one METADATA attempt to one node */
#define METADATA_ATTEMPT_MIN_MS 250 /* an attempt's wait even when the caller's time is up */
/* A refresh's first pass over the nodes: how long each may take to accept the connection
 * and to answer (a stopped node accepts and never answers; sdk/_client.py, same figures). */
#define METADATA_QUICK_CONNECT_MS 100
#define METADATA_QUICK_ANSWER_MS 500
/* A partition past the cached count is asked about again for this long (within
 * max_block_ms) before it is refused: one just added reaches each node by its own
 * ZooKeeper watch (sdk/_client.py PARTITION_LEARN_WAIT_MS, the same figure). */
#define PARTITION_LEARN_WAIT_MS 3000
#define PARTITION_LEARN_PAUSE_MS 50
#define NO_DEADLINE INT64_MAX
#define SOCKET_HWM_MESSAGES 10000  /* ZeroMQ send/receive queue length, in messages */
#define ACKS0_CLOSE_LINGER_MS 5000 /* acks=0 data may still be queued at close */
#define RESPONSE_FRAMES_MAX 1000002 /* header + body + batches; see client_recv */
#define ERROR_TEXT_BYTES 512
#define BOOTSTRAP_ADDRESSES_MAX 64
#define ADDRESS_BYTES_MAX 1024
#define CURVE_KEY_CHARS 40       /* a 32-byte CURVE key in Z85 text */
#define KEY_FILE_BYTES_MAX 4096  /* a zmq certificate file is a few hundred bytes */
/* ZeroMQ sockets a node address takes (conn_t): two DEALERs, and the data DEALER's
 * monitor, which is two PAIRs (libzmq's and ours). */
#define SOCKETS_PER_ADDRESS 4
/* ZMQ_MAX_SOCKETS of the context each producer or consumer creates (libzmq's default, 1,023,
 * ran out at about 170 addresses): room for a full table of FABRIC_NODES_MAX addresses,
 * capped by the context's ZMQ_SOCKET_LIMIT (65,535 with epoll). The open-file limit
 * (RLIMIT_NOFILE) bounds it too: each socket holds one descriptor (its mailbox), each
 * connected DEALER one more, so an address takes FDS_PER_ADDRESS. */
#define CONTEXT_SOCKETS_MAX (FABRIC_NODES_MAX * SOCKETS_PER_ADDRESS)
#define FDS_PER_ADDRESS (SOCKETS_PER_ADDRESS + 2)

typedef struct conn {
    char *address; /* NULL: a free slot (client_close_unused_conns), for client_conn to reuse */
    void *data;    /* DEALER for PRODUCE and FETCH, many requests in flight */
    void *control; /* DEALER for synchronous METADATA and LIST_OFFSETS */
    /* A PAIR receiving the data DEALER's failed handshakes and dropped connections (a libzmq
     * socket monitor), or NULL; opened and closed with the data socket. Failed handshakes are
     * read when a node cannot be reached, to say why (a CURVE mismatch, a refused key). One
     * for the address, not one per DEALER: both connect together, to the same endpoint with
     * the same keys, so a node that refuses one refuses the other, and a monitor costs two
     * sockets (its own and libzmq's end of it) and two file descriptors. On the data DEALER
     * because a drop matters for the requests in flight there: libzmq reports it after it
     * has queued what came on the connection before it, so an answer that beat the drop is
     * still taken (the control DEALER's drop came in no order with the data's answers). */
    void *monitor;
    /* The last failed handshake the monitor reported (event, value; 0 = none), kept until
     * the data socket is reopened: libzmq does not retry a handshake the node refused, so
     * the event comes once, and a later attempt must still say why. */
    uint16_t refusal;
    uint32_t refusal_value;
    /* Connections of the data DEALER that dropped so far, as read from the monitor (never
     * reset while the slot holds this address). A request sent when it was n is lost once it
     * is above n: the node answers on the connection the request came on, and the DEALER
     * reconnects by itself as a new peer, so that answer never comes (client_drops). */
    uint32_t drops;
} conn_t;

typedef struct topic_meta {
    char *name;
    int16_t error;
    int32_t message_bytes_max;
    int32_t partition_count;
    int32_t *leaders;       /* node id per partition, -1 = none */
    int32_t *leader_epochs; /* per partition */
} topic_meta_t;

typedef struct client {
    void *zctx;
    char *bootstrap[BOOTSTRAP_ADDRESSES_MAX];
    size_t bootstrap_count;
    conn_t conns[FABRIC_NODES_MAX];
    size_t conn_count; /* slots in use or freed below it; a conn keeps its index while open */
    int32_t node_ids[FABRIC_NODES_MAX];
    char *node_addresses[FABRIC_NODES_MAX];
    size_t node_count;
    topic_meta_t *topics;
    size_t topic_count;
    uint32_t next_correlation_id;
    size_t metadata_rotor; /* a refresh starts after the node the last one failed on */
    int data_linger_ms;
    int curve; /* 1: every socket is a CURVE client with the keys below */
    char curve_server_key[CURVE_KEY_CHARS + 1];
    char curve_public_key[CURVE_KEY_CHARS + 1];
    char curve_secret_key[CURVE_KEY_CHARS + 1];
    char error[ERROR_TEXT_BYTES];
    unsigned monitor_seq; /* names the inproc endpoints of the handshake monitors */
} client_t;

/* One received multipart message: frames[0] header, frames[1] body, then batches. */
typedef struct response {
    zmq_msg_t *frames;
    size_t count;
    size_t cap;
    fabric_frame_header_t header;
} response_t;

int64_t now_ms(void);
/* An error code a node sent (a header's error_code, a result's error), as this client
 * takes it: wire codes are 0..FABRIC_WIRE_ERROR_MAX, and one below 0 would be read as one
 * of the client's own (-4 NO_NODES is retriable, and a batch was retried until its
 * delivery timeout; -1 INVALID_ARGUMENT blamed the caller's arguments). Such a code is
 * UNKNOWN_SERVER_ERROR, as the Python SDK maps every code it does not know
 * (fabric/errors.py error_for_code). */
static inline int node_error(int code) { return code < 0 ? FABRIC_ERR_UNKNOWN_SERVER_ERROR : code; }
/* Whether a received message is the answer to request id of api_key: a response (flags
 * bit 0, PROTOCOL.md section 2) echoing both. A message without the flag is a request, or a
 * peer's mistake, whatever its body holds: taken as the answer, its body was read as one (a
 * METADATA "answer" that remapped topics, FETCH records handed out). */
static inline int is_answer_to(const fabric_frame_header_t *h, uint32_t id, uint16_t api_key) {
    return (h->flags & FABRIC_FLAG_RESPONSE) && h->correlation_id == id && h->api_key == api_key;
}
/* Strict UTF-8 as Python decodes it (src/codec.c). */
int codec_utf8_valid(const void *s, size_t len);
void client_set_error(client_t *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

int client_init(client_t *c, const char *bootstrap);
/* CURVE keys from the arguments, else from $FABRIC_KEY_FILE/$FABRIC_SERVER_KEY; neither: plaintext. */
int client_set_curve(client_t *c, const char *key_file, const char *server_key);
void client_close(client_t *c);
conn_t *client_conn(client_t *c, const char *address);
/* Close a conn's data socket (and its monitor), discarding what is queued on it; it reopens
 * on next use. */
void client_drop_data(client_t *c, conn_t *conn);
/* conn->drops after reading the events its monitor has queued: one ZMQ_EVENTS query when
 * there are none, so callers read it where they poll or send anyway. Read it just before
 * sending a request, so that a drop before the send is not taken for one after it. */
uint32_t client_drops(conn_t *conn);
/* Close the sockets of every address that is neither a node of the last METADATA answer nor
 * a bootstrap address, except the conns busy[i] marks (a request outstanding on them), and
 * free their slots for client_conn to reuse: nodes that come and go on new ports would
 * otherwise take a slot (and SOCKETS_PER_ADDRESS ZeroMQ sockets) each for good, until no socket could be
 * opened. Called after a successful refresh, when the caller holds no conn_t pointer or
 * index other than those it marks busy (busy has conn_count entries at least). */
void client_close_unused_conns(client_t *c, const uint8_t *busy);
uint32_t client_next_id(client_t *c);

/* Send [header, body, batches...] without blocking longer than CONNECT_WAIT_MS.
 * NODE_NOT_READY when the node cannot take it. */
int client_send(client_t *c, void *sock, const char *address, uint16_t api_key,
                uint32_t correlation_id, const fabric_buf_t *body,
                const fabric_buf_t *const *batches, size_t batch_count);
/* client_send waiting at most connect_ms (0: not at all) for a connected peer. */
int client_send_within(client_t *c, void *sock, const char *address, uint16_t api_key,
                       uint32_t correlation_id, const fabric_buf_t *body,
                       const fabric_buf_t *const *batches, size_t batch_count, int connect_ms);
/* Receive one whole message without waiting. 0 = got one, 1 = none, else an error. */
int client_recv(client_t *c, void *sock, response_t *out);
void response_free(response_t *r);

/* Synchronous request on the conn's control socket; answers to other ids are dropped.
 * A non-zero header error_code is returned as the result, with its message in c->error. */
int client_request(client_t *c, conn_t *conn, uint16_t api_key, const fabric_buf_t *body,
                   int timeout_ms, response_t *out);

/* METADATA for these topics (NULL/0 = all) from any node that answers: known nodes,
 * then the bootstrap list (each address once), starting after the one the last refresh
 * failed on. A first pass gives each node METADATA_QUICK_CONNECT_MS to connect and
 * METADATA_QUICK_ANSWER_MS to answer, a second CONNECT_WAIT_MS and METADATA_TIMEOUT_MS;
 * each attempt waits at most what is left before deadline_ms (but
 * METADATA_ATTEMPT_MIN_MS at least); no attempt starts after deadline_ms, so a refresh
 * ends by then plus one short attempt (NO_DEADLINE: every node is tried, both passes). */
int client_refresh_metadata(client_t *c, const char *const *topics, size_t topic_count,
                            int64_t deadline_ms);
const topic_meta_t *client_topic(const client_t *c, const char *name);
/* The leader's address, or NULL when the map has no leader for it. */
const char *client_leader(const client_t *c, const char *topic, int32_t partition);

#endif
