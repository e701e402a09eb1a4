/* The model's internals, shared by model.c (training forward/backward) and model_decode.c
 * (incremental decoding over a KV cache). Not part of any public API. */
#ifndef CTRL_CORE_MODEL_INTERNAL_H
#define CTRL_CORE_MODEL_INTERNAL_H

#include "device/backend.h"
#include "model/lora.h"
#include "model/nf4.h"
#include "model/model.h"

/* Offsets (in floats) of one layer's tensors inside the flat buffer; -1 when absent. */
typedef struct layer_offsets {
    long ln1, wq, bq, wk, bk, wv, bv, wo, q_norm, k_norm, ln2, wg, wu, wd;
    long post_attn,
        post_ffw; /* Gemma 2's sandwich norms (cfg.sandwich_norm): after o_proj, after down_proj */
    /* an MoE layer's mlp.gate, and its first expert (expert e's gate, up and down proj at
     * experts + (3 e + 0, 1, 2) x moe_intermediate_size x hidden_size; model_moe.c) */
    long router, experts;
} layer_offsets;

/* One layer's activations, T = tokens of the flat batch, C = hidden size, H / HK = query / kv heads,
 * D = head_dim, I = intermediate size (llm.c's convention). The forward writes them in this order;
 * backward reads the ones marked (b). A layer a memory strategy recomputes keeps only x_in through
 * the forward: its other buffers are one set shared by every such layer, refilled by a second
 * forward just before its backward. All live on the model's backend.
 *   x_in    [T, C]      the residual stream entering the layer (b: the first RMSNorm's backward)
 *   ln1     [T, C]      RMSNorm(x_in) * input_layernorm (b: the q/k/v projections' backward)
 *   rstd1   [T]         1 / rms of each x_in row (b)
 *   q_raw   [T, H*D]    q_proj(ln1) (+ bias) (b: q_norm's backward, Qwen3)
 *   k_raw   [T, HK*D]   k_proj(ln1) (+ bias) (b: k_norm's backward, Qwen3)
 *   q_rstd  [T, H]      per-head q_norm rstd (Qwen3) (b)
 *   k_rstd  [T, HK]     per-head k_norm rstd (Qwen3) (b)
 *   q       [T, H*D]    queries after q_norm and RoPE, as [T, H, D] (b: attention backward)
 *   k       [T, HK*D]   keys after k_norm and RoPE, as [T, HK, D] (b)
 *   v       [T, HK*D]   v_proj(ln1) (+ bias), as [T, HK, D] (b)
 *   att     [T, H*D]    attention output, as [T, H, D] (b: o_proj's backward and attention's)
 *   lse     [T, H]      log-sum-exp of each query's scores, from the attention plugin (b)
 *   x_mid   [T, C]      x_in + o_proj(att): the residual stream between attention and MLP (b)
 *   ln2     [T, C]      RMSNorm(x_mid) * post_attention_layernorm (b: gate/up backward)
 *   rstd2   [T]         (b)
 *   g, u    [T, I]      gate_proj(ln2), up_proj(ln2) (b: SwiGLU's backward)
 *   h       [T, I]      silu(g) * u (b: down_proj's backward)
 * With sandwich norms (Gemma 2) also, else NULL:
 *   o_raw   [T, C]      o_proj(att), normed by post_attention_layernorm into x_mid - x_in (b)
 *   rstd_pa [T]         (b)
 *   d_raw   [T, C]      down_proj(h), normed by post_feedforward_layernorm into output - x_mid (b)
 *   rstd_pf [T]         (b)
 * and ln2 is pre_feedforward_layernorm's output.
 * The layer's output, x_mid + down_proj(h), is the next layer's x_in. Above the last layer the
 * model keeps x_out [T, C] (the last output), lnf [T, C] and rstdf [T] (the final norm), and the
 * head's lse [T] and entropy [T]; a fused forward also keeps head_dh [T, C] = dL/dlnf. */
typedef struct lora_bank_entry lora_bank_entry;

typedef struct layer_acts {
    float *x_in, *ln1, *rstd1, *q_raw, *k_raw, *q_rstd, *k_rstd, *q, *k, *v, *att, *lse, *x_mid, *ln2, *rstd2,
        *g, *u, *h;
    float *o_raw, *rstd_pa, *d_raw, *rstd_pf;
    /* with LoRA: s * dropout(x) A^T [T, r] of each adapted projection (b: the adapter's backward);
     * NULL where the layer has no adapter, and in decoding (lora.c uses scratch) */
    float *lora_xa[LORA_N_TARGETS];
} layer_acts;

