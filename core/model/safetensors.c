/* safetensors: an 8-byte little-endian header length, a JSON header mapping each tensor name to
 * {dtype, shape, data_offsets: [begin, end]} relative to the data section, then the data. */
#include "model/safetensors.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

struct ctrl_safetensors {
    char *path;
    unsigned char *map;
    size_t size;
    ctrl_st_tensor *tensors;
    int n;
};

static int parse_dtype(const char *s, ctrl_dtype *out) {
    static const struct {
        const char *name;
        ctrl_dtype dtype;
    } table[] = {{"F32", CTRL_F32}, {"BF16", CTRL_BF16}, {"F16", CTRL_F16},
                 {"I32", CTRL_I32}, {"I64", CTRL_I64},   {"U8", CTRL_U8}};
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(s, table[i].name)) {
            *out = table[i].dtype;
            return 0;
        }
    return -1;
}

/* The header's name of a dtype (the table above, the other way). */
static const char *dtype_tag(ctrl_dtype d) {
    static const char *const tags[CTRL_DTYPE_COUNT] = {
        [CTRL_F32] = "F32", [CTRL_BF16] = "BF16", [CTRL_F16] = "F16",
        [CTRL_I32] = "I32", [CTRL_I64] = "I64",   [CTRL_U8] = "U8"};
    return (unsigned)d < CTRL_DTYPE_COUNT && tags[d] ? tags[d] : "F32";
}

static int cmp_offset(const void *a, const void *b) {
    const ctrl_st_tensor *x = a, *y = b;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const ctrl_st_tensor *)a)->name, ((const ctrl_st_tensor *)b)->name);
}

/* An integral JSON number in [0, max] (offsets and dimensions are counts of bytes or elements). */
static int whole_number(const cJSON *v, double max) {
    return cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= max &&
           v->valuedouble == (double)(int64_t)v->valuedouble;
}

static ctrl_status parse_header(ctrl_safetensors *st, const char *json, size_t len, size_t data_start) {
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: the header is not a JSON object", st->path);
    }
    int count = 0;
    for (cJSON *it = root->child; it; it = it->next)
        if (strcmp(it->string, "__metadata__") != 0) count++;
    if (count > CTRL_ST_MAX_TENSORS) {
        cJSON_Delete(root);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: %d tensors, more than the limit %d", st->path, count,
                              CTRL_ST_MAX_TENSORS);
    }
    st->tensors = calloc(count ? (size_t)count : 1, sizeof *st->tensors);
    if (!st->tensors) {
        cJSON_Delete(root);
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: cannot allocate the table of %d tensors", st->path, count);
    }
    ctrl_status status = CTRL_OK;
    const size_t data_size = st->size - data_start;
    for (cJSON *it = root->child; it && status == CTRL_OK; it = it->next) {
        if (!strcmp(it->string, "__metadata__")) continue;
        ctrl_st_tensor *t = &st->tensors[st->n];
        const char *name = it->string;
#define BAD(...) (status = ctrl_error_set(CTRL_ERR_FORMAT, __VA_ARGS__))
        if (strlen(name) >= CTRL_ST_MAX_NAME) {
            BAD("%s: tensor name longer than %d bytes", st->path, CTRL_ST_MAX_NAME - 1);
            break;
        }
        strcpy(t->name, name);
        cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype"),
              *shape = cJSON_GetObjectItemCaseSensitive(it, "shape");
        cJSON *offs = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
        if (!cJSON_IsString(dt) || parse_dtype(dt->valuestring, &t->dtype) != 0) {
            BAD("%s: tensor '%s': unsupported or missing dtype", st->path, name);
            break;
        }
        if (!cJSON_IsArray(shape) || cJSON_GetArraySize(shape) > CTRL_MAX_DIMS) {
            BAD("%s: tensor '%s': shape must be an array of at most %d dims", st->path, name, CTRL_MAX_DIMS);
            break;
        }
        uint64_t numel = 1;
        t->ndim = 0;
        for (cJSON *d = shape->child; d; d = d->next) {
            if (!whole_number(d, 1e12)) {
                BAD("%s: tensor '%s': bad dimension in shape", st->path, name);
                break;
            }
            const uint64_t dim = (uint64_t)d->valuedouble;
            t->shape[t->ndim++] = (int64_t)dim;
            /* checked before multiplying: [2^32, 2^32] must not wrap around to 0 elements */
            if (dim && numel > CTRL_ST_MAX_NUMEL / dim) {
                BAD("%s: tensor '%s': shape has more than 2^40 elements", st->path, name);
                break;
            }
            numel *= dim;
        }
        if (status != CTRL_OK) break;
        if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !whole_number(offs->child, 1e18) ||
            !whole_number(offs->child->next, 1e18)) {
            BAD("%s: tensor '%s': data_offsets must be [begin, end], whole numbers", st->path, name);
            break;
        }
        double b = offs->child->valuedouble, e = offs->child->next->valuedouble;
        if (b < 0 || e < b || e > (double)data_size) {
            BAD("%s: tensor '%s': data_offsets [%.0f, %.0f] outside the %zu-byte data section", st->path,
                name, b, e, data_size);
            break;
        }
        t->offset = data_start + (size_t)b;
        t->nbytes = (size_t)e - (size_t)b;
        if ((uint64_t)t->nbytes != numel * ctrl_dtype_size(t->dtype)) {
            BAD("%s: tensor '%s': %zu bytes for %llu elements of %s", st->path, name, t->nbytes,
                (unsigned long long)numel, ctrl_dtype_name(t->dtype));
            break;
        }
        st->n++;
