/*
 * test_delivery_callbacks: what a delivery callback may call (fabric.h, docs/C_CLIENT.md
 * "Delivery callbacks").
 *
 *   test_delivery_callbacks BOOTSTRAP TOPIC
 *
 * BOOTSTRAP is a node that answers METADATA (TOPIC with a partition 0) and PRODUCE:
 * tests/interop/test_c_fake_node.py compiles this file against libfabric.a (with -I sdk/c,
 * hence "fabric.h") and plays that node. Checked:
 *
 *   1. Inside a callback run by fabric_producer_flush, fabric_producer_flush and
 *      fabric_producer_poll return FABRIC_ERR_INVALID_ARGUMENT at once (they waited for
 *      the very call that runs the callback: the whole timeout, then REQUEST_TIMED_OUT),
 *      last_error saying why; fabric_producer_destroy does nothing (it freed the producer
 *      under that call); fabric_produce queues the record, which the running flush sends.
 *   2. Inside the callbacks of fabric_producer_destroy (FABRIC_ERR_CLOSED), fabric_produce
 *      and fabric_producer_partition_count return FABRIC_ERR_CLOSED, flush is refused as
 *      above and destroy does nothing (no use after free, no double free under ASan).
 *
 * Prints one line per failed check and "ok" at the end; exits 0 only when all passed.
 */
#include "fabric.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define NESTED_WAIT_MS 2000   /* what the nested flush/poll ask for: a wait shows plainly */
#define AT_ONCE_MS_MAX 200    /* "returned at once" */

typedef struct {
    fabric_producer_t *p;
    const char *topic;
    int callbacks;
    int failures;
    int destroying; /* phase 2: the callbacks come from fabric_producer_destroy */
} state_t;

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void fail(state_t *s, const char *what, int rc, long long elapsed_ms) {
    printf("FAIL %s: %s after %lld ms: %s\n", what, fabric_err_name(rc), elapsed_ms,
           fabric_producer_last_error(s->p));
    s->failures++;
}

/* A call that must return want within AT_ONCE_MS_MAX, with last_error naming the callback. */
static int expect_refused(state_t *s, const char *what, int rc, int want, long long began_ms) {
    long long elapsed_ms = now_ms() - began_ms;
    if (rc != want || elapsed_ms > AT_ONCE_MS_MAX) {
        fail(s, what, rc, elapsed_ms);
        return 0;
    }
    if (want == FABRIC_ERR_INVALID_ARGUMENT &&
        strstr(fabric_producer_last_error(s->p), "delivery callback") == NULL) {
        fail(s, what, rc, elapsed_ms);
        return 0;
    }
    return 1;
}

static void on_delivery(const fabric_delivery_t *d, void *opaque) {
    state_t *s = opaque;
    s->callbacks++;
    long long began = now_ms();
    if (s->destroying) {
        if (d->error != FABRIC_ERR_CLOSED) fail(s, "delivery at destroy", d->error, 0);
        began = now_ms();
        expect_refused(s, "produce inside a destroy callback",
                       fabric_produce(s->p, s->topic, 0, NULL, -1, "late", 4, NULL, 0, -1),
                       FABRIC_ERR_CLOSED, began);
        int32_t count = 0;
        began = now_ms();
        expect_refused(s, "partition_count inside a destroy callback",
                       fabric_producer_partition_count(s->p, s->topic, &count), FABRIC_ERR_CLOSED, began);
        began = now_ms();
        expect_refused(s, "flush inside a destroy callback", fabric_producer_flush(s->p, NESTED_WAIT_MS),
                       FABRIC_ERR_INVALID_ARGUMENT, began);
        fabric_producer_destroy(s->p); /* ignored: the running destroy frees it */
        return;
    }
    if (d->error != 0) {
        fail(s, "delivery", d->error, 0);
        return;
    }
    if (s->callbacks != 1) return; /* the record produced below: nothing more to try */
    int refused = expect_refused(s, "flush inside a delivery callback",
                                 fabric_producer_flush(s->p, NESTED_WAIT_MS), FABRIC_ERR_INVALID_ARGUMENT,
                                 began);
    began = now_ms();
    refused &= expect_refused(s, "poll inside a delivery callback", fabric_producer_poll(s->p, NESTED_WAIT_MS),
                              FABRIC_ERR_INVALID_ARGUMENT, began);
    /* Freeing the producer under the running flush crashed; only asked once the refusals
     * above show the library knows it is inside a callback. */
    if (refused) {
        fabric_producer_destroy(s->p);
        if (strstr(fabric_producer_last_error(s->p), "delivery callback") == NULL)
            fail(s, "destroy inside a delivery callback", 0, 0);
    }
    int rc = fabric_produce(s->p, s->topic, 0, NULL, -1, "from-callback", 13, NULL, 0, -1);
    if (rc) fail(s, "produce inside a delivery callback", rc, 0);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_delivery_callbacks BOOTSTRAP TOPIC\n");
        return 2;
    }
    state_t s = {NULL, argv[2], 0, 0, 0};
    fabric_producer_config_t cfg;
    fabric_producer_config_init(&cfg);
    cfg.acks = 1;
    cfg.on_delivery = on_delivery;
    cfg.opaque = &s;
    if (fabric_producer_new(&s.p, argv[1], &cfg)) return 3;
    int rc = fabric_produce(s.p, s.topic, 0, NULL, -1, "first", 5, NULL, 0, -1);
    if (rc) fail(&s, "first produce", rc, 0);
    rc = fabric_producer_flush(s.p, 10000);
    if (rc) fail(&s, "flush", rc, 0);
    /* The record produced inside the first callback is part of what that flush waited for. */
    if (s.failures == 0 && s.callbacks != 2) {
        printf("FAIL flush returned after %d delivery reports, want 2\n", s.callbacks);
        s.failures++;
    }
    fabric_producer_destroy(s.p); /* nothing pending: no more reports */
    if (s.failures) return 1;

    /* Phase 2: one record left in an open batch (linger of a minute), reported at destroy. */
    cfg.linger_ms = 60000;
    if (fabric_producer_new(&s.p, argv[1], &cfg)) return 3;
    rc = fabric_produce(s.p, s.topic, 0, NULL, -1, "unsent", 6, NULL, 0, -1);
    if (rc) fail(&s, "produce before destroy", rc, 0);
    s.callbacks = 0;
    s.destroying = 1;
    fabric_producer_destroy(s.p);
    if (s.callbacks != 1) {
        printf("FAIL destroy made %d delivery reports, want 1\n", s.callbacks);
        s.failures++;
    }
    if (s.failures) return 1;
    printf("ok\n");
    return 0;
}
