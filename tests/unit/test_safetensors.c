/* safetensors as untrusted input: round trips of the writer, f16/bf16 conversion, and one clear
 * error (never a crash) for each way a header can lie. */
#include <cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/safetensors.h"
#include "test.h"

static const char *tmp_path(const char *name) {
    static char path[256];
    const char *dir = test_tmp_dir();
    if (!dir) return NULL;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* A file made of an 8-byte length, the header text, and `data_bytes` bytes of data. */
static const char *raw_file(const char *name, const char *header, uint64_t claimed_len, size_t data_bytes) {
    const char *path = tmp_path(name);
    FILE *f = fopen(path, "wb");
    uint64_t len = claimed_len ? claimed_len : strlen(header);
    for (int i = 0; i < 8; i++) fputc((int)((len >> (8 * i)) & 0xff), f);
    fputs(header, f);
    for (size_t i = 0; i < data_bytes; i++) fputc((int)(i & 0xff), f);
    fclose(f);
    return path;
}

static void expect_bad(const char *name, const char *header, uint64_t claimed, size_t data,
                       const char *needle) {
    const char *path = raw_file(name, header, claimed, data);
    ctrl_safetensors *st = NULL;
    ctrl_status s = ctrl_safetensors_open(path, &st);
    CHECK_MSG(s == CTRL_ERR_FORMAT, "%s: status %s (%s)", name, ctrl_status_name(s), ctrl_error_message());
    CHECK(st == NULL);
    CHECK_CONTAINS(ctrl_error_message(), name);
    CHECK_CONTAINS(ctrl_error_message(), needle);
}

TEST(write_read_round_trip) {
    float a[6] = {1, -2, 3.5f, 1e-3f, -0.0f, 65504}, b[3] = {0.1f, 0.2f, 0.3f};
    ctrl_st_write t[2] = {{.name = "z.weight", .data = a, .ndim = 2, .shape = {2, 3}},
                          {.name = "a.bias", .data = b, .ndim = 1, .shape = {3}}};
    const char *path = tmp_path("rt.safetensors");
    CHECK_EQ_INT(ctrl_safetensors_write(path, t, 2, CTRL_F32), CTRL_OK);
    ctrl_safetensors *st = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_OK);
    if (!st) return;
    CHECK_EQ_INT(ctrl_safetensors_count(st), 2);
    CHECK_STR(ctrl_safetensors_at(st, 0)->name, "a.bias"); /* sorted by name, as the Python library */
    const ctrl_st_tensor *w = ctrl_safetensors_find(st, "z.weight");
    CHECK(w && w->dtype == CTRL_F32 && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3);
    float back[6];
    CHECK_EQ_INT(ctrl_safetensors_read_f32(st, "z.weight", back, 6), CTRL_OK);
    CHECK(memcmp(back, a, sizeof a) == 0);
    CHECK_EQ_INT(ctrl_safetensors_read_f32(st, "z.weight", back, 5), CTRL_ERR_FORMAT);
    CHECK_EQ_INT(ctrl_safetensors_read_f32(st, "missing", back, 6), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "missing");
    ctrl_safetensors_close(st);
    /* bf16: values exactly representable survive; others round to nearest even. */
    CHECK_EQ_INT(ctrl_safetensors_write(path, t, 2, CTRL_BF16), CTRL_OK);
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_OK);
    CHECK_EQ_INT(ctrl_safetensors_read_f32(st, "z.weight", back, 6), CTRL_OK);
    CHECK(back[0] == 1 && back[1] == -2 && back[2] == 3.5f &&
          back[5] == 65536.0f); /* 65504 -> 65536 in bf16 */
    CHECK_NEAR(back[3], 1e-3, 1e-5);
    ctrl_safetensors_close(st);
}

/* A tensor written raw (an optimizer's 8-bit state) keeps its dtype and bytes beside converted ones;
 * reading it raw checks dtype and size, reading it as floats is refused. */
