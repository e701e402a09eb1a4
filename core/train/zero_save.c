/* ZeRO-3's saves (the final one, checkpoint-N's model) streamed to rank 0 (see zero.h): rank 0 writes the
 * ordinary HF directory with the model's save hooked (ctrl_model_set_save_fetch) so that a layer is gathered
 * to rank 0 alone -- MPI_Gatherv into its own parameter buffer -- when the writer reaches its first weight,
 * and released when the writer moves on (the embeddings and an untied head likewise: units of their
 * own); the final norm is whole on every rank already. Before each gather rank 0 broadcasts the layer's
 * index, and the other ranks, serving, send their slices of it from where they lie (no buffer of their own);
 * -1 ends the save (server mode's push too, train_zero_push: the merged file's writer fetches a layer
 * by its views, a QLoRA layer by its adapters' -- its NF4 weights, sliced by zero_nf4.c, are then
 * gathered to rank 0 too, the serving ranks sending their pieces).
 * So no rank holds more than its slices plus, on rank 0, one layer (DeepSpeed gathers the
 * whole model for stage3_gather_16bit_weights_on_model_save; its zero_to_fp32 script rebuilds it offline). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "device/backend.h"
#include "train/memory_report.h"
#include "train/zero.h"

/* The layer (or slot: the embeddings, an untied head) whose sliced ranges hold [a, a + n) of the
 * parameters, else -1. */
static int layer_of(const train_zero *z, size_t a, size_t n) {
    for (int l = 0; l < z->n_slots; l++) {
        train_zero_unit r[2];
        for (int i = 0, k = train_zero_layer_ranges(z, l, r); i < k; i++)
            if (a >= r[i].a && a + n <= r[i].b) return l;
    }
    return -1;
}

/* Unit l's sliced ranges gathered to rank 0 (every rank: the others send their slices); over a QLoRA
 * base a layer's NF4 weights likewise, into rank 0's store (zero_nf4.c). */
static ctrl_status gather_unit(train_zero *z, int l) {
    ctrl_status st = CTRL_OK;
    train_zero_unit r[2];
    float *p = ctrl_model_params(z->model, NULL);
    for (int i = 0, k = train_zero_layer_ranges(z, l, r); i < k && st == CTRL_OK; i++)
        st = ctrl_collective_gather_f32(p + r[i].a, train_zero_cut_counts(z, r[i]), 0);
    /* (the NF4 gather: a no-op without an NF4 store, and for the embeddings' and the head's units) */
    return st == CTRL_OK ? train_zero_nf4_gather_root(z, l) : st;
}

/* Layer l (or -1: the end) announced to the serving ranks, then gathered to rank 0. */
static ctrl_status gather_to_root(train_zero *z, int32_t l) {
    const ctrl_status st = ctrl_collective_broadcast(&l, sizeof l, 0);
    return st == CTRL_OK && l >= 0 ? gather_unit(z, l) : st;
}

/* Rank 0's fetch: the layer of the weight about to be written whole, the one before released (a weight
 * whole on every rank -- the final norm, a QLoRA layer's norms -- leaves the held layer as it is). */
static ctrl_status fetch(void *user, const float *data, int64_t numel) {
    train_zero *z = user;
    const int l = layer_of(z, (size_t)(data - ctrl_model_params(z->model, NULL)), (size_t)numel);
    if (l == z->save_held || l < 0) return CTRL_OK;
    if (z->save_held >= 0) train_zero_release_layer(z, z->save_held);
    z->save_held = -1;
    ctrl_status st = gather_to_root(z, l);
    if (st == CTRL_OK) z->save_held = l, z->save_gathers++;
    return st;
}

/* Several ranks, stage 3 on the CPU, every layer sliced (a layer whole or in flight: the whole
 * gather handles it), and the test's switch to the old way off. */
static int sliced(const train_zero *z) {
    if (z->stage < 3 || z->size < 2 || z->gathered || !z->state) return 0;
    if (getenv("CTRL_TEST_ZERO_SAVE_WHOLE")) return 0; /* tests: the old way, to compare its bytes */
    for (int l = 0; l < z->n_slots; l++)
        if (z->state[l] != 0) return 0;
    return 1;
}

static int sliced_on_cpu(const train_zero *z) {
    return sliced(z) && !z->dev && ctrl_model_device(z->model).type == CTRL_DEVICE_CPU;
}

int train_zero_save_streams(const train_zero *z) { return sliced_on_cpu(z) && !ctrl_model_lora(z->model); }

ctrl_status train_zero_push(void *ctx, int on) {
    train_zero *z = ctx;
    if (on) z->push_streamed = sliced_on_cpu(z);
    if (!z->push_streamed) return train_zero_whole(z, on);
    if (on) {
        train_zero_save_begin(z);
        return train_zero_save_serve(z); /* the others: until rank 0 has written the weights */
    }
    z->push_streamed = 0;
    const ctrl_status st = train_zero_save_end(z);
    if (st == CTRL_OK && z->rank == 0 && z->pushes++ == 0)
        CTRL_INFO(
            "zero3: server mode's push streamed to rank 0, %ld units (layers, embeddings, head) gathered "
            "to it one at a time (no rank holds the whole model for a push)%s",
            z->save_gathers,
            z->nf4 ? "; the NF4 base's weights gathered to it with their layer, dequantized and merged, "
                     "freed after it"
                   : "");
    return st;
}

/* (on a CUDA model too: the adapters gathered over NCCL, then copied to the host) */
int train_zero_save_adapter_only(const train_zero *z) { return sliced(z) && ctrl_model_lora(z->model); }

