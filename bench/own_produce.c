/* Benchmark-only (never shipped, never on a user's path): Kafka record batches (v2) encoded straight from Arrow
 * buffers, for bench/own_produce.py, which sends them over a plain socket to measure what a produce path of the
 * sink's own could save against librdkafka. No idempotence, no compression, no transactions.
 *
 * A record batch v2: baseOffset int64, batchLength int32, partitionLeaderEpoch int32, magic int8 (2), crc uint32
 * (CRC-32C of everything after it), attributes int16, lastOffsetDelta int32, baseTimestamp int64, maxTimestamp
 * int64, producerId int64 (-1), producerEpoch int16 (-1), baseSequence int32 (-1), records count int32, then each
 * record: length varint, attributes int8, timestampDelta varlong, offsetDelta varint, key length varint and bytes
 * (-1: null), value length varint and bytes, header count varint, each header: key length varint and bytes, value
 * length varint and bytes. Varints are zigzag-encoded, as in protobuf. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

static uint32_t crc_table[8][256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xFF];
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc32c_hw(const uint8_t *p, size_t n) {
    uint64_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = _mm_crc32_u8(c32, *p++);
    return c32 ^ 0xFFFFFFFFu;
}
#endif

static uint32_t crc32c_sw(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = crc_table[7][lo & 0xFF] ^ crc_table[6][(lo >> 8) & 0xFF] ^ crc_table[5][(lo >> 16) & 0xFF] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xFF] ^ crc_table[2][(hi >> 8) & 0xFF] ^
            crc_table[1][(hi >> 16) & 0xFF] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xFF];
    return c ^ 0xFFFFFFFFu;
}

static int use_hw = -1;

uint32_t own_crc32c(const uint8_t *p, size_t n) {
    if (use_hw < 0) {
        crc_init();
#if defined(__x86_64__)
        __builtin_cpu_init();
        use_hw = __builtin_cpu_supports("sse4.2");
#else
        use_hw = 0;
#endif
    }
#if defined(__x86_64__)
    if (use_hw) return crc32c_hw(p, n);
#endif
    return crc32c_sw(p, n);
}

static inline uint8_t *put_varint(uint8_t *o, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    while (z >= 0x80) {
        *o++ = (uint8_t)(z | 0x80);
        z >>= 7;
    }
    *o++ = (uint8_t)z;
    return o;
}

static inline int varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline void put_be32(uint8_t *o, uint32_t v) {
    o[0] = (uint8_t)(v >> 24); o[1] = (uint8_t)(v >> 16); o[2] = (uint8_t)(v >> 8); o[3] = (uint8_t)v;
}

static inline void put_be64(uint8_t *o, uint64_t v) {
    put_be32(o, (uint32_t)(v >> 32));
    put_be32(o + 4, (uint32_t)v);
}

/* Encode records [first, first + count) as one batch into out (capacity cap); returns its size, or 0 if it does
 * not fit. Keys and values: Arrow binary arrays (int32 offsets; key_off NULL: no keys). Headers: a list array
 * (h_list_off) of structs whose key and value are binary arrays (h_key_off/h_key, h_val_off/h_val), or NULL. */
size_t own_encode_batch(const int32_t *key_off, const uint8_t *key, const int32_t *val_off, const uint8_t *val,
                        const int32_t *h_list_off, const int32_t *h_key_off, const uint8_t *h_key,
                        const int32_t *h_val_off, const uint8_t *h_val, int64_t first, int64_t count,
                        int64_t timestamp_ms, uint8_t *out, size_t cap) {
    const size_t header = 61;
    if (cap < header) return 0;
    uint8_t *o = out + header, *end = out + cap;
    for (int64_t i = 0; i < count; i++) {
        int64_t r = first + i;
        int64_t klen = key_off ? key_off[r + 1] - key_off[r] : -1;
        int64_t vlen = val_off[r + 1] - val_off[r];
        int64_t body = 1 + 1 + varint_size(i) + varint_size(klen) + (klen > 0 ? klen : 0) + varint_size(vlen) + vlen;
        int64_t nh = h_list_off ? h_list_off[r + 1] - h_list_off[r] : 0;
        body += varint_size(nh);
        for (int64_t h = 0; h < nh; h++) {
            int64_t j = h_list_off[r] + h;
            int64_t hk = h_key_off[j + 1] - h_key_off[j], hv = h_val_off[j + 1] - h_val_off[j];
            body += varint_size(hk) + hk + varint_size(hv) + hv;
        }
        if (o + varint_size(body) + body > end) return 0;
        o = put_varint(o, body);
        *o++ = 0;                 /* attributes */
        *o++ = 0;                 /* timestampDelta 0 */
        o = put_varint(o, i);     /* offsetDelta */
        o = put_varint(o, klen);
        if (klen > 0) { memcpy(o, key + key_off[r], (size_t)klen); o += klen; }
        o = put_varint(o, vlen);
        memcpy(o, val + val_off[r], (size_t)vlen);
        o += vlen;
        o = put_varint(o, nh);
        for (int64_t h = 0; h < nh; h++) {
            int64_t j = h_list_off[r] + h;
            int64_t hk = h_key_off[j + 1] - h_key_off[j], hv = h_val_off[j + 1] - h_val_off[j];
            o = put_varint(o, hk);
            memcpy(o, h_key + h_key_off[j], (size_t)hk);
            o += hk;
            o = put_varint(o, hv);
            memcpy(o, h_val + h_val_off[j], (size_t)hv);
            o += hv;
        }
    }
    size_t total = (size_t)(o - out);
    put_be64(out, 0);                                /* baseOffset */
    put_be32(out + 8, (uint32_t)(total - 12));       /* batchLength: from partitionLeaderEpoch on */
    put_be32(out + 12, 0xFFFFFFFFu);                 /* partitionLeaderEpoch -1 */
    out[16] = 2;                                     /* magic */
    out[21] = 0; out[22] = 0;                        /* attributes: no compression, CreateTime */
    put_be32(out + 23, (uint32_t)(count - 1));       /* lastOffsetDelta */
    put_be64(out + 27, (uint64_t)timestamp_ms);      /* baseTimestamp */
    put_be64(out + 35, (uint64_t)timestamp_ms);      /* maxTimestamp */
    put_be64(out + 43, UINT64_MAX);                  /* producerId -1 */
    out[51] = 0xFF; out[52] = 0xFF;                  /* producerEpoch -1 */
    put_be32(out + 53, 0xFFFFFFFFu);                 /* baseSequence -1 */
    put_be32(out + 57, (uint32_t)count);             /* records */
    put_be32(out + 17, own_crc32c(out + 21, total - 21));
    return total;
}
