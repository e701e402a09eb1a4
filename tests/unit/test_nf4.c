/* NF4 (core/model/nf4.c) against bitsandbytes itself (tests/reference/make_nf4_fixtures.py:
 * bitsandbytes 0.50.2's quantize_4bit / dequantize_4bit on weights both sides compute from one
 * formula): the code books are bitsandbytes' values; the 4-bit indices and the fp32 block absmax
 * are bitsandbytes' byte for byte; dequantizing bitsandbytes' own double-quantized state gives
 * its values bit for bit; ctrl's double quantization gives bitsandbytes' absmax bytes exactly, its
 * offset (the mean of the absmax, which torch sums in its own order) within an ulp, and so its
 * dequantized values within 1e-6 (an ulp of the offset, relative to a small block scale). */
#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "file_text.h"
#include "model/nf4.h"
#include "test.h"

static cJSON *fixture(void) {
    ctrl_status st;
    char *text = ctrl_read_text_file(CTRL_FIXTURE_DIR "/nf4/nf4.json", 1 << 20, &st);
    cJSON *root = text ? cJSON_Parse(text) : NULL;
    free(text);
    CHECK_MSG(root != NULL, "nf4.json: %s", ctrl_error_message());
    return root;
}

/* make_nf4_fixtures.py's weights(n, seed, scale). */
static float *weights(int n, uint64_t seed, double scale) {
    float *w = malloc(sizeof(float) * (size_t)n);
    uint64_t s = seed;
    for (int i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        double v = ((double)(s >> 40) / 16777216.0 - 0.5) * scale;
        if (i % 97 == 0) v *= 8.0;
        if (i >= 64 && i < 128) v = 0.0;
        w[i] = (float)v;
    }
    return w;
}

static uint8_t *hex(const char *s, size_t *n) {
    *n = strlen(s) / 2;
    uint8_t *b = malloc(*n + 1);
    for (size_t i = 0; i < *n; i++) {
        unsigned v = 0;
        sscanf(s + 2 * i, "%2x", &v);
        b[i] = (uint8_t)v;
    }
    return b;
}

static float *floats(const cJSON *a, int *n) {
    *n = cJSON_GetArraySize(a);
    float *f = malloc(sizeof(float) * (size_t)(*n + 1));
    int i = 0;
    for (const cJSON *e = a ? a->child : NULL; e; e = e->next) f[i++] = (float)e->valuedouble;
    return f;
}

TEST(nf4_code_books_are_bitsandbytes) {
    cJSON *fx = fixture();
    int n;
    float *nf4 = floats(cJSON_GetObjectItemCaseSensitive(fx, "nf4_code"), &n), *dyn;
    CHECK_EQ_INT(n, 16);
    CHECK(n == 16 && !memcmp(nf4, ctrl_nf4_code, sizeof ctrl_nf4_code));
    dyn = floats(cJSON_GetObjectItemCaseSensitive(fx, "dynamic_code"), &n);
    CHECK_EQ_INT(n, 256);
    CHECK(n == 256 && !memcmp(dyn, ctrl_nf4_dynamic_code, sizeof ctrl_nf4_dynamic_code));
    free(nf4), free(dyn);
    cJSON_Delete(fx);
}

