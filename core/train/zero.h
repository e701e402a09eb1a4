/* ZeRO in the shared step loop (issue 19; the `zero1`, `zero2` and `zero3` memory strategies
 * declare the stage, plugins/memory/zero/), with DeepSpeed's meaning (stage_1_and_2.py, stage3.py):
 *
 * The trainable floats of the model (ctrl_model_grads' layout: all parameters, or the LoRA adapters)
 * are cut into units -- stages 1 and 2: one, the whole buffer; stage 3: each layer's parameters
 * (consecutive in the buffer), and the runs between them (embeddings, final norm, head) -- and each
 * unit into N consecutive slices of ceil(L / N) floats (the last one shorter), slice r being rank
 * r's. Each rank creates its optimizer on the parameter groups clipped to its slices
 * (train_zero_shard_groups), so it holds 1/N of the optimizer state (AdamW: exp_avg, exp_avg_sq).
 * A step: the gradients are averaged over the ranks -- all-reduced (stage 1) or reduce-scattered
 * (stages 2 and 3: each rank receives its slices' average only) --, the global gradient norm is the
 * ranks' slices' sums of squares added up (DeepSpeed's partitioned norm), clipping scales the
 * slices, the rank's optimizer steps them, and the updated slices are all-gathered into every
 * rank's model -- with stage 3 only the units outside the layers: a layer's parameters stay sliced,
 * each rank's memory holding its own slice, and are all-gathered just before the layer's forward and
 * again before its backward (train_zero_attach: the model's layer hooks), the other ranks' slices
 * released (madvise) after each -- on the CPU the pages of a small pool moved onto them for each use
 * and back after (zero_layers.c), so that no gather faults them again. The loss curve is plain data
 * parallel's.
 *
 * Checkpoints: the model is gathered whole (stage 3 on the CPU: the saves stream each layer to
 * rank 0 alone instead, and with LoRA gather the adapters alone, zero_save.c), rank 0 writes it; the
 * optimizer state stays sharded, one file per rank (optimizer.rank-R.safetensors, as DeepSpeed's
 * per-rank zero_pp_rank_R files), which rank 0 writes from what each rank sends it (one rank's
 * slices in memory at a time); a resume reads each rank's own file and needs the same number of
 * ranks and stage 3 or not as the checkpoint (the slices differ), zero1 and zero2 resuming each other.
 *
 * On a CUDA model stage 2 partitions the gradients on the device as on the CPU (zero_device.c: NCCL
 * reduce-scatters per bucket during the backward, the slices' sums and the optimizer state in device
 * memory, the slices all-gathered over NCCL after the step); stage 1, and stage 2 with
 * offload_optimizer, step on the host (the gradients brought back first, the state in host memory,
 * the weights copied back to the device after the gather). Stage 3 keeps each rank's slices on the
 * device (with offload_optimizer their fp32 masters and the optimizer's state on the host, the step
 * there) and gathers a layer over NCCL into device memory mapped for its use, unmapped after
 * (zero_device.c; SFT in fp32, or bf16 with the layers gathered as bf16 and fp32 master slices; with
 * LoRA each layer's frozen base sliced and gathered with its adapters, in bf16 held as bf16 only; a
 * frozen model beside it -- DPO's reference, GKD's teacher, zero_ref.c -- sliced and gathered the same
 * way, forward only). */
#ifndef CTRL_CORE_TRAIN_ZERO_H
#define CTRL_CORE_TRAIN_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include <ctrl/memory.h>
#include <ctrl/optimizer.h>

#include "model/model.h"

typedef struct train_zero_unit {
    size_t a, b; /* in trainable floats */
    /* stage 3: the layer whose parameters these are (gathered per use); -2: the embeddings' or an
     * untied LM head's (sliced too, gathered around each use: slots n_layers, n_layers + 1); else -1
     * (kept whole: the final norm, a score head) */
    int layer;
} train_zero_unit;

/* A run of a sliced range (stage3_param_persistence_threshold, zero_persist.c): `u` in parameters,
 * cut as the range `of` is, each rank's slice clipped to u (some ranks' empty). */
typedef struct train_zero_run {
    train_zero_unit u, of;
} train_zero_run;

