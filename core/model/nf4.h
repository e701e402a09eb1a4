/* 4-bit NormalFloat (NF4) as bitsandbytes defines it for QLoRA (bitsandbytes.functional
 * quantize_4bit / dequantize_4bit with quant_type "nf4", blocksize 64, compress_statistics: what
 * transformers' BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
 * bnb_4bit_use_double_quant=True) stores a base weight as):
 *   - each block of 64 values is scaled by 1/absmax (absmax = max |x| of the block) into [-1, 1]
 *     and each value mapped to the nearest of the 16 NF4 code values (the midpoints between
 *     neighbouring codes decide; a value on a midpoint takes the lower code), two 4-bit indices
 *     per byte, the first value in the high nibble; a last partial block has its own absmax;
 *     (bitsandbytes clamps a partial last block's absmax at 1e-38);
 *   - double quantization: the fp32 absmax values less their mean (`offset`) are quantized in
 *     blocks of 256 (scaled by their block's absmax) to bitsandbytes' signed 8-bit dynamic code as
 *     bitsandbytes' CPU kernel does (a 65536-step lookup table), one byte each, one fp32 scale per 256;
 *   - dequantization: absmax = dynamic[q] * scale2 + offset, value = nf4[index] * absmax (fp32).
 * The code books are bitsandbytes' own values; tests/unit/test_nf4.c checks them and every byte
 * against bitsandbytes (tests/reference/make_nf4_fixtures.py). */
#ifndef CTRL_CORE_MODEL_NF4_H
#define CTRL_CORE_MODEL_NF4_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>

#define CTRL_NF4_BLOCK 64
#define CTRL_NF4_BLOCK2 256

extern const float ctrl_nf4_code[16];
extern const float ctrl_nf4_dynamic_code[256];

/* A tensor of n values in NF4 with double-quantized statistics. */
typedef struct ctrl_nf4 {
    int64_t n;
    uint8_t *packed;  /* (n + 1) / 2 bytes */
    uint8_t *qabsmax; /* one byte per block of 64 */
    float *absmax2;   /* one scale per 256 blocks */
    float offset;
} ctrl_nf4;

/* Blocks of 64 of w [n] into packed [(n + 1) / 2] bytes and absmax [ceil(n / 64)]. */
void ctrl_nf4_quantize_blocks(const float *w, int64_t n, uint8_t *packed, float *absmax);
/* The blockwise 8-bit quantization of x [n] (blocks of 256) to the dynamic code: q [n], scale
 * [ceil(n / 256)]. */
void ctrl_nf4_quantize_dynamic(const float *x, int64_t n, uint8_t *q, float *scale);
/* w [n] into *out (its buffers allocated here; ctrl_nf4_free). */
ctrl_status ctrl_nf4_quantize(const float *w, int64_t n, ctrl_nf4 *out);
/* The block scales of q (absmax [ceil(n / 64)]) and the values (out [n]). */
void ctrl_nf4_absmax(const ctrl_nf4 *q, float *absmax);
void ctrl_nf4_dequantize(const ctrl_nf4 *q, const float *absmax, float *out);
void ctrl_nf4_free(ctrl_nf4 *q);
/* The same dequantization from the parts, with the code books given (the CPU backend's
 * nf4_dequantize op; device/backend.h). */
ctrl_status ctrl_nf4_dequantize_raw(float *out, const uint8_t *packed, const uint8_t *qabsmax,
                                    const float *absmax2, float offset, const float *code,
                                    const float *dynamic, int64_t n);
/* Bytes q holds. */
size_t ctrl_nf4_bytes(int64_t n);

/* Slicing an NF4 tensor across `size` ranks (the groundwork for ZeRO-3 over a QLoRA base, issue 19:
 * each rank keeping its slice of every weight's NF4 store and all-gathering a layer's before use).
 * The cut falls on super-blocks of CTRL_NF4_SUPER values (256 blocks of 64: one absmax2 scale each),
 * so each of the three parts (packed codes, absmax bytes, absmax2 scales) slices into whole elements
 * and a slice is itself an NF4 tensor of its values (the same offset: dequantizing it gives exactly
 * those values of the whole); the ranks' parts laid end to end in rank order are the whole's parts
 * (what an all-gather of each part with these counts rebuilds). ctrl_nf4_span: rank's values
 * [*v0, *v1) (super-blocks dealt as evenly as they go, the first ranks one more; empty when there are
 * fewer super-blocks than ranks); ctrl_nf4_part_counts: the bytes of each part of values [v0, v1) of
 * an n-value tensor (v0 on a super-block boundary); ctrl_nf4_slice: rank's slice as a tensor of its
 * own (buffers allocated here; ctrl_nf4_free). */
#define CTRL_NF4_SUPER ((int64_t)CTRL_NF4_BLOCK * CTRL_NF4_BLOCK2)
void ctrl_nf4_span(int64_t n, int rank, int size, int64_t *v0, int64_t *v1);
void ctrl_nf4_part_counts(int64_t v0, int64_t v1, size_t counts[3]);
ctrl_status ctrl_nf4_slice(const ctrl_nf4 *q, int rank, int size, ctrl_nf4 *out);

#endif
