/*
 * test_api_args: a caller's bad arguments to the public client API give a clean error code
 * (and a last_error message), never a crash, and never a wait on the network.
 *
 *   build/test_api_args
 *
 * Offline: the bootstrap address is never contacted, because every call here is refused
 * before the producer looks up the topic. (A call that did reach the network would fail
 * with NO_NODES after a second instead of INVALID_ARGUMENT, and the check would catch it.)
 */
#include "../fabric.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;
static int checks = 0;

#define EXPECT(expr, want)                                                                        \
    do {                                                                                          \
        int got_ = (expr);                                                                        \
        checks++;                                                                                 \
        if (got_ != (want)) {                                                                     \
            fprintf(stderr, "FAIL %s:%d: %s: got %s (%d), want %s\n", __FILE__, __LINE__, #expr,  \
                    fabric_err_name(got_), got_, fabric_err_name(want));                          \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

#define UNREACHABLE "tcp://127.0.0.1:1" /* nothing listens there; never contacted below */

static void test_producer_arguments(void) {
    EXPECT(fabric_producer_new(NULL, UNREACHABLE, NULL), FABRIC_ERR_INVALID_ARGUMENT);
    fabric_producer_t *p = NULL;
    EXPECT(fabric_producer_new(&p, UNREACHABLE, NULL), 0);
    if (p == NULL) return;
    const fabric_header_t ok = {"trace", 5, "abc", 3};
    /* headers NULL with a count: used to crash sizing the record */
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, NULL, 1, -1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_produce(p, "t", -1, "k", 1, NULL, -1, NULL, 3, -1), FABRIC_ERR_INVALID_ARGUMENT);
    /* a header name that is not UTF-8: the node would refuse the whole batch */
    const fabric_header_t bad_utf8[] = {ok, {"\xff\xfe", 2, "v", 1}};
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, bad_utf8, 2, -1), FABRIC_ERR_INVALID_ARGUMENT);
    const fabric_header_t surrogate[] = {{"\xed\xa0\x80", 3, NULL, -1}};
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, surrogate, 1, -1), FABRIC_ERR_INVALID_ARGUMENT);
    if (strstr(fabric_producer_last_error(p), "UTF-8") == NULL) {
        fprintf(stderr, "FAIL: last_error does not explain the refusal: %s\n", fabric_producer_last_error(p));
        failures++;
    }
    const fabric_header_t null_name[] = {{NULL, 4, "v", 1}};
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, null_name, 1, -1), FABRIC_ERR_INVALID_ARGUMENT);
    const fabric_header_t long_name[] = {{"x", (size_t)FABRIC_STRING_BYTES_MAX + 1, "v", 1}};
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, long_name, 1, -1), FABRIC_ERR_INVALID_ARGUMENT);
    const fabric_header_t huge_name[] = {{"x", (size_t)-1, "v", 1}}; /* must not wrap the size */
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, huge_name, 1, -1), FABRIC_ERR_INVALID_ARGUMENT);
    const fabric_header_t bad_value[] = {{"a", 1, "v", -2}};
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, bad_value, 1, -1), FABRIC_ERR_INVALID_ARGUMENT);
    const fabric_header_t null_value[] = {{"a", 1, NULL, 3}};
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, "v", 1, null_value, 1, -1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_produce(p, NULL, 0, NULL, -1, "v", 1, NULL, 0, -1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_produce(p, "t", -2, NULL, -1, "v", 1, NULL, 0, -1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_produce(p, "t", 0, NULL, -2, "v", 1, NULL, 0, -1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_produce(p, "t", 0, NULL, 4, "v", 1, NULL, 0, -1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_produce(p, "t", 0, NULL, -1, NULL, 1, NULL, 0, -1), FABRIC_ERR_INVALID_ARGUMENT);
    int32_t count;
    EXPECT(fabric_producer_partition_count(p, NULL, &count), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_producer_partition_count(p, "t", NULL), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_producer_flush(p, 0), 0); /* nothing was queued */
    fabric_producer_destroy(p);

    EXPECT(fabric_produce(NULL, "t", 0, NULL, -1, "v", 1, NULL, 0, -1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_producer_poll(NULL, 0), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_producer_flush(NULL, 0), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_producer_partition_count(NULL, "t", &count), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_producer_next_timeout_ms(NULL), -1);
    EXPECT(fabric_producer_last_error(NULL) != NULL, 1);
    fabric_producer_destroy(NULL);
}

static void test_builder_refuses_bad_header_names(void) {
    fabric_batch_builder_t b;
    fabric_batch_builder_init(&b);
    const fabric_header_t bad[] = {{"\xc0\xaf", 2, "v", 1}}; /* an overlong '/' */
    EXPECT(fabric_batch_builder_add(&b, 1, NULL, -1, "v", 1, bad, 1), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT((int)b.record_count, 0);
    const fabric_header_t good[] = {{"caf\xc3\xa9", 5, "v", 1}};
    EXPECT(fabric_batch_builder_add(&b, 1, NULL, -1, "v", 1, good, 1), 0);
    fabric_batch_builder_free(&b);
}

static void test_consumer_arguments(void) {
    EXPECT(fabric_consumer_new(NULL, UNREACHABLE, NULL), FABRIC_ERR_INVALID_ARGUMENT);
    fabric_consumer_t *c = NULL;
    EXPECT(fabric_consumer_new(&c, UNREACHABLE, NULL), 0);
    if (c == NULL) return;
    const fabric_record_t *r = (const fabric_record_t *)&checks;
    EXPECT(fabric_consumer_poll(c, 0, &r), FABRIC_ERR_INVALID_ARGUMENT); /* nothing assigned */
    EXPECT(r == NULL, 1);
    EXPECT(fabric_consumer_poll(c, 0, NULL), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_assign(c, NULL, 0, 0), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_assign(c, "t", -1, 0), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_assign(c, "t", 0, -3), FABRIC_ERR_INVALID_ARGUMENT);
    int64_t offset;
    EXPECT(fabric_consumer_position(c, NULL, 0, &offset), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_position(c, "t", 0, NULL), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_position(c, "t", 0, &offset), FABRIC_ERR_UNKNOWN_TOPIC_OR_PARTITION);
    if (strstr(fabric_consumer_last_error(c), "not assigned") == NULL) {
        fprintf(stderr, "FAIL: last_error does not explain the refusal: %s\n", fabric_consumer_last_error(c));
        failures++;
    }
    fabric_consumer_destroy(c);
    EXPECT(fabric_consumer_assign(NULL, "t", 0, 0), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_poll(NULL, 0, &r), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_position(NULL, "t", 0, &offset), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_consumer_last_error(NULL) != NULL, 1);
    fabric_consumer_destroy(NULL);
    int32_t count;
    EXPECT(fabric_topic_partition_count(UNREACHABLE, NULL, 1000, &count), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(fabric_topic_partition_count(UNREACHABLE, "t", 1000, NULL), FABRIC_ERR_INVALID_ARGUMENT);
    /* metadata_wait_ms: -1 (no limit) and up; 60 s by default. */
    fabric_consumer_config_t cfg;
    fabric_consumer_config_init(&cfg);
    EXPECT(cfg.metadata_wait_ms, 60000);
    cfg.metadata_wait_ms = -2;
    c = NULL;
    EXPECT(fabric_consumer_new(&c, UNREACHABLE, &cfg), FABRIC_ERR_INVALID_ARGUMENT);
    EXPECT(c == NULL, 1);
    cfg.metadata_wait_ms = -1;
    EXPECT(fabric_consumer_new(&c, UNREACHABLE, &cfg), 0);
    fabric_consumer_destroy(c);
}

/* Addresses ZeroMQ could never connect to are refused at once: a consumer given one used
 * to spin through its polls, opening two sockets a turn, until it ran out of them. */
static void test_bad_bootstrap_addresses(void) {
    const char *bad[] = {"garbage", "tcp://127.0.0.1", "http://127.0.0.1:9092", "h:0", "h:99999", "tcp://:9092",
                         "tcp://h:port", "h:1,garbage", "zk://127.0.0.1:2181", "ipc://", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fabric_producer_t *p = NULL;
        fabric_consumer_t *c = NULL;
        EXPECT(fabric_producer_new(&p, bad[i], NULL), FABRIC_ERR_INVALID_ARGUMENT);
        EXPECT(fabric_consumer_new(&c, bad[i], NULL), FABRIC_ERR_INVALID_ARGUMENT);
        EXPECT(p == NULL && c == NULL, 1);
        int32_t count;
        EXPECT(fabric_topic_partition_count(bad[i], "t", 1000, &count), FABRIC_ERR_INVALID_ARGUMENT);
    }
    const char *good[] = {"h:1", "127.0.0.1:65535", "tcp://[::1]:9092", " tcp://a:1 , b:2 ", "ipc:///tmp/x"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        fabric_producer_t *p = NULL;
        EXPECT(fabric_producer_new(&p, good[i], NULL), 0);
        fabric_producer_destroy(p);
    }
}

int main(void) {
    test_bad_bootstrap_addresses();
    test_producer_arguments();
    test_builder_refuses_bad_header_names();
    test_consumer_arguments();
    if (failures) {
        fprintf(stderr, "%d of %d checks failed\n", failures, checks);
        return 1;
    }
    printf("ok: %d API argument checks passed\n", checks);
    return 0;
}
