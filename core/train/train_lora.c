/* The trained model with LoRA ([peft] enabled): the typed [peft] settings made into the model's
 * LoRA config (or an adapter directory's, [peft] adapter_path), the base loaded frozen with the
 * adapters on top, their weights from a checkpoint or an adapter directory; saved as PEFT saves
 * it. The loop and the trainers do not need to know: the model trains what it holds gradients
 * for, and says which views those are. */
#include "train/train_lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/log.h>

#include "collective/collective.h"
#include "model/peft.h"
#include "train/zero.h"

static ctrl_status lora_from_settings(const ctrl_run_settings *s, ctrl_lora_config *lc) {
    memset(lc, 0, sizeof *lc);
    lc->r = s->peft.r, lc->lora_alpha = (float)s->peft.lora_alpha, lc->use_rslora = s->peft.use_rslora;
    lc->use_dora = s->peft.use_dora, lc->lora_bias = s->peft.lora_bias;
    lc->ensure_weight_tying = s->peft.ensure_weight_tying;
    lc->save_embed_tokens = s->peft.save_embed_tokens, lc->save_lm_head = s->peft.save_lm_head;
    lc->seq_cls = s->peft.save_score;
    lc->init = ctrl_lora_init_named(s->peft.init_lora_weights);
    ctrl_status st = CTRL_OK;
    static const char *const params[] = {"experts.gate_up_proj", "experts.down_proj"};
    for (int k = 0; k < 2 && st == CTRL_OK; k++)
        if (s->peft.param_bits & (1u << k))
            st = ctrl_lora_add_parameter(lc, params[k], "[peft] target_parameters");
    if (st != CTRL_OK) return st;
    const ctrl_lora_config *ch = s->peft.choices; /* settings_peft.c: checked when the config was */
    if (ch) {
        ctrl_lora_copy_choices(lc, ch);
        if (ch->target_regex[0]) return CTRL_OK; /* instead of target_modules' list */
    }
    if (s->peft.all_linear) return ctrl_lora_add_target(lc, "all-linear", "[peft] target_modules");
    for (int k = 0; k < LORA_N_MODULES && st == CTRL_OK; k++)
        if (s->peft.target_bits & (1u << k))
            st =
                ctrl_lora_add_target(lc, strchr(ctrl_lora_module_names[k], '.') + 1, "[peft] target_modules");
    return st;
}

static int load_on_cpu; /* train_model_on_cpu: the run's compute device is the CPU */

void train_model_on_cpu(int on_cpu) { load_on_cpu = on_cpu; }

static int load_sliced; /* train_model_zero3_sliced */

void train_model_zero3_sliced(int sliced) { load_sliced = sliced; }

/* ||s B A||^2 of each output row of the adapted weight whose magnitudes are view `mag`
 * ("P.lora_magnitude_vector"; "P.lora_A.weight" [r, IN], "P.lora_B.weight" [OUT, r]) into ba[OUT]:
 * s^2 B_j (A A^T) B_j^T, through the r x r Gram matrix of A. */
static ctrl_status ba_row_squares(ctrl_model *m, const ctrl_param_view *mag, double *ba) {
    const struct ctrl_lora_config *c = ctrl_model_lora(m);
    char name[256];
    const size_t stem = strlen(mag->name) - strlen("lora_magnitude_vector");
    snprintf(name, sizeof name, "%.*slora_A.weight", (int)stem, mag->name);
    const ctrl_param_view *va = ctrl_model_find_view(m, name);
    snprintf(name, sizeof name, "%.*slora_B.weight", (int)stem, mag->name);
    const ctrl_param_view *vb = ctrl_model_find_view(m, name);
    int l = -1, mod = LORA_N_MODULES, at = 0; /* model.layers.<l>.<module>.lora_magnitude_vector */
    if (sscanf(mag->name, "model.layers.%d.%n", &l, &at) == 1)
        for (mod = 0; mod < LORA_N_MODULES; mod++)
            if (!strncmp(mag->name + at, ctrl_lora_module_names[mod], stem - (size_t)at - 1) &&
                strlen(ctrl_lora_module_names[mod]) == stem - (size_t)at - 1)
                break;
    int on = 1, r = c->r;
    float s = ctrl_lora_scaling(c);
    if (mod < LORA_N_MODULES && ctrl_lora_module_choice(c, l, mod, &on, &r, &s) != CTRL_OK)
        return CTRL_ERR_CONFIG;
    if (!va || !vb || va->numel % r || vb->numel != mag->numel * r)
        return ctrl_error_set(CTRL_ERR_RUNTIME, "DoRA: no adapters of %d rows beside %s", r, mag->name);
    const float *p = ctrl_model_params(m, NULL), *A = p + va->offset, *B = p + vb->offset;
    const int64_t in = va->numel / r;
    double *g = calloc((size_t)r * (size_t)r, sizeof *g);
    if (!g) return ctrl_error_set(CTRL_ERR_NOMEM, "DoRA: a Gram matrix of %d", r);
    for (int i = 0; i < r; i++)
        for (int k = 0; k < r; k++)
            for (int64_t x = 0; x < in; x++) g[i * r + k] += (double)A[i * in + x] * A[k * in + x];
    for (int64_t j = 0; j < mag->numel; j++) {
        double q = 0;
        for (int i = 0; i < r; i++)
            for (int k = 0; k < r; k++) q += (double)B[j * r + i] * g[i * r + k] * B[j * r + k];
        ba[j] = s * s * q;
    }
    free(g);
    return CTRL_OK;
}

