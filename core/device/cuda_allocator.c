/* The caching device allocator. Requests are rounded up to a size class (multiples of 512 bytes
 * up to 1 MiB, then of 2 MiB) and freed blocks go to a free list of their exact class, so a
 * training loop that allocates the same sizes each step calls cudaMalloc only in its first step.
 * When the driver is out of memory, the cache is returned to it and the allocation retried once. */
#include "cuda/cuda_ops.h"

#include <pthread.h>
#include <stdlib.h>

#ifdef CTRL_HAVE_CUDA
#include "device/cuda_check.h"

typedef struct block {
    void *ptr;
    size_t size; /* the size class */
    struct block *next;
} block;

#define N_BUCKETS 64

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static block *free_lists[N_BUCKETS]; /* cached blocks, hashed by size class */
static block *in_use[N_BUCKETS];     /* handed-out blocks, hashed by pointer */
static ctrl_cuda_mem_stats stats;

static size_t size_class(size_t bytes) {
    if (bytes == 0) bytes = 1;
    if (bytes <= (1u << 20)) return (bytes + 511) & ~(size_t)511;
    return (bytes + (2u << 20) - 1) & ~(size_t)((2u << 20) - 1);
}

static unsigned bucket_of_size(size_t s) { return (unsigned)((s >> 9) * 2654435761u) % N_BUCKETS; }
static unsigned bucket_of_ptr(const void *p) {
    return (unsigned)(((uintptr_t)p >> 9) * 2654435761u) % N_BUCKETS;
}

/* Takes a cached block of exactly this class, or NULL. */
static block *take_cached(size_t s) {
    block **pp = &free_lists[bucket_of_size(s)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->size == s) {
            block *b = *pp;
            *pp = b->next;
            return b;
        }
    return NULL;
}

static void release_cache_locked(void) {
    for (int i = 0; i < N_BUCKETS; i++) {
        while (free_lists[i]) {
            block *b = free_lists[i];
            free_lists[i] = b->next;
            cudaFree(b->ptr);
            stats.reserved -= b->size;
            free(b);
        }
    }
}

ctrl_status ctrl_cuda_malloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    size_t s = size_class(bytes);
    pthread_mutex_lock(&lock);
    block *b = take_cached(s);
    if (!b) {
        b = malloc(sizeof *b);
        void *p = NULL;
        cudaError_t err = b ? cudaMalloc(&p, s) : cudaErrorMemoryAllocation;
        if (err == cudaErrorMemoryAllocation && b) {
            cudaGetLastError();
            release_cache_locked();
            err = cudaMalloc(&p, s);
        }
        if (err != cudaSuccess) {
            free(b);
            cudaGetLastError();
            pthread_mutex_unlock(&lock);
            return ctrl_error_set(
                CTRL_ERR_NOMEM, "cuda: cannot allocate %zu bytes (%.1f MiB in use, %.1f MiB peak): %s", bytes,
                stats.current / 1048576.0, stats.peak / 1048576.0, cudaGetErrorString(err));
        }
        b->ptr = p;
        b->size = s;
        stats.reserved += s;
        stats.driver_allocs++;
    }
    unsigned k = bucket_of_ptr(b->ptr);
    b->next = in_use[k];
    in_use[k] = b;
    stats.current += s;
    if (stats.current > stats.peak) stats.peak = stats.current;
    *ptr = b->ptr;
    pthread_mutex_unlock(&lock);
    return CTRL_OK;
}

void ctrl_cuda_free(void *ptr) {
    if (!ptr) return;
    pthread_mutex_lock(&lock);
    block **pp = &in_use[bucket_of_ptr(ptr)];
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->ptr == ptr) {
            block *b = *pp;
            *pp = b->next;
            stats.current -= b->size;
            unsigned k = bucket_of_size(b->size);
            b->next = free_lists[k];
            free_lists[k] = b;
            break;
        }
    pthread_mutex_unlock(&lock);
}

void ctrl_cuda_empty_cache(void) {
    pthread_mutex_lock(&lock);
    release_cache_locked();
    pthread_mutex_unlock(&lock);
}

void ctrl_cuda_linear_release(void); /* kernels/cuda/linear.cu */

void ctrl_cuda_shutdown(void) {
    ctrl_cuda_linear_release();
    ctrl_cuda_empty_cache();
}

void ctrl_cuda_mem_stats_get(ctrl_cuda_mem_stats *out) {
    pthread_mutex_lock(&lock);
    *out = stats;
    pthread_mutex_unlock(&lock);
}

void ctrl_cuda_mem_stats_reset_peak(void) {
    pthread_mutex_lock(&lock);
    stats.peak = stats.current;
    pthread_mutex_unlock(&lock);
}

#else

ctrl_status ctrl_cuda_malloc(void **ptr, size_t bytes) {
    (void)bytes;
    *ptr = NULL;
    return ctrl_error_set(CTRL_ERR_UNSUPPORTED, "this ctrl was built without CUDA");
}
void ctrl_cuda_free(void *ptr) { (void)ptr; }
void ctrl_cuda_empty_cache(void) {}
void ctrl_cuda_shutdown(void) {}
void ctrl_cuda_mem_stats_get(ctrl_cuda_mem_stats *out) {
    ctrl_cuda_mem_stats zero = {0};
    *out = zero;
}
void ctrl_cuda_mem_stats_reset_peak(void) {}

#endif
