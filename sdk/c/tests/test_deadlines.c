/*
 * test_deadlines: calls that look up METADATA return by the caller's time when every node
 * is connected but silent (stopped), instead of waiting 5 s for each node in turn.
 *
 *   build/test_deadlines BOOTSTRAP
 *
 * BOOTSTRAP lists sockets that accept connections and never answer (the test binds them).
 * Prints one line per call: its name, its result and how long it took in ms.
 */
#include "../fabric.h"

#include <stdio.h>
#include <time.h>

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_deadlines BOOTSTRAP\n");
        return 2;
    }
    fabric_producer_config_t cfg;
    fabric_producer_config_init(&cfg);
    cfg.max_block_ms = 500;
    fabric_producer_t *p = NULL;
    if (fabric_producer_new(&p, argv[1], &cfg) != 0) return 1;
    long long began = now_ms();
    int rc = fabric_produce(p, "t", -1, NULL, -1, "v", 1, NULL, 0, -1);
    printf("produce %s %lld\n", fabric_err_name(rc), now_ms() - began);
    fabric_producer_destroy(p);
    int32_t count = 0;
    began = now_ms();
    rc = fabric_topic_partition_count(argv[1], "t", 500, &count);
    printf("partition_count %s %lld\n", fabric_err_name(rc), now_ms() - began);
    return 0;
}