#undef BAD
    }
    cJSON_Delete(root);
    if (status != CTRL_OK) return status;
    /* No two tensors may share bytes, or a name (JSON allows repeated keys; which one would count?). */
    ctrl_st_tensor *sorted = malloc(sizeof *sorted * (size_t)(st->n ? st->n : 1));
    if (!sorted) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: cannot sort %d tensors", st->path, st->n);
    memcpy(sorted, st->tensors, sizeof *sorted * (size_t)st->n);
    qsort(sorted, (size_t)st->n, sizeof *sorted, cmp_offset);
    for (int i = 1; i < st->n && status == CTRL_OK; i++)
        if (sorted[i].offset < sorted[i - 1].offset + sorted[i - 1].nbytes)
            status = ctrl_error_set(CTRL_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", st->path,
                                    sorted[i - 1].name, sorted[i].name);
    qsort(sorted, (size_t)st->n, sizeof *sorted, cmp_name);
    for (int i = 1; i < st->n && status == CTRL_OK; i++)
        if (!strcmp(sorted[i].name, sorted[i - 1].name))
            status = ctrl_error_set(CTRL_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", st->path,
                                    sorted[i].name);
    free(sorted);
    return status;
}

ctrl_status ctrl_safetensors_open(const char *path, ctrl_safetensors **out) {
    *out = NULL;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ctrl_error_set(CTRL_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ctrl_error_set(CTRL_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: too short for a safetensors file (%lld bytes)", path,
                              (long long)sb.st_size);
    }
    ctrl_safetensors *st = calloc(1, sizeof *st);
    if (!st || !(st->path = strdup(path))) {
        free(st), close(fd);
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    }
    st->size = (size_t)sb.st_size;
    st->map = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        ctrl_safetensors_close(st);
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | st->map[i];
    if (hlen > CTRL_ST_MAX_HEADER || hlen > st->size - 8) {
        ctrl_safetensors_close(st);
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: header length %llu is larger than %s", path,
                              (unsigned long long)hlen,
                              hlen > CTRL_ST_MAX_HEADER ? "the 100 MiB limit" : "the file");
    }
    ctrl_status s = parse_header(st, (const char *)st->map + 8, (size_t)hlen, 8 + (size_t)hlen);
    if (s != CTRL_OK) {
        ctrl_safetensors_close(st);
        return s;
    }
    *out = st;
    return CTRL_OK;
}

void ctrl_safetensors_close(ctrl_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->size);
    free(st->tensors);
    free(st->path);
    free(st);
}

int ctrl_safetensors_count(const ctrl_safetensors *st) { return st->n; }
const ctrl_st_tensor *ctrl_safetensors_at(const ctrl_safetensors *st, int i) {
    return i >= 0 && i < st->n ? &st->tensors[i] : NULL;
}

const ctrl_st_tensor *ctrl_safetensors_find(const ctrl_safetensors *st, const char *name) {
    for (int i = 0; i < st->n; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

static float half_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Elements per chunk of a tensor read or scanned before its mapped pages are let go. */
#define RELEASE_CHUNK ((int64_t)1 << 22)

/* Lets go of the pages wholly inside [p, p + n) of the mapped file (the page cache keeps them). */
static void release_pages(const void *p, size_t n) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), lo = ((uintptr_t)p + page - 1) & ~(page - 1),
                    hi = ((uintptr_t)p + n) & ~(page - 1);
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

ctrl_status ctrl_safetensors_read_f32(const ctrl_safetensors *st, const char *name, float *dst,
                                      int64_t numel) {
    const ctrl_st_tensor *t = ctrl_safetensors_find(st, name);
    if (!t) return ctrl_error_set(CTRL_ERR_FORMAT, "%s: no tensor '%s'", st->path, name);
    size_t esz = ctrl_dtype_size(t->dtype);
    if ((int64_t)(t->nbytes / esz) != numel)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: tensor '%s' has %zu elements, expected %lld", st->path,
                              name, t->nbytes / esz, (long long)numel);
    return ctrl_safetensors_read_f32_part(st, t, dst, 0, numel);
}

