/*
 * client.c: sockets by node address, request/response plumbing and the routing map.
 *
 * Each node gets two DEALER sockets: "data" carries PRODUCE and FETCH with many requests
 * in flight, "control" carries the synchronous METADATA and LIST_OFFSETS calls. Keeping
 * them apart means a synchronous call never has to read (and drop) a PRODUCE answer.
 */
#include "internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void client_set_error(client_t *c, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->error, sizeof c->error, fmt, ap);
    va_end(ap);
}

static char *dup_bytes(const char *s, size_t len) {
    char *out = malloc(len + 1);
    if (out) {
        memcpy(out, s, len);
        out[len] = '\0';
    }
    return out;
}

/* Whether a bootstrap address (scheme already added) is one ZeroMQ can connect a DEALER to:
 * tcp://HOST:PORT with PORT 1-65535, or an ipc:// or inproc:// name, as the Python SDK
 * checks (sdk/_client.py). Anything else would fail every connect, turn after turn. */
static int address_ok(const char *addr) {
    if (strncmp(addr, "ipc://", 6) == 0) return addr[6] != '\0';
    if (strncmp(addr, "inproc://", 9) == 0) return addr[9] != '\0';
    if (strncmp(addr, "tcp://", 6) != 0) return 0;
    const char *host = addr + 6, *colon = strrchr(host, ':');
    if (colon == NULL || colon == host || colon[1] == '\0') return 0;
    long port = 0;
    for (const char *d = colon + 1; *d; d++) {
        if (*d < '0' || *d > '9' || port > 65535) return 0;
        port = port * 10 + (*d - '0');
    }
    return port >= 1 && port <= 65535;
}