struct ctrl_model {
    ctrl_model_config cfg;
    /* the directory it was loaded from: its config.json and generation_config.json (NULL: none, or
     * a model made from a config), carried over when it is saved (model_save.c) */
    char *source_config, *source_generation;
    /* Where the model computes (ctrl_model_to_device; the CPU backend from creation on): every op
     * and every buffer below marked "backend" goes through it. */
    const ctrl_backend_ops *be;
    ctrl_device device;
    const ctrl_attention_ops *attn;
    const ctrl_attention_ops *paged; /* decoding's (ctrl_model_set_paged_attention) */
    float temperature; /* the head's: log-probs and entropies of softmax(logits / temperature) */
    int linear_bf16;   /* linear projections in bf16 (ctrl_model_set_compute_dtype) */
    int bf16_fp32;     /* ctrl_model_set_bf16_fallback FP32: fp32 products where no bf16 kernel runs */
    float *rounded;    /* backend; with linear_bf16: the parameters rounded to bf16 values (what the
                          linear projections multiply with), rebuilt after ctrl_model_weights_changed */
    int rounded_valid;
    /* ranges [a, b) (pairs, ascending) the rounding of the whole copy leaves out: ZeRO-3's sliced
     * layers, rounded by ctrl_model_params_range_changed when gathered */
    const size_t *round_skip;
    int n_round_skip;
    /* ZeRO-3 in bf16 on a device (ctrl_model_set_device_b16): matrices' bf16 values held outside,
     * within ext_ranges (n_ext pairs, in parameters) */
    const uint16_t *ext_b16;
    const size_t *ext_ranges;
    int n_ext;
    /* activation offloading (ctrl_model_set_offload_activations): the recomputed layers' inputs
     * share two device slots (layer l's: l % 2) and are kept in host memory between their forward
     * and their backward, offload_host[l * T * C ...]; on a backend whose memory is host memory
     * (the CPU) they are kept in a file instead (model_offload.c): offload_fd, open while
     * offload_file, unlinked as soon as it is made, in offload_dir (NULL: $TMPDIR, else /tmp) */
    int offload_acts;
    float *offload_host;
    int offload_file, offload_fd;
    char *offload_dir;
    /* on a device with side copies (backend.h's side_copy): offload_host is page-locked and the
     * copies run on the side stream (offload_async); offload_prefetched: 1 + the layer whose input
     * is on its way back (0: none) */
    int offload_async, offload_prefetched;
    /* Host: the parameters and gradients loaded, saved and stepped by the optimizer. On a backend
     * with host memory dparams/dgrads are the same buffers; on a device they are its copies:
     * dparams refreshed from params after ctrl_model_weights_changed (dparams_valid), gradients
     * accumulated in dgrads and brought back by ctrl_model_grads_to_host. */
    float *params, *grads;
    float *dparams, *dgrads;
    int dparams_valid;
    int host_stale; /* an optimizer stepped dparams on the device (ctrl_model_device_weights_changed) */
    size_t n_params;
    ctrl_param_view *views;
    int n_views, cap_views;
    long off_embed, off_norm, off_lm_head; /* off_lm_head -1: a sequence classifier */
    long off_score;                        /* -1: a causal LM (model_score.c) */
    layer_offsets *layers;
    /* backend: RoPE tables [rope_len, head_dim/2] */
    float *cos_tab, *sin_tab;
    int rope_len;
    int rope_long; /* the tables hold longrope's long factors (model_ensure_rope) */
    /* mixture of experts (model_moe.c): per layer (NULL entries for dense ones), the backend buffers
     * (moe_dev, moe_rows), the host ones (moe_host), the capacity in tokens, the backward's scratch */
    struct moe_acts *moe;
    float *moe_dev, *moe_host, *moe_ws;
    int32_t *moe_rows, *moe_host_i;
    int moe_cap_T;
    size_t moe_ws_bytes;
    /* the armed auxiliary loss' gradient (ctrl_model_moe_aux_loss): d(scale aux)/d p_e of a kept row
     * [E], which rows it applies to ([T], moe_aux_mask), for the next backward only */
    float *moe_aux_grad;
    uint8_t *moe_aux_mask;
    int moe_aux_armed;
    /* backend: activations of the last forward (see layer_acts) */
    int T, act_cap_T;
    float *act_mem;
    layer_acts *acts;
    float *x_out, *lnf, *rstdf, *head_lse, *head_ent;
    float *head_dh; /* a fused forward's dL/d(final norm output) [T, C], for the backward */
    struct ctrl_cpu_bf16_packed *head_keep; /* the one-pass bf16 head's panels of W, kept between steps */
    int head_dh_ready;                      /* the last forward was fused */
    /* backend scratch kept between steps (grown as needed): the head's, dL/d(head input), the
     * backward's, and (off the host) the staging of per-token inputs and outputs [4, T] */
    void *head_ws;
    float *bwd_mem, *stage;
    size_t head_ws_bytes, head_dh_bytes, bwd_bytes, stage_bytes;
    /* the batch of the last forward, on the host (batch, in batch_mem) and on the backend (dev_batch,
     * in dbatch_mem; the same buffer with host memory) */
    ctrl_batch batch, dev_batch;
    int32_t *batch_mem, *dbatch_mem;
    const int32_t *grad_tokens; /* backend: the tokens with embed_pad as -1, for the embedding's backward */
    int embed_pad;              /* padding_idx (-1: none) */
    size_t dbatch_bytes;
    /* memory strategy (may be NULL) and which layers it recomputes */
    const ctrl_memory_ops *mem_ops;
    ctrl_memory *mem;
    /* the sharding's layer hooks (ZeRO-3: gather before, release after; may be NULL) */
    const ctrl_memory_ops *shard_ops;
    ctrl_memory *shard_mem;
    int shard_outer; /* its hooks take the embeddings' and head's indices too (ZeRO-3's) */
    /* decoding's layer hook (ctrl_model_set_decode_hook; NULL: none) */
    ctrl_model_layer_hook dec_hook;
    void *dec_hook_ctx;
    uint8_t *recompute; /* per layer: 1 recomputed, | 2 keeping its gate/up outputs (model_keeps_mlp) */
    int n_recompute;
    size_t act_bytes;
    /* decoding's own scratch (model_decode.c), on the backend: one set of layer internals for
     * every layer, the layer inputs in two buffers taking turns, the head's input rows (dec_hin,
     * dec_h, dec_rstd); on the host the new tokens' positions; on a device the call's int32 inputs
     * (dec_ints: tokens, positions, sequences, cache slots, block tables) and its logits. The
     * training activations and batch are left as they were. */
    float *dec_mem;
    int dec_cap_T;
    layer_acts *dec_acts;
    float *dec_out, *dec_hin, *dec_h, *dec_rstd;
    int32_t *dec_pos;
    int32_t *dec_ints;
    float *dec_logits;
    size_t dec_ints_bytes, dec_logits_bytes;
    /* LoRA (lora.c; has_lora = 0 without): the config, the offsets of each layer's lora_A / lora_B
     * ([n_layers][LORA_N_TARGETS], -1 where none), the first trainable float (train_off: the base
     * before it is frozen and has no gradient; 0 without LoRA, everything trains) and how many
     * follow (n_train: the gradient buffers' length). training: dropout on (ctrl_model_set_training);
     * lora_off: adapters skipped (ctrl_model_set_adapters_enabled); lora_step: the dropout masks'
     * counter, one per training forward; lora_ws: backend scratch (freed with the backend's). */
    int has_lora, training, lora_off;
    ctrl_lora_config *lora;
    float lora_scale;
    long *lora_a, *lora_b;
    /* each adapter's rank and scaling ([n_layers][LORA_N_TARGETS]: rank_pattern / alpha_pattern make
     * them per module; lora_r / lora_s read them) */
    int *lora_rank;
    float *lora_scales;
    long *lora_bb; /* [n_layers][LORA_N_TARGETS] lora_B.bias offsets (lora_bias; a fused slot's rows), -1:
                      none */
    int lora_from_base_done; /* adapters set from their base weight as it loaded (pissa, olora) */
    size_t train_off, n_train;
    uint64_t lora_step;
    float *lora_ws;
    size_t lora_ws_bytes;
    float *lora_host; /* host staging of dropout on a device, lora_host_n floats */
    size_t lora_host_n;
    /* DoRA (dora.c; lora->use_dora): each adapted layer's lora_magnitude_vector offset (lora_mag,
     * -1 where none); per adapted layer at dora_at[l][t] in the backend's memory: the weight norm
     * ||W + s B A|| of each output row (dora_norm) and magnitude / norm (dora_g), recomputed before
     * a forward when the weights changed (dora_valid 0; released with the backend's scratch);
     * dora_ws: backend scratch of that. */
    long *lora_mag, *dora_at;
    size_t dora_norm_n; /* floats of dora_norm (and dora_g) */
    float *dora_norm, *dora_g;
    int dora_valid;
    /* ZeRO-3 (the layers sliced between uses: a round skip set, or the device's parameters sliced):
     * dora_prepare leaves each layer's norms to dora_layer_ready, after the layer's gather; pending[l]:
     * layer l's not computed since the weights changed */
    char *dora_pending;
    /* trainable_token_indices (lora_tokens.c): tt[0] the input embedding's rows, tt[1] an untied LM head's;
     * tt_map [V], each token's row in tt[0]'s view (-1: frozen). Each table holds the rows the model
     * computes with: the trained values while the adapters are on, the base's (a set's orig) while they
     * are off (a reference model), written there by lora_tokens_sync before a forward when they differ
     * (tt_state: which rows the tables hold, 0 not known; tt_valid 0: the trained values changed since
     * they were written). lora_merged: the adapters folded into the weights for good (ctrl_peft_merge:
     * the rows stay in the tables, the trained tables stay). tt_tokens: the batch's
     * tokens as rows of tt[0]'s view (-1: none; the lookup's gradient scatters by them), beside
     * m->grad_tokens. */
    struct lora_token_set {
        long view, table;       /* the trained values' view [n, C]; the table they are rows of */
        const int32_t *ids;     /* the rows (the LoRA config's list) */
        int n, captured;        /* captured: the base's rows read (as the table loaded) */
        float *orig, *orig_dev; /* the base's rows [n, C] (host; the backend's copy) */
    } tt[2];
    int32_t *tt_map;
    int tt_state, tt_valid, lora_merged;
    /* modules_to_save with the adapters off (lora_saved.c): a table trained in full (the embedding, an
     * untied LM head) holds the base's values while lora_off, as PEFT's disable_adapter() runs the original
     * module. saved[k]: the table's offset and floats, the base's values (orig: host, kept; orig_dev its
     * backend copy, holding the trained values while swapped; orig_dev_valid 0: to be uploaded again);
     * saved_off: the tables hold the base's values now. */
    struct lora_saved_table {
        long table;
        size_t n;
        float *orig, *orig_dev;
        int captured, orig_dev_valid;
    } saved[2];
    int saved_off;
    const int32_t *tt_tokens;
    int dora_hold_norms; /* tests: the norms kept as they are (PEFT's detached constant) while the
                          * weights change, for finite differences of what backward differentiates */
    float *dora_ws;
    size_t dora_ws_bytes;
    /* QDoRA (an NF4 base): ||W_j|| of every adapted row, at dora_at like dora_norm (backend memory,
     * computed once from the NF4 store: the base is frozen; NULL until then); dora_wn_host: the same
     * computed as each weight loads whole when the store keeps a ZeRO-3 rank's pieces of it
     * (nf4_store_part), whence dora_wn is filled (host memory, kept for the model's life) */
    float *dora_wn;
    float *dora_wn_host;
    /* Adapters served side by side over the base (lora_bank.c, ctrl_model_add_adapter): the bank,
     * its decode scratch (bank_ws, bank_ws_n floats), and for the decode call under way each
     * sequence's adapter (dec_adapters, 0 the base; NULL: all the base) with the sequences' new
     * token counts (dec_n_new, dec_n_seq). */
    lora_bank_entry **bank;
    int n_bank;
    float *bank_ws;
    size_t bank_ws_n;
    const int *dec_adapters, *dec_n_new;
    int dec_n_seq;
    /* QLoRA (model_nf4.c; lora->nf4): each layer's seven projection weights in NF4
     * ([n_layers][LORA_N_TARGETS]); every layer's views of them share one slot of fp32 parameters,
     * which holds layer nf4_layer's dequantized weights (-1: none yet). A fused module (Phi-3's
     * qkv_proj, gate_up_proj) is one NF4 tensor, at its first linear's index (LORA_Q, LORA_GATE), as
     * bitsandbytes quantizes it whole; an MoE layer has no gate/up/down (its experts stay fp32, as
     * transformers + bitsandbytes leave them). nf4_slot[t]: the offset of projection t's shared slot
     * (the first layer that has it; -1: none). */
    ctrl_nf4 *nf4_w;
    int nf4_layer;
    long nf4_slot[LORA_N_TARGETS];
    /* Loaded in pieces (nf4_store_part, ZeRO-3's sliced loading): entry i holds the values
     * [nf4_part[2i], nf4_part[2i + 1]) of its weight alone (its n the whole's); NULL: every entry whole */
    int64_t *nf4_part;
    /* On a device backend (nf4_to_device): each weight's packed values, absmax bytes and absmax
     * scales in the backend's memory ([n_layers * LORA_N_TARGETS][3]), and the code books (16 + 256
     * floats); NULL on the CPU. */
    void **nf4_dev;
    float *nf4_codes;
    /* ctrl_model_defer_device: ctrl_model_to_device allocates and copies neither the parameters nor
     * the gradients, nf4_to_device no weight (ZeRO-3 puts each rank's pieces) */
    int dev_deferred;
    /* A frozen model held in bf16 (model_bf16_store.c): the layers' weights as bf16 (w16, layer
     * after layer), each layer's parameter range [w16_lo[l], w16_lo[n_layers + l]), and the layer
     * widened into params now (-1: none); NULL when not. */
    uint16_t *w16;
    long *w16_lo;
    int w16_layer;
    /* The pages the widened layer borrows (core/page_pool.h: one frame of the largest layer's whole
     * pages, lent to the layer widened now and taken back when the next one is): widening writes
     * resident memory instead of faulting and zeroing fresh pages; NULL: the old way (no pages
     * whole inside a layer, no memory for it, CTRL_TEST_BF16_REFAULT set). */
    struct page_pool *w16_pool;
    /* The frozen base held in bf16 under LoRA (model_bf16_store.c, ctrl_model_hold_base_bf16): the
     * layers' norms and biases in fp32 (w16_keep, view after view; NULL for a frozen model held
     * whole), and the number of weights in w16. */
    float *w16_keep;
    long w16_n;
    /* Held as it loads (lora->bf16_base; 2: as panels only, for inference -- a model frozen whole,
     * an adapter's base in ctrl_peft_load_bf16): set by load_into; each layer's floats read so far
     * (w16_loaded, [n_layers]), the layer packed when all are. */
    int w16_at_load;
    long *w16_loaded;
    /* The frozen input embedding held as bf16 values alone (model_embed16.c, [peft] embedding_dtype =
     * bf16): emb16 [V, C], its fp32 pages given back (they read as zeros); the lookups widen its rows,
     * the LM head tied to it multiplies by them. emb16_at_load: held as the loader reads it. */
    uint16_t *emb16;
    /* Or, tied to the LM head where a bf16 GEMM kernel runs, held only as the head's panels (a held entry
     * of the panel table, model_decode_pack.c): the lookups widen rows out of them, every product of
     * the head reads them (NULL: not so). */
    const struct ctrl_cpu_bf16_packed *emb_panels;
    int head_held_only; /* an untied LM head held as its panels alone (model_hold_head, inference) */
    /* 1 held in bf16 (asked), 2 where it can (embedding_dtype = auto), 3 as the head's panels where it
     * can (auto in a loop that decodes: from bf16 values decoding would pack the head every step), 4
     * where it can and its values are bf16 already (inference: ctrl_model_load_frozen_bf16) */
    int emb16_at_load;
    /* LoRA on the experts (lora_moe.c; lora->n_params, PEFT's target_parameters): per layer the offsets
     * of gate_up_proj's lora_A [E r, C], lora_B and down_proj's lora_A [E r, Im], lora_B
     * ([n_layers][4], -1 where none). A is PEFT's layout (expert e's rows e r ...); B is held expert
     * after expert ([E][out, r], out = 2 Im: gate's rows then up's; C) and permuted to and from PEFT's
     * [out, E r] (column k E + e) by ctrl_peft_file_layout. moe_lora_ws: backend scratch. */
    long *moe_lora;
    float *moe_lora_ws;
    size_t moe_lora_ws_bytes;
    /* Decoding's weights packed to bf16 once (model_decode_pack.c): the table (NULL: none yet), on
     * while a decode call runs with it (dec_pack_on), and the weights' generation, bumped by
     * ctrl_model_weights_changed (a weight packed under another generation is packed again). */
    struct model_pack *dec_pack;
    int dec_pack_on;
    unsigned dec_pack_gen;
    /* A LoRA run's frozen base held as bf16 panels (model_bf16_store.c): the layers' projection
     * weights live only as held entries of dec_pack (w16 stays NULL; w16_n counts them) */
    int base_panels;
    /* ctrl_model_set_save_fetch: called before each weight's data is written (NULL: none) -- by the
     * sharded save, ctrl_model_save_weights and the merged file (model_save_fetch; peft_merge.c) */
    ctrl_status (*save_fetch)(void *user, const float *data, int64_t numel);
    void *save_fetch_user;
    /* ZeRO-3 on a device (ctrl_model_adopt_device_buffers): dparams and dgrads are the caller's
     * (sparse ranges it maps piece by piece), not freed here; while dparams_sliced the device's
     * parameters are not whole, and ctrl_model_params_to_host leaves the host's copy as it is. */
    int dbufs_external, dparams_sliced;
    /* bf16 compute on a backend with 2-byte bf16 operands (backend.h's to_bf16, linear_*_b16;
     * model_dtype.c): wb16, the parameters as bf16 values [n_params] (in place of `rounded`, valid
     * with rounded_valid), and act16, the bf16 copies of the activations the products read more than
     * once or again in backward (MODEL_ACT16_*: ln1 for q/k/v, att, ln2 for gate/up, h), each made
     * once right after the forward writes its source; a product whose input is a kept source (the
     * same pointer and size) reads the copy instead of converting. */
    uint16_t *wb16;
    struct model_act16 {
        const float *src;
        int64_t n;
        uint16_t *buf;
        size_t cap;
    } act16[4];
    /* ctrl_model_adopt_host_grads: grads (and dgrads, on the CPU) are the caller's, not freed here */
    int grads_external;
};

