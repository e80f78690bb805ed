/* The eight- or four-lane BLAKE2b of _digests.c, included once per instruction set with LANES (the lane count),
 * LANES_T (a vector of LANES uint64_t), LANES_FN (the function's name), LANES_TARGET (GCC's target) and
 * ROT32, ROT24, ROT16, ROT63 (rotations right of every lane) defined; VG and TWELVE_ROUNDS come from there. */
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
        TWELVE_ROUNDS(VG);
        for (int i = 0; i < 8; i++) h[i] = ((h[i] ^ v[i] ^ v[i + 8]) & keep) | (h[i] & ~keep);
    }
    for (int l = 0; l < LANES; l++)
        for (int i = 0; i < OUT; i++) out[OUT * l + i] = (uint8_t)(h[i / 8][l] >> (8 * (i % 8)));
}
