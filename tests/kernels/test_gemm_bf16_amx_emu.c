/* The software emulation of the AMX instructions (kernels/cpu/amx_emu.c) against values worked out
 * by hand from the Intel SDM's definitions: loads and stores honour each tile's rows, bytes a row
 * and the stride; TDPBF16PS pairs a's bf16 2k, 2k+1 with b's 2n, 2n+1 (a swapped pair gives another
 * number), keeps the even and the odd lanes in two fp32 chains and adds them to c at the end (each
 * other order gives another number on the cases below), rounds to nearest even, treats denormal
 * inputs as zero (a, b and c) and flushes denormal results; shape and register faults reach the
 * handler. Then the emulator catches the layout bugs a kernel can make: a B tile packed without
 * the VNNI pairing, or loaded at a wrong stride, gives a wrong product where the right packing
 * gives the exact one. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cpu/amx_emu.h"
#include "test.h"

static uint16_t bf(float f) { /* exact for the values used here */
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);
}

static ctrl_amx_tilecfg cfg_all(int rows, int colsb) {
    ctrl_amx_tilecfg c;
    memset(&c, 0, sizeof c);
    c.palette_id = 1;
    for (int t = 0; t < CTRL_AMX_TILES; t++) c.rows[t] = (uint8_t)rows, c.colsb[t] = (uint16_t)colsb;
    return c;
}

TEST(load_and_store_honour_rows_bytes_and_stride) {
    ctrl_amx_tilecfg c = cfg_all(16, 64);
    c.rows[2] = 5, c.colsb[2] = 12;
    ctrl_amx_emu_loadconfig(&c);
    unsigned char src[5 * 40], dst[5 * 20 + 8];
    for (size_t i = 0; i < sizeof src; i++) src[i] = (unsigned char)(i * 7 + 1);
    memset(dst, 0xEE, sizeof dst);
    ctrl_amx_emu_loadd(2, src, 40);
    ctrl_amx_emu_stored(2, dst, 20);
    int bad = 0;
    for (int r = 0; r < 5; r++)
        for (int b = 0; b < 20; b++)
            bad += dst[r * 20 + b] != (b < 12 ? src[r * 40 + b] : 0xEE); /* only colsb bytes written */
    for (int b = 100; b < 108; b++) bad += dst[b] != 0xEE;               /* nothing past the rows */
    CHECK_EQ_INT(bad, 0);
    ctrl_amx_emu_release();
}

/* c (1 row, 16 columns) = a (1 row of npairs pairs) x b (npairs rows of 16 column pairs) + c0 */
static void dp_row(float c[16], const uint16_t *a, const uint16_t *b, int npairs, const float c0[16]) {
    ctrl_amx_tilecfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    cfg.rows[0] = 1, cfg.colsb[0] = 64;                     /* c: 1 x 16 fp32 */
    cfg.rows[1] = 1, cfg.colsb[1] = (uint16_t)(4 * npairs); /* a: 1 x npairs pairs */
    cfg.rows[2] = (uint8_t)npairs, cfg.colsb[2] = 64;       /* b: npairs x 16 pairs */
    ctrl_amx_emu_loadconfig(&cfg);
    ctrl_amx_emu_loadd(0, c0, 64);
    ctrl_amx_emu_loadd(1, a, 4 * npairs);
    ctrl_amx_emu_loadd(2, b, 64);
    ctrl_amx_emu_dpbf16ps(0, 1, 2);
    ctrl_amx_emu_stored(0, c, 64);
    ctrl_amx_emu_release();
}