#define TRAIN_ZERO_OUTER (-2) /* train_zero_unit.layer of the sliced units outside the layers */

typedef struct train_zero {
    int stage; /* 0: off (everything below unused); 1, 2 or 3 */
    int rank, size;
    size_t total;           /* trainable floats */
    size_t first;           /* ctrl_model_trainable_offset: where they start in the parameters */
    train_zero_unit *units; /* in order, covering [0, total) */
    int n_units;
    int *counts; /* scratch: one unit's slice lengths, per rank */
    /* partitioned: each layer's unit (stage 2: its bucket's), -1 when none; stage 3 indexes it (and
     * frozen, state, pending) by slot: the layers, then n_layers the embeddings (and a tied head),
     * n_layers + 1 an untied LM head -- the model's hook indices (ctrl_model_set_sharding) */
    int *layer_unit;
    int n_slots;        /* stage 3: n_layers + 2, else n_layers */
    int gathered;       /* stage 3: every layer is whole (train_zero_gather_all) */
    long whole_gathers; /* stage 3: train_zero_gather_all's gathers of the whole model so far */
    ctrl_model *model;  /* whose gradients the hooks reduce, whose layers stage 3 gathers */
    /* partitioned (stage 2 on the CPU, stage 3): the gradients are reduce-scattered during the
     * backward, bucket by bucket (reduce_bucket_size floats, `bucket`), and each rank keeps only its
     * slices' sums over the step's micro-batches in `acc` (acc_off[u]: where unit u's slice
     * starts); closes[l]: layer l's backward completes a bucket (its lowest layer) */
    int partitioned;
    size_t bucket;
    char *closes;
    float *acc;
    size_t *acc_off, acc_n;
    ctrl_memory *hooks; /* partitioned: the instance the model's hooks get */
    int measure;        /* while set: grad_peak follows the gradient buffer's resident bytes */
    size_t grad_peak;   /* the most seen just before a bucket's reduction */
    int lent;           /* stage 3: gathered by train_zero_whole, released by it */
    /* stage 3 with LoRA: each layer's frozen base parameters ([a, b) in parameters, not trainable
     * floats; layer -1: none), sliced and gathered with the layer, never reduced or stepped */
    train_zero_unit *frozen;
    /* stage 3: the sliced parameter ranges (pairs, in parameters) the model's bf16 copy leaves to
     * the gathers (ctrl_model_set_round_skip) */
    size_t *skip;
    int n_skip;
    /* stage 3's prefetch: prefetch_bucket_size floats of the next layers' gathers started ahead;
     * state[l]: 0 sliced, 1 gathers in flight (pending[2l], pending[2l + 1]), 2 whole */
    size_t prefetch;
    char *state;
    void **pending;
    long prefetched;   /* layers prefetched so far */
    int save_held;     /* the streamed save: the layer whole on rank 0 now, or -1 */
    long save_gathers; /* the streamed save: layers gathered to rank 0 */
    int save_open;     /* the streamed save: rank 0 has not yet told the others it ended */
    int push_streamed; /* server mode's push: streamed as a save (train_zero_push), not gathered whole */
    long pushes;       /* server mode's pushes streamed so far */
    /* overlap_comm: a bucket's reduce-scatters started and left in flight while the backward goes
     * on, finished when the next bucket closes or the backward ends (n_flight of them: units, handles) */
    int overlap;
    int *flight_u, n_flight;
    void **flight_h;
    /* overlap_comm's log: reductions started, and the sum over the layers' backwards of how many were
     * still in flight (started, not finished) when the layer's backward began */
    long flight_started, flight_behind;
    /* stage 2 on a CUDA model (zero_device.c): the model's backend, `acc` in its memory, the
     * reductions and gathers over NCCL on its buffers; NULL on the host */
    const struct ctrl_backend_ops *dev;
    /* stage 3 on a CUDA model: the device's parameters and gradients in ranges mapped piece by piece
     * (zero_device.c), what is not this rank's nor in use unmapped */
    struct zero_vm *vm_params, *vm_grads;
    /* its sliced units outside the layers (the embeddings, an untied head): whether unit u's
     * gradients are mapped now -- from the first use in a backward (the head's, before layer 0's for
     * the lookup's) to the unit's reduce-scatter at the backward's end */
    char *grads_in;
    /* stage 3 on a CUDA model in bf16 ([train] dtype = bf16, DeepSpeed's bf16 + ZeRO-3): the layers'
     * fp32 master slices kept apart (`master`: the layer units' slices, acc's layout from acc_off
     * master_lo on, master_n floats), stepped by the optimizer; their bf16 values in vm_b16 (2 bytes a
     * parameter, this rank's slices mapped for the run, refreshed after each step), all-gathered as
     * bf16 for a layer's forward and backward and widened into the parameters (which then hold bf16
     * values); fp32_gather: the gathers of train_zero_gather_all (a save, an evaluation, generation)
     * send the fp32 masters instead; held16[l]: how the latest gather of layer l holds vm_b16 pieces */
    int b16, fp32_gather;
    /* stage 3 on a CUDA model with offload_optimizer: the optimizer steps this rank's fp32 slices in
     * host memory (the host's parameters: the masters, its state there too) on `hacc`, the slices'
     * sums brought back from `acc` after the backward; the updated slices are copied to the device
     * after the step (in bf16 through `acc`, then rounded into vm_b16; `master` unused) -- or, with
     * the host step overlapped (`ov`, offload_overlap.c: [memory] offload_overlap), unit by unit as
     * stepped, each before its gather in the next forward */
    int host_step;
    struct train_offload *ov;
    float *hacc;
    float *master;
    size_t master_lo, master_n;
    struct zero_vm *vm_b16;
    char *held16;
    /* b16_direct: the products read the gathered layers' weight matrices (`mat`, n_mat pairs [a, b)
     * in parameters, ascending) as bf16 straight from vm_b16 (ctrl_model_set_device_b16), so a
     * layer's gather for its forward or backward maps and widens into fp32 only the rest of its range
     * (norm weights, biases): 2 bytes a matrix parameter in use instead of 2 + 4 */
    int b16_direct;
    size_t *mat;
    int n_mat;
    /* stage 3 on the CPU, [memory] stage3_param_persistence_threshold (`persist` elements, 0: none):
     * the views of fewer elements inside the sliced ranges stay whole on every rank (DeepSpeed's
     * persistent parameters: never released nor re-gathered around a use; their gradients reduced
     * and their optimizer state sliced as the others'). runs[run_at[l] .. run_at[l + 1]): slot l's
     * ranges gathered and released around each use (train_zero_run: cut as their sliced range), the
     * sliced ranges less the persistent views (threshold 0: the ranges themselves); kept[0 .. n_kept):
     * the persistent views (in parameters, cut as their sliced range), the trainable ones all-gathered
     * together once after each step (kept_buf: kept_n floats, rank r's pieces at block r, kept_counts
     * its length); the frozen ones (LoRA's base) once at attach. n_persist views, persist_bytes. */
    size_t persist;
    train_zero_run *runs;
    int *run_at, n_runs;
    int *run_views; /* views in slot l's runs (what a gather of it fetches) */
    train_zero_run *kept;
    int n_kept, n_persist;
    size_t kept_n, persist_bytes;
    int *kept_counts;
    float *kept_buf;
    /* the parameter all-gathers since train_zero_gather_counts last read them: collectives, the views
     * and the floats they fetched (the layers' uses, the units outside them, the persistent views') */
    long gathers, gather_views;
    double gather_floats;
    /* stage 3 on the CPU: the pages reused by the gathers (zero_layers.c): `pool` lends its pages to the
     * released ranges of the layers in use, `gpool` to the layers' gradients during their backward;
     * NULL when off (CTRL_TEST_ZERO3_REFAULT=1, a device) */
    struct page_pool *pool, *gpool; /* page_pool.h */
    /* stage 3 over a QLoRA base, several ranks (zero_nf4.c; a CUDA model's in device memory): this rank's
     * slices of every layer's NF4 weights, a layer's gathered whole into the model's store by need_layer and
     * freed by its release; NULL otherwise */
    struct zero_nf4 *nf4;
} train_zero;