/* The gradient of the parameter at offset `off` (NULL when it has none: absent, or frozen). */
static inline float *model_grad(const ctrl_model *m, long off) {
    return off < 0 || (size_t)off < m->train_off ? NULL : m->dgrads + ((size_t)off - m->train_off);
}

/* Returns the status of `call` when it is not CTRL_OK. */
#define MODEL_TRY(call)                                                                                      \
    do {                                                                                                     \
        ctrl_status s_ = (call);                                                                             \
        if (s_ != CTRL_OK) return s_;                                                                        \
    } while (0)

/* Writes `text` to `path` atomically (temp file, fsync, rename): model_save.c. */
ctrl_status model_write_text_atomic(const char *path, const char *text);
/* The weights in `dtype`, sharded as save_pretrained shards them (model_shards.c). */
ctrl_status model_save_shards(ctrl_model *m, const char *dir, ctrl_dtype dtype, int64_t max_shard);
/* The source's config.json text with the fields the model changed rewritten (config_carry.c);
 * NULL when it is not a JSON object the scanner follows (then the config is generated). */
char *model_config_carried(const char *source, const ctrl_model_config *cfg, const char *arch_class,
                           const char *dtype_name);
/* Adds a view of d0 x d1 floats at *cursor (model.c's layout). */
long model_add_view(ctrl_model *m, size_t *cursor, const char *name, int ndim, int64_t d0, int64_t d1,
                    int no_decay);
