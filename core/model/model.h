/* The decoder (Llama family): parameters in one flat fp32 buffer laid out layer by layer with named
 * views under their Hugging Face names, gradients in the same layout, explicit forward and backward
 * per layer (llm.c style), attention through the selected plugin, and the fused log-prob head at
 * the top. Written once against the backend ops table (device/backend.h): the model computes on
 * the CPU from creation on, or on the device ctrl_model_to_device places it on. */
#ifndef CTRL_CORE_MODEL_H
#define CTRL_CORE_MODEL_H

#include <ctrl/attention.h>
#include <ctrl/memory.h>

#include "model/model_config.h"

/* The paged KV cache decoding appends to (model/kv_cache.h); declared opaque here so that users
 * of the model that never decode do not see its layout. */
typedef struct ctrl_kv_cache ctrl_kv_cache;
typedef struct ctrl_kv_seq ctrl_kv_seq;
struct ctrl_backend_ops;

/* A flat variable-length batch: sequence b is tokens cu_seqlens[b] .. cu_seqlens[b+1]-1. */
typedef struct ctrl_batch {
    int T, B;
    const int32_t *tokens;     /* [T] */
    const int32_t *positions;  /* [T], restarting at 0 for each sequence */
    const int32_t *cu_seqlens; /* [B+1] */
    const int32_t *targets;    /* [T] next-token targets, < 0 where nothing is predicted */
} ctrl_batch;

/* A named view of the flat parameter buffer. */
typedef struct ctrl_param_view {
    char name[96];
    size_t offset; /* in floats */
    int ndim;
    int64_t shape[2];
    int64_t numel;
    int no_decay; /* norms and biases: no weight decay, as the HF Trainer groups them */
    int lora;     /* a LoRA adapter tensor (lora_A / lora_B): saved with the adapter, not the model */
    int nf4;      /* QLoRA: 1 + layer * 7 + projection of a base weight held in NF4 (its offset is the
                   * shared slot the layer being computed is dequantized into); 0 otherwise */
} ctrl_param_view;

typedef struct ctrl_model ctrl_model;

struct ctrl_lora_config;
ctrl_status ctrl_model_create(const ctrl_model_config *cfg, const ctrl_attention_ops *attn, ctrl_model **out);
/* config.json + model.safetensors (or the shards of model.safetensors.index.json). */
ctrl_status ctrl_model_load(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out);
/* For inference (ctrl generate --dtype bf16): DIR's model frozen (ctrl_model_freeze) and computing in
 * bf16, each layer held as the bf16 GEMM's panels as soon as the loader has read it (its fp32 pages
 * given back), then the LM head's: what ctrl_model_hold_panels does after a load, without the whole
 * model in fp32 first. Where it cannot be held (ctrl_model_hold_panels says why) the model is frozen,
 * bf16, its weights fp32 (ctrl_model_base_in_panels tells). */
ctrl_status ctrl_model_load_frozen_bf16(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out);
/* DIR's weights into a model of shape *cfg (DIR's config.json, or it with another head: a causal
 * LM's trunk under a score); a tensor of the model DIR lacks is an error, except the one named
 * `optional` (NULL: none), which is left zero. */
ctrl_status ctrl_model_load_as(const char *dir, const ctrl_model_config *cfg, const ctrl_attention_ops *attn,
                               const char *optional, ctrl_model **out);
/* The same with LoRA adapters (model/lora.h; NULL: none) laid out after the base and initialised
 * as lora->init says: the base is frozen (no gradients), the views from
 * ctrl_model_trainable_offset on train. */
ctrl_status ctrl_model_create_lora(const ctrl_model_config *cfg, const ctrl_attention_ops *attn,
                                   const struct ctrl_lora_config *lora, ctrl_model **out);
ctrl_status ctrl_model_load_lora(const char *dir, const ctrl_attention_ops *attn,
                                 const struct ctrl_lora_config *lora, ctrl_model **out);
/* ctrl_model_load_as with LoRA adapters (a classifier's trunk under adapters, its score trained). */
ctrl_status ctrl_model_load_as_lora(const char *dir, const ctrl_model_config *cfg,
                                    const ctrl_attention_ops *attn, const char *optional,
                                    const struct ctrl_lora_config *lora, ctrl_model **out);
/* ctrl_model_load reading only some of DIR's weights (ZeRO-3's slices): `parts` is called on the
 * model once it is laid out (its parameters all zero, none of their pages touched) and gives the
 * ranges of parameters to read, *ranges (malloc'd, freed by the caller) holding n pairs [a, b),
 * ascending and apart; only those elements are checked, read and written (the mapped file is read
 * there only), the rest of the parameters stays zero and untouched. */
typedef ctrl_status (*ctrl_model_parts_fn)(const ctrl_model *m, void *ctx, size_t **ranges, int *n);
ctrl_status ctrl_model_load_part(const char *dir, const ctrl_attention_ops *attn, ctrl_model_parts_fn parts,
                                 void *ctx, ctrl_model **out);
/* The same laid out as `cfg` says, `optional` (a view's name, or NULL) left zero when DIR lacks it,
 * as ctrl_model_load_as. */