int client_init(client_t *c, const char *bootstrap) {
    memset(c, 0, sizeof *c);
    c->next_correlation_id = 1;
    if (bootstrap == NULL || bootstrap[0] == '\0') {
        client_set_error(c, "bootstrap is empty: give node addresses, tcp://host:port[,...]");
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    /* Split "a,b,c"; a bare "host:port" gets "tcp://". ZooKeeper bootstrap (zk://) is a
     * Python SDK feature: the C client takes node addresses only. */
    const char *p = bootstrap;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        while (len > 0 && (*p == ' ' || *p == '\t')) p++, len--;
        while (len > 0 && (p[len - 1] == ' ' || p[len - 1] == '\t')) len--;
        if (len > 0) {
            if (len >= 5 && strncmp(p, "zk://", 5) == 0) {
                client_set_error(c, "zk:// bootstrap is not supported by the C client: give node "
                                    "addresses (tcp://host:port)");
                client_close(c);
                return FABRIC_ERR_INVALID_ARGUMENT;
            }
            if (c->bootstrap_count == BOOTSTRAP_ADDRESSES_MAX || len > ADDRESS_BYTES_MAX) {
                client_set_error(c, "bootstrap has more than %d addresses or one above %d bytes",
                                 BOOTSTRAP_ADDRESSES_MAX, ADDRESS_BYTES_MAX);
                client_close(c);
                return FABRIC_ERR_INVALID_ARGUMENT;
            }
            char *addr;
            if (memchr(p, ':', len) && len > 3 && strstr(p, "://") && strstr(p, "://") < p + len) {
                addr = dup_bytes(p, len);
            } else {
                addr = malloc(len + 7);
                if (addr) {
                    memcpy(addr, "tcp://", 6);
                    memcpy(addr + 6, p, len);
                    addr[len + 6] = '\0';
                }
            }
            if (addr == NULL) {
                client_close(c);
                return FABRIC_ERR_NO_MEMORY;
            }
            if (!address_ok(addr)) {
                client_set_error(c, "bootstrap address '%.*s' is not tcp://HOST:PORT", (int)len, p);
                free(addr);
                client_close(c);
                return FABRIC_ERR_INVALID_ARGUMENT;
            }
            c->bootstrap[c->bootstrap_count++] = addr;
        }
        if (!end) break;
        p = end + 1;
    }
    if (c->bootstrap_count == 0) {
        client_set_error(c, "bootstrap lists no address");
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    c->zctx = zmq_ctx_new();
    if (c->zctx == NULL) {
        client_close(c);
        return FABRIC_ERR_TRANSPORT;
    }
    /* libzmq allows a context 1,023 sockets unless told otherwise, which a client ran out of
     * at about 170 node addresses; the context is this client's own (no caller shares it),
     * so it is sized here, before its first socket (libzmq reads the value then). */
    int sockets_max = CONTEXT_SOCKETS_MAX;
    int socket_limit = zmq_ctx_get(c->zctx, ZMQ_SOCKET_LIMIT); /* -1 before libzmq 4.1 */
    if (socket_limit > 0 && sockets_max > socket_limit) sockets_max = socket_limit;
    /* Not fatal: with libzmq's default the client works, for fewer addresses at once, and
     * a socket it cannot open says so (open_socket). */
    zmq_ctx_set(c->zctx, ZMQ_MAX_SOCKETS, sockets_max);
    return 0;
}

/* Copy the 40-character value of `field = "..."` from a zmq certificate file. */
static int read_cert_field(client_t *c, const char *path, const char *field, char *out) {
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        client_set_error(c, "cannot open key file %s: %s", path, strerror(errno));
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    char text[KEY_FILE_BYTES_MAX + 1];
    size_t n = fread(text, 1, KEY_FILE_BYTES_MAX, f);
    fclose(f);
    text[n] = '\0';
    const char *at = strstr(text, field);
    const char *quote = at ? strchr(at, '"') : NULL;
    if (quote == NULL || strlen(quote + 1) < CURVE_KEY_CHARS + 1 || quote[1 + CURVE_KEY_CHARS] != '"') {
        client_set_error(c, "key file %s has no %s of %d characters", path, field, CURVE_KEY_CHARS);
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    memcpy(out, quote + 1, CURVE_KEY_CHARS);
    out[CURVE_KEY_CHARS] = '\0';
    return 0;
}

int client_set_curve(client_t *c, const char *key_file, const char *server_key) {
    if (key_file == NULL && server_key == NULL) {
        key_file = getenv("FABRIC_KEY_FILE");
        server_key = getenv("FABRIC_SERVER_KEY");
        if ((key_file == NULL || !*key_file) && (server_key == NULL || !*server_key)) return 0;
    }
    if (key_file == NULL || !*key_file || server_key == NULL || !*server_key) {
        client_set_error(c, "a secure client needs both a key file and the server key");
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    int rc = read_cert_field(c, key_file, "public-key", c->curve_public_key);
    if (rc == 0) rc = read_cert_field(c, key_file, "secret-key", c->curve_secret_key);
    if (rc) return rc;
    FILE *probe = strlen(server_key) == CURVE_KEY_CHARS ? fopen(server_key, "r") : NULL;
    if (strlen(server_key) == CURVE_KEY_CHARS && probe == NULL) {
        memcpy(c->curve_server_key, server_key, CURVE_KEY_CHARS + 1);
    } else {
        if (probe) fclose(probe);
        rc = read_cert_field(c, server_key, "public-key", c->curve_server_key);
        if (rc) return rc;
    }
    c->curve = 1;
    return 0;
}

static void close_socket(void **sock, int linger_ms) {
    if (*sock) {
        zmq_setsockopt(*sock, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
        zmq_close(*sock);
        *sock = NULL;
    }
}

#define HANDSHAKE_EVENTS                                                                       \
    (ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |               \
     ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
/* ...and a connection that dropped: a node that died (the kernel closes a killed process's
 * connections at once), stopped or restarted. The requests sent on it are lost, long before
 * they time out (as the Python SDK watches, fabric/transport.py). */
#define MONITOR_EVENTS (HANDSHAKE_EVENTS | ZMQ_EVENT_DISCONNECTED)

/* A PAIR receiving sock's failed handshakes and dropped connections, or NULL (then
 * failures are only timeouts). Set up before sock connects, so that no event is missed. */
static void *watch_connections(client_t *c, void *sock) {
    char endpoint[96];
    snprintf(endpoint, sizeof endpoint, "inproc://fabric-monitor-%p-%u", (void *)c, c->monitor_seq++);
    if (zmq_socket_monitor(sock, endpoint, MONITOR_EVENTS) != 0) return NULL;
    void *pair = zmq_socket(c->zctx, ZMQ_PAIR);
    if (pair == NULL) return NULL;
    int zero = 0;
    zmq_setsockopt(pair, ZMQ_LINGER, &zero, sizeof zero);
    if (zmq_connect(pair, endpoint) != 0) {
        zmq_close(pair);
        return NULL;
    }
    return pair;
}

/* Read every event conn's monitor has queued: the last failed handshake is kept
 * (conn->refusal), dropped connections are counted (conn->drops). */
static void read_monitor(conn_t *conn) {
    void *monitor = conn->monitor;
    int ready = 0;
    size_t ready_size = sizeof ready;
    /* The common case, nothing queued, costs this query rather than a failed receive. */
    if (monitor == NULL || zmq_getsockopt(monitor, ZMQ_EVENTS, &ready, &ready_size) != 0 || !(ready & ZMQ_POLLIN))
        return;
    for (;;) {
        zmq_msg_t first, second;
        zmq_msg_init(&first);
        if (zmq_msg_recv(&first, monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&first);
            break;
        }
        if (zmq_msg_size(&first) >= 6) { /* u16 event, u32 value, native byte order */
            const uint8_t *d = zmq_msg_data(&first);
            uint16_t event;
            uint32_t value;
            memcpy(&event, d, 2);
            memcpy(&value, d + 2, 4);
            if (event == ZMQ_EVENT_DISCONNECTED) conn->drops++;
            else if (event & HANDSHAKE_EVENTS) conn->refusal = event, conn->refusal_value = value;
        }
        int more = zmq_msg_more(&first);
        zmq_msg_close(&first);
        if (more) { /* the endpoint */
            zmq_msg_init(&second);
            zmq_msg_recv(&second, monitor, ZMQ_DONTWAIT);
            zmq_msg_close(&second);
        }
    }
}

uint32_t client_drops(conn_t *conn) {
    read_monitor(conn);
    return conn->drops;
}

/* Why address could not be reached, when a handshake failed (as the Python SDK words
 * it, fabric/transport.py); NULL when nothing failed but the connection itself. */
static const char *handshake_failure(client_t *c, const char *address) {
    for (size_t i = 0; i < c->conn_count; i++) {
        conn_t *conn = &c->conns[i];
        if (conn->address == NULL || strcmp(conn->address, address) != 0) continue;
        /* The data DEALER's monitor speaks for the control DEALER too (conn_t). */
        read_monitor(conn);
        uint16_t event = conn->refusal;
        uint32_t value = conn->refusal_value;
        if (event == 0) return NULL;
        if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
            return "the node does not know this client's key (register it: fabric principal add)";
        if (!c->curve && event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
            value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
            return "the node requires CURVE; set $FABRIC_KEY_FILE and $FABRIC_SERVER_KEY (docs/SECURITY.md)";
        if (!c->curve)
            return "either the node requires CURVE (set $FABRIC_KEY_FILE and $FABRIC_SERVER_KEY, "
                   "docs/SECURITY.md) or what answers there is not a Fabric node";
        return "the CURVE handshake failed: wrong server key, or the node is not secure";
    }
    return NULL;
}

static void free_topics(client_t *c) {
    for (size_t i = 0; i < c->topic_count; i++) {
        free(c->topics[i].name);
        free(c->topics[i].leaders);
        free(c->topics[i].leader_epochs);
    }
    free(c->topics);
    c->topics = NULL;
    c->topic_count = 0;
}

static void free_nodes(client_t *c) {
    for (size_t i = 0; i < c->node_count; i++) free(c->node_addresses[i]);
    c->node_count = 0;
}

/* A conn's sockets and address; the slot is free afterwards (address NULL). */
static void close_conn(client_t *c, conn_t *conn) {
    close_socket(&conn->data, c->data_linger_ms);
    close_socket(&conn->monitor, 0);
    close_socket(&conn->control, 0);
    free(conn->address);
    memset(conn, 0, sizeof *conn);
}

void client_close(client_t *c) {
    for (size_t i = 0; i < c->conn_count; i++) close_conn(c, &c->conns[i]);
    c->conn_count = 0;
    for (size_t i = 0; i < c->bootstrap_count; i++) free(c->bootstrap[i]);
    c->bootstrap_count = 0;
    free_nodes(c);
    free_topics(c);
    if (c->zctx) {
        zmq_ctx_term(c->zctx);
        c->zctx = NULL;
    }
}

uint32_t client_next_id(client_t *c) {
    uint32_t id = c->next_correlation_id++;
    if (c->next_correlation_id == 0) c->next_correlation_id = 1;
    return id;
}

static void *open_socket(client_t *c, const char *address, int linger_ms, void **monitor) {
    void *s = zmq_socket(c->zctx, ZMQ_DEALER);
    if (s == NULL) {  /* out of sockets (ZMQ_MAX_SOCKETS) or file descriptors */
        int err = errno;
        size_t open_sockets = 0;
        for (size_t i = 0; i < c->conn_count; i++)
            open_sockets += (c->conns[i].data != NULL) + (c->conns[i].control != NULL) +
                            2 * (c->conns[i].monitor != NULL);
        struct rlimit files;
        long long files_max = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                                  ? (long long)files.rlim_cur : -1;
        client_set_error(c,
                         "cannot open a socket for %s: %s (%zu sockets open of the ZeroMQ context's "
                         "%d; the process may open %lld files, and each node address takes %d)",
                         address, zmq_strerror(err), open_sockets, zmq_ctx_get(c->zctx, ZMQ_MAX_SOCKETS),
                         files_max, FDS_PER_ADDRESS);
        return NULL;
    }
    int hwm = SOCKET_HWM_MESSAGES, one = 1;
    int64_t max_bytes = FABRIC_RESPONSE_BYTES_MAX;
    zmq_setsockopt(s, ZMQ_LINGER, &linger_ms, sizeof linger_ms);
    zmq_setsockopt(s, ZMQ_SNDHWM, &hwm, sizeof hwm);
    zmq_setsockopt(s, ZMQ_RCVHWM, &hwm, sizeof hwm);
    /* The largest frame a node may send us; bigger ones close the connection in ZeroMQ
     * before any of it reaches our memory. */
    zmq_setsockopt(s, ZMQ_MAXMSGSIZE, &max_bytes, sizeof max_bytes);
    /* Without IMMEDIATE a DEALER queues messages for a peer that is not there; with it a
     * send to a dead node fails fast and we try another route (as the Python SDK does). */
    zmq_setsockopt(s, ZMQ_IMMEDIATE, &one, sizeof one);
    if (c->curve && (zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, c->curve_server_key, CURVE_KEY_CHARS + 1) != 0 ||
                     zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, c->curve_public_key, CURVE_KEY_CHARS + 1) != 0 ||
                     zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, c->curve_secret_key, CURVE_KEY_CHARS + 1) != 0)) {
        client_set_error(c, "CURVE keys refused by ZeroMQ (is libzmq built with CURVE?): %s", zmq_strerror(errno));
        zmq_close(s);
        return NULL;
    }
    if (monitor) {
        close_socket(monitor, 0); /* the last socket's, if any */
        *monitor = watch_connections(c, s);
    }
    if (zmq_connect(s, address) != 0) {
        client_set_error(c, "cannot connect to %s: %s", address, zmq_strerror(errno));
        zmq_close(s);
        if (monitor) close_socket(monitor, 0);
        return NULL;
    }
    return s;
}

conn_t *client_conn(client_t *c, const char *address) {
    conn_t *conn = NULL, *free_slot = NULL;
    for (size_t i = 0; i < c->conn_count && conn == NULL; i++) {
        if (c->conns[i].address == NULL) {
            if (free_slot == NULL) free_slot = &c->conns[i];
        } else if (strcmp(c->conns[i].address, address) == 0) {
            conn = &c->conns[i];
        }
    }
    if (conn == NULL) {
        /* A slot client_close_unused_conns freed, else a new one at the end. */
        if (free_slot == NULL && c->conn_count == FABRIC_NODES_MAX) {
            client_set_error(c, "more than FABRIC_NODES_MAX=%d node addresses in use", FABRIC_NODES_MAX);
            return NULL;
        }
        conn = free_slot ? free_slot : &c->conns[c->conn_count];
        memset(conn, 0, sizeof *conn);
        conn->address = dup_bytes(address, strlen(address));
        if (conn->address == NULL) return NULL;
        if (free_slot == NULL) c->conn_count++;
    }
    if (conn->data == NULL) {
        conn->data = open_socket(c, address, c->data_linger_ms, &conn->monitor);
        conn->refusal = 0;
    }
    if (conn->control == NULL) {
        conn->control = open_socket(c, address, 0, NULL);
    }
    if (conn->data == NULL || conn->control == NULL) return NULL;
    return conn;
}

void client_drop_data(client_t *c, conn_t *conn) {
    (void)c;
    close_socket(&conn->data, 0);
    close_socket(&conn->monitor, 0);
}

/* Whether address is one the routing map or a refresh may send to: a node of the last
 * METADATA answer (every live node, so every leader it names) or a bootstrap address. */
static int address_in_use(const client_t *c, const char *address) {
    for (size_t i = 0; i < c->node_count; i++)
        if (strcmp(c->node_addresses[i], address) == 0) return 1;
    for (size_t i = 0; i < c->bootstrap_count; i++)
        if (strcmp(c->bootstrap[i], address) == 0) return 1;
    return 0;
}

void client_close_unused_conns(client_t *c, const uint8_t *busy) {
    for (size_t i = 0; i < c->conn_count; i++) {
        conn_t *conn = &c->conns[i];
        if (conn->address == NULL) continue;
        if (busy[i] || address_in_use(c, conn->address)) {
            /* Kept: its monitor is read here too, so that the drops of a node the client sends
             * nothing to do not pile up (libzmq's send of an event waits while the queue, 1,000
             * events, is full). */
            read_monitor(conn);
            continue;
        }
        close_conn(c, conn);
    }
    /* Free slots at the end are given back, so loops over conn_count stay short; the others
     * stay where they are, since callers hold the index of a busy slot. */
    while (c->conn_count > 0 && c->conns[c->conn_count - 1].address == NULL) c->conn_count--;
}

/* client_send, waiting at most connect_ms for a connected peer. */
static int send_within(client_t *c, void *sock, const char *address, uint16_t api_key,
                       uint32_t correlation_id, const fabric_buf_t *body,
                       const fabric_buf_t *const *batches, size_t batch_count, int connect_ms) {
    fabric_frame_header_t h = {FABRIC_PROTOCOL_VERSION, 0, api_key, 0, 0, correlation_id};
    uint8_t header[FABRIC_HEADER_BYTES];
    fabric_header_encode(&h, header);
    int64_t deadline = now_ms() + connect_ms;
    /* Once the first frame is queued ZeroMQ accepts the rest of the message, so only the
     * first send can report EAGAIN (queue full, or no connected peer with IMMEDIATE). */
    for (;;) {
        if (zmq_send(sock, header, sizeof header, ZMQ_SNDMORE | ZMQ_DONTWAIT) >= 0) break;
        if (errno != EAGAIN) {
            client_set_error(c, "send to %s failed: %s", address, zmq_strerror(errno));
            return FABRIC_ERR_TRANSPORT;
        }
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            const char *why = handshake_failure(c, address);
            if (why)
                client_set_error(c, "node %s refused the connection: %s", address, why);
            else
                client_set_error(c, "node %s is not reachable (no connection within %d ms)", address,
                                 connect_ms);
            return FABRIC_ERR_NODE_NOT_READY;
        }
        zmq_pollitem_t item = {sock, 0, ZMQ_POLLOUT, 0};
        zmq_poll(&item, 1, left < 10 ? (long)left : 10);
    }
    int more = batch_count ? ZMQ_SNDMORE : 0;
    if (zmq_send(sock, body->data ? (const void *)body->data : (const void *)"", body->len, more) <
        0)
        return FABRIC_ERR_TRANSPORT;
    for (size_t i = 0; i < batch_count; i++) {
        int flags = i + 1 < batch_count ? ZMQ_SNDMORE : 0;
        if (zmq_send(sock, batches[i]->data, batches[i]->len, flags) < 0)
            return FABRIC_ERR_TRANSPORT;
    }
    return 0;
}

int client_send(client_t *c, void *sock, const char *address, uint16_t api_key,
                uint32_t correlation_id, const fabric_buf_t *body,
                const fabric_buf_t *const *batches, size_t batch_count) {
    return send_within(c, sock, address, api_key, correlation_id, body, batches, batch_count,
                       CONNECT_WAIT_MS);
}

int client_send_within(client_t *c, void *sock, const char *address, uint16_t api_key,
                       uint32_t correlation_id, const fabric_buf_t *body,
                       const fabric_buf_t *const *batches, size_t batch_count, int connect_ms) {
    return send_within(c, sock, address, api_key, correlation_id, body, batches, batch_count,
                       connect_ms < 0 ? 0 : connect_ms);
}

void response_free(response_t *r) {
    for (size_t i = 0; i < r->count; i++) zmq_msg_close(&r->frames[i]);
    free(r->frames);
    memset(r, 0, sizeof *r);
}

int client_recv(client_t *c, void *sock, response_t *out) {
    memset(out, 0, sizeof *out);
    int flags = ZMQ_DONTWAIT;
    int too_many = 0;
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, sock, flags) < 0) {
            zmq_msg_close(&msg);
            if (errno == EAGAIN && out->count == 0 && !too_many) return 1;
            response_free(out);
            client_set_error(c, "receive failed: %s", zmq_strerror(errno));
            return FABRIC_ERR_TRANSPORT;
        }
        flags = 0; /* the rest of a multipart message is already here */
        int more = zmq_msg_more(&msg);
        /* Frames are kept only up to RESPONSE_FRAMES_MAX; beyond that the message is
         * drained and refused, so a peer cannot make us keep an unbounded frame list. */
        if (!too_many && out->count == out->cap) {
            size_t cap = out->cap ? out->cap * 2 : 8;
            if (cap > RESPONSE_FRAMES_MAX) cap = RESPONSE_FRAMES_MAX;
            zmq_msg_t *frames =
                out->count < RESPONSE_FRAMES_MAX ? realloc(out->frames, cap * sizeof *frames) : NULL;
            if (frames == NULL) {
                too_many = 1;
            } else {
                out->frames = frames;
                out->cap = cap;
            }
        }
        if (too_many) {
            zmq_msg_close(&msg);
        } else {
            out->frames[out->count++] = msg;
        }
        if (!more) break;
    }
    if (too_many) {
        response_free(out);
        client_set_error(c, "response with more than %d frames refused", RESPONSE_FRAMES_MAX);
        return FABRIC_ERR_MALFORMED_REQUEST;
    }
    if (out->count < 2) {
        response_free(out);
        client_set_error(c, "response has no body frame");
        return FABRIC_ERR_MALFORMED_REQUEST;
    }
    int rc = fabric_header_decode(zmq_msg_data(&out->frames[0]), zmq_msg_size(&out->frames[0]),
                                  &out->header, c->error, sizeof c->error);
    if (rc) {
        response_free(out);
        return rc;
    }
    out->header.error_code = (int16_t)node_error(out->header.error_code);
    return 0;
}