TEST(tdpbf16ps_pairs_chains_and_rounding_as_the_sdm_defines) {
    enum { P = 2 };
    uint16_t a[2 * P] = {bf(1.0f), bf(2.0f), bf(1.0f), bf(1.0f)}, b[P][32];
    float c0[16] = {0}, c[16];
    memset(b, 0, sizeof b);
    /* column n takes b[k][2n] (even lane, times a[2k]) and b[k][2n + 1] (odd lane, times a[2k + 1]) */
    /* 0, pairing: (1, 2) . (10, 1000) = 2010 (swapped lanes: 1020) */
    b[0][0] = bf(10.0f), b[0][1] = bf(1000.0f);
    /* 1: even products (2^24, 1), odd (1, 1): the even chain 2^24 + 1 -> 2^24 (tie to even), the odd
     * one 2, c = 2^24 + 2. Summing the four products in k order would give 2^24. */
    b[0][2] = bf(16777216.0f), b[0][3] = bf(0.5f), b[1][2] = bf(1.0f), b[1][3] = bf(1.0f);
    /* 2: even (1, 2^24), odd (1, 0): even 2^24 + 1 -> 2^24, odd 1, 2^24 + 1 -> 2^24. Adding each
     * pair's two products first (2, then 2^24) would give 2^24 + 2. */
    b[0][4] = bf(1.0f), b[0][5] = bf(0.5f), b[1][4] = bf(16777216.0f);
    /* 3: 1 + 3 * 2^-24 (1.5 ulps) -> 1 + 2^-22; 10: 1 + 2^-24 (half an ulp) -> 1, the even neighbour */
    b[0][6] = bf(1.0f), b[1][6] = bf(3 * 0x1p-24f);
    b[0][20] = bf(1.0f), b[1][20] = bf(0x1p-24f);
    /* 7: overflow: 2 * 2^127 -> +inf */
    b[0][15] = bf(0x1p127f);
    /* 8: c + (even + odd), not (c + even) + odd: c = 2^24, even 1, odd 1 -> 2^24 + 2 */
    c0[8] = 16777216.0f, b[1][16] = bf(1.0f), b[1][17] = bf(1.0f);
    dp_row(c, a, &b[0][0], P, c0);
    CHECK_MSG(c[0] == 2010.0f, "column 0: %.1f (2010: a's pair 2k, 2k+1 with b's lanes 2n, 2n+1)", c[0]);
    CHECK_MSG(c[1] == 16777218.0f, "column 1: %.1f (16777218: separate even and odd chains)", c[1]);
    CHECK_MSG(c[2] == 16777216.0f, "column 2: %.1f (16777216: the chains, not per-pair sums)", c[2]);
    CHECK_MSG(c[3] == 1.0f + 0x1p-22f, "column 3: %a (0x1.000004p+0)", c[3]);
    CHECK_MSG(c[10] == 1.0f, "column 10: %a (ties to even)", c[10]);
    CHECK_MSG(isinf(c[7]) && c[7] > 0, "column 7: %a (overflow: +inf)", c[7]);
    CHECK_MSG(c[8] == 16777218.0f, "column 8: %.1f (c + (even + odd))", c[8]);

    /* denormals: a = (2^10, 2^-100), (1, 1) */
    uint16_t d[2 * P] = {bf(0x1p10f), bf(0x1p-100f), bf(1.0f), bf(1.0f)};
    memset(b, 0, sizeof b);
    memset(c0, 0, sizeof c0);
    b[0][0] = 0x0001;       /* 0: 2^10 * 2^-133 (a denormal b) = 2^-123 without DAZ; 0 with it */
    b[0][3] = bf(0x1p-30f); /* 1: 2^-100 * 2^-30 = 2^-130, denormal: flushed (FTZ) */
    b[0][5] = bf(0x1p-26f); /* 2: 2^-100 * 2^-26 = FLT_MIN: kept */
    c0[3] = 1e-40f;         /* 3: a denormal c is read as 0 */
    b[0][9] =
        bf(0x1.8p-26f); /* 4: odd 2^-100 * 1.5 * 2^-26 = 1.5 FLT_MIN, then - FLT_MIN: 0.5 FLT_MIN -> 0 */
    b[1][9] = bf(-0x1p-126f);
    dp_row(c, d, &b[0][0], P, c0);
    CHECK_MSG(c[0] == 0.0f, "column 0: %a (a denormal input is zero)", c[0]);
    CHECK_MSG(c[1] == 0.0f && !signbit(c[1]), "column 1: %a (a denormal product is flushed)", c[1]);
    CHECK_MSG(c[2] == FLT_MIN, "column 2: %a (FLT_MIN is kept)", c[2]);
    CHECK_MSG(c[3] == 0.0f, "column 3: %a (a denormal c is zero)", c[3]);
    CHECK_MSG(c[4] == 0.0f, "column 4: %a (a denormal partial sum is flushed)", c[4]);
}

