/*
 * test_vectors: decode every shared vector of tests/vectors/, re-encode it and compare byte
 * for byte, and compute the key hash vectors.
 *
 *   test_vectors VECTOR_DIR [DUMP_JSON]
 *   test_vectors --reencode BATCH_HEX_FILE   decode a batch, print it re-encoded, in hex
 *   test_vectors --errors                    print the error table: code name retriable
 *
 * Exits 0 when every check passed. With DUMP_JSON it also writes the decoded values as
 * JSON, laid out like tests/vectors/bodies.json and batch.json, so the pytest wrapper can
 * compare the C decoder's values with the Python generator's (one source of truth).
 */
#include "../fabric.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VECTOR_BYTES_MAX (1024 * 1024) /* the largest vector is a few hundred bytes */

static int failures = 0;
static FILE *dump = NULL;

#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                                  \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fprintf(stderr, "\n");                                                                \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

/* Read VECTOR_DIR/name as hex into a malloc'd buffer. */
static uint8_t *read_hex(const char *dir, const char *name, size_t *len) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    char *text = malloc(2 * VECTOR_BYTES_MAX + 2);
    size_t n = fread(text, 1, 2 * VECTOR_BYTES_MAX + 1, f);
    fclose(f);
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) n--;
    uint8_t *out = malloc(n / 2 + 1);
    long got = fabric_hex_decode(text, n, out, n / 2 + 1);
    free(text);
    if (got < 0) {
        fprintf(stderr, "%s is not hex\n", path);
        exit(2);
    }
    *len = (size_t)got;
    return out;
}

static void check_same(const char *what, const uint8_t *want, size_t want_len,
                       const fabric_buf_t *got) {
    CHECK(got->err == 0, "%s: encoder error %d", what, got->err);
    if (got->len != want_len || memcmp(got->data, want, want_len) != 0) {
        char *a = malloc(2 * want_len + 1), *b = malloc(2 * got->len + 1);
        fabric_hex_encode(want, want_len, a);
        fabric_hex_encode(got->data, got->len, b);
        CHECK(0, "%s: re-encoded bytes differ\n  want %s\n  got  %s", what, a, b);
        free(a);
        free(b);
    } else {
        printf("ok %s: %zu bytes re-encoded identically\n", what, want_len);
    }
}

/* ---- a tiny JSON writer (values in the vectors are ASCII; others are escaped) ---------- */
static int json_first = 1;
static void j_sep(void) {
    if (!json_first) fputc(',', dump);
    json_first = 0;
}
static void j_open(char c) {
    j_sep();
    fputc(c, dump);
    json_first = 1;
}
static void j_close(char c) {
    fputc(c, dump);
    json_first = 0;
}
static void j_raw_str(const char *s, size_t len) {
    fputc('"', dump);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(dump, "\\%c", c);
        else if (c < 0x20) fprintf(dump, "\\u%04x", c);
        else fputc(c, dump);
    }
    fputc('"', dump);
}
static void j_key(const char *k) {
    j_sep();
    j_raw_str(k, strlen(k));
    fputc(':', dump);
    json_first = 1;
}
static void j_str(fabric_str_t s) {
    j_sep();
    j_raw_str(s.data, s.len);
}
static void j_int(long long v) {
    j_sep();
    fprintf(dump, "%lld", v);
}
static void j_null(void) {
    j_sep();
    fputs("null", dump);
}
static void j_hex(const void *data, int32_t len) {
    if (len < 0) {
        j_null();
        return;
    }
    char *hex = malloc(2 * (size_t)len + 1);
    fabric_hex_encode(data, (size_t)len, hex);
    j_sep();
    j_raw_str(hex, 2 * (size_t)len);
    free(hex);
}
#define J_FIELD_INT(name, v) (j_key(name), j_int((long long)(v)))
#define J_FIELD_STR(name, v) (j_key(name), j_str(v))

static void j_i32_array(const int32_t *items, uint32_t n) {
    j_open('[');
    for (uint32_t i = 0; i < n; i++) j_int(items[i]);
    j_close(']');
}