/* client_request, waiting at most connect_ms for a connection (then timeout_ms for the answer). */
static int request_within(client_t *c, conn_t *conn, uint16_t api_key, const fabric_buf_t *body,
                          int connect_ms, int timeout_ms, response_t *out) {
    memset(out, 0, sizeof *out);
    uint32_t id = client_next_id(c);
    int rc = send_within(c, conn->control, conn->address, api_key, id, body, NULL, 0, connect_ms);
    if (rc) return rc;
    int64_t deadline = now_ms() + timeout_ms;
    unsigned not_responses = 0; /* messages with our id and API but no response flag, dropped */
    for (;;) {
        int64_t left = deadline - now_ms();
        if (left <= 0) {
            /* A fresh control socket, so a late answer cannot be mistaken for a later one. */
            close_socket(&conn->control, 0);
            client_set_error(c, "request (api %u) to %s timed out after %d ms%s", api_key,
                             conn->address, timeout_ms,
                             not_responses ? " (what came with its id had no response flag: dropped)" : "");
            return FABRIC_ERR_REQUEST_TIMED_OUT;
        }
        zmq_pollitem_t item = {conn->control, 0, ZMQ_POLLIN, 0};
        if (zmq_poll(&item, 1, (long)left) <= 0) continue;
        rc = client_recv(c, conn->control, out);
        if (rc == 1) continue;
        if (rc) return rc;
        if (!is_answer_to(&out->header, id, api_key)) {
            if (out->header.correlation_id == id && out->header.api_key == api_key) not_responses++;
            response_free(out);
            continue;
        }
        if (out->header.error_code != 0) {
            int code = out->header.error_code;
            fabric_arena_t arena;
            fabric_arena_init(&arena);
            fabric_error_body_t eb;
            if (fabric_error_body_decode(zmq_msg_data(&out->frames[1]),
                                         zmq_msg_size(&out->frames[1]), &arena, &eb, NULL, 0) == 0)
                client_set_error(c, "%s from %s: %s", fabric_err_name(code), conn->address,
                                 eb.message.data);
            fabric_arena_free(&arena);
            response_free(out);
            return code;
        }
        return 0;
    }
}