ctrl_status ctrl_model_load_part_as(const char *dir, const ctrl_model_config *cfg,
                                    const ctrl_attention_ops *attn, const char *optional,
                                    ctrl_model_parts_fn parts, void *ctx, ctrl_model **out);
/* The model's LoRA config (NULL without adapters). */
const struct ctrl_lora_config *ctrl_model_lora(const ctrl_model *m);
/* QLoRA ([peft] quantization = nf4): what the base holds in NF4 and what stays fp32, in words for the
 * start-up log (buf: "" without an NF4 base). */
void ctrl_model_nf4_summary(const ctrl_model *m, char *buf, size_t cap);
/* ZeRO-3 over a QLoRA base (core/train/zero_nf4.c): the model's NF4 store in host memory -- layer l's
 * projection t at [l * *per_layer + t]; an entry whose packed is NULL holds nothing (a fused module's
 * later linears, an MoE layer's MLP) -- or NULL (no NF4 base). On a device model the products read the
 * device's copy (ctrl_model_nf4_device); the host's entries then keep what it was copied from. The caller
 * may replace an entry's buffers (ctrl_nf4_free frees them; the model frees what an entry holds when it
 * is freed): each rank keeps its slice and puts the whole weight back around a layer's use. A product
 * with a weight whose entry holds nothing is an error naming the layer, never a read of freed memory. */
struct ctrl_nf4 *ctrl_model_nf4_store(ctrl_model *m, int *per_layer);
/* A device model's copy of the NF4 store: 3 device buffers an entry (packed, absmax bytes, absmax
 * scales), entry i at [3i], described by the host entry's n and offset; NULL on the CPU. The caller may
 * free an entry's buffers (the backend's free) and put others of the same bytes in their place (the
 * model frees what is there when it is freed); a product with an entry whose buffers are NULL is an
 * error naming the layer. */
void **ctrl_model_nf4_device(ctrl_model *m);
/* ZeRO-3 on a device: the model's move to a device (ctrl_model_to_device, called after this) copies
 * neither its parameters nor its gradients there (ctrl_model_device_params and _grads are NULL until
 * ZeRO-3 hands the model its sliced buffers, ctrl_model_adopt_device_buffers, which it fills from the
 * host's parameters) nor any NF4 weight of QLoRA's store (its entries stay NULL: each rank puts only
 * its pieces there, core/train/zero_nf4.c) -- so no device ever holds the whole model; a product
 * before that is an error. */
void ctrl_model_defer_device(ctrl_model *m);
/* QDoRA over an NF4 base: its weights' row norms computed now from the host's store (kept on the
 * model's backend until it moves), before ZeRO-3 cuts the store into slices; a no-op otherwise. */
ctrl_status ctrl_model_nf4_hold_norms(ctrl_model *m);
/* ctrl_model_load_part with LoRA adapters (ctrl_model_load_lora; lora may be NULL): the adapters are made,
 * not read, whatever the ranges say. QLoRA (lora->nf4): each NF4 weight is read and quantized whole (its
 * absmax offset is the mean over all of its blocks) and only its values [spans[2i], spans[2i + 1])
 * kept, i its store index (1 + i = the view's nf4), spans[] [2 x n_layers x 7] filled by `nf4_parts`
 * (the start on a super-block, CTRL_NF4_SUPER); the store then holds those pieces alone
 * (ctrl_model_nf4_parts), and a product with an NF4 weight is an error until they are put whole again
 * (zero_nf4.c). nf4_parts NULL: each weight kept whole. DoRA (not over NF4): the magnitudes set are the
 * row norms of W + s B A over the parts read (the rest of W zero): with B = 0, each row's whole norm
 * is the root of their squares summed over parts that cover W once (core/train/train_lora.c). */
typedef ctrl_status (*ctrl_model_nf4_parts_fn)(const ctrl_model *m, void *ctx, int64_t *spans);
ctrl_status ctrl_model_load_lora_part(const char *dir, const ctrl_attention_ops *attn,
                                      const struct ctrl_lora_config *lora, ctrl_model_parts_fn parts,
                                      ctrl_model_nf4_parts_fn nf4_parts, void *ctx, ctrl_model **out);
/* The same laid out as `cfg` says, `optional` left zero when DIR lacks it (ctrl_model_load_part_as). */
ctrl_status ctrl_model_load_lora_part_as(const char *dir, const ctrl_model_config *cfg,
                                         const ctrl_attention_ops *attn, const char *optional,
                                         const struct ctrl_lora_config *lora, ctrl_model_parts_fn parts,
                                         ctrl_model_nf4_parts_fn nf4_parts, void *ctx, ctrl_model **out);
/* After a load with nf4_parts: the spans each NF4 store entry holds ([2i], [2i + 1] in values of the
 * whole weight, whose n the entry keeps; the entry's buffers begin at value [2i]); NULL when every
 * entry is whole. ctrl_model_nf4_parts_done: the entries are whole again or freed (the spans dropped). */
