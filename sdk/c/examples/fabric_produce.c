/*
 * fabric-produce: lines from stdin -> records of a topic.
 *
 *   fabric-produce -b tcp://127.0.0.1:9092 -t events [options] < lines.txt
 *
 * Each line (without its '\n') is one record's value. With --key-sep SEP the line is
 * "key SEP value" (a line without SEP has a null key); with --line-headers too, the fields
 * after the value are headers "name=value" (a field without '=' is a null-valued header),
 * separated by SEP. Prints a summary on stderr; exits 1 if any record failed.
 */
#define _GNU_SOURCE /* memmem */
#include "../fabric.h"
#include "int_arg.h"

#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define LINE_BYTES_MAX (16 * 1024 * 1024) /* a longer line is refused */
#define READ_BYTES 65536
#define HEADERS_MAX 64 /* per record, from -H and --line-headers together */

typedef struct {
    unsigned long long acked, failed, batches;
    int quiet;
    int last_error;
} stats_t;

static void on_delivery(const fabric_delivery_t *d, void *opaque) {
    stats_t *s = opaque;
    s->batches++;
    if (d->error) {
        s->failed += d->record_count;
        s->last_error = d->error;
        if (!s->quiet)
            fprintf(stderr, "fabric-produce: %u records to %s/%d failed: %s (%s)\n",
                    d->record_count, d->topic, d->partition, fabric_err_name(d->error),
                    d->message[0] ? d->message : fabric_strerror(d->error));
    } else {
        s->acked += d->record_count;
    }
}

/* A zk:// bootstrap is ZooKeeper, which the C client does not speak: say so plainly, with
 * where to find node addresses, instead of a bare INVALID_ARGUMENT. */
static int refuse_zookeeper(const char *prog, const char *bootstrap) {
    if (strstr(bootstrap, "zk://") == NULL) return 0;
    fprintf(stderr,
            "%s: %s is a ZooKeeper address; the C client needs node addresses (tcp://HOST:PORT,...): "
            "`fabric up` prints them, or run python3 -c \"from sdk import Admin; "
            "print(','.join(Admin('%s').nodes().values()))\"\n",
            prog, bootstrap, bootstrap);
    return 1;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: fabric-produce -b BOOTSTRAP -t TOPIC [options] < lines\n"
            "  -b, --bootstrap ADDRS     node addresses, tcp://host:port[,...] (not zk://)\n"
            "  -t, --topic NAME          topic to produce to\n"
            "  -p, --partition N         fixed partition (default: by key, sticky without key)\n"
            "  -k, --key-sep SEP         each line is KEY SEP VALUE\n"
            "  -K, --key KEY             the same key for every record\n"
            "  -H, --header NAME=VALUE   a header on every record (repeatable)\n"
            "      --line-headers        with -k: fields after the value are NAME=VALUE headers\n"
            "  -a, --acks 0|1|-1|all     default all (as `fabric produce` and the Python SDK)\n"
            "  -z, --compression lz4|none  default lz4\n"
            "  -l, --linger-ms N         default 5\n"
            "  -s, --batch-bytes N       default 262144\n"
            "  -T, --timeout-ms N        how long to wait for acknowledgements at the end (120000;\n"
            "                            -1 = no limit)\n"
            "  -q, --quiet               no per-batch error lines\n");
}

static volatile sig_atomic_t stopping = 0;
static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

/* Split one header field "name=value" into h (pointers into the line). */
static void parse_header(char *field, size_t len, fabric_header_t *h) {
    char *eq = memchr(field, '=', len);
    h->name = field;
    if (eq == NULL) {
        h->name_len = len;
        h->value = NULL;
        h->value_len = -1;
    } else {
        h->name_len = (size_t)(eq - field);
        h->value = eq + 1;
        h->value_len = (int32_t)(len - h->name_len - 1);
    }
}

typedef struct {
    const char *topic;
    int32_t partition;
    const char *key_sep;
    size_t key_sep_len;
    const char *fixed_key;
    int line_headers;
    fabric_header_t fixed_headers[HEADERS_MAX];
    size_t fixed_header_count;
} options_t;