int client_request(client_t *c, conn_t *conn, uint16_t api_key, const fabric_buf_t *body,
                   int timeout_ms, response_t *out) {
    return request_within(c, conn, api_key, body, CONNECT_WAIT_MS, timeout_ms, out);
}

/* Replace the routing map with a decoded METADATA response. Topics not in the response
 * keep their old entry (we may have asked for a subset), and so do known topics it lists
 * with an error. */
static int apply_metadata(client_t *c, const fabric_metadata_response_t *m) {
    if (m->node_count > FABRIC_NODES_MAX) {
        client_set_error(c, "METADATA lists %u nodes, above FABRIC_NODES_MAX=%d", m->node_count,
                         FABRIC_NODES_MAX);
        return FABRIC_ERR_MALFORMED_REQUEST;
    }
    free_nodes(c);
    for (uint32_t i = 0; i < m->node_count; i++) {
        c->node_ids[i] = m->nodes[i].node_id;
        c->node_addresses[i] = dup_bytes(m->nodes[i].address.data, m->nodes[i].address.len);
        if (c->node_addresses[i] == NULL) return FABRIC_ERR_NO_MEMORY;
        c->node_count = i + 1;
    }
    for (uint32_t t = 0; t < m->topic_count; t++) {
        const fabric_metadata_topic_t *mt = &m->topics[t];
        /* A topic error (LEADER_NOT_AVAILABLE while a node learns of added partitions or an
         * election runs, UNKNOWN_TOPIC_OR_PARTITION from a node that has not learned the
         * topic yet) says nothing about the partitions we know: the entry it replaced left
         * no partition a leader, and a consumer took UNKNOWN_TOPIC_OR_PARTITION from one
         * lagging node as the topic's end. The map we had is kept, as the Python SDK's
         * MetadataClient._parse keeps it for LEADER_NOT_AVAILABLE (it forgets it on other
         * errors; here a topic that really went is reported by its leaders, whose PRODUCE and
         * FETCH results say UNKNOWN_TOPIC_OR_PARTITION or AUTHORIZATION_FAILED). Without a map
         * to keep, the entry records the error: what a caller asking for the topic gets. */
        topic_meta_t *known = (topic_meta_t *)client_topic(c, mt->name.data);
        if (mt->error != 0 && known != NULL && known->partition_count > 0) continue;
        /* Partitions are listed by number, each once: 0..n-1 in any order (the array
         * decoder bounds n by FABRIC_ARRAY_ITEMS_MAX, so it fits an int32). Those listed
         * with a topic error are not routed to (nor does the Python SDK route to them). */
        int32_t count = mt->error ? 0 : (int32_t)mt->partition_count;
        int32_t *leaders = malloc(sizeof(int32_t) * (size_t)(count ? count : 1));
        int32_t *epochs = malloc(sizeof(int32_t) * (size_t)(count ? count : 1));
        uint8_t *listed = calloc((size_t)(count ? count : 1), 1);
        if (leaders == NULL || epochs == NULL || listed == NULL) {
            free(leaders);
            free(epochs);
            free(listed);
            return FABRIC_ERR_NO_MEMORY;
        }
        /* A topic listed with no partitions (and no error), or with a number twice, past
         * the count or negative, is not trusted: read as it came, partition 0 listed twice
         * made a topic of one partition (keys hashed over that count went to the wrong
         * partitions), a known topic listed with none was given up by the consumer, and a
         * number past the count refused the whole answer, every other topic with it. Its
         * entry is ignored, the topic kept as it was known or left unknown, as a node still
         * learning it (the Python SDK's MetadataClient._parse). */
        int trusted = mt->error != 0 || count > 0;
        for (uint32_t k = 0; k < (uint32_t)count; k++) {
            const fabric_partition_state_t *ps = &mt->partitions[k];
            if (ps->partition < 0 || ps->partition >= count || listed[ps->partition]) {
                trusted = 0;
                break;
            }
            listed[ps->partition] = 1;
            leaders[ps->partition] = ps->error ? -1 : ps->leader;
            epochs[ps->partition] = ps->leader_epoch;
        }
        free(listed);
        if (!trusted) {
            free(leaders);
            free(epochs);
            continue;
        }
        /* A new topic enters the map only whole: one left there without its partitions (out
         * of memory for them) read as a topic with none, which callers take as an answer
         * and do not ask about again. */
        topic_meta_t *tm = known;
        if (tm == NULL) {
            char *name = dup_bytes(mt->name.data, mt->name.len);
            topic_meta_t *grown = name ? realloc(c->topics, (c->topic_count + 1) * sizeof *grown) : NULL;
            if (grown == NULL) {
                free(name);
                free(leaders);
                free(epochs);
                return FABRIC_ERR_NO_MEMORY;
            }
            c->topics = grown;
            tm = &c->topics[c->topic_count++];
            memset(tm, 0, sizeof *tm);
            tm->name = name;
        }
        tm->error = (int16_t)node_error(mt->error);
        tm->message_bytes_max = mt->message_bytes_max;
        free(tm->leaders);
        free(tm->leader_epochs);
        tm->leaders = leaders;
        tm->leader_epochs = epochs;
        tm->partition_count = count;
    }
    return 0;
}