/* zero3's sliced read with DoRA: the magnitudes the load set are the norms of each rank's part of
 * every row of W + s B A, the rest of its base zero there -- each value of W is in one rank's part,
 * while s B A (the adapters, made whole on every rank) is in all of them -- so the whole rows' norms
 * are the square roots of their squares summed over the ranks, less (ranks - 1) x ||s B A||^2 where B
 * does not start at zero (init_lora_weights = false) -- DoRA's initial magnitudes, no rank reading
 * the whole base. */
static ctrl_status dora_whole_norms(ctrl_model *m) {
    float *p = ctrl_model_params(m, NULL);
    const int b_zero = ctrl_model_lora(m)->init != CTRL_LORA_INIT_NONE, extra = ctrl_collective_size() - 1;
    ctrl_status st = CTRL_OK;
    for (int i = 0; i < ctrl_model_view_count(m) && st == CTRL_OK; i++) {
        const ctrl_param_view *v = ctrl_model_view(m, i);
        if (!strstr(v->name, ".lora_magnitude_vector")) continue;
        double *sq = malloc(sizeof(double) * 2 * (size_t)v->numel), *ba = sq + v->numel;
        if (!sq) return ctrl_error_set(CTRL_ERR_NOMEM, "DoRA: %lld magnitudes", (long long)v->numel);
        for (int64_t j = 0; j < v->numel; j++) sq[j] = (double)p[v->offset + j] * p[v->offset + j];
        st = ctrl_collective_allreduce_sum_f64(sq, (size_t)v->numel);
        if (st == CTRL_OK && !b_zero) st = ba_row_squares(m, v, ba);
        for (int64_t j = 0; j < v->numel && st == CTRL_OK; j++) {
            const double w = b_zero ? sq[j] : sq[j] - extra * ba[j];
            p[v->offset + j] = (float)sqrt(w > 0 ? w : 0);
        }
        free(sq);
    }
    ctrl_model_weights_changed(m);
    return st;
}

static int loop_decodes; /* train_model_decodes */

void train_model_decodes(int decodes) { loop_decodes = decodes; }

ctrl_status train_lora_config(const ctrl_run_settings *s, ctrl_lora_config *out) {
    return s->peft.adapter_path ? ctrl_peft_read_config(s->peft.adapter_path, out, NULL, 0)
                                : lora_from_settings(s, out);
}