static int produce_line(fabric_producer_t *p, const options_t *o, char *line, size_t len) {
    const char *key = o->fixed_key;
    int32_t key_len = key ? (int32_t)strlen(key) : -1;
    char *value = line;
    size_t value_len = len;
    fabric_header_t headers[HEADERS_MAX];
    size_t header_count = o->fixed_header_count;
    memcpy(headers, o->fixed_headers, header_count * sizeof headers[0]);
    if (o->key_sep) {
        char *sep = memmem(line, len, o->key_sep, o->key_sep_len);
        if (sep) {
            key = line;
            key_len = (int32_t)(sep - line);
            value = sep + o->key_sep_len;
            value_len = len - (size_t)(value - line);
            if (o->line_headers) {
                char *end = line + len;
                char *next = memmem(value, value_len, o->key_sep, o->key_sep_len);
                if (next) {
                    value_len = (size_t)(next - value);
                    char *field = next + o->key_sep_len;
                    for (;;) {
                        char *field_end = memmem(field, (size_t)(end - field), o->key_sep, o->key_sep_len);
                        size_t field_len = field_end ? (size_t)(field_end - field) : (size_t)(end - field);
                        if (header_count == HEADERS_MAX) {
                            fprintf(stderr, "fabric-produce: more than %d headers on a line\n", HEADERS_MAX);
                            return FABRIC_ERR_INVALID_ARGUMENT;
                        }
                        parse_header(field, field_len, &headers[header_count++]);
                        if (!field_end) break;
                        field = field_end + o->key_sep_len;
                    }
                }
            }
        }
    }
    return fabric_produce(p, o->topic, o->partition, key, key_len, value, (int32_t)value_len,
                          headers, header_count, -1);
}