/* Rank r's slice [*lo, *hi) of unit u (in trainable floats), and every rank's slice length of unit
 * u (in z->counts, returned). */
void train_zero_slice(const train_zero *z, int u, int r, size_t *lo, size_t *hi);
const int *train_zero_counts(train_zero *z, int u);
/* A run's slice for rank r (its range's slice clipped to it), and every rank's (in z->counts). */
void train_zero_run_cut(const train_zero *z, const train_zero_run *run, int r, size_t *lo, size_t *hi);
const int *train_zero_run_counts(train_zero *z, const train_zero_run *run);
/* The same for any range cut in N (u.a, u.b in its own indexing). */
void train_zero_cut(const train_zero *z, train_zero_unit u, int r, size_t *lo, size_t *hi);
const int *train_zero_cut_counts(train_zero *z, train_zero_unit u);
/* Stage 3: the bytes of the sliced parameters (the layers', the embeddings' and an untied head's:
 * the units sliced between uses), less the persistent views' (persist_bytes, whole on every rank). */
size_t train_zero_layer_bytes(const train_zero *z);
/* Stage 3 slices the views outside the layers that are the largest tensors at any real vocabulary
 * -- the embeddings (0) and an untied LM head (1) -- as a layer, as DeepSpeed partitions any
 * parameter above stage3_param_persistence_threshold; -1 for any other view (the final norm, a
 * score head: kept whole, small). */
