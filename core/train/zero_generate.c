/* ZeRO-3's generation phases, the whole model gathered or one layer at a time (see zero_generate.h). */
#include <ctrl/log.h>

#include "collective/collective.h"
#include "train/memory_report.h"
#include "train/zero_generate.h"

/* Passes of each phase whose resident parameters are measured (the first pass holds what every
 * later one does: the same layers gathered the same way; mincore costs a page walk each layer). */
#define MEASURED_PASSES 4

void train_zero_gen_init(train_zero_gen *g, train_zero *z, int layerwise) {
    *g = (train_zero_gen){.z = z, .layerwise = layerwise};
}

/* This rank's parameter bytes resident now: the host's pages of the parameters, or on a CUDA model
 * the device memory mapped for them. */
static double resident(train_zero *z) {
    if (z->dev) {
        double v[4];
        train_zero_device_mapped(z, v);
        return v[0];
    }
    size_t n = 0;
    const float *p = ctrl_model_params(z->model, &n);
    return (double)train_zero_resident(p, n * sizeof *p);
}

/* The parameters' resident bytes and the process's (VmRSS) now, the most seen kept. */
static void measure(train_zero_gen *g) {
    double rss = 0, hwm = 0;
    const double r = resident(g->z);
    train_memory_read(&rss, &hwm);
    g->peak = r > g->peak ? r : g->peak;
    g->rss = rss > g->rss ? rss : g->rss;
}

/* Layer l's gather (after = 0) or release (1) in a pass, measured before the release while the
 * phase's first passes last. A pass is the embeddings (slot n_layers), the layers, the head (slot
 * n_layers + 1, or n_layers tied): in_pass is 1 from its start, 2 once past the layers, and the
 * head's release ends it. */
static ctrl_status layer_step(train_zero_gen *g, int l, int after) {
    if (after && g->measure > 0) measure(g);
    ctrl_status st = train_zero_forward_layer(g->z, l, after);
    const int n_layers = ctrl_model_cfg(g->z->model)->n_layers;
    if (after && l == n_layers - 1)
        g->in_pass = 2;
    else if (after && l >= n_layers && g->in_pass == 2)
        g->in_pass = 0, g->measure--;
    return st;
}

/* The slot of the head: its own when sliced apart from the embeddings, else theirs (tied, or not
 * sliced: no collective either way). */
static int head_slot(const train_zero *z) {
    const int n = ctrl_model_cfg(z->model)->n_layers;
    return z->layer_unit[n + 1] >= 0 || z->frozen[n + 1].layer >= 0 ? n + 1 : n;
}

/* The decoding pass's hook: before its first gather (the embeddings') the ranks say they are
 * generating (the idle ones answer in idle_passes), then each unit gathered and released. */
static ctrl_status decode_hook(void *ctx, int l, int after) {
    train_zero_gen *g = ctx;
    if (!after && !g->in_pass) {
        double v = 1;
        ctrl_status st = ctrl_collective_allreduce_sum_f64(&v, 1);
        if (st != CTRL_OK) return st;
        g->in_pass = 1, g->passes++;
    }
    return layer_step(g, l, after);
}

/* A rank done with its requests: passes with no tokens while any other rank still generates (the
 * same gathers, in the same order, as theirs), until every rank says it is done. */
static ctrl_status idle_passes(train_zero_gen *g) {
    const int n_layers = ctrl_model_cfg(g->z->model)->n_layers;
    for (;;) {
        double v = 0;
        ctrl_status st = ctrl_collective_allreduce_sum_f64(&v, 1);
        if (st != CTRL_OK || v == 0) return st;
        g->in_pass = 1, g->passes++, g->idle++;
        for (int k = -1; k <= n_layers && st == CTRL_OK; k++) { /* embeddings, layers, head */
            const int l = k < 0 ? n_layers : k < n_layers ? k : head_slot(g->z);
            st = layer_step(g, l, 0);
            if (st == CTRL_OK) st = layer_step(g, l, 1);
        }
        if (st != CTRL_OK) return st;
    }
}

/* The most bytes one unit's gather fetches (a layer's, the embeddings', the head's): its runs, the
 * sliced ranges less the views stage3_param_persistence_threshold keeps whole (never gathered). */
static size_t largest_layer(const train_zero *z) {
    size_t most = 0;
    for (int l = 0; l < z->n_slots; l++) {
        size_t n = 0;
        for (int i = z->run_at[l]; i < z->run_at[l + 1]; i++) n += z->runs[i].u.b - z->runs[i].u.a;
        most = n > most ? n : most;
    }
    return most * sizeof(float);
}