const int64_t *ctrl_model_nf4_parts(const ctrl_model *m);
void ctrl_model_nf4_parts_done(ctrl_model *m);
/* The first trainable float of the parameters (0 without LoRA): views at or past it train, and
 * ctrl_model_grads holds their gradients from there (grads[i] is that of params[offset + i]). */
size_t ctrl_model_trainable_offset(const ctrl_model *m);
/* Training mode (LoRA dropout on; off by default, as after model.eval()); the dropout masks are a
 * function of the seed, `step` and the forwards counted since this call, so that a resumed run
 * draws the same ones. */
void ctrl_model_set_training(ctrl_model *m, int training, uint64_t step);
/* Adapters on (default) or skipped: with them off the model is its base (a trainer's reference
 * model with LoRA, as TRL's disable_adapter()). */
void ctrl_model_set_adapters_enabled(ctrl_model *m, int enabled);
void ctrl_model_free(ctrl_model *m);
/* Every parameter under its HF name into one safetensors file (CTRL_F32 or CTRL_BF16), atomically. */
ctrl_status ctrl_model_save_weights(ctrl_model *m, const char *path, ctrl_dtype dtype);
/* transformers' initialisation: weights ~ N(0, std) (initializer_range, 0.02), biases 0, norms 1. */
void ctrl_model_init_random(ctrl_model *m, uint64_t seed, float std);
/* View i (ctrl_model_view) alone ~ N(0, std), from the same stream ctrl_model_init_random gives it. */
void ctrl_model_init_view(ctrl_model *m, int i, uint64_t seed, float std);
/* Writes DIR as transformers' save_pretrained does: config.json (a loaded model's source config.json
 * carried over with only the changed fields rewritten: the dtype, the class when the head changed;
 * generated for a model made from a config), generation_config.json (the source's; none for a
 * classifier) and the weights in `dtype` (CTRL_F32, CTRL_BF16 or CTRL_F16), in one
 * model.safetensors or, above max_shard_bytes, model-0000K-of-0000N.safetensors shards with
 * model.safetensors.index.json, cut as huggingface_hub cuts them; an earlier save's weight files
 * there are removed. ctrl_model_save: max_shard_size's default, 50GB (save_pretrained's). */
#define CTRL_DEFAULT_MAX_SHARD ((int64_t)50000000000)
ctrl_status ctrl_model_save(ctrl_model *m, const char *dir, ctrl_dtype dtype);
ctrl_status ctrl_model_save_sharded(ctrl_model *m, const char *dir, ctrl_dtype dtype,
                                    int64_t max_shard_bytes);
/* The saves above call fetch(user, data, numel) just before they read each weight's numel floats
 * at data (inside ctrl_model_params), in the order they write them: ZeRO-3 gathers a layer there
 * only when its first weight is written (core/train/zero_save.c). An error from it fails the
 * save. NULL: none (the default). */
void ctrl_model_set_save_fetch(ctrl_model *m,
                               ctrl_status (*fetch)(void *user, const float *data, int64_t numel),
                               void *user);
/* transformers' max_shard_size: "5GB", "500MB", "200KB", "1TB" (powers of 1000, any case, a
 * decimal number before the unit) or a plain number of bytes. */
ctrl_status ctrl_parse_shard_size(const char *text, int64_t *bytes);
/* The dtype a model directory holds: config.json's dtype (or torch_dtype) -- float32, bfloat16,
 * float16 --, else the stored dtype of its first floating-point weight; CTRL_F32 when neither says. */
ctrl_status ctrl_model_dir_dtype(const char *dir, ctrl_dtype *out);

/* Places the model on a backend (device/backend.h: ctrl_backend_cpu(), or the CUDA backend's table
 * from ctrl_device_select) and device: its parameters are copied there, and forward, backward and
 * all they keep live there from then on; what the model held on the previous backend is freed.
 * The host buffers of ctrl_model_params and ctrl_model_grads stay the master copy that loading,
 * saving and the optimizer use: say ctrl_model_weights_changed after changing the parameters,
 * and call ctrl_model_grads_to_host before reading the gradients. */
ctrl_status ctrl_model_to_device(ctrl_model *m, const struct ctrl_backend_ops *be, ctrl_device device);
ctrl_device ctrl_model_device(const ctrl_model *m);
/* The backend the model computes on (what its KV caches are allocated on: ctrl_kv_cache_create_on). */
const struct ctrl_backend_ops *ctrl_model_backend(const ctrl_model *m);
/* The gradients accumulated on the device copied into the host buffer (ctrl_model_grads); nothing
 * to do for a model on the CPU, whose gradients are that buffer. */
ctrl_status ctrl_model_grads_to_host(ctrl_model *m);
/* ZeRO-3 on a device (core/train/zero_device.c): the model computes on `params` and `grads` (device
 * buffers of the same sizes, the caller's: not freed by the model, valid until it is freed) instead
 * of its own, which are freed; and while `sliced`, the device's parameters are not whole, so
 * ctrl_model_params does not refresh the host's copy from them (it is refreshed once they are whole
 * again and the flag cleared). */