TEST(nf4_quantize_and_dequantize_equal_bitsandbytes) {
    cJSON *fx = fixture();
    int cases = 0;
    for (const cJSON *c = cJSON_GetObjectItemCaseSensitive(fx, "cases")->child; c; c = c->next, cases++) {
        const int n = cJSON_GetObjectItemCaseSensitive(c, "n")->valueint;
        float *w = weights(n, (uint64_t)cJSON_GetObjectItemCaseSensitive(c, "seed")->valuedouble,
                           cJSON_GetObjectItemCaseSensitive(c, "scale")->valuedouble);
        int nb, nb2, n_deq;
        size_t n_packed, n_q;
        float *want_absmax = floats(cJSON_GetObjectItemCaseSensitive(c, "absmax"), &nb),
              *want_absmax2 = floats(cJSON_GetObjectItemCaseSensitive(c, "absmax2"), &nb2),
              *want_deq = floats(cJSON_GetObjectItemCaseSensitive(c, "dequant_every_31st"), &n_deq);
        uint8_t *want_packed = hex(cJSON_GetObjectItemCaseSensitive(c, "packed")->valuestring, &n_packed),
                *want_q = hex(cJSON_GetObjectItemCaseSensitive(c, "qabsmax")->valuestring, &n_q);
        const float want_offset = (float)cJSON_GetObjectItemCaseSensitive(c, "offset")->valuedouble;
        const float first = (float)cJSON_GetObjectItemCaseSensitive(c, "first_values")->child->valuedouble;
        CHECK_MSG(w[0] == first, "the weight formula: %.9g vs bitsandbytes' input %.9g", (double)w[0],
                  (double)first);
        /* the 4-bit indices and block absmax: exact */
        uint8_t *packed = malloc(n_packed + 1);
        float *absmax = malloc(sizeof(float) * (size_t)(nb + 1));
        ctrl_nf4_quantize_blocks(w, n, packed, absmax);
        CHECK_EQ_INT((long)n_packed, (n + 1) / 2);
        CHECK_EQ_INT(nb, (n + 63) / 64);
        CHECK_MSG(!memcmp(packed, want_packed, n_packed), "n %d: NF4 indices differ from bitsandbytes'", n);
        CHECK_MSG(!memcmp(absmax, want_absmax, sizeof(float) * (size_t)nb), "n %d: absmax differs", n);
        /* bitsandbytes' own double-quantized state, dequantized here: its values bit for bit */
        ctrl_nf4 theirs = {
            .n = n, .packed = want_packed, .qabsmax = want_q, .absmax2 = want_absmax2, .offset = want_offset};
        float *deq = malloc(sizeof(float) * (size_t)n), *am = malloc(sizeof(float) * (size_t)nb);
        ctrl_nf4_absmax(&theirs, am);
        ctrl_nf4_dequantize(&theirs, am, deq);
        int same = 0;
        for (int k = 0; k < n_deq; k++) same += deq[(size_t)k * 31] == want_deq[k];
        CHECK_MSG(same == n_deq, "n %d: dequantized %d of %d equal bitsandbytes'", n, same, n_deq);
        /* ctrl's double quantization from the weights: bitsandbytes' absmax bytes exactly; the offset
         * (the mean of the absmax, which torch sums in its own order) within an ulp */
        ctrl_nf4 ours;
        CHECK_EQ_INT(ctrl_nf4_quantize(w, n, &ours), CTRL_OK);
        CHECK_MSG(fabsf(ours.offset - want_offset) <= nextafterf(want_offset, INFINITY) - want_offset,
                  "n %d: offset %.9g vs %.9g", n, (double)ours.offset, (double)want_offset);
        CHECK_REL(ours.absmax2, want_absmax2, nb2, 1e-6);
        CHECK_MSG(!memcmp(ours.qabsmax, want_q, (size_t)nb), "n %d: double-quantized absmax bytes differ", n);
        CHECK_MSG(!memcmp(ours.packed, want_packed, n_packed), "n %d: packed differs", n);
        ctrl_nf4_absmax(&ours, am);
        ctrl_nf4_dequantize(&ours, am, deq);
        double worst = 0;
        for (int k = 0; k < n_deq; k++)
            worst =
                fmax(worst, fabs((double)deq[(size_t)k * 31] - want_deq[k]) / fmax(fabs(want_deq[k]), 1e-30));
        CHECK_MSG(worst <= 1e-6, "n %d: dequantized values %.3g from bitsandbytes'", n, worst);
        printf("  n %5d: %d blocks of 64, %d of 256: indices, absmax and absmax bytes equal bitsandbytes', "
               "offset %s, dequantized values within %.1e\n",
               n, nb, nb2, ours.offset == want_offset ? "equal" : "1 ulp off", worst);
        ctrl_nf4_free(&ours);
        free(w), free(want_absmax), free(want_absmax2), free(want_deq), free(want_packed), free(want_q);
        free(packed), free(absmax), free(deq), free(am);
    }
    CHECK_EQ_INT(cases, 3);
    cJSON_Delete(fx);
}

/* The backends' op form (ctrl_nf4_dequantize_raw: the parts and the code books given, as a device
 * holds them) computes ctrl_nf4_absmax + ctrl_nf4_dequantize's values bit for bit. */
