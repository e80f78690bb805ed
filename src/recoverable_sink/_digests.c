/* recoverable_sink._digests: the record digests of a whole Arrow batch in one call, without the GIL.
 *
 * BLAKE2b with a 16-byte digest, written from RFC 7693 (no key, salt or personalisation), over
 * prefix || element for each element of an Arrow binary array (given as its offsets and data buffers).
 * The same bytes as hashlib.blake2b(prefix + element, digest_size=16).digest(): recoverable_sink.identity
 * falls back to hashlib where this module was not built (spark-submit --py-files), and the unit tests hold
 * the two to the same results. Where the CPU has AVX-512 or AVX2, eight or four records are hashed per pass
 * (digest_lanes8, digest_lanes4), two to three times the records per second of one at a time.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 128
#define OUT 16

static const uint64_t IV[8] = {
    0x6a09e667f3bcc908ULL, 0xbb67ae8584caa73bULL, 0x3c6ef372fe94f82bULL, 0xa54ff53a5f1d36f1ULL,
    0x510e527fade682d1ULL, 0x9b05688c2b3e6c1fULL, 0x1f83d9abfb41bd6bULL, 0x5be0cd19137e2179ULL,
};

/* The message schedule of RFC 7693 section 2.7; rounds 10 and 11 reuse rows 0 and 1 (r % 10 below). */
static const uint8_t SIGMA[10][16] = {
    {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
    {14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3},
    {11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4},
    {7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8},
    {9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13},
    {2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9},
    {12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11},
    {13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10},
    {6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5},
    {10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0},
};

static inline uint64_t rotr(uint64_t x, int n) { return (x >> n) | (x << (64 - n)); }

static inline uint64_t load64(const uint8_t *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t x;
    memcpy(&x, p, 8);  /* one unaligned load */
    return x;
#else
    uint64_t x = 0;
    for (int i = 7; i >= 0; i--) x = (x << 8) | p[i];  /* little-endian, whatever the host */
    return x;
#endif
}

#define G(a, b, c, d, x, y)          \
    do {                             \
        a = a + b + (x);             \
        d = rotr(d ^ a, 32);         \
        c = c + d;                   \
        b = rotr(b ^ c, 24);         \
        a = a + b + (y);             \
        d = rotr(d ^ a, 16);         \
        c = c + d;                   \
        b = rotr(b ^ c, 63);         \
    } while (0)

/* The twelve rounds of F on v[16] with message words m[16], spelled out so that every message index is a
 * constant and v stays in registers; G_ is the mixing function (G here, VG for the lanes). */
#define ROUND(G_, r)                                                                  \
    do {                                                                              \
        G_(v[0], v[4], v[8], v[12], m[SIGMA[(r) % 10][0]], m[SIGMA[(r) % 10][1]]);    \
        G_(v[1], v[5], v[9], v[13], m[SIGMA[(r) % 10][2]], m[SIGMA[(r) % 10][3]]);    \
        G_(v[2], v[6], v[10], v[14], m[SIGMA[(r) % 10][4]], m[SIGMA[(r) % 10][5]]);   \
        G_(v[3], v[7], v[11], v[15], m[SIGMA[(r) % 10][6]], m[SIGMA[(r) % 10][7]]);   \
        G_(v[0], v[5], v[10], v[15], m[SIGMA[(r) % 10][8]], m[SIGMA[(r) % 10][9]]);   \
        G_(v[1], v[6], v[11], v[12], m[SIGMA[(r) % 10][10]], m[SIGMA[(r) % 10][11]]); \
        G_(v[2], v[7], v[8], v[13], m[SIGMA[(r) % 10][12]], m[SIGMA[(r) % 10][13]]);  \
        G_(v[3], v[4], v[9], v[14], m[SIGMA[(r) % 10][14]], m[SIGMA[(r) % 10][15]]);  \
    } while (0)
#define TWELVE_ROUNDS(G_)                                                                             \
    do {                                                                                              \
        ROUND(G_, 0); ROUND(G_, 1); ROUND(G_, 2); ROUND(G_, 3); ROUND(G_, 4); ROUND(G_, 5);           \
        ROUND(G_, 6); ROUND(G_, 7); ROUND(G_, 8); ROUND(G_, 9); ROUND(G_, 10); ROUND(G_, 11);         \
    } while (0)

/* F of RFC 7693 section 3.2; `t` counts the message bytes so far (messages here stay far below 2^64). */
static void compress(uint64_t h[8], const uint8_t block[BLOCK], uint64_t t, int last) {
    uint64_t m[16], v[16];
    for (int i = 0; i < 16; i++) m[i] = load64(block + 8 * i);
    for (int i = 0; i < 8; i++) {
        v[i] = h[i];
        v[i + 8] = IV[i];
    }
    v[12] ^= t;
    if (last) v[14] = ~v[14];
    TWELVE_ROUNDS(G);
    for (int i = 0; i < 8; i++) h[i] ^= v[i] ^ v[i + 8];
}

/* Copy len bytes at position pos of the concatenation a || b into dst. */
static void gather(uint8_t *dst, const uint8_t *a, size_t alen, const uint8_t *b, size_t pos, size_t len) {
    if (pos < alen) {
        size_t take = alen - pos < len ? alen - pos : len;
        memcpy(dst, a + pos, take);
        dst += take;
        pos += take;
        len -= take;
    }
    if (len) memcpy(dst, b + (pos - alen), len);
}

/* BLAKE2b-128 of a || b (the prefix and one element), into out[16]. */
static void digest2(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, uint8_t out[OUT]) {
    uint64_t h[8];
    uint8_t block[BLOCK];
    memcpy(h, IV, sizeof h);
    h[0] ^= 0x01010000ULL ^ OUT;  /* parameter block: digest length 16, no key, fanout 1, depth 1 */
    size_t total = alen + blen, pos = 0;
    while (total - pos > BLOCK) {  /* every block but the last, which is compressed as the final one */
        if (pos >= alen) {
            compress(h, b + (pos - alen), pos + BLOCK, 0);  /* wholly inside b: no copy */
        } else {
            gather(block, a, alen, b, pos, BLOCK);
            compress(h, block, pos + BLOCK, 0);
        }
        pos += BLOCK;
    }
    size_t rest = total - pos;  /* 0 (an empty message) to BLOCK */
    gather(block, a, alen, b, pos, rest);
    memset(block + rest, 0, BLOCK - rest);
    compress(h, block, total, 1);
    for (int i = 0; i < OUT; i++) out[i] = (uint8_t)(h[i / 8] >> (8 * (i % 8)));
}

#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
/* Several records at once: lane l of every vector belongs to record l, so each instruction of BLAKE2b's rounds
 * works on independent messages. Two builds of the same rounds (_digests_lanes.h): eight lanes in AVX-512
 * registers, where rotations are one instruction, and four lanes in AVX2 registers, where the rotations by 32,
 * 24 and 16 bits are byte shuffles within a register (GCC lowers a shuffle of a vector wider than the CPU's
 * element by element, so the AVX2 build cannot use eight lanes in two registers with shuffles: as shifts they
 * cost 22 against 12 ms for 10,000 1 KB records on an AMD EPYC). The module picks one when it loads. The
 * digests are the same bytes as digest2's, which the unit tests hold to hashlib's. */
#define MAX_LANES 8
#define VG(a, b, c, d, x, y)         \
    do {                             \
        a = a + b + (x);             \
        d = ROT32(d ^ a);            \
        c = c + d;                   \
        b = ROT24(b ^ c);            \
        a = a + b + (y);             \
        d = ROT16(d ^ a);            \
        c = c + d;                   \
        b = ROT63(b ^ c);            \
    } while (0)

typedef uint64_t lanes8_t __attribute__((vector_size(64)));
#define LANES 8
#define LANES_T lanes8_t
#define LANES_FN digest_lanes8
#define LANES_TARGET "avx512f"
#define VROTR(x, n) (((x) >> (n)) | ((x) << (64 - (n))))  /* one vprorq */
#define ROT32(x) VROTR(x, 32)
#define ROT24(x) VROTR(x, 24)
#define ROT16(x) VROTR(x, 16)
#define ROT63(x) VROTR(x, 63)
#include "_digests_lanes.h"
#undef LANES
#undef LANES_T
#undef LANES_FN
#undef LANES_TARGET
#undef ROT32
#undef ROT24
#undef ROT16
#undef ROT63

typedef uint64_t lanes4_t __attribute__((vector_size(32)));
typedef uint32_t words4_t __attribute__((vector_size(32)));
typedef uint8_t bytes4_t __attribute__((vector_size(32)));
#define LANES 4
#define LANES_T lanes4_t
#define LANES_FN digest_lanes4
#define LANES_TARGET "avx2"
/* Byte b of a rotated word comes from byte (b + n / 8) % 8 of the same word: vpshufd for 32, vpshufb for 24, 16. */
#define BYTE_ROT(w, k) 8 * (w) + (k) % 8, 8 * (w) + (1 + (k)) % 8, 8 * (w) + (2 + (k)) % 8, 8 * (w) + (3 + (k)) % 8, \
                       8 * (w) + (4 + (k)) % 8, 8 * (w) + (5 + (k)) % 8, 8 * (w) + (6 + (k)) % 8, 8 * (w) + (7 + (k)) % 8
#define WORD_SHUFFLE(x, k)                                                                                     \
    ((lanes4_t)__builtin_shuffle((bytes4_t)(x),                                                               \
                                 (bytes4_t){BYTE_ROT(0, k), BYTE_ROT(1, k), BYTE_ROT(2, k), BYTE_ROT(3, k)}))
#define ROT32(x) ((lanes4_t)__builtin_shuffle((words4_t)(x), (words4_t){1, 0, 3, 2, 5, 4, 7, 6}))
#define ROT24(x) WORD_SHUFFLE(x, 3)
#define ROT16(x) WORD_SHUFFLE(x, 2)
#define ROT63(x) (((x) >> 63) | ((x) + (x)))
#include "_digests_lanes.h"

/* Without AVX2 the lanes cost more than one record at a time (SSE2 splits every vector, with rotations as two
 * shifts): 28 against 18 ms for 10,000 1 KB records. Set when the module loads: 8, 4 or 0. */
static int lanes = 0;
#else
#define MAX_LANES 0
#endif

/* Element i's offset in an Arrow offsets buffer (int32, or int64 if wide). */
static inline int64_t offset_at(const uint8_t *offs, int wide, Py_ssize_t i) {
    if (wide) {
        int64_t x;
        memcpy(&x, offs + 8 * i, 8);
        return x;
    }
    int32_t x;
    memcpy(&x, offs + 4 * i, 4);
    return x;
}

static PyObject *batch(PyObject *Py_UNUSED(self), PyObject *args) {
    Py_buffer prefix, offsets, data;
    Py_ssize_t first, count;
    int wide;
    if (!PyArg_ParseTuple(args, "y*y*y*nnp", &prefix, &offsets, &data, &first, &count, &wide)) return NULL;
    PyObject *result = NULL;
    size_t width = wide ? 8 : 4;
    if (first < 0 || count < 0 || (size_t)offsets.len < (size_t)(first + count + 1) * width) {
        PyErr_SetString(PyExc_ValueError, "offsets buffer too short for the rows asked");
        goto done;
    }
    result = PyBytes_FromStringAndSize(NULL, count * OUT);
    if (result == NULL) goto done;
    uint8_t *out = (uint8_t *)PyBytes_AS_STRING(result);
    const uint8_t *offs = (const uint8_t *)offsets.buf, *bytes = (const uint8_t *)data.buf;
    int bad = 0;
    const uint8_t *pre = (const uint8_t *)prefix.buf;
    Py_BEGIN_ALLOW_THREADS
    /* Check every offset first, so that the hashing below only reads inside the buffers. */
    int64_t prev = 0;
    for (Py_ssize_t i = 0; i <= count && !bad; i++) {
        int64_t at = offset_at(offs, wide, first + i);
        bad = at < 0 || at > data.len || (i > 0 && at < prev);
        prev = at;
    }
    Py_ssize_t i = 0;
#if MAX_LANES
    for (; !bad && lanes && i + lanes <= count; i += lanes) {
        const uint8_t *bodies[MAX_LANES];
        size_t lens[MAX_LANES];
        for (int l = 0; l < lanes; l++) {
            int64_t start = offset_at(offs, wide, first + i + l);
            bodies[l] = bytes + start;
            lens[l] = (size_t)(offset_at(offs, wide, first + i + l + 1) - start);
        }
        if (lanes == 8)
            digest_lanes8(pre, (size_t)prefix.len, bodies, lens, out + OUT * i);
        else
            digest_lanes4(pre, (size_t)prefix.len, bodies, lens, out + OUT * i);
    }
#endif
    for (; !bad && i < count; i++) {
        int64_t start = offset_at(offs, wide, first + i);
        digest2(pre, (size_t)prefix.len, bytes + start, (size_t)(offset_at(offs, wide, first + i + 1) - start),
                out + OUT * i);
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        Py_CLEAR(result);
        PyErr_SetString(PyExc_ValueError, "an offset points outside the data buffer");
    }
done:
    PyBuffer_Release(&prefix);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&data);
    return result;
}

static PyMethodDef methods[] = {
    {"batch", batch, METH_VARARGS,
     "batch(prefix, offsets, data, first, count, wide) -> bytes\n\n"
     "BLAKE2b-128 of prefix + element for `count` elements of an Arrow binary array from `first`, given its\n"
     "offsets buffer (int32, or int64 if `wide`) and data buffer; 16 bytes per element, concatenated."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_digests", NULL, -1, methods};

PyMODINIT_FUNC PyInit__digests(void) {
    int n = 0;
#if MAX_LANES
    __builtin_cpu_init();
    lanes = __builtin_cpu_supports("avx512f") ? 8 : __builtin_cpu_supports("avx2") ? 4 : 0;
    n = lanes;
#endif
    PyObject *m = PyModule_Create(&module);
    /* How many records one pass hashes on this CPU (1: one at a time), for tests and benchmarks to report. */
    if (m != NULL && PyModule_AddIntConstant(m, "LANES", n ? n : 1) < 0) Py_CLEAR(m);
    return m;
}