ctrl_status train_model_load(const ctrl_run_settings *s, const ctrl_lora_config *lora,
                             const ctrl_attention_ops *attn, const char *ckpt, int num_labels,
                             ctrl_model **out) {
    if (!s->peft.enabled)
        return num_labels > 0 ? ctrl_model_load_classifier(ckpt ? ckpt : s->model.path, attn, num_labels,
                                                           s->run.seed, out)
                              : ctrl_model_load(ckpt ? ckpt : s->model.path, attn, out);
    static ctrl_lora_config lc; /* large (the target list): not on the stack */
    lc = *lora;
    const char *adapter = s->peft.adapter_path;
    ctrl_status st = CTRL_OK;
    if (adapter && lc.seq_cls != (num_labels > 0))
        return ctrl_error_set(
            CTRL_ERR_CONFIG, "[peft] adapter_path = %s: a %s adapter, and trainer %s trains %s", adapter,
            lc.seq_cls ? "sequence classifier's (task_type SEQ_CLS)" : "causal LM's", s->run.trainer,
            num_labels > 0 ? "a sequence classifier (SEQ_CLS)" : "a causal LM");
    lc.lora_dropout = (float)s->peft.lora_dropout, lc.seed = s->run.seed, lc.nf4 = s->peft.nf4;
    /* bf16 compute on the CPU: the frozen base held in bf16 as it loads (the same numbers) */
    lc.bf16_base = load_on_cpu && !strcmp(s->train.dtype, "bf16");
    /* [peft] embedding_dtype = bf16: the frozen embedding held as bf16 values as it loads (the
     * settings refused it with fp32 compute, a named CUDA device or embed_tokens trained); auto (the
     * default): so wherever bf16 would be accepted -- bf16 compute on the CPU, no zero3 (load_on_cpu
     * is 0 there), the table frozen (the loader keeps a trained one fp32); in a loop that decodes only
     * as the tied head's panels (3: decoding from bf16 values packs the head in every step, +55% of
     * the generation's CPU measured, docs/performance.md), and fp32 elsewhere */
    lc.bf16_embed = s->peft.embed_bf16 == 2
                        ? (load_on_cpu && !strcmp(s->train.dtype, "bf16") ? (loop_decodes ? 3 : 2) : 0)
                        : s->peft.embed_bf16;
    if (lc.bf16_embed == 1 && !load_on_cpu)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "[peft] embedding_dtype = bf16: the run computes on a device; the embedding is "
            "held in bf16 on the CPU only (set [run] device = cpu, or embedding_dtype = fp32)");
    /* a classifier (PEFT's SEQ_CLS): the trunk frozen under the adapters, the score trained in full,
     * its first value the base's (a classifier) or a new one's (a causal LM's trunk) */
    st = num_labels > 0 && load_sliced
             ? ctrl_model_load_classifier_lora_part(s->model.path, attn, num_labels, s->run.seed, &lc,
                                                    train_zero_rank_parts, train_zero_rank_nf4_parts, NULL,
                                                    out)
         : num_labels > 0
             ? ctrl_model_load_classifier_lora(s->model.path, attn, num_labels, s->run.seed, &lc, out)
         : load_sliced ? ctrl_model_load_lora_part(s->model.path, attn, &lc, train_zero_rank_parts,
                                                   train_zero_rank_nf4_parts, NULL, out)
                       : ctrl_model_load_lora(s->model.path, attn, &lc, out);
    /* (a checkpoint's or an adapter's magnitudes are read over them below) */
    /* (QDoRA's are whole already: its norms taken as each NF4 weight loaded whole) */
    if (st == CTRL_OK && load_sliced && lc.use_dora && !lc.nf4 && !ckpt && !adapter &&
        (st = dora_whole_norms(*out))) {
        ctrl_model_free(*out);
        *out = NULL;
    }
    if (st != CTRL_OK) return st;
    if (load_sliced && lc.nf4)
        CTRL_INFO(
            "zero3 + QLoRA: each rank read its slices of the frozen embeddings (and an untied head) from "
            "%s and kept its slices of each NF4 weight (each read and quantized whole as it loads, one at "
            "a time: its absmax offset is the mean over the whole weight); the layers' norms and biases "
            "and the final norm whole; not the whole base",
            s->model.path);
    else if (load_sliced)
        CTRL_INFO("zero3 + LoRA: each rank read its slices of the frozen base from %s (each layer's, the "
                  "embeddings' and an untied head's; the final norm whole), not the whole base",
                  s->model.path);
    const char *from = ckpt ? ckpt : adapter;
    if (from && (st = ctrl_peft_load_weights(*out, from)) != CTRL_OK) {
        ctrl_model_free(*out);
        *out = NULL;
        return st;
    }
    size_t all, train;
    ctrl_model_params(*out, &all);
    ctrl_model_grads(*out, &train);
    char nf4[512];
    ctrl_model_nf4_summary(*out, nf4, sizeof nf4);
    if (ctrl_model_embedding_held_bf16(*out))
        CTRL_INFO("LoRA: the frozen embedding held in bf16 ([peft] embedding_dtype = %s) as %s: the lookups "
                  "return its rows rounded to bf16%s",
                  lc.bf16_embed >= 2 ? "auto, the default" : "bf16",
                  ctrl_model_embedding_held_bf16(*out) == 2
                      ? "the tied LM head's bf16 GEMM panels (its only copy)"
                      : "bf16 values",
                  lc.bf16_embed >= 2 ? " (embedding_dtype = fp32 keeps it fp32, as autocast does)" : "");
    CTRL_INFO("LoRA: r %d, scale %.4g%s, %zu trainable parameters of %zu (%.3f%%)%s, the base frozen%s%s%s%s",
              lc.r, (double)ctrl_lora_scaling(&lc),
              lc.n_rank_pattern || lc.n_alpha_pattern
                  ? " (other ranks / scales where rank_pattern / alpha_pattern say)"
                  : "",
              train, all, 100.0 * (double)train / (double)all,
              lc.use_dora ? (lc.nf4 ? ", DoRA magnitudes (QDoRA)" : ", DoRA magnitudes") : "",
              nf4[0] ? " " : "", nf4, from ? "; adapter from " : "", from ? from : "");
    if (lc.n_tokens > 0 || lc.n_head_tokens > 0)
        CTRL_INFO(
            "LoRA: trainable_token_indices: %d rows of the input embedding trained%s, %d of the LM head's; "
            "the tables held in fp32",
            lc.n_tokens, ctrl_model_cfg(*out)->tie_word_embeddings ? " (the LM head's: tied)" : "",
            ctrl_model_cfg(*out)->tie_word_embeddings ? 0 : lc.n_head_tokens);
    if (lc.init == CTRL_LORA_INIT_PISSA || lc.init == CTRL_LORA_INIT_OLORA)
        CTRL_INFO("LoRA: init_lora_weights = %s: each adapter from its weight's %s as the weight loaded, "
                  "the frozen base the residual W - s B A%s",
                  lc.init == CTRL_LORA_INIT_PISSA ? "pissa" : "olora",
                  lc.init == CTRL_LORA_INIT_PISSA ? "top-r SVD" : "QR",
                  lc.nf4 ? ", then quantized to NF4" : "");
    return CTRL_OK;
}