TEST(nf4_dequantize_raw_equals_the_two_step_dequantization) {
    const int64_t n = (int64_t)64 * 256 + 64 * 3 + 21; /* two absmax2 blocks, a partial block */
    float *w = malloc(sizeof(float) * (size_t)n), *a = malloc(sizeof(float) * (size_t)n),
          *b = malloc(sizeof(float) * (size_t)n), *absmax = malloc(sizeof(float) * (size_t)(n / 64 + 1));
    for (int64_t i = 0; i < n; i++) w[i] = (float)sin((double)i * 0.37) * (float)(1 + (i / 64) % 5);
    ctrl_nf4 q;
    CHECK_EQ_INT(ctrl_nf4_quantize(w, n, &q), CTRL_OK);
    ctrl_nf4_absmax(&q, absmax);
    ctrl_nf4_dequantize(&q, absmax, a);
    CHECK_EQ_INT(ctrl_nf4_dequantize_raw(b, q.packed, q.qabsmax, q.absmax2, q.offset, ctrl_nf4_code,
                                         ctrl_nf4_dynamic_code, n),
                 CTRL_OK);
    CHECK(!memcmp(a, b, sizeof(float) * (size_t)n));
    ctrl_nf4_free(&q);
    free(w), free(a), free(b), free(absmax);
}

/* Slicing across ranks (ctrl_nf4_span / ctrl_nf4_slice, the groundwork for ZeRO-3 over an NF4 base):
 * for 1-3 ranks over a tensor of three super-blocks and a partial one, the spans tile [0, n) on
 * super-block boundaries, the slices' parts laid end to end in rank order are the whole's parts byte
 * for byte (what an all-gather rebuilds), and each slice dequantized on its own gives exactly its
 * values of the whole's dequantization. With more ranks than super-blocks the last spans are empty. */
TEST(nf4_slices_tile_the_tensor_and_dequantize_alone) {
    const int64_t n = 3 * CTRL_NF4_SUPER + 64 * 5 + 21;
    float *w = malloc(sizeof(float) * (size_t)n), *whole = malloc(sizeof(float) * (size_t)n),
          *part = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) w[i] = (float)cos((double)i * 0.11) * (float)(1 + (i / 64) % 7);
    ctrl_nf4 q;
    CHECK_EQ_INT(ctrl_nf4_quantize(w, n, &q), CTRL_OK);
    CHECK_EQ_INT(ctrl_nf4_dequantize_raw(whole, q.packed, q.qabsmax, q.absmax2, q.offset, ctrl_nf4_code,
                                         ctrl_nf4_dynamic_code, n),
                 CTRL_OK);
    size_t all[3];
    ctrl_nf4_part_counts(0, n, all);
    for (int size = 1; size <= 3; size++) {
        uint8_t *joined[3] = {malloc(all[0]), malloc(all[1]), malloc(all[2])};
        size_t at[3] = {0, 0, 0};
        int64_t next = 0;
        for (int r = 0; r < size; r++) {
            int64_t v0, v1;
            ctrl_nf4_span(n, r, size, &v0, &v1);
            CHECK_MSG(v0 == next && v0 % CTRL_NF4_SUPER == 0 && v1 > v0, "size %d rank %d: [%lld, %lld)",
                      size, r, (long long)v0, (long long)v1);
            next = v1;
            ctrl_nf4 s;
            CHECK_EQ_INT(ctrl_nf4_slice(&q, r, size, &s), CTRL_OK);
            CHECK(s.n == v1 - v0 && s.offset == q.offset);
            size_t c[3];
            ctrl_nf4_part_counts(v0, v1, c);
            const void *src[3] = {s.packed, s.qabsmax, s.absmax2};
            for (int k = 0; k < 3; k++) memcpy(joined[k] + at[k], src[k], c[k]), at[k] += c[k];
            CHECK_EQ_INT(ctrl_nf4_dequantize_raw(part, s.packed, s.qabsmax, s.absmax2, s.offset,
                                                 ctrl_nf4_code, ctrl_nf4_dynamic_code, s.n),
                         CTRL_OK);
            CHECK_MSG(!memcmp(part, whole + v0, sizeof(float) * (size_t)s.n),
                      "size %d rank %d: the slice's values differ from the whole's", size, r);
            ctrl_nf4_free(&s);
        }
        CHECK(next == n && at[0] == all[0] && at[1] == all[1] && at[2] == all[2]);
        CHECK(!memcmp(joined[0], q.packed, all[0]) && !memcmp(joined[1], q.qabsmax, all[1]) &&
              !memcmp(joined[2], q.absmax2, all[2]));
        for (int k = 0; k < 3; k++) free(joined[k]);
    }
    int64_t v0, v1; /* 4 super-blocks over 6 ranks: ranks 4 and 5 hold nothing */
    ctrl_nf4_span(n, 5, 6, &v0, &v1);
    CHECK(v0 == n && v1 == n);
    ctrl_nf4_free(&q);
    free(w), free(whole), free(part);
}