ctrl_status ctrl_model_adopt_device_buffers(ctrl_model *m, float *params, float *grads);
/* (Such a model keeps no bf16 copy of its parameters in bf16 compute: the products round w.) */
/* On the CPU, before the optimizer's groups are made: `grads` (the model's gradient count, zeroed;
 * the caller's memory, never freed by the model: plain data parallel's buffer shared between the
 * ranks) becomes the model's gradient buffer; its own is freed. */
ctrl_status ctrl_model_adopt_host_grads(ctrl_model *m, float *grads);
void ctrl_model_set_device_sliced(ctrl_model *m, int sliced);
/* The gradients where the backend keeps them (the host's on the CPU), as many floats as
 * ctrl_model_grads (the trainable ones): for a collective on device memory before
 * ctrl_model_grads_to_host. */
float *ctrl_model_device_grads(ctrl_model *m, size_t *n);

/* For an optimizer that steps on the device: its parameters there (the host buffer on the CPU); the
 * sum of squares of the (trainable) gradients, accumulated in double, and their scaling, on the
 * model's backend. After a step there, ctrl_model_device_weights_changed: the device copy is the
 * master until ctrl_model_params (or ctrl_model_params_to_host) brings it back to the host. */
float *ctrl_model_device_params(ctrl_model *m);
ctrl_status ctrl_model_grad_sum_squares(ctrl_model *m, double *out);
ctrl_status ctrl_model_scale_grads(ctrl_model *m, float s);
void ctrl_model_device_weights_changed(ctrl_model *m);
ctrl_status ctrl_model_params_to_host(ctrl_model *m);

const ctrl_model_config *ctrl_model_cfg(const ctrl_model *m);
/* The host parameters and gradients (see ctrl_model_to_device); *n of the gradients is the number
 * of trainable floats (all of them without LoRA); the parameters brought back from the device
 * first when an optimizer stepped them there. */
float *ctrl_model_params(ctrl_model *m, size_t *n);
float *ctrl_model_grads(ctrl_model *m, size_t *n);
int ctrl_model_view_count(const ctrl_model *m);
const ctrl_param_view *ctrl_model_view(const ctrl_model *m, int i);
const ctrl_param_view *ctrl_model_find_view(const ctrl_model *m, const char *name);

/* Per-token log-probabilities of batch->targets (0 where target < 0) and, optionally, entropies
 * and argmax-equals-target flags (mean_token_accuracy); keeps what backward needs. */
ctrl_status ctrl_model_forward(ctrl_model *m, const ctrl_batch *batch, float *logp, float *entropy,
                               int32_t *correct);
/* The forward with dL/dlogp known up front (a loss linear in the log-probs, as SFT's): the head's
 * backward runs inside it (its logits are never recomputed) and accumulates the head's parameter
 * gradient; ctrl_model_backward(m, NULL) then does the rest. */
ctrl_status ctrl_model_forward_fused(ctrl_model *m, const ctrl_batch *batch, const float *dlogp, float *logp,
                                     float *entropy, int32_t *correct);
/* After a forward (either kind), per token [T] of its batch (0 where there is no target): the mean
 * over the vocabulary of the scaled logits (TRL's mean_logits) and log sum_v p_v^2 (TRL's
 * log_sum_sq_probs, WPO's weights); either may be NULL. No gradient flows through them, and the
 * [T x V] logits are never built (model_head_stats.c). */
ctrl_status ctrl_model_head_stats(ctrl_model *m, float *mean_logit, float *log_sum_sq_probs);
/* Distillation (model_jsd.c). ctrl_model_hidden_forward runs the model up to its final norm only
 * (no head, nothing for a backward): a frozen teacher's forward. ctrl_model_jsd_forward then runs
 * the student's forward over the same batch and, at each token with a target, the generalized
 * JSD between softmax(student logits / temperature) and softmax(teacher logits / temperature) as
 * TRL's GKD computes it (beta 0: KL(teacher || student), 1: KL(student || teacher), between: the
 * JSD of the mixture (1 - beta) p_student + beta p_teacher) into jsd[T] (0 elsewhere), a chunk
 * of tokens' logits at a time from both heads (never a [tokens x vocabulary] tensor). The
 * gradient of sum_t weight[t] jsd[t] (weight known up front: a loss linear in the per-token
 * divergences) is taken into the student's LM head and kept for ctrl_model_backward(student,
 * NULL). Both models on one backend, with the same vocabulary; the teacher is never written. */
typedef struct ctrl_jsd_args {
    double beta;         /* 0 .. 1 */
    double temperature;  /* > 0 */
    const float *weight; /* [T] dL/djsd[t] (NULL: no gradient) */
    int chunk_tokens;    /* tokens whose logits are held at once (0: 32 MiB worth per head) */
} ctrl_jsd_args;
ctrl_status ctrl_model_hidden_forward(ctrl_model *m, const ctrl_batch *batch);
/* A frozen model (a distillation teacher): no gradient buffer and nothing trainable from now on
 * (on the CPU, before ctrl_model_to_device); and a model placed where `like` computes (its backend
 * and device). */