static int faults;
static char last_fault[200];
static void record(const char *what) {
    faults++;
    snprintf(last_fault, sizeof last_fault, "%s", what);
}

TEST(faults_reach_the_handler_and_do_nothing) {
    ctrl_amx_emu_fault_fn old = ctrl_amx_emu_set_fault_handler(record);
    float buf[256] = {0};
    ctrl_amx_emu_release();
    faults = 0;
    ctrl_amx_emu_zero(0); /* not configured */
    CHECK_EQ_INT(faults, 1);
    ctrl_amx_tilecfg c = cfg_all(16, 64);
    c.rows[3] = 17; /* past the palette */
    ctrl_amx_emu_loadconfig(&c);
    CHECK_EQ_INT(faults, 2);
    c = cfg_all(16, 64);
    c.reserved0[5] = 1;
    ctrl_amx_emu_loadconfig(&c);
    CHECK_EQ_INT(faults, 3);
    c = cfg_all(16, 64);
    c.rows[2] = 8; /* b: 8 rows, a: 16 pairs a row */
    ctrl_amx_emu_loadconfig(&c);
    ctrl_amx_emu_zero(0);
    ctrl_amx_emu_dpbf16ps(0, 1, 2);
    CHECK_EQ_INT(faults, 4);
    CHECK_CONTAINS(last_fault, "src2 rows");
    ctrl_amx_emu_dpbf16ps(0, 0, 1); /* not distinct */
    CHECK_EQ_INT(faults, 5);
    c.colsb[0] = 32; /* c 8 columns, b 16 */
    c.rows[2] = 16;
    ctrl_amx_emu_loadconfig(&c);
    ctrl_amx_emu_dpbf16ps(0, 1, 2);
    CHECK_EQ_INT(faults, 6);
    ctrl_amx_emu_loadd(9, buf, 64); /* no such register */
    CHECK_EQ_INT(faults, 7);
    ctrl_amx_emu_release();
    ctrl_amx_emu_set_fault_handler(old);
}

/* A 16 x 16 x 32 product of small integers (exact in fp32 in any order) through tiles, B packed with
 * the VNNI pairing or a kernel's mistakes: only the right packing and stride give the exact C. */
static int product_errors(int variant) {
    enum { M = 16, N = 32, K = 32 };
    float A[M][K], B[K][N], want[M][16], got[M][16];
    uint16_t a[M][K], vnni[K / 2][N][2], plain[K][N];
    for (int i = 0; i < M; i++)
        for (int k = 0; k < K; k++) A[i][k] = (float)((i * 3 + k * 5) % 17 - 8), a[i][k] = bf(A[i][k]);
    for (int k = 0; k < K; k++)
        for (int j = 0; j < N; j++) {
            B[k][j] = (float)((k * 7 + j * 11) % 13 - 6);
            vnni[k / 2][j][k % 2] = bf(B[k][j]), plain[k][j] = bf(B[k][j]);
        }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < 16; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += (double)A[i][k] * B[k][j];
            want[i][j] = (float)s;
        }
    ctrl_amx_tilecfg c = cfg_all(16, 64);
    ctrl_amx_emu_loadconfig(&c);
    ctrl_amx_emu_zero(0);
    ctrl_amx_emu_loadd(1, a, sizeof a[0]);
    if (variant == 0) ctrl_amx_emu_loadd(2, vnni, sizeof vnni[0]);       /* pairs of rows, 32 columns a row */
    if (variant == 1) ctrl_amx_emu_loadd(2, plain, 2 * sizeof plain[0]); /* no pairing */
    if (variant == 2) ctrl_amx_emu_loadd(2, vnni, 64);                   /* stride of one tile's row */
    ctrl_amx_emu_dpbf16ps(0, 1, 2);
    ctrl_amx_emu_stored(0, got, sizeof got[0]);
    ctrl_amx_emu_release();
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < 16; j++) bad += got[i][j] != want[i][j];
    return bad;
}

TEST(layout_mistakes_give_wrong_products) {
    CHECK_EQ_INT(product_errors(0), 0);
    const int unpaired = product_errors(1), strided = product_errors(2);
    printf("  wrong elements of 256: B without VNNI pairs %d, B at a wrong stride %d\n", unpaired, strided);
    CHECK(unpaired > 128);
    CHECK(strided > 128);
}