int train_zero_outer_index(const ctrl_param_view *v);
/* Lays out the units and slices of the model's trainable floats (stage 0: nothing); `bucket`:
 * [memory] reduce_bucket_size, `prefetch` prefetch_bucket_size (floats), `overlap` overlap_comm,
 * `host_step` offload_optimizer (a CUDA model's zero2 steps on the host, unpartitioned; its zero3
 * partitions on the device and steps the slices on the host). An error when a slice offset does not fit MPI's
 * int counts (more than 2^31 - 1 trainable floats). */
ctrl_status train_zero_init(train_zero *z, int stage, ctrl_model *m, size_t bucket, size_t prefetch,
                            int overlap, int host_step);
void train_zero_free(train_zero *z);
/* Stage 3 on several ranks (zero_load.c): the model of DIR (config.json, its safetensors files, no
 * adapters nor score head) with only this rank's slices of the layers, the embeddings and an untied
 * head read (the rest of them zero, untouched), the final norm whole; the same on every rank, no
 * broadcast needed. */
ctrl_status train_zero_load(const char *dir, const ctrl_attention_ops *attn, ctrl_model **out);
/* The same for a sequence classifier of num_labels (ctrl_model_load_classifier: a causal LM's trunk
 * under a fresh score head seeded by `seed`, kept whole on every rank; PPO's value model): this
 * rank's slices read, the rest whole. */
ctrl_status train_zero_load_classifier(const char *dir, const ctrl_attention_ops *attn, int num_labels,
                                       uint64_t seed, ctrl_model **out);
/* Stage 3 on the CPU: the views of fewer than `threshold` elements inside the sliced ranges kept whole
 * on every rank ([memory] stage3_param_persistence_threshold; call after train_zero_init, before
 * train_zero_attach; 0, the default, none). */
void train_zero_set_persistence(train_zero *z, size_t threshold);
/* Stage 3, from train_zero_attach (zero_persist.c): the runs and the persistent pieces laid out; after
 * each step (train_zero_gather_params; all = 1: at attach, the frozen base's too) the ranks' slices of
 * the persistent views all-gathered in one collective. */
ctrl_status train_zero_make_runs(train_zero *z, ctrl_model *m);
ctrl_status train_zero_gather_kept(train_zero *z, int all);
/* A layer-by-layer phase whose gathers send the fp32 masters (on: an evaluation or a generation phase
 * on a CUDA model in bf16) begins or ends: fp32_gather set or cleared, and the persistent views of a
 * model in bf16 given the values to match (the masters, or their bf16 values; a collective). */