int main(int argc, char **argv) {
    const char *bootstrap = NULL;
    options_t o;
    memset(&o, 0, sizeof o);
    o.partition = -1;
    int timeout_ms = 120000;
    stats_t stats = {0, 0, 0, 0, 0};
    fabric_producer_config_t cfg;
    fabric_producer_config_init(&cfg);
    cfg.on_delivery = on_delivery;
    cfg.opaque = &stats;
    static const struct option long_options[] = {
        {"bootstrap", required_argument, 0, 'b'},   {"topic", required_argument, 0, 't'},
        {"partition", required_argument, 0, 'p'},   {"key-sep", required_argument, 0, 'k'},
        {"key", required_argument, 0, 'K'},         {"header", required_argument, 0, 'H'},
        {"line-headers", no_argument, 0, 'L'},      {"acks", required_argument, 0, 'a'},
        {"compression", required_argument, 0, 'z'}, {"linger-ms", required_argument, 0, 'l'},
        {"batch-bytes", required_argument, 0, 's'}, {"timeout-ms", required_argument, 0, 'T'},
        {"quiet", no_argument, 0, 'q'},             {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "b:t:p:k:K:H:a:z:l:s:T:qh", long_options, NULL)) != -1) {
        switch (opt) {
        case 'b': bootstrap = optarg; break;
        case 't': o.topic = optarg; break;
        case 'p': o.partition = (int32_t)int_arg("fabric-produce", "--partition", optarg, -1, INT32_MAX); break;
        case 'k':
            o.key_sep = optarg;
            o.key_sep_len = strlen(optarg);
            break;
        case 'K': o.fixed_key = optarg; break;
        case 'H':
            if (o.fixed_header_count == HEADERS_MAX) {
                fprintf(stderr, "fabric-produce: at most %d -H options\n", HEADERS_MAX);
                return 2;
            }
            parse_header(optarg, strlen(optarg), &o.fixed_headers[o.fixed_header_count++]);
            break;
        case 'L': o.line_headers = 1; break;
        case 'a':
            cfg.acks = strcmp(optarg, "all") == 0 ? -1 : (int)int_arg("fabric-produce", "--acks", optarg, -1, 1);
            break;
        case 'z':
            if (strcmp(optarg, "lz4") == 0) cfg.compression = FABRIC_CODEC_LZ4;
            else if (strcmp(optarg, "none") == 0) cfg.compression = FABRIC_CODEC_NONE;
            else {
                fprintf(stderr, "fabric-produce: compression must be lz4 or none\n");
                return 2;
            }
            break;
        case 'l': cfg.linger_ms = (int)int_arg("fabric-produce", "--linger-ms", optarg, 0, INT32_MAX); break;
        case 's':
            cfg.batch_bytes_max = (size_t)int_arg("fabric-produce", "--batch-bytes", optarg, 1,
                                                  FABRIC_BATCH_UNCOMPRESSED_BYTES_MAX);
            break;
        case 'T': timeout_ms = (int)int_arg("fabric-produce", "--timeout-ms", optarg, -1, INT32_MAX); break;
        case 'q': stats.quiet = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (bootstrap == NULL || o.topic == NULL || optind != argc ||
        (o.line_headers && o.key_sep == NULL) || (o.key_sep && o.key_sep_len == 0)) {
        usage(stderr);
        return 2;
    }
    if (refuse_zookeeper("fabric-produce", bootstrap)) return 2;
    if (cfg.buffer_bytes_max < cfg.batch_bytes_max) cfg.buffer_bytes_max = 4 * cfg.batch_bytes_max;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    fabric_producer_t *p;
    int rc = fabric_producer_new(&p, bootstrap, &cfg);
    if (rc) {
        fprintf(stderr, "fabric-produce: %s: %s\n", fabric_err_name(rc), fabric_strerror(rc));
        return 2;
    }
    int32_t partitions;
    rc = fabric_producer_partition_count(p, o.topic, &partitions);
    if (rc) {
        fprintf(stderr, "fabric-produce: %s: %s\n", fabric_err_name(rc), fabric_producer_last_error(p));
        fabric_producer_destroy(p);
        return 1;
    }

    /* Read with poll() rather than stdio, so that linger timers fire while stdin is idle. */
    size_t cap = READ_BYTES, len = 0;
    char *buf = malloc(cap);
    unsigned long long sent = 0;
    int eof = 0, failed = buf == NULL;
    while (!eof && !failed && !stopping) {
        struct pollfd pfd = {STDIN_FILENO, POLLIN, 0};
        int wait = fabric_producer_next_timeout_ms(p);
        int ready = poll(&pfd, 1, wait < 0 ? 100 : wait);
        if (ready <= 0) {
            fabric_producer_poll(p, 0);
            continue;
        }
        if (cap - len < READ_BYTES) {
            if (cap >= LINE_BYTES_MAX + READ_BYTES) {
                fprintf(stderr, "fabric-produce: a line is longer than %d bytes\n", LINE_BYTES_MAX);
                failed = 1;
                break;
            }
            char *grown = realloc(buf, cap * 2);
            if (grown == NULL) {
                failed = 1;
                break;
            }
            buf = grown;
            cap *= 2;
        }
        ssize_t n = read(STDIN_FILENO, buf + len, cap - len);
        if (n < 0) {
            if (errno == EINTR) continue;
            perror("fabric-produce: read");
            failed = 1;
            break;
        }
        if (n == 0) {
            eof = 1;
            if (len > 0) buf[len++] = '\n'; /* a last line without '\n' */
        }
        len += (size_t)n;
        size_t start = 0;
        for (;;) {
            char *nl = memchr(buf + start, '\n', len - start);
            if (nl == NULL) break;
            size_t line_len = (size_t)(nl - (buf + start));
            rc = produce_line(p, &o, buf + start, line_len);
            if (rc) {
                fprintf(stderr, "fabric-produce: record %llu: %s: %s\n", sent + 1,
                        fabric_err_name(rc), fabric_producer_last_error(p));
                failed = 1;
                break;
            }
            sent++;
            start = (size_t)(nl - buf) + 1;
        }
        memmove(buf, buf + start, len - start);
        len -= start;
    }
    free(buf);
    rc = fabric_producer_flush(p, timeout_ms);
    if (rc) fprintf(stderr, "fabric-produce: %s\n", fabric_producer_last_error(p));
    fabric_producer_destroy(p);
    fprintf(stderr,
            "fabric-produce: %llu records sent, %llu acknowledged%s, %llu failed, %llu batches\n",
            sent, stats.acked, cfg.acks == 0 ? " (acks=0: handed to the socket)" : "",
            stats.failed, stats.batches);
    return (failed || rc || stats.failed || stats.acked != sent) ? 1 : 0;
}