ctrl_status ctrl_safetensors_read_raw(const ctrl_safetensors *st, const char *name, ctrl_dtype dtype,
                                      void *dst, int64_t numel) {
    const ctrl_st_tensor *t = ctrl_safetensors_find(st, name);
    if (!t) return ctrl_error_set(CTRL_ERR_FORMAT, "%s: no tensor '%s'", st->path, name);
    const size_t esz = ctrl_dtype_size(dtype);
    if (t->dtype != dtype || (int64_t)(t->nbytes / esz) != numel)
        return ctrl_error_set(CTRL_ERR_FORMAT,
                              "%s: tensor '%s' is %s with %zu elements, expected %s with %lld", st->path,
                              name, ctrl_dtype_name(t->dtype), t->nbytes / ctrl_dtype_size(t->dtype),
                              ctrl_dtype_name(dtype), (long long)numel);
    memcpy(dst, st->map + t->offset, t->nbytes);
    return CTRL_OK;
}

ctrl_status ctrl_safetensors_read_f32_part(const ctrl_safetensors *st, const ctrl_st_tensor *t, float *dst,
                                           int64_t start, int64_t count) {
    if (t->dtype != CTRL_F32 && t->dtype != CTRL_BF16 && t->dtype != CTRL_F16)
        return ctrl_error_set(CTRL_ERR_FORMAT, "%s: tensor '%s' is %s, not a float type", st->path, t->name,
                              ctrl_dtype_name(t->dtype));
    const size_t esz = ctrl_dtype_size(t->dtype);
    if (start < 0 || count < 0 || (uint64_t)(start + count) > t->nbytes / esz)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "%s: elements [%lld, %lld) of tensor '%s', which has %zu",
                              st->path, (long long)start, (long long)(start + count), t->name,
                              t->nbytes / esz);
    /* A chunk at a time, each chunk's mapped pages let go once copied (read again from the file if
     * ever touched): loading a model peaks at its fp32 weights plus a chunk, not the weights plus
     * the mapped file (a LoRA run's peak: 1434 -> 797 MiB with a 704 MiB file; a whole 519 MiB
     * embedding mapped beside its copy was QLoRA's peak at 0.5B: docs/performance.md). */
    const unsigned char *src = st->map + t->offset + esz * (size_t)start;
    for (int64_t c0 = 0; c0 < count; c0 += RELEASE_CHUNK) {
        const int64_t c1 = c0 + RELEASE_CHUNK < count ? c0 + RELEASE_CHUNK : count;
        switch (t->dtype) {
        case CTRL_F32: memcpy(dst + c0, src + 4 * c0, (size_t)(c1 - c0) * 4); break;
        case CTRL_BF16:
            for (int64_t i = c0; i < c1; i++) {
                uint32_t u = (uint32_t)(src[2 * i] | (src[2 * i + 1] << 8)) << 16;
                memcpy(&dst[i], &u, 4);
            }
            break;
        default:
            for (int64_t i = c0; i < c1; i++)
                dst[i] = half_to_f32((uint16_t)(src[2 * i] | (src[2 * i + 1] << 8)));
        }
        release_pages(src + esz * (size_t)c0, esz * (size_t)(c1 - c0));
    }
    return CTRL_OK;
}

/* Is the element at i of a float tensor's raw data non-finite (all exponent bits set)? The data is
 * little-endian, as the host (the f32 read copies it as is). */
static int raw_non_finite(const unsigned char *src, ctrl_dtype dtype, int64_t i) {
    if (dtype == CTRL_F32) {
        uint32_t u;
        memcpy(&u, src + 4 * i, 4);
        return (u & 0x7f800000u) == 0x7f800000u;
    }
    uint16_t h;
    memcpy(&h, src + 2 * i, 2);
    return dtype == CTRL_BF16 ? (h & 0x7f80u) == 0x7f80u : (h & 0x7c00u) == 0x7c00u;
}

