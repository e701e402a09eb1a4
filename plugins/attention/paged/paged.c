/* The `paged` attention plugin: decoding over a paged KV cache (block pools and per-sequence block
 * tables, as vLLM's paged attention), for the generation engine. fp32 queries over an fp32 or bf16
 * cache, on the CPU (paged_cpu.c) or, built with CUDA, on a CUDA device (paged_cuda.cu), through
 * the same arguments (ctrl_paged_attention_args: flat queries, the layer's K/V pools, int32 block
 * tables, positions). It has no training forward/backward. */
#include <ctrl/plugin_api.h>

#include "paged_cpu.h"
#ifdef CTRL_HAVE_CUDA
#include "paged_cuda.h"
#endif

CTRL_PLUGIN_API_DEFINE;

#define BAD(...) ctrl_error_set(CTRL_ERR_RUNTIME, "attention paged: " __VA_ARGS__)

/* Every query's block-table entries must exist and name blocks of the pool: a bad table would read
 * outside the cache. */
static ctrl_status check_tables(const ctrl_paged_attention_args *a) {
    for (int t = 0; t < a->n_tokens; t++) {
        const int s = a->seq_of_token[t], p = a->positions[t];
        if (s < 0 || s >= a->n_seqs) return BAD("token %d belongs to sequence %d of %d", t, s, a->n_seqs);
        if (p < 0 || p > a->max_position || p / a->block_size >= a->max_blocks_per_seq)
            return BAD("token %d at position %d is outside its block table (%d blocks of %d)", t, p,
                       a->max_blocks_per_seq, a->block_size);
        const int32_t *table = a->block_tables + (size_t)s * a->max_blocks_per_seq;
        const int lo = ctrl_attention_first_key(a->window, p);
        for (int b = lo / a->block_size; b <= p / a->block_size; b++)
            if (table[b] < 0 || table[b] >= a->n_blocks)
                return BAD("sequence %d: block table entry %d is %d (pool of %d blocks)", s, b, table[b],
                           a->n_blocks);
    }
    return CTRL_OK;
}

static ctrl_status paged_forward(const ctrl_paged_attention_args *a) {
    if (!a || a->size < sizeof(ctrl_paged_attention_args))
        return BAD("argument struct is missing or too old");
    int cuda = 0;
#ifdef CTRL_HAVE_CUDA
    cuda = paged_cuda_supported(a);
#endif
    if (!cuda && (a->device.type != CTRL_DEVICE_CPU || a->dtype != CTRL_F32 ||
                  (a->cache_dtype != CTRL_F32 && a->cache_dtype != CTRL_BF16)))
        return ctrl_error_set(
            CTRL_ERR_UNSUPPORTED,
            "attention paged: runs fp32 queries over an fp32 or bf16 cache (on CUDA: head_dim <= 128, "
            "at most 32 query heads per kv head); got %s over %s on %s",
            ctrl_dtype_name(a->dtype), ctrl_dtype_name(a->cache_dtype),
            a->device.type == CTRL_DEVICE_CPU ? "cpu" : "a device");
    if (a->n_tokens < 0 || a->n_seqs < 1 || a->n_head < 1 || a->n_kv_head < 1 || a->n_head % a->n_kv_head ||
        a->head_dim < 1 || a->block_size < 1 || a->n_blocks < 1 || a->max_blocks_per_seq < 1 || a->window < 0)
        return BAD("bad shape (%d tokens, %d sequences, %d/%d heads of %d, %d blocks of %d, %d per sequence)",
                   a->n_tokens, a->n_seqs, a->n_head, a->n_kv_head, a->head_dim, a->n_blocks, a->block_size,
                   a->max_blocks_per_seq);
    if (a->n_tokens == 0) return CTRL_OK;
    if (!a->q || !a->out || !a->k_cache || !a->v_cache || !a->block_tables || !a->seq_of_token ||
        !a->positions)
        return BAD("a buffer is missing");
    if (!(a->softcap >= 0)) return BAD("softcap = %g must be >= 0", (double)a->softcap);
#ifdef CTRL_HAVE_CUDA
    if (cuda) return paged_cuda_forward(a); /* the tables are on the device: the core's, trusted */
#endif
    ctrl_status st = check_tables(a);
    if (st != CTRL_OK) return st;
    return paged_cpu_forward(a);
}

static const ctrl_attention_ops paged_ops = {
    .size = sizeof(ctrl_attention_ops),
    .paged_forward = paged_forward,
    .features = CTRL_ATTENTION_SOFTCAP, /* on the CPU and on CUDA */
};

static const ctrl_plugin paged_plugin = {
    CTRL_PLUGIN_HEADER,
    .kind = CTRL_KIND_ATTENTION,
    .name = "paged",
    .version = "0.1.0",
    .summary =
        "paged attention for decoding: queries over a paged KV cache through block tables; GQA, window",
    .init = ctrl_plugin_api_init,
    .ops = &paged_ops,
};

CTRL_PLUGIN_DEFINE(&paged_plugin)