/* A CUDA model's adapters: each layer's trainable range mapped and all-gathered on the device (in
 * bf16: its fp32 masters; the embeddings and head too when among the modules_to_save), every
 * trainable float (the final norm's whole on the device already) copied into the host's parameters, which the
 * adapter's writer reads, and the ranges released again. */
static ctrl_status gather_adapters_device(train_zero *z) {
    ctrl_status st = CTRL_OK;
    int l = 0;
    z->fp32_gather = 1;
    for (; l < z->n_slots && st == CTRL_OK; l++) { /* (modules_to_save: the embeddings, head) */
        const int u = z->layer_unit[l];
        if (u < 0) continue;
        st = train_zero_device_gather_range(
            z, (train_zero_unit){z->first + z->units[u].a, z->first + z->units[u].b, z->units[u].layer}, NULL,
            NULL);
        if (st == CTRL_OK) z->save_gathers++;
    }
    z->fp32_gather = 0;
    if (st == CTRL_OK) st = z->dev->synchronize();
    if (st == CTRL_OK)
        st = z->dev->to_host(ctrl_model_params(z->model, NULL) + z->first,
                             ctrl_model_device_params(z->model) + z->first, z->total * sizeof(float));
    for (int k = 0; k < l; k++) { /* those gathered (the last one too, were it to fail) */
        const int u = z->layer_unit[k];
        if (u < 0) continue;
        const ctrl_status r = train_zero_device_release_range(
            z, (train_zero_unit){z->first + z->units[u].a, z->first + z->units[u].b, z->units[u].layer});
        if (st == CTRL_OK) st = r;
    }
    /* in bf16 the gathers wrote the fp32 masters over the persistent views: their bf16 values again */
    return st == CTRL_OK && z->b16 ? train_zero_gather_kept(z, 0) : st;
}

ctrl_status train_zero_gather_adapters(train_zero *z) {
    ctrl_status st = CTRL_OK;
    float *p = ctrl_model_params(z->model, NULL);
    z->save_gathers = 0;
    if (z->dev) return gather_adapters_device(z);
    for (int l = 0; l < z->n_slots && st == CTRL_OK; l++) { /* (modules_to_save: the embeddings, head) */
        train_zero_unit r[2];
        for (int i = 0, k = train_zero_layer_ranges(z, l, r); i < k && st == CTRL_OK; i++) {
            if (z->frozen && z->frozen[l].layer >= 0 && r[i].a == z->frozen[l].a) continue; /* the base */
            st = ctrl_collective_allgather_f32(p + r[i].a, train_zero_cut_counts(z, r[i]));
            if (st == CTRL_OK) st = ctrl_model_params_range_changed(z->model, r[i].a, r[i].b - r[i].a);
            if (st == CTRL_OK) z->save_gathers++;
        }
    }
    return st;
}

void train_zero_save_begin(train_zero *z) {
    z->save_held = -1, z->save_gathers = 0, z->save_open = z->rank == 0;
    if (z->rank == 0) ctrl_model_set_save_fetch(z->model, fetch, z);
}

ctrl_status train_zero_save_end(train_zero *z) {
    if (z->rank != 0 || !z->save_open) return CTRL_OK;
    z->save_open = 0;
    ctrl_model_set_save_fetch(z->model, NULL, NULL);
    if (z->save_held >= 0) train_zero_release_layer(z, z->save_held);
    z->save_held = -1;
    return gather_to_root(z, -1); /* however the save went: the others stop serving */
}

ctrl_status train_zero_save_model_written(void *user) { return train_zero_save_end(user); }

ctrl_status train_zero_save_serve(train_zero *z) {
    if (z->rank == 0) return CTRL_OK;
    for (;;) {
        int32_t l = -1;
        ctrl_status st = ctrl_collective_broadcast(&l, sizeof l, 0);
        if (st != CTRL_OK || l < 0) return st;
        if (l >= z->n_slots)
            return ctrl_error_set(CTRL_ERR_RUNTIME, "zero3 save: rank 0 asked for unit %d of %d", (int)l,
                                  z->n_slots);
        st = gather_unit(z, l);
        /* QLoRA: the gather left nothing here unless the layer's NF4 weights were already whole on
         * every rank (gathered before the save); then they go as rank 0's go, with the layer */
        train_zero_nf4_release(z, l);
        if (st != CTRL_OK) return st;
        z->save_gathers++;
    }
}

void train_zero_save_report(train_zero *z, const char *what) {
    double *v = calloc((size_t)z->size, sizeof *v), rss = 0, peak = 0;
    if (!v) return;
    train_memory_read(&rss, &peak);
    v[z->rank] = peak;
    if (ctrl_collective_allreduce_sum_f64(v, (size_t)z->size) == CTRL_OK && z->rank == 0) {
        char list[256];
        size_t at = 0;
        for (int r = 0; r < z->size && at < sizeof list; r++)
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%.0f", r ? " / " : "", v[r] / 1024);
        if (ctrl_model_lora(z->model))
            CTRL_INFO("zero3: %s saved from the adapters alone, %ld layers' adapter slices all-gathered (the "
                      "frozen base never gathered); peak resident memory per rank so far (VmHWM): %s MiB",
                      what, z->save_gathers, list);
        else
            CTRL_INFO("zero3: %s saved by rank 0 alone, %ld units (layers, embeddings, head) gathered to it "
                      "one at a time (no rank held the whole model); peak resident memory per rank so far "
                      "(VmHWM): %s MiB",
                      what, z->save_gathers, list);
    }
    free(v);
}