/* Whether [b, e) holds one: one branch-free loop per dtype, so that each vectorises. */
static int block_non_finite(const unsigned char *src, ctrl_dtype dtype, int64_t b, int64_t e) {
    unsigned any = 0;
    if (dtype == CTRL_F32)
#pragma omp simd reduction(| : any)
        for (int64_t i = b; i < e; i++) any |= (unsigned)raw_non_finite(src, CTRL_F32, i);
    else if (dtype == CTRL_BF16)
#pragma omp simd reduction(| : any)
        for (int64_t i = b; i < e; i++) any |= (unsigned)raw_non_finite(src, CTRL_BF16, i);
    else
#pragma omp simd reduction(| : any)
        for (int64_t i = b; i < e; i++) any |= (unsigned)raw_non_finite(src, CTRL_F16, i);
    return any != 0;
}

int64_t ctrl_safetensors_find_non_finite(const ctrl_safetensors *st, const ctrl_st_tensor *t, float *value) {
    if (t->dtype != CTRL_F32 && t->dtype != CTRL_BF16 && t->dtype != CTRL_F16) return -1;
    return ctrl_safetensors_find_non_finite_part(st, t, 0, (int64_t)(t->nbytes / ctrl_dtype_size(t->dtype)),
                                                 value);
}

int64_t ctrl_safetensors_find_non_finite_part(const ctrl_safetensors *st, const ctrl_st_tensor *t,
                                              int64_t start, int64_t count, float *value) {
    if (t->dtype != CTRL_F32 && t->dtype != CTRL_BF16 && t->dtype != CTRL_F16) return -1;
    const unsigned char *src = st->map + t->offset;
    const int64_t all = (int64_t)(t->nbytes / ctrl_dtype_size(t->dtype));
    const int64_t n = start + count < all ? start + count : all;
    const size_t esz = ctrl_dtype_size(t->dtype);
    if (start < 0) start = 0;
    for (int64_t b = start; b < n; b += 4096) { /* a branch-free pass per block, vectorised */
        const int64_t e = b + 4096 < n ? b + 4096 : n;
        if ((b - start) % RELEASE_CHUNK == 0 &&
            b > start) /* the scanned chunk's pages let go, as the read does */
            release_pages(src + esz * (size_t)(b - RELEASE_CHUNK), esz * (size_t)RELEASE_CHUNK);
        if (!block_non_finite(src, t->dtype, b, e)) continue;
        for (int64_t i = b; i < e; i++)
            if (raw_non_finite(src, t->dtype, i)) {
                if (value) {
                    const uint32_t sign = t->dtype == CTRL_F32 ? src[4 * i + 3] >> 7 : src[2 * i + 1] >> 7;
                    const int nan = t->dtype == CTRL_F32
                                        ? (src[4 * i] | src[4 * i + 1] | (src[4 * i + 2] & 0x7f)) != 0
                                    : t->dtype == CTRL_BF16 ? (src[2 * i] & 0x7f) != 0
                                                            : (src[2 * i] | (src[2 * i + 1] & 0x03)) != 0;
                    *value = nan ? NAN : sign ? -INFINITY : INFINITY;
                }
                return i;
            }
    }
    return -1;
}

static int cmp_write(const void *a, const void *b) {
    return strcmp(((const ctrl_st_write *)a)->name, ((const ctrl_st_write *)b)->name);
}

static uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffff) > 0x7f800000) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* IEEE half, rounded to nearest even as torch's .to(torch.float16): overflow to infinity,
 * subnormals below 2^-14, NaN kept quiet. */
static uint16_t f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    const uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) return sign | 0x7e00;  /* NaN */
    if (a >= 0x477ff000) return sign | 0x7c00; /* rounds to 65536 or more (or is infinite) */
    if (a < 0x38800000) {                      /* below 2^-14: a subnormal half, m * 2^-24 */
        if (a < 0x33000000) return sign;       /* at most 2^-25: rounds to zero (the tie to even) */
        const uint32_t mant = (a & 0x7fffff) | 0x800000, shift = 126 - (a >> 23); /* 14..24 */
        uint32_t h = mant >> shift;
        const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (h & 1))) h++;
        return sign | (uint16_t)h;
    }
    uint32_t h = ((a >> 23) - 112) << 10 | ((a >> 13) & 0x3ff); /* exponent rebiased 127 -> 15 */
    const uint32_t rest = a & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++; /* a carry into the exponent is right */
    return sign | (uint16_t)h;
}

