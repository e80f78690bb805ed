/* The eight- or four-lane BLAKE2b of _digests.c, included once per instruction set with LANES (the lane count),
 * LANES_T (a vector of LANES uint64_t), LANES_FN (the function's name), LANES_TARGET (GCC's target) and
 * ROT32, ROT24, ROT16, ROT63 (rotations right of every lane) defined. */
/* BLAKE2b-128 of a || bodies[l] for l < LANES, into out + OUT * l. Records of fewer blocks than the longest
 * sit out the extra compressions (their lanes are masked when the state is updated). */
__attribute__((target(LANES_TARGET)))
static void LANES_FN(const uint8_t *a, size_t alen, const uint8_t *const bodies[LANES],
                     const size_t blens[LANES], uint8_t *out) {
    size_t total[LANES], nblocks[LANES], most = 0;
    for (int l = 0; l < LANES; l++) {
        total[l] = alen + blens[l];
        nblocks[l] = total[l] ? (total[l] + BLOCK - 1) / BLOCK : 1;
        if (nblocks[l] > most) most = nblocks[l];
    }
    LANES_T h[8];
    for (int i = 0; i < 8; i++) h[i] = (LANES_T){0} + IV[i];
    h[0] ^= 0x01010000ULL ^ OUT;  /* parameter block: digest length 16, no key, fanout 1, depth 1 */
    uint64_t words[16][LANES] __attribute__((aligned(64)));
    uint64_t counter[LANES] __attribute__((aligned(64))), final[LANES] __attribute__((aligned(64)));
    uint64_t live[LANES] __attribute__((aligned(64)));
    uint8_t block[BLOCK];
    for (size_t blk = 0; blk < most; blk++) {
        size_t pos = blk * BLOCK;
        for (int l = 0; l < LANES; l++) {
            if (blk >= nblocks[l]) {  /* this record is done: any input will do, the result is dropped */
                counter[l] = final[l] = live[l] = 0;
                continue;
            }
            const uint8_t *src;
            int last = blk + 1 == nblocks[l];
            if (!last && pos >= alen) {
                src = bodies[l] + (pos - alen);  /* wholly inside the body: no copy */
            } else {
                size_t len = last ? total[l] - pos : BLOCK;
                gather(block, a, alen, bodies[l], pos, len);
                memset(block + len, 0, BLOCK - len);
                src = block;
            }
            for (int i = 0; i < 16; i++) words[i][l] = load64(src + 8 * i);
            counter[l] = last ? total[l] : pos + BLOCK;
            final[l] = last ? ~0ULL : 0;
            live[l] = ~0ULL;
        }
        LANES_T m[16], v[16], t, f, keep;
        memcpy(m, words, sizeof m);
        memcpy(&t, counter, sizeof t);
        memcpy(&f, final, sizeof f);
        memcpy(&keep, live, sizeof keep);
        for (int i = 0; i < 8; i++) {
            v[i] = h[i];
            v[i + 8] = (LANES_T){0} + IV[i];
        }
        v[12] ^= t;
        v[14] ^= f;
#define VROUND(r)                                                   \
    do {                                                            \
        VG(v[0], v[4], v[8], v[12], m[SIGMA[(r) % 10][0]], m[SIGMA[(r) % 10][1]]);    \
        VG(v[1], v[5], v[9], v[13], m[SIGMA[(r) % 10][2]], m[SIGMA[(r) % 10][3]]);    \
        VG(v[2], v[6], v[10], v[14], m[SIGMA[(r) % 10][4]], m[SIGMA[(r) % 10][5]]);   \
        VG(v[3], v[7], v[11], v[15], m[SIGMA[(r) % 10][6]], m[SIGMA[(r) % 10][7]]);   \
        VG(v[0], v[5], v[10], v[15], m[SIGMA[(r) % 10][8]], m[SIGMA[(r) % 10][9]]);   \
        VG(v[1], v[6], v[11], v[12], m[SIGMA[(r) % 10][10]], m[SIGMA[(r) % 10][11]]); \
        VG(v[2], v[7], v[8], v[13], m[SIGMA[(r) % 10][12]], m[SIGMA[(r) % 10][13]]);  \
        VG(v[3], v[4], v[9], v[14], m[SIGMA[(r) % 10][14]], m[SIGMA[(r) % 10][15]]);  \
    } while (0)
        VROUND(0); VROUND(1); VROUND(2); VROUND(3); VROUND(4); VROUND(5);
        VROUND(6); VROUND(7); VROUND(8); VROUND(9); VROUND(10); VROUND(11);
#undef VROUND
        for (int i = 0; i < 8; i++) h[i] = ((h[i] ^ v[i] ^ v[i + 8]) & keep) | (h[i] & ~keep);
    }
    for (int l = 0; l < LANES; l++)
        for (int i = 0; i < OUT; i++) out[OUT * l + i] = (uint8_t)(h[i / 8][l] >> (8 * (i % 8)));
}