/* ---- headers ---------------------------------------------------------------------------- */
static void test_header(const char *dir, const char *name) {
    size_t len;
    uint8_t *raw = read_hex(dir, name, &len);
    fabric_frame_header_t h;
    char err[256];
    int rc = fabric_header_decode(raw, len, &h, err, sizeof err);
    CHECK(rc == 0, "%s: decode failed: %s", name, err);
    uint8_t again[FABRIC_HEADER_BYTES];
    fabric_header_encode(&h, again);
    fabric_buf_t b;
    fabric_buf_init(&b);
    fabric_buf_put(&b, again, sizeof again);
    check_same(name, raw, len, &b);
    fabric_buf_free(&b);
    if (dump) {
        j_key(name);
        j_open('{');
        J_FIELD_INT("protocol_version", h.protocol_version);
        J_FIELD_INT("flags", h.flags);
        J_FIELD_INT("api_key", h.api_key);
        J_FIELD_INT("api_version", h.api_version);
        J_FIELD_INT("error_code", h.error_code);
        J_FIELD_INT("correlation_id", h.correlation_id);
        j_close('}');
    }
    free(raw);
}

/* ---- batches ----------------------------------------------------------------------------- */
static void test_batch(const char *dir, const char *name, int codec) {
    size_t len;
    uint8_t *raw = read_hex(dir, name, &len);
    fabric_batch_t *batch = NULL;
    char err[256];
    int rc = fabric_batch_decode(raw, len, &batch, err, sizeof err);
    CHECK(rc == 0, "%s: decode failed (%s): %s", name, fabric_err_name(rc), err);
    if (rc) {
        free(raw);
        return;
    }
    CHECK((batch->header.attributes & FABRIC_CODEC_MASK) == codec, "%s: codec %d", name,
          batch->header.attributes & FABRIC_CODEC_MASK);
    rc = fabric_batch_validate(raw, len, 8 * 1024 * 1024, NULL, err, sizeof err);
    CHECK(rc == 0, "%s: validate failed: %s", name, err);

    fabric_batch_builder_t builder;
    fabric_batch_builder_init(&builder);
    for (uint32_t i = 0; i < batch->record_count; i++) {
        const fabric_record_t *r = &batch->records[i];
        rc = fabric_batch_builder_add(&builder, r->timestamp_ms, r->key, r->key_len, r->value,
                                      r->value_len, r->headers, r->header_count);
        CHECK(rc == 0, "%s: builder_add %u: %s", name, i, fabric_err_name(rc));
    }
    fabric_batch_options_t o;
    fabric_batch_options_init(&o);
    o.codec = codec;
    o.base_offset = batch->header.base_offset;
    o.leader_epoch = batch->header.leader_epoch;
    o.producer_id = batch->header.producer_id;
    o.producer_epoch = batch->header.producer_epoch;
    o.base_sequence = batch->header.base_sequence;
    o.global_id_base = batch->header.global_id_base;
    fabric_buf_t out;
    fabric_buf_init(&out);
    rc = fabric_batch_builder_finish(&builder, &o, &out);
    CHECK(rc == 0, "%s: finish: %s", name, fabric_err_name(rc));
    check_same(name, raw, len, &out);
    fabric_buf_free(&out);
    fabric_batch_builder_free(&builder);

    if (dump) {
        const fabric_batch_header_t *h = &batch->header;
        j_key(name);
        j_open('{');
        J_FIELD_INT("base_offset", h->base_offset);
        J_FIELD_INT("base_sequence", h->base_sequence);
        J_FIELD_INT("global_id_base", h->global_id_base);
        J_FIELD_INT("leader_epoch", h->leader_epoch);
        J_FIELD_INT("producer_epoch", h->producer_epoch);
        J_FIELD_INT("producer_id", h->producer_id);
        j_key("timestamps");
        j_open('[');
        for (uint32_t i = 0; i < batch->record_count; i++) j_int(batch->records[i].timestamp_ms);
        j_close(']');
        j_key("keys");
        j_open('[');
        for (uint32_t i = 0; i < batch->record_count; i++)
            j_hex(batch->records[i].key, batch->records[i].key_len);
        j_close(']');
        j_key("values");
        j_open('[');
        for (uint32_t i = 0; i < batch->record_count; i++)
            j_hex(batch->records[i].value, batch->records[i].value_len);
        j_close(']');
        j_key("headers");
        j_open('[');
        for (uint32_t i = 0; i < batch->record_count; i++) {
            j_open('[');
            for (uint32_t k = 0; k < batch->records[i].header_count; k++) {
                const fabric_header_t *hd = &batch->records[i].headers[k];
                j_open('[');
                j_sep();
                j_raw_str(hd->name, hd->name_len);
                j_hex(hd->value, hd->value_len);
                j_close(']');
            }
            j_close(']');
        }
        j_close(']');
        j_close('}');
    }
    fabric_batch_free(batch);
    free(raw);
}