/* The first phase's numbers, over the ranks (a collective), logged on rank 0. */
static ctrl_status report(train_zero_gen *g) {
    train_zero *z = g->z;
    double v[4] = {g->peak, (double)g->idle, g->rss, 0}, rss = 0;
    train_memory_read(&rss, &v[3]);
    ctrl_status st = ctrl_collective_allreduce_max_f64(v, 4);
    if (st != CTRL_OK || !ctrl_collective_is_root()) return st;
    const size_t model = ctrl_model_param_bytes(z->model), layers = train_zero_layer_bytes(z);
    const char *where = z->dev ? "device memory mapped" : "resident";
    if (!g->layerwise) {
        CTRL_INFO("zero3 generation with the whole model gathered (ds3_gather_for_generation = true): "
                  "parameters %s at most %.0f of the model's %zu bytes per rank; process memory in the "
                  "phase at most %.0f kB (VmRSS), %.0f kB at its peak so far (VmHWM)",
                  where, v[0], model, v[2], v[3]);
        return st;
    }
    CTRL_INFO("zero3 generation one layer at a time (ds3_gather_for_generation = false): parameters %s at "
              "most %.0f of the model's %zu bytes per rank (layers, embeddings and head %zu bytes, sliced "
              "over %d ranks, the "
              "largest %zu bytes); %ld forward passes on every rank, up to %.0f of them idle on a rank "
              "whose requests were done; process memory in the phase at most %.0f kB (VmRSS), %.0f kB at "
              "its peak so far (VmHWM)",
              where, v[0], model, layers, z->size, largest_layer(z), g->passes, v[1], v[2], v[3]);
    return st;
}

ctrl_status train_zero_generation(void *ctx, int on) {
    train_zero_gen *g = ctx;
    train_zero *z = g->z;
    if (z->stage < 3) return CTRL_OK;
    /* the model whole already (gathered by rank 0's evaluation, which generates on it alone): its
     * owner releases it, and nothing here is collective */
    if (on && z->gathered) {
        g->passive = 1;
        return CTRL_OK;
    }
    if (!on && g->passive) {
        g->passive = 0;
        return CTRL_OK;
    }
    if (!g->layerwise) {
        if (!on && g->phases == 1 && !g->reported) measure(g); /* whole, the KV cache still held */
        ctrl_status st = train_zero_whole(z, on);
        if (on && st == CTRL_OK && ++g->phases == 1) measure(g);
        if (!on && st == CTRL_OK && g->phases == 1 && !g->reported) g->reported = 1, st = report(g);
        return st;
    }
    if (on) {
        g->open = 1, g->in_pass = 0, g->passes = g->idle = 0, g->measure = MEASURED_PASSES;
        g->prefetched = z->prefetched;
        g->phases++;
        ctrl_model_set_decode_hook(z->model, decode_hook, g);
        /* a CUDA model's zero3 in bf16: the fp32 masters, as the whole gather sends */
        return train_zero_fp32_phase(z, 1);
    }
    if (!g->open) return CTRL_OK;
    /* a pass left between its layers (its forward failed): the ranks' gathers no longer match, so no
     * idle passes -- the error ends the job (ctrl_collective_finalize aborts it) */
    if (!g->reported) measure(g); /* the KV cache still held */
    ctrl_status st = g->in_pass ? CTRL_OK : idle_passes(g);
    ctrl_model_set_decode_hook(z->model, NULL, NULL);
    g->open = 0;
    const ctrl_status sf = train_zero_fp32_phase(z, 0);
    if (st == CTRL_OK) st = sf;
    z->prefetched = g->prefetched;
    if (st == CTRL_OK && !g->in_pass && !g->reported) g->reported = 1, st = report(g);
    if (g->in_pass) CTRL_ERROR("zero3 generation: a forward pass failed between its layers");
    CTRL_DEBUG("zero3 generation: %ld forward passes, %ld without tokens on this rank", g->passes, g->idle);
    return st;
}

ctrl_status train_zero_gen_check(const ctrl_config *cfg, int zero_stage, int generates) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    if (s->generation.ds3_gather_for_generation) return CTRL_OK;
    const char *where = ctrl_config_where(cfg, "generation", "ds3_gather_for_generation");
    if (zero_stage < 3)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [generation] ds3_gather_for_generation = false: applies to [memory] "
                              "strategies = zero3 (the layers sliced over the ranks); without it every rank "
                              "holds the whole model and generates from it (drop the key, or add zero3)",
                              where);
    if (!generates)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [generation] ds3_gather_for_generation = false: trainer %s has no "
                              "generation phase (the online trainers have: grpo, rloo, online_dpo, ppo)",
                              where, s->run.trainer);
    return CTRL_OK;
}
