/*
 * fabric-consume: partitions of one topic from an offset -> stdout.
 *
 *   fabric-consume -b tcp://127.0.0.1:9092 -t events -p 0 [-p 1 ...] [-o beginning|end|N] [-c N] [-f]
 *
 * Prints one line per record: the --fields (default "value") separated by tabs. With
 * --hex, keys, values and header values are printed in hex (binary safe; a null is "-").
 * It stops after --count records if given; without --follow also once no record has come
 * for --idle-ms. A poll error ends it with exit status 1, among them REQUEST_TIMED_OUT once
 * the topic has had no partition map for --metadata-wait-ms (fabric_consumer_config_t).
 */
#include "../fabric.h"
#include "int_arg.h"

#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FIELDS_MAX 8
#define PARTITIONS_MAX 1024
#define POLL_SLICE_MS 500 /* how often a follow loop checks for Ctrl-C */

enum field { F_PARTITION, F_OFFSET, F_TIMESTAMP, F_KEY, F_VALUE, F_HEADERS };

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static volatile sig_atomic_t stopping = 0;
static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
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
            "usage: fabric-consume -b BOOTSTRAP -t TOPIC -p PARTITION [options]\n"
            "  -b, --bootstrap ADDRS   node addresses, tcp://host:port[,...] (not zk://)\n"
            "  -t, --topic NAME\n"
            "  -p, --partition N       repeat for more partitions (all from --offset)\n"
            "  -o, --offset OFF        beginning (default), end, or an offset\n"
            "  -c, --count N           stop after N records\n"
            "  -f, --follow            wait for new records forever (Ctrl-C stops)\n"
            "  -i, --idle-ms N         without -f: stop after N ms without records (2000)\n"
            "  -F, --fields LIST       comma list of partition,offset,timestamp,key,value,headers\n"
            "  -x, --hex               hex-encode keys, values and header values\n"
            "  -z, --reset earliest|latest|none  on OFFSET_OUT_OF_RANGE (earliest)\n"
            "  -m, --metadata-wait-ms N  exit 1 once METADATA has not mapped the topic (listed it with\n"
            "                          a retriable error or no partitions) for N ms (60000; -1 = no\n"
            "                          limit); without -f only a wait below --idle-ms is reached\n");
}

static void put_bytes(const void *data, int32_t len, int hex) {
    if (len < 0) {
        if (hex) fputc('-', stdout);
        return;
    }
    if (!hex) {
        fwrite(data, 1, (size_t)len, stdout);
        return;
    }
    static const char digits[] = "0123456789abcdef";
    const unsigned char *p = data;
    for (int32_t i = 0; i < len; i++) {
        fputc(digits[p[i] >> 4], stdout);
        fputc(digits[p[i] & 15], stdout);
    }
}

static void print_record(const fabric_record_t *r, const int *fields, size_t field_count, int hex) {
    for (size_t i = 0; i < field_count; i++) {
        if (i) fputc('\t', stdout);
        switch (fields[i]) {
        case F_PARTITION: printf("%d", r->partition); break;
        case F_OFFSET: printf("%lld", (long long)r->offset); break;
        case F_TIMESTAMP: printf("%lld", (long long)r->timestamp_ms); break;
        case F_KEY: put_bytes(r->key, r->key_len, hex); break;
        case F_VALUE: put_bytes(r->value, r->value_len, hex); break;
        case F_HEADERS:
            for (uint32_t k = 0; k < r->header_count; k++) {
                const fabric_header_t *h = &r->headers[k];
                if (k) fputc(',', stdout);
                fwrite(h->name, 1, h->name_len, stdout);
                if (h->value_len >= 0) {
                    fputc('=', stdout);
                    put_bytes(h->value, h->value_len, hex);
                }
            }
            break;
        }
    }
    fputc('\n', stdout);
}

static int parse_fields(const char *list, int *fields, size_t *count) {
    static const char *names[] = {"partition", "offset", "timestamp", "key", "value", "headers"};
    *count = 0;
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        int found = -1;
        for (int i = 0; i < 6; i++) {
            if (strlen(names[i]) == len && strncmp(names[i], p, len) == 0) found = i;
        }
        if (found < 0 || *count == FIELDS_MAX) return -1;
        fields[(*count)++] = found;
        if (!end) break;
        p = end + 1;
    }
    return *count ? 0 : -1;
}