/* Backend scratch *buf holding at least `bytes`, kept between steps (fresh pages every step cost
 * page faults and zeroing; a device allocation is worse). */
ctrl_status model_grow(const ctrl_model *m, void **buf, size_t *cap, size_t bytes);
/* Frees every backend buffer (the device copies, activations, scratch, tables); the host
 * parameters and gradients stay. */
void model_release_backend(ctrl_model *m);
/* The device's parameters brought up to date from the host after ctrl_model_weights_changed (a
 * no-op with host memory), then with bf16 compute the rounded copy where one is kept (before a
 * forward or decode of T tokens; model_dtype.c says where). */
ctrl_status model_prepare_weights(ctrl_model *m, int T);
/* Whether bf16 compute's linear products run as plain fp32 now: the bf16 fallback is FP32, the
 * device has no bf16 kernel now (the backend's bf16_kernel) and the model is not decoding. */
int model_bf16_as_fp32(const ctrl_model *m);
/* A linear projection in the model's compute dtype (the backend's linear_forward or its bf16 twin,
 * multiplying with the rounded copy of w). */
ctrl_status model_linear_forward(const ctrl_model *m, float *out, const float *x, const float *w,
                                 const float *bias, int T, int IN, int OUT);
ctrl_status model_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias, const float *dout,
                                  const float *x, const float *w, int T, int IN, int OUT);
/* Activation buffers for T tokens (model->acts, x_out, ...). */
ctrl_status model_ensure_acts(ctrl_model *m, int T);
/* One decoder layer from acts[l].x_in over m->T tokens at m->dev_batch.positions, writing the layer's
 * output into `next` (NULL: stop after the MLP's activations, all a recompute for backward needs).
 * (NULL still keeps the down projection adapter's input: its backward needs it.)
 * `attend` computes acts[l].att from acts[l].q, k, v: the attention plugin in training, the paged
 * KV cache in decoding. */
typedef ctrl_status (*model_attention_fn)(ctrl_model *m, int l, layer_acts *a, void *ctx);
ctrl_status model_layer_forward(ctrl_model *m, int l, float *next, model_attention_fn attend, void *ctx);
/* The forward up to the final norm (m->lnf), keeping the batch and all backward needs; the heads
 * (the fused LM head in model.c, the score in model_score.c) run on top of it. */