ctrl_status ctrl_model_freeze(ctrl_model *m);
/* A frozen model on the CPU held in bf16 (model_bf16_store.c): every parameter rounded to bf16 once,
 * the layers' weights kept as 2-byte values and widened to fp32 one layer at a time as it runs (the
 * embeddings, final norm and LM head stay fp32, holding bf16 values). With bf16 compute its
 * projections are then those of a model loaded in bf16. CTRL_ERR_UNSUPPORTED off the CPU. */
ctrl_status ctrl_model_hold_bf16(ctrl_model *m);
/* The frozen base of a LoRA model computing in bf16 held in bf16 (model_bf16_store.c): the layers'
 * projection weights rounded to bf16 once (bf16 compute multiplies them as bf16 values anyway: the
 * numbers do not change), kept as 2-byte values and widened to fp32 one layer at a time, forward and
 * backward; the layers' norms and biases, embeddings, LM head, modules_to_save and adapters stay
 * fp32. CTRL_ERR_UNSUPPORTED (the model unchanged) off the CPU, with fp32 compute, QLoRA, DoRA or
 * a mixture of experts. ctrl_model_param_bytes: the bytes the parameters occupy now. */
ctrl_status ctrl_model_hold_base_bf16(ctrl_model *m);
/* Whether the base is held in bf16 (here, or as it loaded: ctrl_lora_config.bf16_base). Where a bf16
 * GEMM kernel runs (AVX-512 BF16, AMX) it is held as the GEMM's packed panels instead of 2-byte
 * values (ctrl_model_base_in_panels): packed once, never widened, multiplied by the forward, the
 * backward's dX and decoding (model_decode_pack.c); CTRL_NO_BASE_PANELS=1 keeps the 2-byte store. */
int ctrl_model_base_held_bf16(const ctrl_model *m);
int ctrl_model_base_in_panels(const ctrl_model *m);
/* For inference (ctrl generate --dtype bf16): the frozen base of a LoRA model, or a model frozen whole
 * (ctrl_model_freeze), computing in bf16 where a bf16 GEMM kernel runs, held as the GEMM's panels
 * alone -- the layers' projections packed once and their fp32 pages given back, the LM head's panels
 * packed once beside its fp32 values -- so decoding packs nothing and the process holds about 2 bytes
 * a projection weight instead of 4 + 2. The numbers are decoding's on packed panels, bit for bit.
 * CTRL_ERR_UNSUPPORTED (the model unchanged) with fp32 compute, without a bf16 GEMM kernel (AVX2 only:
 * decoding packs its own AVX2 panels), with CTRL_NO_BASE_PANELS set, QLoRA, DoRA or experts. */
ctrl_status ctrl_model_hold_panels(ctrl_model *m);
/* New values x[numel] of view v (ctrl serve's /update_weights), written where the model holds it: in
 * place in fp32, or a weight held as bf16 panels packed again from x (its fp32 pages stay given back),
 * or an embedding held in bf16 because its values were bf16 ones (ctrl_model_load_frozen_bf16) kept so
 * where x's are too and put back in fp32 where they are not; the caller calls
 * ctrl_model_weights_changed after its writes. ctrl_model_view_held: whether v's fp32 values are
 * not in the parameters (write through ctrl_model_write_view, not into ctrl_model_params). */
ctrl_status ctrl_model_write_view(ctrl_model *m, const ctrl_param_view *v, const float *x);
/* One line for the log: the parameters' bytes and what of them is held in bf16 (as panels, as values). */
void ctrl_model_held_summary(const ctrl_model *m, char *buf, size_t cap);
int ctrl_model_view_held(const ctrl_model *m, const ctrl_param_view *v);
/* Whether the frozen input embedding is held in bf16 alone (ctrl_lora_config.bf16_embed, [peft]
 * embedding_dtype = bf16 or auto; model_embed16.c), counted by ctrl_model_param_bytes: 0 no, 1 as bf16
 * values (2 bytes a value), 2 as the tied LM head's bf16 GEMM panels (its only copy). */
int ctrl_model_embedding_held_bf16(const ctrl_model *m);
/* The bytes of the bf16 panels decoding packed (the weights packed once for decoding and reused by
 * the training products of the same weights; a held base's are in ctrl_model_param_bytes). */
size_t ctrl_model_decode_panel_bytes(const ctrl_model *m);
size_t ctrl_model_param_bytes(const ctrl_model *m);
ctrl_status ctrl_model_place_like(ctrl_model *m, const ctrl_model *like);
ctrl_status ctrl_model_jsd_forward(ctrl_model *student, const ctrl_batch *batch, ctrl_model *teacher,
                                   const ctrl_jsd_args *args, float *jsd);
/* Log-probabilities and entropies of softmax(logits / temperature) from now on (1 by default);
 * the online trainers use their sampling temperature, as TRL. */
void ctrl_model_set_temperature(ctrl_model *m, float temperature);
/* Compute dtype of the layers' linear projections: CTRL_F32 (the default) or CTRL_BF16 — inputs and
 * weights rounded to bf16, products accumulated in fp32, as torch.autocast(bfloat16) runs them;
 * parameters, gradients, norms, attention and the fused head stay fp32. CTRL_ERR_UNSUPPORTED for
 * any other dtype. */
