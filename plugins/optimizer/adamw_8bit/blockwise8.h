/* bitsandbytes' blockwise 8-bit quantization (functional.create_dynamic_map, quantize_blockwise /
 * dequantize_blockwise), as its 8-bit optimizers store their moments: blocks of
 * BW8_BLOCK values, each byte an index into a 256-value dynamic map (signed for the first moment,
 * unsigned for the second), each block scaled by its absolute maximum. */
#ifndef CTRL_ADAMW8BIT_BLOCKWISE8_H
#define CTRL_ADAMW8BIT_BLOCKWISE8_H

#include <stdint.h>

#define BW8_BLOCK 256 /* the block size of bitsandbytes' blockwise optimizer kernels */

/* The dynamic map (8 bits, at most 7 exponent bits), sorted, as create_dynamic_map(signed) makes it. */
void bw8_dynamic_map(int is_signed, float map[256]);

/* bitsandbytes' CPU quantizer (csrc/cpu_ops.cpp, quantize_cpu) rounds through a table: [-1, 1] cut
 * into BW8_LUT points, each given the first map index whose midpoint with the next is not below it;
 * a value scaled by its block's 1 / absmax (clamped to [-1, 1]) takes the nearest point's index. */
#define BW8_LUT 65536
void bw8_build_lut(const float map[256], uint8_t lut[BW8_LUT]);

/* One block of n <= BW8_BLOCK values: its absmax in *absmax and each value's map index in q, through
 * the map's table (an all-zero block: absmax 0 and index 0 everywhere). */
void bw8_quantize_block(const uint8_t lut[BW8_LUT], const float *x, int n, uint8_t *q, float *absmax);

#endif