ctrl_status train_zero_fp32_phase(train_zero *z, int on);
/* The parameter all-gathers counted since the last call (collectives, views, floats), then zeroed. */
void train_zero_gather_counts(train_zero *z, long *gathers, long *views, double *floats);
/* Partitioned stages: hooks the model's layers (the buckets' reductions after the backward; stage
 * 3: gather before forward and backward, release after), zeroes and releases the model's gradient
 * buffer, and (stage 3) releases the other ranks' slices of every layer. Nothing for stage 1 and a
 * CUDA model's stage 2. */
ctrl_status train_zero_attach(train_zero *z, ctrl_model *m);
/* Stage 3: a second, frozen model laid out by its own train_zero_init (DPO's and KTO's reference, GKD's
 * teacher, zero_ref.c) hooked forward-only -- each layer, the embeddings and an untied head
 * gathered around each use and released after, as the policy's forward; never a backward, no
 * reduction, no gradients -- and its other ranks' slices released (on a CUDA model: its pieces
 * unmapped, zero_device.c). While z->measure is set, each use's end records the parameters' resident
 * bytes (a device's: mapped), the most seen, in z->grad_peak. */
ctrl_status train_zero_attach_frozen(train_zero *z, ctrl_model *m);
/* Stage 3 on the CPU: the reused pages' counts since attach logged (rank 0; after the first step). */
void train_zero_pool_report(const train_zero *z);
void train_zero_pool_free(train_zero *z);
/* The groups (set over the whole model) clipped to this rank's slices, in place, those outside
 * dropped; returns how many are left. */
int train_zero_shard_groups(const train_zero *z, ctrl_model *m, ctrl_param_group *groups, int n);
/* After the kind accumulated: the gradients averaged (this rank's slices at least, see above) on
 * the host and their global sum of squares. */
ctrl_status train_zero_reduce_grads(train_zero *z, ctrl_model *m, double *sum_sq);
/* Before a step's micro-batches: the gradients zeroed (partitioned: this rank's slices' sums; the
 * model's are zeroed and released after each backward's reductions). */
ctrl_status train_zero_zero_grad(train_zero *z, ctrl_model *m);
/* Clipping: the slices' gradients times `coef`. */
ctrl_status train_zero_scale_grads(const train_zero *z, ctrl_model *m, float coef);
/* After the optimizer stepped the slices: every rank's slices into every rank's model (stage 3:
 * those of the units outside the layers). */
ctrl_status train_zero_gather_params(train_zero *z, ctrl_model *m);
/* Stage 3 (no-ops otherwise): every layer gathered whole on every rank (a collective: every rank
 * calls it), for what reads the whole model -- an evaluation (each rank its share), a save, the weights'
 * checksum; then released again. */
ctrl_status train_zero_gather_all(train_zero *z);
void train_zero_release_all(train_zero *z);
/* Rank 0, zero3 on several ranks: how many times the run gathered the whole model on every rank (an
 * evaluation, generation gathered whole, a save or push not streamed), in the log. */
void train_zero_whole_report(const train_zero *z);
/* Stage 3: layer l's sliced ranges in the parameters (its trainable unit's, LoRA's frozen base's),
 * and layer l released (the other ranks' slices handed back to the system). (zero_layers.c) */
int train_zero_layer_ranges(const train_zero *z, int l, train_zero_unit out[2]);
/* Stage 3, a forward outside the model's layer hooks (a decoding pass, zero_generate.c): before
 * layer l (after = 0) l gathered and the next layers' gathers started as the training forward's
 * hooks do (prefetch_bucket_size); after it (after = 1) l released. */
ctrl_status train_zero_forward_layer(train_zero *z, int l, int after);
void train_zero_release_layer(train_zero *z, int l);
/* Stage 3 over a QLoRA base (zero_nf4.c; no-ops without one, on one rank, and for a layer already
 * whole / released): init (from train_zero_init) slices the model's NF4 store, each rank keeping its
 * super-blocks of every weight and freeing the rest; gather rebuilds layer l's weights whole in the
 * store (a collective: every rank gathers the same layers in the same order, as the hooks do);
 * release frees them again (waiting for a prefetch's gathers first); free drops the slices (never touching
 * the model, which may be gone). */