ctrl_status train_model_hold_base(ctrl_model *m, const ctrl_run_settings *s) {
    if (!ctrl_model_lora(m) || strcmp(s->train.dtype, "bf16") != 0) return CTRL_OK;
    size_t np = 0;
    ctrl_model_params(m, &np);
    const size_t before = sizeof(float) * np;
    if (ctrl_model_base_held_bf16(m)) {               /* as it loaded */
        if (ctrl_model_compute_dtype(m) != CTRL_BF16) /* a bug: the numbers would change */
            return ctrl_error_set(CTRL_ERR_RUNTIME, "LoRA: the base held in bf16 under fp32 compute");
    } else if (ctrl_model_hold_base_bf16(m) != CTRL_OK) { /* the model is unchanged: fp32, as before */
        CTRL_INFO("LoRA: the frozen base stays in fp32 (%s)", ctrl_error_message());
        ctrl_error_clear();
        return CTRL_OK;
    }
    CTRL_INFO(
        "LoRA: the frozen base held in bf16 ([train] dtype = bf16)%s: parameters %.1f MiB, were %.1f MiB",
        ctrl_model_base_in_panels(m) ? " as the bf16 GEMM's packed panels" : ", widened a layer at a time",
        (double)ctrl_model_param_bytes(m) / 1048576.0, (double)before / 1048576.0);
    return CTRL_OK;
}

ctrl_status train_model_save(ctrl_model *m, const char *dir, const char *base) {
    return ctrl_model_lora(m) ? ctrl_peft_save(m, dir, base) : ctrl_model_save(m, dir, CTRL_F32);
}

ctrl_status train_model_export(ctrl_model *m, const char *dir, const ctrl_run_settings *s) {
    /* the training is over: its activations and scratch are given back before the save's buffers
     * (the adapter in PEFT's layout, a model's tensors converted) are made, not held beside them */
    ctrl_model_release_scratch(m);
    if (ctrl_model_lora(m)) return ctrl_peft_save(m, dir, s->model.path);
    const char *want = s->train.save_dtype;
    ctrl_dtype dtype = !strcmp(want, "bf16") ? CTRL_BF16 : !strcmp(want, "fp16") ? CTRL_F16 : CTRL_F32;
    if (!strcmp(want, "auto")) { /* the source's: a bf16 model stays bf16 */
        ctrl_status st = ctrl_model_dir_dtype(s->model.path, &dtype);
        if (st != CTRL_OK) return st;
    }
    return ctrl_model_save_sharded(m, dir, dtype, s->train.save_max_shard_bytes);
}