ctrl_status ctrl_safetensors_write(const char *path, const ctrl_st_write *tensors, int n, ctrl_dtype dtype) {
    return ctrl_safetensors_write_fetched(path, tensors, n, dtype, NULL, NULL);
}

ctrl_status ctrl_safetensors_write_fetched(const char *path, const ctrl_st_write *tensors, int n,
                                           ctrl_dtype dtype, ctrl_st_fetch fetch, void *user) {
    if (dtype != CTRL_F32 && dtype != CTRL_BF16 && dtype != CTRL_F16)
        return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "%s: safetensors are written as F32, BF16 or F16", path);
    ctrl_st_write *sorted = malloc(sizeof *sorted * (size_t)(n ? n : 1));
    if (!sorted) return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory", path);
    memcpy(sorted, tensors, sizeof *sorted * (size_t)n);
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_write);
    const size_t esz = ctrl_dtype_size(dtype);
    /* the header is built whole or not at all: a tensor missing from it would be a corrupt file */
    cJSON *root = cJSON_CreateObject();
    /* __metadata__ first, then the tensors by name: the Python library's header, byte for byte */
    cJSON *meta = root ? cJSON_AddObjectToObject(root, "__metadata__") : NULL;
    int built = meta && cJSON_AddStringToObject(meta, "format", "pt");
    size_t off = 0;
    for (int i = 0; i < n && built; i++) {
        cJSON *t = cJSON_CreateObject();
        if (!t || !cJSON_AddItemToObject(root, sorted[i].name, t)) { /* root owns t once added */
            cJSON_Delete(t);
            built = 0;
            break;
        }
        const ctrl_dtype dt = sorted[i].raw ? sorted[i].raw_dtype : dtype;
        built = cJSON_AddStringToObject(t, "dtype", dtype_tag(dt)) != NULL;
        cJSON *shape = built ? cJSON_AddArrayToObject(t, "shape") : NULL;
        built = shape != NULL;
        size_t numel = 1;
        for (int d = 0; d < sorted[i].ndim && built; d++) {
            built = cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)sorted[i].shape[d]));
            numel *= (size_t)sorted[i].shape[d];
        }
        cJSON *offs = built ? cJSON_AddArrayToObject(t, "data_offsets") : NULL;
        built = offs && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        off += numel * (sorted[i].raw ? ctrl_dtype_size(sorted[i].raw_dtype) : esz);
        built = built && cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
    }
    char *json = built ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) {
        free(sorted);
        return ctrl_error_set(CTRL_ERR_NOMEM, "%s: out of memory building the header", path);
    }
    size_t hlen = strlen(json), padded = (hlen + 7) & ~(size_t)7; /* data 8-byte aligned, spaces as padding */
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    ctrl_status status = CTRL_OK;
    if (!f) {
        status = ctrl_error_set(CTRL_ERR_IO, "%s: %s", tmp, strerror(errno));
    } else {
        unsigned char len8[8];
        for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
        fwrite(len8, 1, 8, f);
        fwrite(json, 1, hlen, f);
        for (size_t i = hlen; i < padded; i++) fputc(' ', f);
        for (int i = 0; i < n && status == CTRL_OK; i++) {
            size_t numel = 1;
            for (int d = 0; d < sorted[i].ndim; d++) numel *= (size_t)sorted[i].shape[d];
            if (fetch && (status = fetch(user, &sorted[i])) != CTRL_OK) break;
            if (sorted[i].raw) {
                fwrite(sorted[i].raw, ctrl_dtype_size(sorted[i].raw_dtype), numel, f);
            } else if (dtype == CTRL_F32) {
                fwrite(sorted[i].data, 4, numel, f);
            } else {
                for (size_t k = 0; k < numel; k++) {
                    uint16_t h =
                        dtype == CTRL_BF16 ? f32_to_bf16(sorted[i].data[k]) : f32_to_f16(sorted[i].data[k]);
                    unsigned char b2[2] = {(unsigned char)h, (unsigned char)(h >> 8)};
                    fwrite(b2, 1, 2, f);
                }
            }
        }
        if (status != CTRL_OK) { /* the fetch failed: its message stands, no file */
            fclose(f);
            unlink(tmp);
            free(json);
            free(sorted);
            return status;
        }
        int bad = ferror(f) != 0;
        bad |= fflush(f) != 0;
        bad |= fsync(fileno(f)) != 0;
        bad |= fclose(f) != 0;
        if (bad || rename(tmp, path) != 0) {
            status = ctrl_error_set(CTRL_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
            unlink(tmp);
        }
    }
    free(json);
    free(sorted);
    return status;
}