ctrl_status model_trunk_forward(ctrl_model *m, const ctrl_batch *b);
/* Where layer l's RoPE tables start in cos_tab / sin_tab (in floats): the local ones after the global
 * ones on a sliding layer of a model with two RoPEs (Gemma 3), else 0. */
static inline size_t model_rope_offset(const ctrl_model *m, int l) {
    return m->cfg.local_rope && m->cfg.sliding_layer[l]
               ? (size_t)m->rope_len * (size_t)(ctrl_model_rope_dim(&m->cfg) / 2)
               : 0;
}
/* RoPE tables covering positions [0, max_pos). */
ctrl_status model_ensure_rope(ctrl_model *m, int max_pos);
/* The attention plugin's arguments for layer activations `a` over the kept batch, and the training
 * forward's model_attention_fn (the plugin's forward). */
ctrl_attention_args model_attention_args(const ctrl_model *m, int l, const layer_acts *a);
ctrl_status model_plugin_attention(ctrl_model *m, int l, layer_acts *a, void *ctx);
/* The fused head's arguments over the kept batch (lnf, the LM head, the targets, temperature). */
ctrl_head_args model_head_args(const ctrl_model *m);
/* What the families differ in (model_arch.c): the RMSNorm (Llama's w, or Gemma's 1 + w), the MLP's
 * gate activation (SwiGLU or GeGLU), and whether the model's backend has the ops they need
 * (CTRL_ERR_UNSUPPORTED naming the op and the family where not). */
ctrl_status model_norm_forward(const ctrl_model *m, float *out, float *rstd, const float *x, const float *w,
                               int T, int C);
ctrl_status model_norm_backward(const ctrl_model *m, float *dx, float *dw, const float *dout, const float *x,
                                const float *w, const float *rstd, int T, int C);
ctrl_status model_act_forward(const ctrl_model *m, float *h, const float *g, const float *u, int64_t n);
ctrl_status model_act_backward(const ctrl_model *m, float *dg, float *du, const float *dh, const float *g,
                               const float *u, int64_t n);
ctrl_status model_check_backend(const ctrl_model *m, const ctrl_backend_ops *be);
/* RoPE of layer l on x [T, n_head, head_dim] into out (forward = 0: its backward): the layer's tables
 * (model_rope_offset), over the rotated dimensions only where the model's RoPE is partial. */
ctrl_status model_rope(const ctrl_model *m, int l, float *out, const float *x, const int32_t *pos, int T,
                       int n_head, int forward);
/* Extra floats per token a layer's internals take for the family (the sandwich norms' inputs). */
size_t model_arch_act_floats(const ctrl_model_config *c);
/* The sandwich norms' buffers carved from *p (T tokens), or NULL without them. */
void model_arch_take_acts(const ctrl_model_config *c, layer_acts *a, float **p, int T);

/* Mixture-of-experts layers (model_moe.c). Routing runs on the host over the router logits [T, E]
 * (softmax, top-k, renormalisation: a few floats a token); the experts on the backend, each one GEMM
 * over the tokens routed to it, gathered into one block. moe_ensure sizes every MoE layer's buffers for
 * T tokens (before a forward's layer loop: the buffers are per layer, kept for backward, and a
 * recompute refills its own); moe_forward writes the layer's MLP output into out (NULL: keep only what
 * backward needs), moe_backward accumulates the router's and experts' gradients and writes
 * dL/d(ln2) into dx from dL/d(output) dout; moe_release frees everything. */
typedef struct moe_acts {
    float *logits, *xs, *g, *u, *h, *y, *w; /* backend: [T, E], [TK, C], [TK, Im] x 3, [TK, C], [TK] */
    int32_t *rows;                          /* backend [TK]: the token of each grouped row */
    float *probs, *weight;                  /* host [T, E] and [T, K] */
    int32_t *idx, *count;                   /* host [T, K] chosen experts, [E + 1] row offsets per expert */
} moe_acts;
ctrl_status model_moe_ensure(ctrl_model *m, int T);
ctrl_status model_moe_forward(ctrl_model *m, int l, const float *x, float *out);
ctrl_status model_moe_backward(ctrl_model *m, int l, const float *x, const float *dout, float *dx);
void model_moe_release(ctrl_model *m);

/* LoRA (lora.c). lora_layout adds each layer's lora_A / lora_B views after *cursor; lora_init fills
 * them as init_lora_weights says. lora_forward adds the adapter of layer l's linear `target` to
 * `out` [T, OUT] from its input x [T, IN] (nothing where there is none), keeping a->lora_xa for
 * backward (out NULL: only that, for a recompute that stops before the projection); lora_backward accumulates
 * dA, dB and adds the adapter's share to dx [T, IN] from dout. */
ctrl_status lora_layout(ctrl_model *m, size_t *cursor);
void lora_init(ctrl_model *m);
/* Floats per token of layer l's lora_xa (l < 0: the shared set of the recomputed layers). */
size_t lora_act_floats(const ctrl_model *m, int l);
/* Layer l's adapter on linear t: its rank (0 where none) and its scaling (lora_alpha / r or / sqrt(r)). */
int lora_r(const ctrl_model *m, int l, int t);
float lora_s(const ctrl_model *m, int l, int t);
/* init_lora_weights = pissa / olora (lora_from_base.c): lora_init_from_base_on says whether the config
 * asks for it; lora_init_from_base sets the adapter over view v (a projection's whole base weight, just
 * read in fp32) from it and leaves the residual in its place (nothing for other views), counting
 * them in m->lora_from_base_done. */
int lora_init_from_base_on(const ctrl_lora_config *c);
ctrl_status lora_init_from_base(ctrl_model *m, const ctrl_param_view *v);
/* After the load: every adapter was set so (else an error), and the model told its weights changed. */
ctrl_status lora_init_from_base_check(ctrl_model *m);
/* trainable_token_indices (lora_tokens.c): whether the model has them; their views laid out after the
 * adapters (the ids checked against the vocabulary); the rows captured from a table as the model's
 * values are set (the table at offset `table` loaded; -1: every table, a random init): the trained values
 * and the base's copy; the tables made to hold the rows the model computes with now (before each
 * forward); the batch's tokens as rows of the embedding's view (tt[t]); the lookup's gradient into the
 * view's (dx: dL/d the looked-up rows); the LM head's trained rows and their gradient (its ids, count and
 * gradient rows: n 0 where none train the head now); parameters [off, off + n) changed (the views among
 * them: written again); the rows folded into the tables for good (merge: the adapters go off); the
 * backend's copies released (the model moves), then the host's (the model is freed). */