static int metadata_from(client_t *c, const char *address, const fabric_buf_t *body, int connect_ms,
                         int timeout_ms) {
    conn_t *conn = client_conn(c, address);
    if (conn == NULL) return FABRIC_ERR_TRANSPORT;
    response_t resp;
    int rc = request_within(c, conn, FABRIC_API_METADATA, body, connect_ms, timeout_ms, &resp);
    if (rc) return rc;
    fabric_arena_t arena;
    fabric_arena_init(&arena);
    fabric_metadata_response_t m;
    rc = fabric_metadata_response_decode(zmq_msg_data(&resp.frames[1]),
                                         zmq_msg_size(&resp.frames[1]), &arena, &m, c->error,
                                         sizeof c->error);
    if (rc == 0 && resp.count != 2) {
        client_set_error(c, "METADATA response has %zu frames, expected 2", resp.count);
        rc = FABRIC_ERR_MALFORMED_REQUEST;
    }
    if (rc == 0) rc = apply_metadata(c, &m);
    fabric_arena_free(&arena);
    response_free(&resp);
    return rc;
}

int client_refresh_metadata(client_t *c, const char *const *topics, size_t topic_count,
                            int64_t deadline_ms) {
    fabric_buf_t body;
    fabric_buf_init(&body);
    fabric_buf_put_u32(&body, (uint32_t)topic_count);
    for (size_t i = 0; i < topic_count; i++) fabric_buf_put_str(&body, topics[i], strlen(topics[i]));
    if (body.err) {
        fabric_buf_free(&body);
        client_set_error(c, "topic name too long");
        return FABRIC_ERR_INVALID_ARGUMENT;
    }
    /* Known nodes first (the cluster may have moved on from the bootstrap list), then the
     * bootstrap addresses, each address once. Copies, because a successful answer replaces
     * the node list. */
    char *candidates[FABRIC_NODES_MAX + BOOTSTRAP_ADDRESSES_MAX];
    size_t n = 0;
    for (size_t i = 0; i < c->node_count + c->bootstrap_count; i++) {
        const char *address = i < c->node_count ? c->node_addresses[i] : c->bootstrap[i - c->node_count];
        int seen = 0;
        for (size_t k = 0; k < n && !seen; k++) seen = candidates[k] && strcmp(candidates[k], address) == 0;
        if (!seen) candidates[n++] = dup_bytes(address, strlen(address));
    }
    /* Any live node answers METADATA in milliseconds, so a first pass gives each node only
     * a short while to take the request and answer it: a stopped node (SIGSTOP, a frozen
     * VM) still accepts connections and never answers, and asked first it cost the whole
     * METADATA_TIMEOUT_MS while nothing else progressed. Then the patient pass. As the
     * Python SDK (sdk/_client.py METADATA_QUICK_ANSWER_MS). */
    static const struct {
        int connect_ms, answer_ms;
    } passes[] = {{METADATA_QUICK_CONNECT_MS, METADATA_QUICK_ANSWER_MS}, {CONNECT_WAIT_MS, METADATA_TIMEOUT_MS}};
    int rc = FABRIC_ERR_NO_NODES;
    char last[ERROR_TEXT_BYTES] = "";
    size_t tried = 0, start = n ? c->metadata_rotor % n : 0;
    int out_of_time = 0;
    for (size_t pass = 0; pass < sizeof passes / sizeof passes[0] && rc == FABRIC_ERR_NO_NODES && !out_of_time; pass++) {
        for (size_t k = 0; k < n; k++) {
            size_t i = (start + k) % n;
            if (candidates[i] == NULL) continue;
            int64_t left = deadline_ms == NO_DEADLINE ? METADATA_TIMEOUT_MS : deadline_ms - now_ms();
            if (tried > 0 && left <= 0) {
                snprintf(last + strlen(last), sizeof last - strlen(last),
                         " (out of time after %zu attempts to %zu nodes)", tried, n);
                out_of_time = 1;
                break;
            }
            if (left < METADATA_ATTEMPT_MIN_MS) left = METADATA_ATTEMPT_MIN_MS;
            int answer_ms = left < passes[pass].answer_ms ? (int)left : passes[pass].answer_ms;
            int connect_ms = left < passes[pass].connect_ms ? (int)left : passes[pass].connect_ms;
            tried++;
            int attempt = metadata_from(c, candidates[i], &body, connect_ms, answer_ms);
            if (attempt == 0) {
                rc = 0;
                break;
            }
            c->metadata_rotor = start + k + 1; /* the next refresh starts past this node */
            snprintf(last, sizeof last, "%s", c->error);
            if (attempt == FABRIC_ERR_NO_MEMORY) {
                rc = attempt;
                break;
            }
        }
    }
    for (size_t i = 0; i < n; i++) free(candidates[i]);
    fabric_buf_free(&body);
    if (rc == FABRIC_ERR_NO_NODES)
        client_set_error(c, "no node answered METADATA; last error: %s", last);
    return rc;
}