TEST(raw_u8_round_trip) {
    float a[3] = {1, 2, 3};
    const unsigned char q[5] = {0, 7, 128, 254, 255};
    ctrl_st_write t[2] = {{.name = "m", .data = a, .ndim = 1, .shape = {3}},
                          {.name = "q", .ndim = 1, .shape = {5}, .raw = q, .raw_dtype = CTRL_U8}};
    const char *path = tmp_path("raw.safetensors");
    CHECK_EQ_INT(ctrl_safetensors_write(path, t, 2, CTRL_BF16), CTRL_OK);
    ctrl_safetensors *st = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_OK);
    if (!st) return;
    const ctrl_st_tensor *w = ctrl_safetensors_find(st, "q");
    CHECK(w && w->dtype == CTRL_U8 && w->nbytes == 5);
    CHECK(ctrl_safetensors_find(st, "m") && ctrl_safetensors_find(st, "m")->dtype == CTRL_BF16);
    unsigned char back[5] = {0};
    CHECK_EQ_INT(ctrl_safetensors_read_raw(st, "q", CTRL_U8, back, 5), CTRL_OK);
    CHECK(memcmp(back, q, 5) == 0);
    CHECK_EQ_INT(ctrl_safetensors_read_raw(st, "q", CTRL_U8, back, 4), CTRL_ERR_FORMAT);
    CHECK_EQ_INT(ctrl_safetensors_read_raw(st, "m", CTRL_U8, back, 3), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "bf16");
    float f[5];
    CHECK_EQ_INT(ctrl_safetensors_read_f32(st, "q", f, 5), CTRL_ERR_FORMAT);
    ctrl_safetensors_close(st);
}

TEST(f16_conversion) {
    /* IEEE half bit patterns: 1.0, -2.0, 65504 (largest), 2^-24 (smallest subnormal), 2^-14. */
    const char *hdr = "{\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]}}";
    const char *path = tmp_path("f16.safetensors");
    FILE *f = fopen(path, "wb");
    uint64_t len = strlen(hdr);
    for (int i = 0; i < 8; i++) fputc((int)((len >> (8 * i)) & 0xff), f);
    fputs(hdr, f);
    const uint16_t bits[5] = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400};
    for (int i = 0; i < 5; i++) fputc(bits[i] & 0xff, f), fputc(bits[i] >> 8, f);
    fclose(f);
    ctrl_safetensors *st = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_OK);
    float v[5];
    CHECK_EQ_INT(ctrl_safetensors_read_f32(st, "h", v, 5), CTRL_OK);
    CHECK(v[0] == 1.0f && v[1] == -2.0f && v[2] == 65504.0f && v[3] == 0x1p-24f && v[4] == 0x1p-14f);
    CHECK_EQ_INT(ctrl_safetensors_find_non_finite(st, ctrl_safetensors_find(st, "h"), NULL), -1);
    ctrl_safetensors_close(st);
    /* f16 infinity and NaN (exponent all ones) are found, at their index, with their value */
    const uint16_t nonfinite[5] = {0x3C00, 0x7BFF, 0xFC00, 0x7E00, 0x7C00};
    f = fopen(path, "wb");
    for (int i = 0; i < 8; i++) fputc((int)((len >> (8 * i)) & 0xff), f);
    fputs(hdr, f);
    for (int i = 0; i < 5; i++) fputc(nonfinite[i] & 0xff, f), fputc(nonfinite[i] >> 8, f);
    fclose(f);
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_OK);
    float value = 0;
    CHECK_EQ_INT(ctrl_safetensors_find_non_finite(st, ctrl_safetensors_find(st, "h"), &value), 2);
    CHECK(value == -INFINITY);
    ctrl_safetensors_close(st);
}