int lora_tokens_on(const ctrl_model *m);
int lora_tokens_in(const ctrl_model *m, long table); /* rows of the table at offset `table` train */
ctrl_status lora_tokens_layout(ctrl_model *m, size_t *cursor);
void lora_tokens_capture(ctrl_model *m, long table);
ctrl_status lora_tokens_sync(ctrl_model *m);
void lora_tokens_batch(const ctrl_model *m, const int32_t *tokens, int T, int32_t *tt);
ctrl_status lora_tokens_backward(ctrl_model *m, const float *dx);
/* ... and a tied head's part from dz [n, V] = dL/dlogits of hidden rows h [n, C] (the backend's), where the
 * head is not the fused one (GKD's divergence; fp32 products) */
ctrl_status lora_tokens_head_grad(ctrl_model *m, const float *dz, const float *h, int n);
void lora_tokens_head(const ctrl_model *m, const int32_t **ids, int *n, float **dw);
void lora_tokens_changed(ctrl_model *m, size_t off, size_t n);
void lora_tokens_merge(ctrl_model *m);
void lora_tokens_release(ctrl_model *m);
void lora_tokens_free(ctrl_model *m);
/* modules_to_save's base values (lora_saved.c): found at layout (the trainable tables), captured as a
 * table loads (-1: every one), the tables made to hold the base's values while the adapters are off and
 * the trained ones while on (before each forward, and as the adapters go on), released with the backend
 * (swapped back first), freed with the model. */
void lora_saved_layout(ctrl_model *m);
void lora_saved_capture(ctrl_model *m, long table);
ctrl_status lora_saved_sync(ctrl_model *m);
void lora_saved_release(ctrl_model *m);
void lora_saved_uploaded(ctrl_model *m); /* the host's parameters were put on the device whole */
void lora_saved_free(ctrl_model *m);
ctrl_status lora_forward(ctrl_model *m, int l, int target, layer_acts *a, float *out, const float *x, int IN,
                         int OUT);
ctrl_status lora_backward(ctrl_model *m, int l, int target, const layer_acts *a, float *dx, const float *dout,
                          const float *x, int IN, int OUT);
/* Scratch of an adapter's forward and backward on the backend: xa [T, r], and three buffers of
 * [T, widest linear width] (lora.c). */
ctrl_status lora_scratch(ctrl_model *m, float **xa, float **w1, float **w2, float **w3);
/* Operands several of a layer's products read, packed once (model_share.c): model_share puts x [T, IN]
 * in slot 0 or 1 as the products' A (as_b 0: x W^T, dY W) or as the B of weight gradients (as_b 1:
 * dY^T x) where `readers` >= 2 products will read it (else, or x NULL, the slot is emptied); x must
 * not change until model_share_end empties both slots. model_share_release frees their memory (the
 * end of a backward). lora_reads: 1 when layer l's adapter on target t multiplies by the projection's
 * dL/dout (dY B), and (x 1) by its input too (no dropout: x A^T, dA = dXA^T x). */
void model_share(const ctrl_model *m, int slot, int as_b, const float *x, int T, int IN, int readers);
void model_share_end(const ctrl_model *m);
void model_share_release(const ctrl_model *m);
int lora_reads(const ctrl_model *m, int l, int t, int x);
/* dst = dropout(src) [n] with layer l's target t's mask of this forward (lora.c); lora_dropout_on: the
 * model trains with lora_dropout > 0. */
ctrl_status lora_apply_dropout(ctrl_model *m, int l, int t, float *dst, const float *src, int64_t n);
int lora_dropout_on(const ctrl_model *m);
/* QLoRA (model_nf4.c): nf4_store quantizes view `v`'s weight (just read into its slot) into its
 * NF4 store; nf4_layer_weights dequantizes layer l's seven weights into the shared slot (nothing
 * when it holds them already), before layer l's forward or backward. */
ctrl_status nf4_store(ctrl_model *m, const ctrl_param_view *v);
/* nf4_store, then only the values [v0, v1) of it kept (v0 on a super-block; the parts' buffers of
 * those values alone, ctrl_model_nf4_parts). */
ctrl_status nf4_store_part(ctrl_model *m, const ctrl_param_view *v, int64_t v0, int64_t v1);
ctrl_status nf4_layer_weights(ctrl_model *m, int l);
/* NF4 view v's whole weight dequantized on the host into out (numel floats), the slot untouched. */
ctrl_status nf4_dequantize_view(const ctrl_model *m, const ctrl_param_view *v, float *out);
void nf4_free(ctrl_model *m);
/* nf4_use_layer: the products that follow are layer l's (its forward or backward); nf4_holds: w is
 * one of the NF4 weights' (shared) views; nf4_linear_*: the product with that weight of the layer in
 * use, dequantized tile by tile in the backend's GEMM (the base is frozen: dw, dbias must be NULL). */
ctrl_status nf4_use_layer(ctrl_model *m, int l);
int nf4_holds(const ctrl_model *m, const float *w);
ctrl_status nf4_linear_forward(const ctrl_model *m, float *out, const float *x, const float *w,
                               const float *bias, int T, int IN, int OUT);
ctrl_status nf4_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias, const float *dout,
                                const float *w, int T, int IN, int OUT);
/* The NF4 store copied into a device backend's memory (m->be, after the switch), and freed from it
 * (before the model leaves the backend); the host copy stays. */
/* QDoRA (dora.c over an NF4 base): nf4_product: out [T, OUT] = x [T, IN] W^T with layer l's
 * projection t, in fp32 whatever the compute dtype (tile by tile, the backend's NF4 product);
 * nf4_row_norms: ||W_j|| of each of its OUT rows into norms (host memory), dequantized from the
 * host's store a row at a time as the products dequantize it, summed in double. */
ctrl_status nf4_product(const ctrl_model *m, int l, int t, float *out, const float *x, int T);
ctrl_status nf4_row_norms(const ctrl_model *m, int l, int t, float *norms);
/* QDoRA, the store keeping a ZeRO-3 rank's pieces (nf4_store_part): right after NF4 view v was
 * quantized whole, the row norms of every adapted linear whose base it is into dora_wn_host. */
ctrl_status nf4_hold_dora_norms(ctrl_model *m, const ctrl_param_view *v);
ctrl_status nf4_to_device(ctrl_model *m);
void nf4_release_device(ctrl_model *m);
/* A model held in bf16 (model_bf16_store.c): layer l's weights widened into params before it runs
 * (the previous layer's pages given back); the store freed. */
ctrl_status model_bf16_layer_weights(ctrl_model *m, int l);
void model_bf16_free(ctrl_model *m);
/* Whether w (inside the parameters) holds bf16 values because the model is held in bf16. */
int model_bf16_holds(const ctrl_model *m, const float *w);
/* The loader read view v (lora->bf16_base): a layer whose views are all read is packed into bf16; a
 * model whose base cannot be held stays fp32 (w16_at_load cleared). */
