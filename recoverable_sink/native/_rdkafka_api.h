/* The part of librdkafka's public C API that the _produce extension calls (_produce*.c), declared here so it
 * builds with only a C compiler: no rdkafka.h, no librdkafka-dev. The library itself is opened at run time
 * (_produce.c, load()), and load() refuses one older than RK_MIN_VERSION, the first release with every function below.
 *
 * Written from librdkafka's API documentation (rdkafka.h, "stable API"): opaque handles are incomplete types;
 * the structs whose fields the extension reads or fills are spelt out with every field up to the last one it
 * touches (rd_kafka_vu_t and rd_kafka_metadata_topic_t whole, since they are used as arrays).
 * tests/unit/native/test_rdkafka_api.py checks sizes, offsets and constants against a system rdkafka.h where one is
 * installed, and the error codes against confluent-kafka's.
 */
#ifndef RECOVERABLE_SINK_RDKAFKA_API_H
#define RECOVERABLE_SINK_RDKAFKA_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h> /* ssize_t */

#define RK_MIN_VERSION 0x010400ff /* 1.4.0: produceva, the transactional API and rd_kafka_error_t */

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_topic_s rd_kafka_topic_t;
typedef struct rd_kafka_conf_s rd_kafka_conf_t;
typedef struct rd_kafka_topic_conf_s rd_kafka_topic_conf_t;
typedef struct rd_kafka_headers_s rd_kafka_headers_t;
typedef struct rd_kafka_error_s rd_kafka_error_t;
typedef struct rd_kafka_consumer_group_metadata_s rd_kafka_consumer_group_metadata_t;

typedef enum rd_kafka_type_t { RD_KAFKA_PRODUCER = 0, RD_KAFKA_CONSUMER = 1 } rd_kafka_type_t;

typedef enum { RD_KAFKA_CONF_UNKNOWN = -2, RD_KAFKA_CONF_INVALID = -1, RD_KAFKA_CONF_OK = 0 } rd_kafka_conf_res_t;

/* Only the codes the extension names; the library returns others, which pass through as plain ints. */
typedef enum {
    RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC = -188,
    RD_KAFKA_RESP_ERR__INVALID_ARG = -186,
    RD_KAFKA_RESP_ERR__QUEUE_FULL = -184,
    RD_KAFKA_RESP_ERR_NO_ERROR = 0,
} rd_kafka_resp_err_t;

#define RD_KAFKA_MSG_F_COPY 0x2
#define RD_KAFKA_PURGE_F_QUEUE 0x1
#define RD_KAFKA_PURGE_F_INFLIGHT 0x2
#define RD_KAFKA_PURGE_F_NON_BLOCKING 0x4

typedef struct rd_kafka_message_s {
    rd_kafka_resp_err_t err;
    rd_kafka_topic_t *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private; /* the per-message opaque given to produceva */
} rd_kafka_message_t;

typedef enum rd_kafka_vtype_t {
    RD_KAFKA_VTYPE_END,
    RD_KAFKA_VTYPE_TOPIC,
    RD_KAFKA_VTYPE_RKT,
    RD_KAFKA_VTYPE_PARTITION,
    RD_KAFKA_VTYPE_VALUE,
    RD_KAFKA_VTYPE_KEY,
    RD_KAFKA_VTYPE_OPAQUE,
    RD_KAFKA_VTYPE_MSGFLAGS,
    RD_KAFKA_VTYPE_TIMESTAMP,
    RD_KAFKA_VTYPE_HEADER,
    RD_KAFKA_VTYPE_HEADERS,
} rd_kafka_vtype_t;

typedef struct rd_kafka_vu_s {
    rd_kafka_vtype_t vtype;
    union {
        const char *cstr;
        rd_kafka_topic_t *rkt;
        int i;
        int32_t i32;
        int64_t i64;
        struct {
            void *ptr;
            size_t size;
        } mem;
        struct {
            const char *name;
            const void *val;
            ssize_t size;
        } header;
        rd_kafka_headers_t *headers;
        void *ptr;
        char _pad[64]; /* the library's own reserve: it fixes the element size of a vu array */
    } u;
} rd_kafka_vu_t;

struct rd_kafka_metadata_partition;
struct rd_kafka_metadata_broker;

typedef struct rd_kafka_metadata_topic {
    char *topic;
    int partition_cnt;
    struct rd_kafka_metadata_partition *partitions;
    rd_kafka_resp_err_t err;
} rd_kafka_metadata_topic_t;

typedef struct rd_kafka_metadata {
    int broker_cnt;
    struct rd_kafka_metadata_broker *brokers;
    int topic_cnt;
    struct rd_kafka_metadata_topic *topics;
    /* further fields are never read here */
} rd_kafka_metadata_t;

typedef struct rd_kafka_topic_partition_s {
    char *topic;
    int32_t partition;
    int64_t offset;
    void *metadata;
    size_t metadata_size;
    /* further fields are never read here; elements are only reached through rd_kafka_topic_partition_list_add */
} rd_kafka_topic_partition_t;

typedef struct rd_kafka_topic_partition_list_s rd_kafka_topic_partition_list_t;