ctrl_status ctrl_model_set_compute_dtype(ctrl_model *m, ctrl_dtype dtype);
ctrl_dtype ctrl_model_compute_dtype(const ctrl_model *m);
/* bf16 compute where the device has no bf16 kernel now (a CPU without AVX-512 BF16 or AMX, or with
 * them turned off by CTRL_NO_AVX512BF16; the backend's bf16_kernel says): ROUNDED (the default) emulates
 * bf16 -- inputs rounded to bf16 values, fp32 SGEMM: bf16's numbers, no faster than fp32 --; FP32
 * multiplies the forwards' and backwards' linear products in plain fp32 instead (fp32's numbers at
 * fp32's speed; weights held as bf16 values keep them, only nothing more is rounded). Decoding keeps
 * bf16's products either way; a device with a bf16 kernel is not affected. */
typedef enum { CTRL_BF16_FALLBACK_ROUNDED = 0, CTRL_BF16_FALLBACK_FP32 = 1 } ctrl_bf16_fallback;
void ctrl_model_set_bf16_fallback(ctrl_model *m, ctrl_bf16_fallback fallback);
ctrl_bf16_fallback ctrl_model_bf16_fallback(const ctrl_model *m);
/* like's compute dtype and bf16 fallback onto m (a reference, value or teacher model beside a policy). */
ctrl_status ctrl_model_set_compute_like(ctrl_model *m, const ctrl_model *like);
/* Whoever changes the parameters in place (an optimizer step, loaded weights) says so: a model on a
 * device copies them there, and with bf16 compute the model keeps a rounded copy of them; both are
 * refreshed before the next forward or decode. */
void ctrl_model_weights_changed(ctrl_model *m);
/* Accumulates dL/dparams into the gradient buffer from dL/dlogp of the last forward (NULL after
 * ctrl_model_forward_fused). */
ctrl_status ctrl_model_backward(ctrl_model *m, const float *dlogp);
/* Attaches a memory strategy (NULL: none): its hooks run around each layer, and the layers it
 * recomputes keep only their input through the forward (activation checkpointing).
 * CTRL_ERR_NOMEM (and no strategy) when its per-layer flags cannot be allocated. */
ctrl_status ctrl_model_set_memory(ctrl_model *m, const ctrl_memory_ops *ops, ctrl_memory *mem);
/* A second set of layer hooks beside the memory strategy's (NULL: none), for the parameters' and
 * gradients' sharding (ZeRO-2/3, core/train/zero_layers.c): before_forward and before_backward run
 * first (before a recompute too), after_forward and after_backward last; after_backward runs once
 * more at the end of each backward with layer -1, every gradient written (the embeddings' last).
 * With ctrl_model_set_sharding_outer(m, 1) (after it; ZeRO-3's sliced embeddings and head):
 * before_forward / before_backward and after_forward run around each of their uses too, with layer
 * n_layers (the embeddings, and a tied head) or n_layers + 1 (an untied head) -- the lookup, the
 * head's forward (with its backward when fused), its backward, its statistics; after_backward never
 * with those. Without it (the default, reset by each ctrl_model_set_sharding) the hooks see the
 * layers only. */
ctrl_status ctrl_model_set_sharding(ctrl_model *m, const ctrl_memory_ops *ops, ctrl_memory *mem);
void ctrl_model_set_sharding_outer(ctrl_model *m, int on);
/* A hook around each layer of every decoding pass (ctrl_model_decode, ctrl_model_decode_all; NULL:
 * none): fn(ctx, l, 0) before layer l's forward, fn(ctx, l, 1) after it -- ZeRO-3's generation with
 * one layer gathered at a time (core/train/zero_generate.c). An error stops the pass. Around the
 * embedding lookup and the LM head it runs too, with layer n_layers (the embeddings; a tied head) and
 * n_layers + 1 (an untied head): a pass is embeddings, layers 0..n-1, head. */
typedef ctrl_status (*ctrl_model_layer_hook)(void *ctx, int layer, int after);
void ctrl_model_set_decode_hook(ctrl_model *m, ctrl_model_layer_hook fn, void *ctx);
/* ZeRO-3's sliced parameters and the bf16 copy (host models): the ranges [a, b) (n pairs,
 * ascending; NULL: none) that rounding the whole copy leaves out, their gathers rounding them with
 * ctrl_model_params_range_changed (parameters [off, off + n) changed: their part of the copy
 * re-rounded, when the model keeps a current one); ctrl_model_bf16_copy is the copy (the
 * parameters' layout; NULL when none), whose pages the sharding may release with the layer's. */
ctrl_status ctrl_model_set_round_skip(ctrl_model *m, const size_t *ranges, int n);
/* ZeRO-3 in bf16 on a device: the bf16 values of weight matrices held outside the model (`b16`,
 * indexed as the parameters, backend memory), valid within `ranges` (n pairs [a, b) in parameters,
 * ascending, each one matrix): the products read their 2-byte operands there and never the
 * parameters' fp32 values of those ranges. Returns 1 when the model's products take them (bf16
 * compute on a backend with 2-byte products, neither DoRA nor experts), else 0 with nothing set.
 * NULL / 0 unsets. The caller keeps b16 and ranges alive while set. */