ctrl_status model_bf16_view_loaded(ctrl_model *m, const ctrl_param_view *v);
/* The LM head's panels held (model_decode_pack.c) where it does not train: ctrl_model_hold_panels' last
 * step, and ctrl_model_load_frozen_bf16's once every layer is held. */
ctrl_status model_hold_head(ctrl_model *m);
/* Gives back the whole pages inside params[lo, hi) (model_bf16_store.c; their contents become zeros). */
void model_release_range(ctrl_model *m, long lo, long hi);
/* The frozen embedding in bf16 (model_embed16.c): the loader read view v (emb16_at_load), the
 * embedding's is narrowed into emb16 or packed into the tied head's panels, and its fp32 pages given
 * back; the lookup out[t] = the row of tokens[t] (from the bf16 table where held, else the backend's
 * embedding_forward); whether w is the held table (the tied LM head); the held table's rows [n] widened
 * into out [n, C] (exact); x W[v0 : v0 + vc]^T (v0 and vc whole multiples of _chunk, vc may reach V;
 * _chunk 0: any) and dX = dY W on it (host memory: the head's products on the bf16 values); W's values as
 * bf16 into a new buffer (*out, the caller frees it) unless held as bf16 values
 * (*out = emb16). */
ctrl_status model_embed16_view_loaded(ctrl_model *m, const ctrl_param_view *v);
ctrl_status model_embed_lookup(ctrl_model *m, float *out, const int32_t *tokens, int T, int C);
int model_embed16_holds(const ctrl_model *m, const float *w);
ctrl_status model_embed16_rows(const ctrl_model *m, const int32_t *rows, int n, float *out);
ctrl_status model_embed16_forward(const ctrl_model *m, float *out, int ldo, const float *x, int T, int v0,
                                  int vc, int bf16);
int model_embed16_chunk(const ctrl_model *m);
ctrl_status model_embed16_backward(const ctrl_model *m, float *dx, const float *dout, int T, int bf16);
ctrl_status model_embed16_values(const ctrl_model *m, const uint16_t **out);
/* A frozen model held as panels after its load (ctrl_model_hold_panels): the table held in bf16 alone
 * where its values are bf16 ones already (tied: as the head's held panels; untied: as values), as
 * ctrl_model_load_frozen_bf16 holds it as it loads. */
ctrl_status model_embed16_hold_exact(ctrl_model *m);
/* New values x of the table held in bf16 (ctrl_model_write_view): written into its bf16 form where
 * they are bf16 values, else the table back in fp32 (its bf16 form dropped; a tied head's panels
 * packed again from x). */
ctrl_status model_embed16_write(ctrl_model *m, const float *x);
/* LoRA on the experts (lora_moe.c): lora_moe_layout adds layer l's expert adapters (PEFT's names,
 * gate_up_proj's under base_layer. when down_proj has one too) and returns how many parameters it
 * wrapped (lora_init fills them); the forward adds expert e's adapter over its n
 * rows to g, u [n, Im] (from xs [n, C]) and to y [n, C] (from h [n, Im]); the backward accumulates
 * the adapters' gradients and adds their share to dxs [n, C] and dh [n, Im]. */
int lora_moe_layout(ctrl_model *m, size_t *cursor, int l);
ctrl_status lora_moe_gate_up(ctrl_model *m, int l, int e, const float *xs, int n, float *g, float *u);
ctrl_status lora_moe_down(ctrl_model *m, int l, int e, const float *h, int n, float *y);
ctrl_status lora_moe_down_backward(ctrl_model *m, int l, int e, const float *h, const float *dy, int n,
                                   float *dh);
ctrl_status lora_moe_gate_up_backward(ctrl_model *m, int l, int e, const float *xs, const float *dg,
                                      const float *du, int n, float *dxs);
/* The safetensors writer's fetch (user the model): its save_fetch for tensor t's data. */
struct ctrl_st_write;
ctrl_status model_save_fetch(void *user, const struct ctrl_st_write *t);
/* W_e += s B_e A_e of layer l's expert adapters (ctrl_peft_merge), into `experts`: the layer's experts
 * block (its host parameters, or a copy of them). */
void lora_moe_merge(ctrl_model *m, int l, float *experts);
/* The input and output widths of linear t (LORA_Q ...). */
void lora_dims(const ctrl_model *m, int t, int *in, int *out);
/* The adapter module linear t is part of (t itself, or Phi-3's LORA_QKV / LORA_GATE_UP), the first
 * row of t's block in that module's output and the module's output width. */
int lora_module(const ctrl_model *m, int t, int *row0, int *module_out);
/* lora_bank.c: adds the bank's adapters of the decode call under way to out [T, OUT] (see
 * ctrl_model_set_decode_adapters); lora_bank_free releases the bank. */
ctrl_status lora_bank_forward(ctrl_model *m, int l, int t, float *out, const float *x, int IN, int OUT);
/* The same for layer l's experts (model_moe.c, through lora_moe.c): expert ex's n routed rows xs
 * [n, in] under adapter k (LORA_MOE_GATE_UP: o1 = gate's [n, Im], o2 = up's; LORA_MOE_DOWN: o1 [n, C]),
 * each run of rows under one adapter given that adapter's expert ex. */
ctrl_status lora_bank_moe(ctrl_model *m, int l, int k, int ex, const float *xs, int n, float *o1, float *o2);
void lora_bank_free(ctrl_model *m);
/* Layer l's base weight [OUT, IN] and bias (-1: none) of linear t, as offsets into the parameters. */
void lora_base_weight(const ctrl_model *m, int l, int t, long *w, long *bias);
/* DoRA (dora.c). dora_layout adds layer l's target t's lora_magnitude_vector [OUT] after *cursor;
 * dora_init_magnitudes sets every magnitude to its weight norm (PEFT's initialisation: the adapted
 * model starts as plain LoRA's), once the base weights are loaded; dora_prepare recomputes the norms
 * and magnitude / norm after the weights changed (before a forward). dora_combine turns `out`
 * [T, OUT], which holds x W^T + b, into DoRA's output given the adapter's yl = s (x A^T) B^T and, with
 * dropout, yb = dropout(x) W^T (else NULL: out - b is used); dora_backward is lora_backward for a
 * DoRA layer. */
void dora_layout(ctrl_model *m, size_t *cursor, int l, int module, int OUT);
ctrl_status dora_init_magnitudes(ctrl_model *m);
/* QDoRA with init_lora_weights = false (B != 0) over a ZeRO-3 rank's pieces of the NF4 base: layer l's
 * target t's magnitude := ||W + s B A|| while its NF4 weight is whole in the store (nf4_store_part,
 * right after its rows' norms: the same computation as dora_init_magnitudes' over a whole store). */
ctrl_status dora_nf4_magnitudes_at_load(ctrl_model *m, int l, int t);
ctrl_status dora_prepare(ctrl_model *m);
/* Before layer l's forward or backward, after the sharding's gather (model_layer_hooks): its norms
 * and scalings, where dora_prepare left them to the layer (ZeRO-3); nothing otherwise. */