ctrl_status train_zero_nf4_init(train_zero *z, ctrl_model *m);
ctrl_status train_zero_nf4_gather(train_zero *z, int l);
/* A streamed save's (zero_save.c): layer l's weights rebuilt whole in rank 0's store alone, the other
 * ranks sending their pieces (their store unchanged); a layer whole or in flight already: as
 * train_zero_nf4_gather (on every rank alike). A collective. */
ctrl_status train_zero_nf4_gather_root(train_zero *z, int l);
/* The prefetch: layer l's NF4 gathers started (completed by train_zero_nf4_gather), and the floats'
 * worth of its NF4 bytes (what prefetch_bucket_size counts in flight; 0 without an NF4 store). */
ctrl_status train_zero_nf4_start(train_zero *z, int l);
size_t train_zero_nf4_floats(const train_zero *z, int l);
void train_zero_nf4_release(train_zero *z, int l);
void train_zero_nf4_free(train_zero *z);
/* The NF4 bytes this rank holds now (its slices, the layers whole) and the layers gathered so far,
 * logged by rank 0 (the largest over the ranks; a collective). */
ctrl_status train_zero_nf4_report(train_zero *z);
/* ZeRO-3's sliced loading, the loader's callbacks (train_zero_load's; ctrl_model_load_part /
 * ctrl_model_load_lora_part): the ranges of parameters this rank keeps once train_zero_attach
 * slices the model (with LoRA: its slices of the frozen base's ranges too, the adapters' ranges made at
 * load), and QLoRA's: this rank's values of each NF4 weight, as train_zero_nf4_init cuts them
 * (train_zero_nf4_spans; spans [2 x n_layers x 7], by store index); ctx unused (NULL). */
ctrl_status train_zero_rank_parts(const ctrl_model *m, void *ctx, size_t **ranges, int *n);
ctrl_status train_zero_rank_nf4_parts(const ctrl_model *m, void *ctx, int64_t *spans);
ctrl_status train_zero_nf4_spans(const ctrl_model *m, int rank, int size, int64_t *spans);
/* Tests (CTRL_TEST_ZERO3_DIGEST): after train_zero_attach, the model gathered whole from the ranks'
 * slices (train_zero_gather_all; released again after) and hashed -- every parameter, QLoRA's NF4 store
 * -- logged by rank 0 with whether every rank's hash agrees (a collective): the same whether the model
 * was read sliced or whole, a slice not read or read wrong showing as a different hash. */
ctrl_status train_zero_digest(train_zero *z, ctrl_model *m);
/* Stage 3's saves (the final one and checkpoint-N's model) streamed to rank 0 (zero_save.c): 1 when
 * it applies -- several ranks, a CPU model without LoRA, every layer sliced; else the save gathers
 * the whole model on every rank first (train_zero_gather_all). Then, on every rank:
 * train_zero_save_begin; rank 0 saves the model (ctrl_model_save_sharded: each layer gathered to it
 * alone when the writer reaches it) and calls train_zero_save_end (whatever the save returned; a
 * second call does nothing), while the others call train_zero_save_serve, which sends their slices
 * until rank 0's end. */
int train_zero_save_streams(const train_zero *z);
/* A LoRA run's save under stage 3 on the CPU (the same conditions, with LoRA): 1 when the save needs
 * the adapters only -- train_zero_gather_adapters all-gathers each layer's trainable range (the
 * adapters: a few floats a layer), never the frozen base's slices; train_zero_release_all after. */
int train_zero_save_adapter_only(const train_zero *z);
ctrl_status train_zero_gather_adapters(train_zero *z);
void train_zero_save_begin(train_zero *z);
ctrl_status train_zero_save_end(train_zero *z);
ctrl_status train_zero_save_serve(train_zero *z);
/* After it, on every rank (a collective): rank 0 logs the layers gathered to it for `what` (the
 * model, checkpoint-N's model) and each rank's peak resident memory (VmHWM) so far. */
void train_zero_save_report(train_zero *z, const char *what);
/* The checkpoint's hook (ctrl_checkpoint_shards.model_written, user the train_zero): the save's end. */
ctrl_status train_zero_save_model_written(void *user);
/* The kinds' whole_weights (kind.h; `ctx` the train_zero): on = 1 gathers every layer unless it is
 * already (then on = 0 leaves it to whoever gathered), on = 0 releases what on = 1 gathered. */