int ctrl_model_set_device_b16(ctrl_model *m, const uint16_t *b16, const size_t *ranges, int n);
ctrl_status ctrl_model_params_range_changed(ctrl_model *m, size_t off, size_t n);
float *ctrl_model_bf16_copy(const ctrl_model *m);
/* Every layer recomputed, without a strategy plugin: the activations keep each layer's input and
 * one set of layer internals that all layers share -- for a model that only runs forwards (a frozen
 * reference), whose forward needs no more; a backward would still be right (it recomputes). */
ctrl_status ctrl_model_set_recompute_all(ctrl_model *m);
/* Frees the scratch of the last forward/backward (activations, the head's workspace, the backward's
 * buffers); the next forward allocates them again. For a model whose forwards are rare next to the
 * work between them (a frozen reference between the policy's passes), so that its scratch is not
 * held through the policy's backward and optimizer step. A backward now needs a new forward. */
void ctrl_model_release_scratch(ctrl_model *m);
/* The attention plugin decoding runs with (its paged_forward; the `paged` plugin): CTRL_ERR_PLUGIN
 * when `ops` has none. */
ctrl_status ctrl_model_set_paged_attention(ctrl_model *m, const ctrl_attention_ops *ops);
/* Frees decoding's scratch (allocated again by the next decode); for the engine's sleep level 2. */
void ctrl_model_release_decode_scratch(ctrl_model *m);
const ctrl_attention_ops *ctrl_model_paged_attention(const ctrl_model *m);
/* Incremental decoding (model_decode.c; on the model's backend, the cache on the same one):
 * n_new[s] tokens of sequence s (flat in
 * `tokens`, at positions seqs[s]->len onwards) run through the model; their K/V are appended to the paged
 * cache (blocks reserved as needed) and logits[s * V ...] receive the next-token logits after each sequence's
 * last new token. The paged attention plugin (ctrl_model_set_paged_attention) reads the cache through the
 * block tables. On a device backend logits may be NULL: the logits then stay in device memory,
 * [n_seq, V] at ctrl_model_decode_logits() until the next decode, without the final soft-capping
 * (the caller applies final_softcap: the device sampler does). */
ctrl_status ctrl_model_decode(ctrl_model *m, ctrl_kv_cache *c, ctrl_kv_seq *const *seqs,
                              const int32_t *tokens, const int *n_new, int n_seq, float *logits);
const float *ctrl_model_decode_logits(const ctrl_model *m);
/* The same for one sequence, with the logits after every one of its n new tokens: logits[n * V]
 * (scoring a prompt: the OpenAI prompt_logprobs). */
ctrl_status ctrl_model_decode_all(ctrl_model *m, ctrl_kv_cache *c, ctrl_kv_seq *seq, const int32_t *tokens,
                                  int n, float *logits);
/* Serving several LoRA adapters over one base (model/lora_bank.c; ctrl serve --lora): adds the PEFT
 * adapter directory DIR to the model's bank (plain LoRA; a DoRA or modules_to_save adapter, or a
 * model with its own adapters, is refused) and gives its id (1, 2, ...; 0 is the base).
 * ctrl_model_set_decode_adapters tells the next decode call (only that one) the adapter of each
 * of its sequences ([n_seq], 0: the base; NULL: every one the base): one call mixes them. */
ctrl_status ctrl_model_add_adapter(ctrl_model *m, const char *dir, int *id);
int ctrl_model_adapter_count(const ctrl_model *m);
/* Frees adapter `id`'s weights (ctrl serve's /v1/unload_lora_adapter): the id is not given again,
 * and a sequence still naming it decodes as the base -- the caller makes sure none does.
 * CTRL_ERR_RUNTIME for an id never given or already removed. */
ctrl_status ctrl_model_remove_adapter(ctrl_model *m, int id);
void ctrl_model_set_decode_adapters(ctrl_model *m, const int *adapter_of_seq);
/* Bytes of activations the model holds for the last forward's length. */
size_t ctrl_model_activation_bytes(const ctrl_model *m);
/* Bytes of the scratch kept between steps (the head's workspace and dL/d(head input), the backward's
 * buffers, the staging, the adapters' and experts' workspaces), and of the bf16-rounded copy of the
 * weights (0 when the model keeps none: model_dtype.c). For the run's memory report. */
size_t ctrl_model_scratch_bytes(const ctrl_model *m);
size_t ctrl_model_bf16_copy_bytes(const ctrl_model *m);
/* Activation offloading (TRL's activation_offloading; the offload_activations memory strategy):
 * the inputs of the layers the memory strategy recomputes leave the compute memory after each
 * layer's forward and come back just before its backward, the model keeping two slots for them
 * instead of one per layer; the gradients are the same bit for bit. On a device backend they go to
 * host memory; on a backend whose memory is host memory (the CPU) to a file (NVMe offload), made in
 * the directory ctrl_model_set_offload_dir names (NULL: $TMPDIR, else /tmp) and unlinked as soon
 * as it is made, so that nothing is left behind on exit or on a crash. CTRL_ERR_UNSUPPORTED when no
 * layer is recomputed. Set after the memory strategy; ctrl_model_offloaded_bytes: the bytes holding
 * them in host memory or the file (after a forward; 0 when none), *per_layer one layer's input. */
