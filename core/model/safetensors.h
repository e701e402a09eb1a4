/* safetensors files, read as untrusted input: the header length and the tensor count are bounded,
 * every tensor's dtype/shape (product checked before it can overflow) must match its byte range
 * (whole-number offsets), ranges must lie inside the file and not overlap, names must be unique. The
 * file is memory-mapped; reads convert f32/bf16/f16 to f32. Writing is atomic (temp + rename). */
#ifndef CTRL_CORE_SAFETENSORS_H
#define CTRL_CORE_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/status.h>
#include <ctrl/tensor.h>

#define CTRL_ST_MAX_HEADER (100u << 20) /* 100 MiB, as the reference implementation allows */
#define CTRL_ST_MAX_NAME 256
#define CTRL_ST_MAX_TENSORS (1 << 18)         /* per file: ~90 MB of tensor table at most */
#define CTRL_ST_MAX_NUMEL ((uint64_t)1 << 40) /* elements of one tensor */

typedef struct ctrl_st_tensor {
    char name[CTRL_ST_MAX_NAME];
    ctrl_dtype dtype;
    int ndim;
    int64_t shape[CTRL_MAX_DIMS];
    size_t offset; /* from the start of the file */
    size_t nbytes;
} ctrl_st_tensor;

typedef struct ctrl_safetensors ctrl_safetensors;

ctrl_status ctrl_safetensors_open(const char *path, ctrl_safetensors **out);
void ctrl_safetensors_close(ctrl_safetensors *st);
int ctrl_safetensors_count(const ctrl_safetensors *st);
const ctrl_st_tensor *ctrl_safetensors_at(const ctrl_safetensors *st, int i);
const ctrl_st_tensor *ctrl_safetensors_find(const ctrl_safetensors *st, const char *name);
/* Copies a tensor into dst as f32 (converting bf16/f16); numel must match. */
ctrl_status ctrl_safetensors_read_f32(const ctrl_safetensors *st, const char *name, float *dst,
                                      int64_t numel);

/* Copies a tensor stored as `dtype` into dst byte for byte (no conversion); its dtype and numel must
 * match (an optimizer's 8-bit state). */
ctrl_status ctrl_safetensors_read_raw(const ctrl_safetensors *st, const char *name, ctrl_dtype dtype,
                                      void *dst, int64_t numel);

/* The index of the first NaN or infinity in a float tensor (f32/bf16/f16, read from its stored bits,
 * nothing converted), its value in *value (may be NULL); -1 when every value is finite or the
 * tensor is not a float type. For checks before anything is written (weights never hold these). */
int64_t ctrl_safetensors_find_non_finite(const ctrl_safetensors *st, const ctrl_st_tensor *t, float *value);
/* The same over elements [start, start + count) of t only (the index returned is the tensor's), and
 * those elements read as f32 into dst (the mapped pages read let go), for loading a part of a
 * tensor (ZeRO-3's slices) without touching the rest of the file. */
int64_t ctrl_safetensors_find_non_finite_part(const ctrl_safetensors *st, const ctrl_st_tensor *t,
                                              int64_t start, int64_t count, float *value);
ctrl_status ctrl_safetensors_read_f32_part(const ctrl_safetensors *st, const ctrl_st_tensor *t, float *dst,
                                           int64_t start, int64_t count);

/* One tensor to write: f32 data, stored as `dtype` (CTRL_F32, CTRL_BF16 or CTRL_F16, rounded to
 * nearest even as torch's .to() rounds); or, with `raw` set, raw_dtype elements stored as they are
 * (an optimizer's 8-bit state: CTRL_U8), whatever the file's dtype. */
typedef struct ctrl_st_write {
    const char *name;
    const float *data;
    int ndim;
    int64_t shape[CTRL_MAX_DIMS];
    const void *raw;
    ctrl_dtype raw_dtype;
} ctrl_st_write;

/* Writes a safetensors file atomically, laid out as the Python library lays it out for tensors of one
 * dtype: the header's __metadata__ ({"format": "pt"}) first, then the tensors sorted by name, the
 * header padded with spaces to a multiple of 8 bytes. */
ctrl_status ctrl_safetensors_write(const char *path, const ctrl_st_write *tensors, int n, ctrl_dtype dtype);
/* The same, with fetch(user, t) called just before tensor t's data is read, in the file's order (a
 * caller that makes each tensor's data ready only when it is written: ZeRO-3's save, whose layers
 * are gathered one at a time); an error from it ends the write (no file). NULL: none. */
typedef ctrl_status (*ctrl_st_fetch)(void *user, const ctrl_st_write *t);
ctrl_status ctrl_safetensors_write_fetched(const char *path, const ctrl_st_write *tensors, int n,
                                           ctrl_dtype dtype, ctrl_st_fetch fetch, void *user);

#endif