int main(int argc, char **argv) {
    const char *bootstrap = NULL, *topic = NULL;
    int32_t partitions[PARTITIONS_MAX];
    size_t partition_count = 0;
    int64_t offset = FABRIC_OFFSET_BEGINNING;
    long long count = -1;
    int follow = 0, hex = 0, idle_ms = 2000;
    int fields[FIELDS_MAX] = {F_VALUE};
    size_t field_count = 1;
    fabric_consumer_config_t cfg;
    fabric_consumer_config_init(&cfg);
    static const struct option long_options[] = {
        {"bootstrap", required_argument, 0, 'b'}, {"topic", required_argument, 0, 't'},
        {"partition", required_argument, 0, 'p'}, {"offset", required_argument, 0, 'o'},
        {"count", required_argument, 0, 'c'},     {"follow", no_argument, 0, 'f'},
        {"idle-ms", required_argument, 0, 'i'},   {"fields", required_argument, 0, 'F'},
        {"hex", no_argument, 0, 'x'},             {"reset", required_argument, 0, 'z'},
        {"metadata-wait-ms", required_argument, 0, 'm'},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    int opt;
    while ((opt = getopt_long(argc, argv, "b:t:p:o:c:fi:F:xz:m:h", long_options, NULL)) != -1) {
        switch (opt) {
        case 'b': bootstrap = optarg; break;
        case 't': topic = optarg; break;
        case 'p':
            if (partition_count == PARTITIONS_MAX) {
                fprintf(stderr, "fabric-consume: at most %d --partition\n", PARTITIONS_MAX);
                return 2;
            }
            partitions[partition_count++] = (int32_t)int_arg("fabric-consume", "--partition", optarg, 0, INT32_MAX);
            break;
        case 'o':
            if (strcmp(optarg, "beginning") == 0) offset = FABRIC_OFFSET_BEGINNING;
            else if (strcmp(optarg, "end") == 0) offset = FABRIC_OFFSET_END;
            else offset = int_arg("fabric-consume", "--offset (or beginning, end)", optarg, 0, INT64_MAX);
            break;
        case 'c': count = int_arg("fabric-consume", "--count", optarg, 0, INT64_MAX); break;
        case 'f': follow = 1; break;
        case 'i': idle_ms = (int)int_arg("fabric-consume", "--idle-ms", optarg, 0, INT32_MAX); break;
        case 'F':
            if (parse_fields(optarg, fields, &field_count)) {
                fprintf(stderr, "fabric-consume: bad --fields %s\n", optarg);
                return 2;
            }
            break;
        case 'x': hex = 1; break;
        case 'z':
            if (strcmp(optarg, "earliest") == 0) cfg.offset_reset = FABRIC_RESET_EARLIEST;
            else if (strcmp(optarg, "latest") == 0) cfg.offset_reset = FABRIC_RESET_LATEST;
            else if (strcmp(optarg, "none") == 0) cfg.offset_reset = FABRIC_RESET_NONE;
            else {
                usage(stderr);
                return 2;
            }
            break;
        case 'm':
            /* Below -1 fabric_consumer_new would refuse it as INVALID_ARGUMENT: a usage error here. */
            cfg.metadata_wait_ms = (int)int_arg("fabric-consume", "--metadata-wait-ms", optarg, -1, INT32_MAX);
            break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (bootstrap == NULL || topic == NULL || partition_count == 0 || optind != argc || offset < -2) {
        usage(stderr);
        return 2;
    }
    if (refuse_zookeeper("fabric-consume", bootstrap)) return 2;
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    fabric_consumer_t *c;
    int rc = fabric_consumer_new(&c, bootstrap, &cfg);
    for (size_t i = 0; rc == 0 && i < partition_count; i++) rc = fabric_consumer_assign(c, topic, partitions[i], offset);
    if (rc) {
        fprintf(stderr, "fabric-consume: %s: %s\n", fabric_err_name(rc), fabric_strerror(rc));
        fabric_consumer_destroy(c);
        return 2;
    }
    long long got = 0;
    /* Idle time is measured, not summed from the slices asked for: a poll can overrun its
     * timeout while nodes are unreachable (a connect attempt waits up to 1 s). */
    int64_t last_record_ms = monotonic_ms();
    while (!stopping && (count < 0 || got < count)) {
        const fabric_record_t *r;
        int slice = !follow && idle_ms < POLL_SLICE_MS ? idle_ms : POLL_SLICE_MS;
        if (!follow) {
            int64_t left = idle_ms - (monotonic_ms() - last_record_ms);
            if (left < slice) slice = left < 0 ? 0 : (int)left;
        }
        rc = fabric_consumer_poll(c, slice, &r);
        if (rc) {
            fprintf(stderr, "fabric-consume: %s: %s\n", fabric_err_name(rc),
                    fabric_consumer_last_error(c));
            break;
        }
        if (r == NULL) {
            if (!follow && monotonic_ms() - last_record_ms >= idle_ms) break;
            continue;
        }
        last_record_ms = monotonic_ms();
        print_record(r, fields, field_count, hex);
        got++;
    }
    fflush(stdout);
    fabric_consumer_destroy(c);
    fprintf(stderr, "fabric-consume: %lld records\n", got);
    return rc ? 1 : 0;
}