ctrl_status ctrl_model_set_offload_activations(ctrl_model *m, int on);
ctrl_status ctrl_model_set_offload_dir(ctrl_model *m, const char *dir);
/* 1 when the offloaded inputs are in page-locked host memory, copied on a side stream beside the
 * compute (a CUDA device; after a forward). */
int ctrl_model_offload_overlapped(const ctrl_model *m);
size_t ctrl_model_offloaded_bytes(const ctrl_model *m, size_t *per_layer);
/* Zeroes the gradients where they are computed (on a device, the device's: the host copy is left as it
 * is until ctrl_model_grads_to_host overwrites it). */
ctrl_status ctrl_model_zero_grad(ctrl_model *m);

/* Mixture of experts (model_moe.c): the load-balancing auxiliary loss of the last forward, as
 * transformers' load_balancing_loss_func computes it over every sparse layer's router:
 * aux = E sum_e (f_e) (P_e), f_e the share of the (token, layer) rows' top-k choices that went to
 * expert e, P_e the mean probability of e, both over the rows of the tokens `mask` keeps (NULL: all;
 * [T] of the last batch, as the attention mask of a padded batch). Arms the next backward to add
 * scale x d aux / d(router logits) to the routers' gradients (a trainer's coef / accumulation
 * steps). CTRL_ERR_RUNTIME on a dense model or before a forward. */
ctrl_status ctrl_model_moe_aux_loss(ctrl_model *m, const uint8_t *mask, float scale, double *aux);

/* Sequence classification (model_score.c; a model whose config has num_labels > 0, as transformers'
 * *ForSequenceClassification): the trunk's final hidden states times `score` [num_labels, hidden]
 * (no bias), read at one token per sequence -- transformers' rule, ctrl_model_score_index -- and no
 * LM head computed at all. */
/* A classifier from DIR: its config.json's *ForSequenceClassification with score.weight, or a
 * causal LM's trunk under a new score of num_labels rows initialised as transformers does (normal,
 * std = initializer_range, from `seed`); num_labels must match a classifier's. */
ctrl_status ctrl_model_load_classifier(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                       uint64_t seed, ctrl_model **out);
/* The same under LoRA adapters (lora; NULL: none), PEFT's task_type SEQ_CLS: the base frozen, the
 * score trained in full beside the adapters (a modules_to_save), its first value DIR's or the new
 * one's. */
ctrl_status ctrl_model_load_classifier_lora(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                            uint64_t seed, const struct ctrl_lora_config *lora,
                                            ctrl_model **out);
/* The same without adapters reading only the ranges `parts` gives (ctrl_model_load_part: ZeRO-3's
 * slices; a fresh score head is initialised whole, as ctrl_model_load_classifier's). */
ctrl_status ctrl_model_load_classifier_part(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                            uint64_t seed, ctrl_model_parts_fn parts, void *ctx,
                                            ctrl_model **out);
/* Under LoRA adapters (ctrl_model_load_classifier_lora) reading the ranges `parts` gives and, with
 * QLoRA, the NF4 spans `nf4_parts` gives (ctrl_model_load_lora_part). */
ctrl_status ctrl_model_load_classifier_lora_part(const char *dir, const ctrl_attention_ops *attn,
                                                 int num_labels, uint64_t seed,
                                                 const struct ctrl_lora_config *lora,
                                                 ctrl_model_parts_fn parts, ctrl_model_nf4_parts_fn nf4_parts,
                                                 void *ctx, ctrl_model **out);
/* The token of a sequence its score is read at: the last one that is not pad_token_id (the
 * rightmost non-pad token; 0 when all are pad), or the last one when the config has no pad token --
 * what transformers does on a padded row holding this sequence. */
int ctrl_model_score_index(const ctrl_model *m, const int32_t *tokens, int len);
/* The pad token the rule skips (-1: none); saved in config.json, as TRL sets the model's. */
void ctrl_model_set_pad_token_id(ctrl_model *m, int pad_token_id);
/* scores[b * num_labels + k] for each sequence b of the batch (its targets are not read; may be NULL);
 * keeps what ctrl_model_score_backward needs. */
ctrl_status ctrl_model_score_forward(ctrl_model *m, const ctrl_batch *batch, float *scores);
/* Accumulates dL/dparams (score and trunk) from dL/dscores [B * num_labels] of the last score forward. */
ctrl_status ctrl_model_score_backward(ctrl_model *m, const float *dscores);
/* The same with the n read positions given (flat token indices into the batch: a layout whose
 * sequences carry pad segments of their own, as the preference batches' `last`). */
ctrl_status ctrl_model_score_forward_at(ctrl_model *m, const ctrl_batch *batch, int n, const int32_t *at,
                                        float *scores);
ctrl_status ctrl_model_score_backward_at(ctrl_model *m, int n, const int32_t *at, const float *dscores);

#endif