const topic_meta_t *client_topic(const client_t *c, const char *name) {
    for (size_t i = 0; i < c->topic_count; i++) {
        if (strcmp(c->topics[i].name, name) == 0) return &c->topics[i];
    }
    return NULL;
}

const char *client_leader(const client_t *c, const char *topic, int32_t partition) {
    const topic_meta_t *t = client_topic(c, topic);
    if (t == NULL || partition < 0 || partition >= t->partition_count) return NULL;
    int32_t leader = t->leaders[partition];
    if (leader < 0) return NULL;
    for (size_t i = 0; i < c->node_count; i++) {
        if (c->node_ids[i] == leader) return c->node_addresses[i];
    }
    return NULL;
}

int fabric_topic_partition_count(const char *bootstrap, const char *topic, int timeout_ms,
                                 int32_t *count) {
    if (topic == NULL || count == NULL) return FABRIC_ERR_INVALID_ARGUMENT;
    int64_t deadline = timeout_ms < 0 ? NO_DEADLINE : now_ms() + timeout_ms;
    client_t c;
    int rc = client_init(&c, bootstrap);
    if (rc) return rc;
    rc = client_set_curve(&c, NULL, NULL);
    if (rc == 0) rc = client_refresh_metadata(&c, &topic, 1, deadline);
    if (rc == 0) {
        const topic_meta_t *t = client_topic(&c, topic);
        if (t == NULL || t->error) rc = t ? t->error : FABRIC_ERR_UNKNOWN_TOPIC_OR_PARTITION;
        else *count = t->partition_count;
    }
    client_close(&c);
    return rc;
}