ctrl_status train_zero_whole(void *ctx, int on);
/* Server mode's push (ctrl_remote_server.whole, `ctx` the train_zero), on every rank: where the
 * weights can stream to rank 0 as a save's do (several ranks, a CPU model, every layer sliced; with
 * LoRA too -- the merged file's writer reaches each layer's base and adapters --, and over a QLoRA
 * base, each layer's NF4 weights all-gathered with its adapters and freed with them), on = 1 opens it (rank
 * 0: the model's save hooked; the others serve their slices until rank 0's on = 0), on = 0 closes it and logs
 * the layers gathered; else train_zero_whole. */
ctrl_status train_zero_push(void *ctx, int on);
/* A hash of how the slices are cut (the ranks, the units' bounds), which a checkpoint's sharded
 * optimizer state must share to resume; 0 without ZeRO. */
uint64_t train_zero_layout(const train_zero *z);
/* The bytes of [p, p + bytes) resident in memory (mincore), this process's. */
size_t train_zero_resident(const void *p, size_t bytes);
/* The optimizer state's bytes (state_get's buffers) on this rank. */
size_t train_zero_state_bytes(const ctrl_optimizer_ops *ops, ctrl_optimizer *opt);
/* Logs (rank 0) the optimizer state per rank, the largest and the sum over the ranks. */
ctrl_status train_zero_report(const train_zero *z, const char *optimizer, const ctrl_optimizer_ops *ops,
                              ctrl_optimizer *opt);
/* Stage 2 on a CUDA model (zero_device.c): whether a run partitions on the device; its init (after
 * the units: `acc` in device memory, the NCCL communicator), free; a unit's reduce-scatter into the
 * sums (the unit's gradients zeroed; `handle`: the one train_zero_device_start_unit queued, waited
 * for; NULL: reduced now); the sums' global sum of squares; the slices all-gathered into
 * every rank's device parameters; the groups' parameters moved to the device's (after
 * train_zero_shard_groups, whose gradients are `acc`'s already). */
int train_zero_wants_device(int stage, ctrl_model *m, int host_step);
ctrl_status train_zero_device_init(train_zero *z, ctrl_model *m);
void train_zero_device_free(train_zero *z);
ctrl_status train_zero_device_finish_unit(train_zero *z, int u, void *handle);
/* overlap_comm: unit u's reduce-scatter queued on the communication stream (*handle), finished by
 * train_zero_device_finish_unit(z, u, *handle) -- which makes the compute stream wait for it --
 * after later layers' backwards were queued. */
ctrl_status train_zero_device_start_unit(train_zero *z, int u, void **handle);
ctrl_status train_zero_device_sum_squares(train_zero *z, double *sum_sq);
ctrl_status train_zero_device_gather(train_zero *z, ctrl_model *m);
/* zero3 with offload_optimizer overlapped (offload_overlap.c, `ov`): unit u's slice, stepped on the
 * host, queued for the device on the upload stream (backend.h's upload_copy, event u) -- into the
 * device's parameters, or in bf16 into its fp32 master staging in `acc` --; and once the compute
 * stream waited for it, unit_ready: its bf16 slice refreshed, its gradient sums zeroed for the next
 * backward (train_zero_zero_grad leaves them while a round is in flight), a unit kept whole (the
 * final norm) all-gathered (a collective: called in the same order on every rank). */
ctrl_status train_zero_device_upload_unit(train_zero *z, int u);
ctrl_status train_zero_device_unit_ready(train_zero *z, int u);
/* Zero3 on a CUDA model whose host parameters were read anew (a resume): this rank's slices put on
 * the device from the host's values, and what every rank keeps whole gathered as after a step. A
 * collective. */