ctrl_status dora_layer_ready(ctrl_model *m, int l);
ctrl_status dora_combine(ctrl_model *m, int l, int t, float *out, const float *yl, const float *yb, int OUT);
ctrl_status dora_backward(ctrl_model *m, int l, int t, const layer_acts *a, float *dx, const float *dout,
                          const float *x, int IN, int OUT);
static inline int model_recomputed(const ctrl_model *m, int l) { return m->recompute && m->recompute[l]; }
/* Whether recomputed layer l keeps its gate/up outputs (ctrl_memory_ops.keep_mlp): a dense layer's
 * recompute then skips those products. */
static inline int model_keeps_mlp(const ctrl_model *m, int l) {
    return m->recompute && (m->recompute[l] & 2) && m->layers[l].router < 0;
}
/* Layer l's hooks: the memory strategy's and the sharding's (ctrl_model_set_sharding), of the
 * forward or the backward, before or after the layer. */
ctrl_status model_layer_hooks(ctrl_model *m, int l, int backward, int before);
/* ZeRO-3's sliced tensors outside the layers: the sharding's hook index of the embeddings (head = 0:
 * n_layers) or of the LM head (head = 1: n_layers + 1, or n_layers when tied to the embeddings), and
 * its hooks around a use of it -- before = 1: before_forward (backward = 0) or before_backward (the
 * head's backward: the gather then maps its gradients on a device), before = 0: after_forward (the
 * release). Never the memory strategy's hooks (its layers only). */
int model_outer_slot(const ctrl_model *m, int head);
ctrl_status model_outer_hooks(ctrl_model *m, int head, int backward, int before);
/* Offloaded activations: layer l's input to host memory or the file (out = 1, just before its
 * forward) or back into its slot (before its backward); nothing for a layer kept whole. */
ctrl_status model_offload_input(ctrl_model *m, int l, int out);
/* The store of the offloaded inputs for T tokens (model_ensure_acts): host memory on a device, a
 * file on the CPU; model_offload_release waits for the copies in flight and frees the host memory
 * (the file stays open for the next layout; call it before freeing the activations),
 * model_offload_close closes the file too (ctrl_model_free). model_offload_begin: at the start of a
 * forward, the compute waits for the copies still in flight (their slots are written again). */
ctrl_status model_offload_store(ctrl_model *m, int T);
ctrl_status model_offload_begin(ctrl_model *m);
void model_offload_release(ctrl_model *m);
void model_offload_close(ctrl_model *m);

/* The per-token inputs and outputs of the head where the backend's ops can use them: the caller's
 * host buffers with host memory, else m->stage ([3, T] floats: logp, dL/dlogp, correct), with
 * dlogp copied in by model_stage_in and logp/correct copied out by model_stage_out. Any may be NULL. */
typedef struct model_stage {
    const float *dlogp;
    float *logp;
    int32_t *correct;
} model_stage;
ctrl_status model_stage_in(ctrl_model *m, model_stage *st, const float *dlogp, float *logp, int32_t *correct);
ctrl_status model_stage_out(ctrl_model *m, const model_stage *st, float *logp, int32_t *correct);

/* The weights as bf16 panels (model_decode_pack.c). usable: a bf16 model on the CPU with
 * AVX-512 BF16, or with AVX2 + FMA only (avx2: decoding's own panels, gemm_bf16_avx2.c), whose
 * weights only change through ctrl_model_weights_changed (and no CTRL_NO_PACKED_DECODE=1); begin: the table
 * made and dec_pack_on set (decode clears it after the call); hold: the weight at params + off ([out, in])
 * packed as a held entry, its only copy from then on (the caller gives its fp32 pages back); valid: w's
 * panels usable now (held, or decoding's of the current generation with CTRL_NO_PACKED_TRAIN unset), NULL
 * otherwise; linear: out = x w^T (+ bias) on w's panels -- decoding packs w first where new or stale, other
 * forwards only use valid ones; linear_backward: dx = dout w on valid panels read transposed, then dw, dbias
 * as the backend computes them (*used = 0 for either: nothing done, the caller's product runs); bytes:
 * decoding's panels, held_bytes: the held ones; free: decoding's (held_too: all of it). */
int model_pack_usable(const ctrl_model *m);
int model_pack_avx2(const ctrl_model *m);
ctrl_status model_pack_begin(ctrl_model *m);
ctrl_status model_pack_hold(ctrl_model *m, size_t off, int in, int out);
const struct ctrl_cpu_bf16_packed *model_pack_valid(const ctrl_model *m, const float *w, int IN, int OUT);
ctrl_status model_pack_linear(const ctrl_model *m, float *out, const float *x, const float *w,
                              const float *bias, int T, int IN, int OUT, int *used);
ctrl_status model_pack_linear_backward(const ctrl_model *m, float *dx, float *dw, float *dbias,
                                       const float *dout, const float *x, const float *w, int T, int IN,
                                       int OUT, int *used);
size_t model_pack_bytes(const ctrl_model *m);
size_t model_pack_held_bytes(const ctrl_model *m);
/* The held panels of the weight (off, in, out), NULL where it is not held. */
const struct ctrl_cpu_bf16_packed *model_pack_held(const ctrl_model *m, size_t off, int in, int out);
void model_pack_free(ctrl_model *m, int held_too);
/* Whether a weight inside params[lo, hi) has held panels. */
int model_pack_held_in(const ctrl_model *m, size_t lo, size_t hi);
/* The held panels of every weight inside params[lo, hi) packed again from x (x[0] is params[lo]'s new
 * value): how many; -1 where no bf16 kernel can pack now (the panels are then partly new). */
int model_pack_rewrite(ctrl_model *m, size_t lo, size_t hi, const float *x);
/* How many training products (forward or dX) ran on decoding's panels so far (tests). */
size_t model_pack_reused(const ctrl_model *m);

/* The activations kept in bf16 (ctrl_model.act16): model_act16_keep converts x [n] into slot `slot`
 * when the model multiplies bf16 operands on a backend with to_bf16 (else does nothing);
 * model_act16_clear forgets every slot (a layer's forward starts: the buffers are about to be
 * written again; a layer's backward is done). model_act16_release frees the copies. */
enum { MODEL_ACT16_LN1, MODEL_ACT16_ATT, MODEL_ACT16_LN2, MODEL_ACT16_H };
ctrl_status model_act16_keep(ctrl_model *m, int slot, const float *x, int64_t n);
void model_act16_clear(ctrl_model *m);
void model_act16_release(ctrl_model *m);
/* The LM head's weight as bf16 values where the model holds them (ctrl_head_args.w16), else NULL. */
const uint16_t *model_head_w16(const ctrl_model *m);

#endif