typedef void rd_kafka_dr_msg_cb_t(rd_kafka_t *rk, const rd_kafka_message_t *rkmessage, void *opaque);
/* level: syslog's, 0 (emergency) to 7 (debug); fac: the facility, a short tag; buf: the line. Called from any of
 * librdkafka's threads unless log.queue forwards the lines to a queue the application serves. */
typedef void rd_kafka_log_cb_t(const rd_kafka_t *rk, int level, const char *fac, const char *buf);

int rd_kafka_version(void);
const char *rd_kafka_version_str(void);
const char *rd_kafka_err2str(rd_kafka_resp_err_t err);

rd_kafka_conf_t *rd_kafka_conf_new(void);
rd_kafka_conf_res_t rd_kafka_conf_set(rd_kafka_conf_t *conf, const char *name, const char *value, char *errstr,
                                      size_t errstr_size);
void rd_kafka_conf_destroy(rd_kafka_conf_t *conf);
void rd_kafka_conf_set_dr_msg_cb(rd_kafka_conf_t *conf, rd_kafka_dr_msg_cb_t *dr_msg_cb);
void rd_kafka_conf_set_opaque(rd_kafka_conf_t *conf, void *opaque);
void rd_kafka_conf_set_log_cb(rd_kafka_conf_t *conf, rd_kafka_log_cb_t *log_cb);

rd_kafka_t *rd_kafka_new(rd_kafka_type_t type, rd_kafka_conf_t *conf, char *errstr, size_t errstr_size);
void rd_kafka_destroy(rd_kafka_t *rk);
void *rd_kafka_opaque(const rd_kafka_t *rk);
const char *rd_kafka_name(const rd_kafka_t *rk);
rd_kafka_resp_err_t rd_kafka_fatal_error(rd_kafka_t *rk, char *errstr, size_t errstr_size);

rd_kafka_topic_t *rd_kafka_topic_new(rd_kafka_t *rk, const char *topic, rd_kafka_topic_conf_t *conf);
void rd_kafka_topic_destroy(rd_kafka_topic_t *rkt);
const char *rd_kafka_topic_name(const rd_kafka_topic_t *rkt);

rd_kafka_error_t *rd_kafka_produceva(rd_kafka_t *rk, const rd_kafka_vu_t *vus, size_t cnt);
int rd_kafka_poll(rd_kafka_t *rk, int timeout_ms);
rd_kafka_resp_err_t rd_kafka_flush(rd_kafka_t *rk, int timeout_ms);
int rd_kafka_outq_len(rd_kafka_t *rk);
rd_kafka_resp_err_t rd_kafka_purge(rd_kafka_t *rk, int purge_flags);

rd_kafka_headers_t *rd_kafka_headers_new(size_t initial_count);
void rd_kafka_headers_destroy(rd_kafka_headers_t *hdrs);
rd_kafka_resp_err_t rd_kafka_header_add(rd_kafka_headers_t *hdrs, const char *name, ssize_t name_size,
                                        const void *value, ssize_t value_size);

rd_kafka_resp_err_t rd_kafka_metadata(rd_kafka_t *rk, int all_topics, rd_kafka_topic_t *only_rkt,
                                      const struct rd_kafka_metadata **metadatap, int timeout_ms);
void rd_kafka_metadata_destroy(const struct rd_kafka_metadata *metadata);

rd_kafka_error_t *rd_kafka_init_transactions(rd_kafka_t *rk, int timeout_ms);
rd_kafka_error_t *rd_kafka_begin_transaction(rd_kafka_t *rk);
rd_kafka_error_t *rd_kafka_send_offsets_to_transaction(rd_kafka_t *rk, const rd_kafka_topic_partition_list_t *offsets,
                                                       const rd_kafka_consumer_group_metadata_t *cgmetadata,
                                                       int timeout_ms);
rd_kafka_error_t *rd_kafka_commit_transaction(rd_kafka_t *rk, int timeout_ms);
rd_kafka_error_t *rd_kafka_abort_transaction(rd_kafka_t *rk, int timeout_ms);

rd_kafka_resp_err_t rd_kafka_error_code(const rd_kafka_error_t *error);
const char *rd_kafka_error_string(const rd_kafka_error_t *error);
int rd_kafka_error_is_fatal(const rd_kafka_error_t *error);
int rd_kafka_error_is_retriable(const rd_kafka_error_t *error);
int rd_kafka_error_txn_requires_abort(const rd_kafka_error_t *error);
void rd_kafka_error_destroy(rd_kafka_error_t *error);

rd_kafka_consumer_group_metadata_t *rd_kafka_consumer_group_metadata_new(const char *group_id);
void rd_kafka_consumer_group_metadata_destroy(rd_kafka_consumer_group_metadata_t *cgmd);

rd_kafka_topic_partition_list_t *rd_kafka_topic_partition_list_new(int size);
rd_kafka_topic_partition_t *rd_kafka_topic_partition_list_add(rd_kafka_topic_partition_list_t *rktparlist,
                                                              const char *topic, int32_t partition);
void rd_kafka_topic_partition_list_destroy(rd_kafka_topic_partition_list_t *rkparlist);

#endif