/* ---- bodies -------------------------------------------------------------------------------- */
static void dump_partition_state(const fabric_partition_state_t *p) {
    j_open('{');
    J_FIELD_INT("partition", p->partition);
    J_FIELD_INT("error", p->error);
    J_FIELD_INT("leader", p->leader);
    J_FIELD_INT("leader_epoch", p->leader_epoch);
    j_key("replicas");
    j_i32_array(p->replicas, p->replica_count);
    j_key("isr");
    j_i32_array(p->isr, p->isr_count);
    j_close('}');
}

/* One body vector: decode with `decode`, dump it with `show`, re-encode with `encode`. */
#define BODY_TEST(vname, type, SHOW)                                                             \
    static void test_##vname(const char *dir) {                                                  \
        size_t len;                                                                              \
        uint8_t *raw = read_hex(dir, #vname ".hex", &len);                                       \
        fabric_arena_t arena;                                                                    \
        fabric_arena_init(&arena);                                                               \
        fabric_##type##_t v;                                                                     \
        char err[256];                                                                           \
        int rc = fabric_##type##_decode(raw, len, &arena, &v, err, sizeof err);                  \
        CHECK(rc == 0, #vname ": decode failed: %s", err);                                       \
        if (rc == 0) {                                                                           \
            fabric_buf_t b;                                                                      \
            fabric_buf_init(&b);                                                                 \
            fabric_##type##_encode(&v, &b);                                                      \
            check_same(#vname, raw, len, &b);                                                    \
            fabric_buf_free(&b);                                                                 \
            /* every proper prefix must be refused, never half-parsed */                         \
            for (size_t cut = 0; cut < len; cut++) {                                             \
                fabric_arena_t a2;                                                               \
                fabric_arena_init(&a2);                                                          \
                fabric_##type##_t w;                                                             \
                CHECK(fabric_##type##_decode(raw, cut, &a2, &w, NULL, 0) ==                      \
                          FABRIC_ERR_MALFORMED_REQUEST,                                          \
                      #vname ": prefix of %zu bytes accepted", cut);                             \
                fabric_arena_free(&a2);                                                          \
            }                                                                                    \
            if (dump) {                                                                          \
                j_key(#vname);                                                                   \
                j_open('{');                                                                     \
                SHOW;                                                                            \
                j_close('}');                                                                    \
            }                                                                                    \
        }                                                                                        \
        fabric_arena_free(&arena);                                                               \
        free(raw);                                                                               \
    }

BODY_TEST(metadata_request, metadata_request, {
    j_key("topics");
    j_open('[');
    for (uint32_t i = 0; i < v.topic_count; i++) j_str(v.topics[i]);
    j_close(']');
})

BODY_TEST(metadata_response, metadata_response, {
    J_FIELD_INT("controller_id", v.controller_id);
    j_key("nodes");
    j_open('[');
    for (uint32_t i = 0; i < v.node_count; i++) {
        j_open('{');
        J_FIELD_INT("node_id", v.nodes[i].node_id);
        J_FIELD_STR("address", v.nodes[i].address);
        j_close('}');
    }
    j_close(']');
    j_key("topics");
    j_open('[');
    for (uint32_t i = 0; i < v.topic_count; i++) {
        const fabric_metadata_topic_t *t = &v.topics[i];
        j_open('{');
        J_FIELD_INT("error", t->error);
        J_FIELD_STR("name", t->name);
        J_FIELD_INT("strict_order", t->strict_order);
        J_FIELD_INT("message_bytes_max", t->message_bytes_max);
        j_key("partitions");
        j_open('[');
        for (uint32_t k = 0; k < t->partition_count; k++) dump_partition_state(&t->partitions[k]);
        j_close(']');
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(produce_request, produce_request, {
    J_FIELD_INT("acks", v.acks);
    J_FIELD_INT("timeout_ms", v.timeout_ms);
    j_key("entries");
    j_open('[');
    for (uint32_t i = 0; i < v.entry_count; i++) {
        j_open('{');
        J_FIELD_STR("topic", v.entries[i].topic);
        J_FIELD_INT("partition", v.entries[i].partition);
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(produce_response, produce_response, {
    j_key("results");
    j_open('[');
    for (uint32_t i = 0; i < v.result_count; i++) {
        const fabric_produce_result_t *x = &v.results[i];
        j_open('{');
        J_FIELD_STR("topic", x->topic);
        J_FIELD_INT("partition", x->partition);
        J_FIELD_INT("error", x->error);
        J_FIELD_INT("base_offset", x->base_offset);
        J_FIELD_INT("log_start_offset", x->log_start_offset);
        J_FIELD_STR("message", x->message);
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(fetch_request, fetch_request, {
    J_FIELD_INT("replica_id", v.replica_id);
    J_FIELD_INT("max_wait_ms", v.max_wait_ms);
    J_FIELD_INT("min_bytes", v.min_bytes);
    J_FIELD_INT("max_bytes", v.max_bytes);
    j_key("partitions");
    j_open('[');
    for (uint32_t i = 0; i < v.partition_count; i++) {
        const fabric_fetch_partition_t *p = &v.partitions[i];
        j_open('{');
        J_FIELD_STR("topic", p->topic);
        J_FIELD_INT("partition", p->partition);
        J_FIELD_INT("fetch_offset", p->fetch_offset);
        J_FIELD_INT("partition_bytes_max", p->partition_bytes_max);
        J_FIELD_INT("current_leader_epoch", p->current_leader_epoch);
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(fetch_response, fetch_response, {
    j_key("partitions");
    j_open('[');
    for (uint32_t i = 0; i < v.partition_count; i++) {
        const fabric_fetch_partition_result_t *p = &v.partitions[i];
        j_open('{');
        J_FIELD_STR("topic", p->topic);
        J_FIELD_INT("partition", p->partition);
        J_FIELD_INT("error", p->error);
        J_FIELD_INT("high_watermark", p->high_watermark);
        J_FIELD_INT("log_start_offset", p->log_start_offset);
        J_FIELD_INT("log_end_offset", p->log_end_offset);
        J_FIELD_INT("batch_count", p->batch_count);
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(list_offsets_request, list_offsets_request, {
    j_key("partitions");
    j_open('[');
    for (uint32_t i = 0; i < v.partition_count; i++) {
        j_open('{');
        J_FIELD_STR("topic", v.partitions[i].topic);
        J_FIELD_INT("partition", v.partitions[i].partition);
        J_FIELD_INT("timestamp", v.partitions[i].timestamp);
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(list_offsets_response, list_offsets_response, {
    j_key("partitions");
    j_open('[');
    for (uint32_t i = 0; i < v.partition_count; i++) {
        const fabric_list_offsets_result_t *p = &v.partitions[i];
        j_open('{');
        J_FIELD_STR("topic", p->topic);
        J_FIELD_INT("partition", p->partition);
        J_FIELD_INT("error", p->error);
        J_FIELD_INT("timestamp", p->timestamp);
        J_FIELD_INT("offset", p->offset);
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(create_topic_request, create_topic_request, {
    J_FIELD_STR("name", v.name);
    J_FIELD_INT("partitions", v.partitions);
    J_FIELD_INT("replication_factor", v.replication_factor);
    j_key("configs");
    j_open('[');
    for (uint32_t i = 0; i < v.config_count; i++) {
        j_open('{');
        J_FIELD_STR("key", v.configs[i].key);
        J_FIELD_STR("value", v.configs[i].value);
        j_close('}');
    }
    j_close(']');
})

BODY_TEST(error_response, error_body, { J_FIELD_STR("message", v.message); })

BODY_TEST(allocate_ids_request, allocate_ids_request, {
    J_FIELD_INT("count", v.count);
    J_FIELD_INT("kind", v.kind);
})

BODY_TEST(allocate_ids_response, allocate_ids_response, {
    J_FIELD_INT("epoch", v.epoch);
    J_FIELD_INT("first_id", v.first_id);
    J_FIELD_INT("count", v.count);
    J_FIELD_INT("records_end", v.records_end);
})

/* ---- key hash ------------------------------------------------------------------------------- */
static void test_keyhash(const char *dir) {
    char path[4096];
    snprintf(path, sizeof path, "%s/keyhash.txt", dir);
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(2);
    }
    char line[1024];
    int lines = 0;
    if (dump) {
        j_key("keyhash");
        j_open('[');
    }
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        char key_hex[512], crc_hex[16];
        long count, partition;
        if (sscanf(line, "%511s %ld %15s %ld", key_hex, &count, crc_hex, &partition) != 4) {
            CHECK(0, "keyhash.txt: bad line %s", line);
            continue;
        }
        uint8_t key[256];
        long key_len = strcmp(key_hex, "-") == 0 ? 0
                                                 : fabric_hex_decode(key_hex, strlen(key_hex), key,
                                                                     sizeof key);
        CHECK(key_len >= 0, "keyhash.txt: bad key %s", key_hex);
        if (key_len < 0) continue;
        uint32_t want_crc = (uint32_t)strtoul(crc_hex, NULL, 16);
        uint32_t crc = fabric_key_hash(key, (size_t)key_len);
        int32_t p = fabric_partition_for_key(key, (size_t)key_len, (int32_t)count);
        CHECK(crc == want_crc, "keyhash %s: crc %08x, want %08x", key_hex, crc, want_crc);
        CHECK(p == partition, "keyhash %s %% %ld: partition %d, want %ld", key_hex, count, p,
              partition);
        if (dump) {
            char crc_text[9];
            snprintf(crc_text, sizeof crc_text, "%08x", crc);
            j_open('[');
            j_sep();
            j_raw_str(key_hex, strlen(key_hex));
            j_int(count);
            j_sep();
            j_raw_str(crc_text, 8);
            j_int(p);
            j_close(']');
        }
        lines++;
    }
    fclose(f);
    if (dump) j_close(']');
    CHECK(lines > 0, "keyhash.txt has no vectors");
    /* The CRC check value of PROTOCOL.md section 4.4. */
    CHECK(fabric_key_hash("123456789", 9) == 0xCBF43926u, "crc32 check value");
    printf("ok keyhash: %d vectors\n", lines);
}

/* Decode any batch (e.g. a large multi-block lz4 one made by Python) and print it
 * re-encoded with the same header fields, so the caller can compare the bytes. */
static int reencode(const char *path) {
    const char *slash = strrchr(path, '/');
    char dir[4096];
    snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    size_t len;
    uint8_t *raw = read_hex(dir, slash ? slash + 1 : path, &len);
    fabric_batch_t *batch;
    char err[256];
    int rc = fabric_batch_decode(raw, len, &batch, err, sizeof err);
    if (rc) {
        fprintf(stderr, "decode: %s: %s\n", fabric_err_name(rc), err);
        free(raw);
        return 1;
    }
    fabric_batch_builder_t b;
    fabric_batch_builder_init(&b);
    for (uint32_t i = 0; i < batch->record_count && rc == 0; i++) {
        const fabric_record_t *r = &batch->records[i];
        rc = fabric_batch_builder_add(&b, r->timestamp_ms, r->key, r->key_len, r->value,
                                      r->value_len, r->headers, r->header_count);
    }
    fabric_batch_options_t o;
    fabric_batch_options_init(&o);
    o.codec = batch->header.attributes & FABRIC_CODEC_MASK;
    o.base_offset = batch->header.base_offset;
    o.leader_epoch = batch->header.leader_epoch;
    o.producer_id = batch->header.producer_id;
    o.producer_epoch = batch->header.producer_epoch;
    o.base_sequence = batch->header.base_sequence;
    o.global_id_base = batch->header.global_id_base;
    fabric_buf_t out;
    fabric_buf_init(&out);
    if (rc == 0) rc = fabric_batch_builder_finish(&b, &o, &out);
    if (rc == 0) {
        char *hex = malloc(2 * out.len + 1);
        fabric_hex_encode(out.data, out.len, hex);
        printf("%s\n", hex);
        free(hex);
    } else {
        fprintf(stderr, "re-encode: %s\n", fabric_err_name(rc));
    }
    fabric_buf_free(&out);
    fabric_batch_builder_free(&b);
    fabric_batch_free(batch);
    free(raw);
    return rc ? 1 : 0;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "--errors") == 0) {
        for (int code = -7; code <= FABRIC_WIRE_ERROR_MAX; code++)
            printf("%d %s %d\n", code, fabric_err_name(code), fabric_err_retriable(code));
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "--reencode") == 0) return reencode(argv[2]);
    if (argc < 2 || argc > 3) {
        fprintf(stderr, "usage: %s VECTOR_DIR [DUMP_JSON]\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    if (argc == 3) {
        dump = fopen(argv[2], "w");
        if (dump == NULL) {
            perror(argv[2]);
            return 2;
        }
        j_open('{');
    }
    test_header(dir, "header_request.hex");
    test_header(dir, "header_response.hex");
    test_batch(dir, "batch_none.hex", FABRIC_CODEC_NONE);
    test_batch(dir, "batch_lz4.hex", FABRIC_CODEC_LZ4);
    test_metadata_request(dir);
    test_metadata_response(dir);
    test_produce_request(dir);
    test_produce_response(dir);
    test_fetch_request(dir);
    test_fetch_response(dir);
    test_list_offsets_request(dir);
    test_list_offsets_response(dir);
    test_create_topic_request(dir);
    test_error_response(dir);
    test_allocate_ids_request(dir);
    test_allocate_ids_response(dir);
    test_keyhash(dir);
    if (dump) {
        j_close('}');
        fputc('\n', dump);
        fclose(dump);
    }
    if (failures) {
        fprintf(stderr, "%d check(s) failed\n", failures);
        return 1;
    }
    printf("all vector checks passed\n");
    return 0;
}