ctrl_status train_zero_device_reload(train_zero *z, ctrl_model *m);
void train_zero_device_groups(const train_zero *z, ctrl_model *m, ctrl_param_group *groups, int n);
/* Stage 3 on a CUDA model (zero_device.c): init (after the units: the device's parameters and
 * gradients moved into ranges mapped piece by piece, this rank's slices and the final norm pinned,
 * the rest unmapped) and free; a range of the parameters (in parameters) mapped and
 * all-gathered -- on the side stream when `handle` is given, completed by
 * ctrl_collective_device_allgather_wait; `counts`: every rank's piece, NULL for the range's own cut
 * (a run of a persistence threshold passes its range's, train_zero_run_counts) --, released (unmapped
 * once nothing else in its pieces is
 * in use); unit u's gradients mapped (zeroed) for its backward (a unit outside the layers: once
 * until its reduce-scatter, grads_in); the bytes mapped now and at most
 * since the last call (parameters, gradients: out[0..3] = now, peak, now, peak), the piece. */
ctrl_status train_zero_device3_init(train_zero *z, ctrl_model *m);
void train_zero_device3_free(train_zero *z);
ctrl_status train_zero_device_gather_range(train_zero *z, train_zero_unit u, const int *counts,
                                           void **handle);
/* stage3_param_persistence_threshold on a CUDA model (from train_zero_attach, after the runs): the
 * persistent views' pieces mapped for the run (in bf16 a layer's bf16 values too) and their values
 * all-gathered whole on every rank's device (train_zero_gather_kept, over NCCL; after each step again
 * for the trainable ones, from train_zero_device_gather). In bf16 a layer's persistent piece holds
 * its bf16 values widened, as a gathered layer's rest does (so a threshold changes no number), and
 * its fp32 masters while the model is gathered whole (train_zero_gather_all: a save, a generation
 * phase). kept_part: this rank's part [lo, hi) (in parameters) of a layer's persistent piece into dst
 * (device memory): its bf16 slice widened, or with fp32_gather a trainable one's masters; kept_b16:
 * the piece's bf16 values from its fp32 ones, whole. */
ctrl_status train_zero_device_keep(train_zero *z);
/* Whether range u is held in bf16 (zero3 in bf16 on a device): a layer's, trainable or LoRA's frozen
 * base; the embeddings and head (their slots past the layers), trainable or frozen, are fp32. */
int train_zero_in_b16(const train_zero *z, train_zero_unit u);
ctrl_status train_zero_device_kept_part(train_zero *z, train_zero_unit piece, size_t lo, size_t hi,
                                        float *dst);
ctrl_status train_zero_device_kept_b16(train_zero *z, train_zero_unit piece);
ctrl_status train_zero_device_release_range(train_zero *z, train_zero_unit u);
ctrl_status train_zero_device_grads_in(train_zero *z, int u);
size_t train_zero_device_mapped(train_zero *z, double out[4]);
/* zero3 in bf16 on a CUDA model: a prefetched range's gather completed (the compute stream waited):
 * its bf16 values widened into the parameters (queued on the compute stream); no-op otherwise. And
 * the bf16 range's bytes mapped now and at most since the last call (out[0], out[1]). */
ctrl_status train_zero_device_gathered(train_zero *z, train_zero_unit u);
/* zero3 on a CUDA model: the device memory held now for the parameters (mapped; in bf16 their bf16
 * values mapped and the fp32 master slices too), in bytes -- a frozen model's resident bytes (zero_ref.c). */
size_t train_zero_device_resident(const train_zero *z);
/* TR-DPO's sync of a frozen reference sliced on the device (zero_ref.c's train_zero_ref_mix): each of
 * its slices (its masters in bf16, their bf16 values refreshed) = (1 - alpha) x its own + alpha x
 * the policy's same slice (`pz`: the policy's train_zero, cut alike), on the device; no collective. */
ctrl_status train_zero_device_mix(train_zero *z, train_zero *pz, float alpha);
void train_zero_device_b16_mapped(train_zero *z, double out[2]);
/* A checkpoint save: ranks other than 0 send their optimizer state to rank 0 (call while rank 0 is
 * in ctrl_checkpoint_save, which receives it with train_zero_write_shard). */
ctrl_status train_zero_send_state(const train_zero *z, const ctrl_optimizer_ops *ops, ctrl_optimizer *opt);
/* Rank 0: receives rank `rank`'s optimizer state and writes it to `path` (safetensors, the names
 * optimizer.safetensors has). `user` is the train_zero. */
ctrl_status train_zero_write_shard(void *user, int rank, const char *path);

#endif