/* Issue 15: header lies that once passed. */
TEST(untrusted_header_edges) {
    /* 2^32 × 2^32 elements wrapped around to 0, which 0 bytes then matched */
    expect_bad("wrap.st",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, 0,
               "more than 2^40 elements");
    expect_bad("frac.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0.5,4.5]}}", 0, 8,
               "whole numbers");
    expect_bad("dup.st",
               "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
               "\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
               0, 8, "tensor 'w' appears twice");
    /* more entries than the limit: refused before the table is allocated */
    const int n = CTRL_ST_MAX_TENSORS + 1;
    char *hdr = malloc((size_t)n * 12 + 16), *p = hdr;
    *p++ = '{';
    for (int i = 0; i < n; i++) p += sprintf(p, "%s\"%d\":0", i ? "," : "", i);
    *p++ = '}', *p = 0;
    expect_bad("many.st", hdr, 0, 0, "262145 tensors, more than the limit 262144");
    free(hdr);
}

/* cJSON's allocator, failing from the `budget`-th allocation on (cJSON_InitHooks): the writer's
 * header running out of memory at every point. */
static int json_budget;
static void *json_malloc(size_t n) { return json_budget-- > 0 ? malloc(n) : NULL; }

/* Out of memory anywhere in the header is CTRL_ERR_NOMEM naming the file and nothing written (not
 * a header missing tensors, nor a crash); with enough memory the file is whole. */
TEST(writer_out_of_memory_in_the_header) {
    float a[4] = {1, 2, 3, 4};
    ctrl_st_write t[2] = {{.name = "w", .data = a, .ndim = 2, .shape = {2, 2}},
                          {.name = "b", .data = a, .ndim = 1, .shape = {4}}};
    const char *path = tmp_path("oom.safetensors");
    int ok = 0;
    for (int budget = 0; budget < 200 && !ok; budget++) {
        unlink(path);
        json_budget = budget;
        cJSON_InitHooks(&(cJSON_Hooks){.malloc_fn = json_malloc, .free_fn = free});
        ctrl_status st = ctrl_safetensors_write(path, t, 2, CTRL_F32);
        cJSON_InitHooks(NULL);
        ok = st == CTRL_OK;
        if (!ok) {
            CHECK_EQ_INT(st, CTRL_ERR_NOMEM);
            CHECK_CONTAINS(ctrl_error_message(), "oom.safetensors");
            CHECK_MSG(access(path, F_OK) != 0, "a file was written after running out at allocation %d",
                      budget);
        }
    }
    CHECK(ok);
    ctrl_safetensors *st = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_OK);
    if (st) CHECK_EQ_INT(ctrl_safetensors_count(st), 2);
    ctrl_safetensors_close(st);
}

TEST(malformed_headers) {
    expect_bad("huge_len.st", "{}", (uint64_t)1 << 40, 0, "header length");
    expect_bad("past_end.st", "{}", 4096, 0, "larger than the file");
    expect_bad("not_json.st", "{\"a\": [1, 2", 0, 0, "not a JSON object");
    expect_bad("array.st", "[1, 2, 3]", 0, 0, "not a JSON object");
    expect_bad("bad_dtype.st", "{\"w\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,2]}}", 0, 2,
               "dtype");
    expect_bad("no_offsets.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2]}}", 0, 8, "data_offsets");
    expect_bad("neg_dim.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 0, 8,
               "shape");
    expect_bad("out_of_bounds.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 0, 8,
               "outside the 8-byte data section");
    expect_bad("reversed.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 0, 8,
               "data_offsets");
    expect_bad("size_mismatch.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, 8,
               "8 bytes for 3 elements");
    expect_bad("overlap.st",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
               0, 12, "overlap");
    expect_bad("five_dims.st", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,4]}}", 0,
               4, "at most 4 dims");
    /* Shorter than the length prefix. */
    const char *path = tmp_path("tiny.st");
    FILE *f = fopen(path, "wb");
    fputs("abc", f);
    fclose(f);
    ctrl_safetensors *st = NULL;
    CHECK_EQ_INT(ctrl_safetensors_open(path, &st), CTRL_ERR_FORMAT);
    CHECK_CONTAINS(ctrl_error_message(), "too short");
    CHECK_EQ_INT(ctrl_safetensors_open("/nonexistent.safetensors", &st), CTRL_ERR_IO);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", test_tmp_dir());
    CHECK(system(cmd) == 0);
}
