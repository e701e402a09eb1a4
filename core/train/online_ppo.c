/* The value model of a token-level online trainer (PPO; spec.value_model), see online_internal.h.
 *
 * How it is held and run: a second ctrl_model, a sequence classifier of one label -- `[ppo]
 * value_model` (a *ForSequenceClassification directory, or a causal LM whose trunk gets a fresh
 * `score` head seeded from [run] seed), by default the policy's own weights under a fresh head, as
 * TRL's examples build it. It lives where the policy does: on the policy's backend and device, in
 * the policy's compute dtype. Its per-token values are the score head read at every position
 * (ctrl_model_score_forward_at), the policy's tokens laid out exactly as for the policy's forward.
 * After generation it scores each completion once without gradients (the rollout's old values);
 * in each micro-batch it runs forward beside the policy, the trainer's loss gives dL/dvalues, and
 * ctrl_model_score_backward_at accumulates its own gradients. On a device only those per-token
 * values (one float a token) come to the host and dL/dvalues go back; GAE and whitening are the
 * plugin's arithmetic on them, on the host, as on the CPU. It has its own optimizer (the run's
 * optimizer plugin and settings: TRL's single optimizer over PolicyAndValueWrapper steps both with
 * the same learning rate and schedule), stepped right after the policy's -- on the device when the
 * policy's model is there and the plugin can step there (as the loop decides for the policy:
 * [memory] offload_optimizer keeps it on the host), its gradient norm and clipping on the model's
 * backend. The value model is not saved with the policy (TRL saves only the policy); checkpoints
 * hold it (online_value_save / online_value_load).
 *
 * Under zero3 on several ranks (the policy sliced; on a CUDA model on the devices) it is partitioned as the
 * policy, as DeepSpeed partitions TRL's PolicyAndValueWrapper: its own train_zero (zero.h) cut as a
 * policy of its shape, its layers and embeddings sliced over the ranks and gathered around each
 * forward and backward (the model's layer hooks), its gradients reduce-scattered during the backward
 * into this rank's slices' sums, its optimizer over its slices, the final norm and the score head
 * whole (all-gathered after each step). Its forwards are collectives: the rollout's score the whole
 * gathered generation batch on every rank, the micro-batches' follow the policy's, one each. A
 * checkpoint's rank 0 receives the other ranks' slices into its copy (online_value_serve, sent after
 * their ZeRO optimizer state; on a device every rank gathers it whole there instead), writes the
 * weights whole and releases the pages again, and its optimizer state goes one file per rank; a resume
 * reads the weights (keeping its slices; on a device putting them there) and its own rank's state. Each rank
 * reads only its slices at start-up (train_zero_load_classifier). */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <ctrl/memory.h>
#include <ctrl/optimizer.h>

#include "collective/collective.h"
#include "model/safetensors.h"
#include "registry/registry.h"
#include "train/checkpoint.h"
#include "train/compute.h"
#include "train/online_internal.h"
#include "train/zero.h"
#include "train/zero_ref.h"

struct online_value {
    ctrl_model *model;
    const ctrl_optimizer_ops *opt_ops;
    ctrl_optimizer *opt;
    ctrl_param_group *groups;
    int n_groups;
    int opt_on_device; /* the optimizer steps the device's buffers */
    double max_grad_norm;
    int W; /* the generation batch's response width */
    /* per completion of the generation batch, [W] each */
    float **adv, **ret, **oval, **pm, **vm;
    int gn;
    /* the micro-batch in flight: the flat positions the value is read at, and dL/dvalues there */
    int32_t *at;
    float *dv_at;
    int n_at;
    uint64_t shuffles;
    /* zero3 on several ranks on the CPU: the value model sliced as the policy (its own train_zero:
     * layers, embeddings gathered around each use, gradients reduce-scattered into this rank's
     * slices' sums, the optimizer over its slices); NULL: whole on every rank */
    train_zero *zero;
    int reported;     /* the first step's memory line logged */
    double last_norm; /* the last step's gradient norm */
};

static void rows_free(online_value *v) {
    for (int i = 0; i < v->gn; i++)
        free(v->adv[i]), free(v->ret[i]), free(v->oval[i]), free(v->pm[i]), free(v->vm[i]);
    free(v->adv), free(v->ret), free(v->oval), free(v->pm), free(v->vm);
    v->adv = v->ret = v->oval = v->pm = v->vm = NULL, v->gn = 0;
}

void online_value_free(ctrl_online *o) {
    online_value *v = o->value;
    if (!v) return;
    rows_free(v);
    if (v->opt) v->opt_ops->destroy(v->opt);
    if (v->zero) train_zero_free(v->zero);
    free(v->zero);
    ctrl_model_free(v->model);
    free(v->groups), free(v->at), free(v->dv_at);
    free(v);
    o->value = NULL;
}

/* [memory] strategies lists offload_optimizer (the optimizer steps on the host, its state there). */
static int offload_optimizer(const ctrl_run_plugins *p) {
    for (int i = 0; i < p->n_memory; i++) {
        const ctrl_memory_ops *ops = p->memory[i]->ops;
        if (ops->size >= offsetof(ctrl_memory_ops, offload_optimizer) + sizeof ops->offload_optimizer &&
            ops->offload_optimizer)
            return 1;
    }
    return 0;
}

/* zero3 on several ranks (the policy sliced; with LoRA its frozen base): the value model sliced, as
 * DeepSpeed partitions TRL's PolicyAndValueWrapper whole (with a peft_config the value model has no
 * adapters: trained in full), on the CPU or on the policy's device. CTRL_TEST_ZERO3_WHOLE_VALUE keeps
 * it whole (benchmarks and tests compare). */
static int value_sliced(const ctrl_online *o) { return o->zero3 && !getenv("CTRL_TEST_ZERO3_WHOLE_VALUE"); }

/* Its optimizer over this rank's slices (train_zero_shard_groups: the gradients are the slices'
 * sums; on a device the device's, stepped there unless `host_step`, offload_optimizer, as the
 * policy's), its layers hooked (gathered around each forward and backward, the gradients
 * reduce-scattered bucket by bucket) and the other ranks' slices released; the bucket sizes the
 * policy's. */
static ctrl_status value_zero3(ctrl_online *o, online_value *v, int host_step) {
    const ctrl_run_settings *s = ctrl_config_settings(o->cfg);
    const double hidden = (double)ctrl_model_cfg(v->model)->hidden_size;
    const size_t bucket = s->memory.reduce_bucket_size >= 0
                              ? (size_t)s->memory.reduce_bucket_size
                              : (size_t)(hidden * hidden > 1 ? hidden * hidden : 1);
    const size_t prefetch = s->memory.prefetch_bucket_size >= 0 ? (size_t)s->memory.prefetch_bucket_size
                                                                : (size_t)(0.9 * hidden * hidden);
    if (!(v->zero = calloc(1, sizeof *v->zero)))
        return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    ctrl_status st =
        train_zero_init(v->zero, 3, v->model, bucket, prefetch, s->memory.overlap_comm, host_step);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "the value model under zero3");
    /* [memory] stage3_param_persistence_threshold as the policy's (train_setup.c; auto: 10 x hidden) */
    const long t = s->memory.param_persistence_threshold;
    if (t != 0) train_zero_set_persistence(v->zero, t < 0 ? (size_t)(10 * hidden) : (size_t)t);
    v->n_groups =
        train_param_groups(v->model, ctrl_model_params(v->model, NULL), ctrl_model_grads(v->model, NULL),
                           (float)s->train.weight_decay, v->groups);
    v->n_groups = train_zero_shard_groups(v->zero, v->model, v->groups, v->n_groups);
    v->opt_on_device = v->zero->dev && !v->zero->host_step;
    st = v->opt_ops->create(
        ctrl_host_table(), o->cfg, v->groups, v->n_groups,
        v->opt_on_device ? ctrl_model_device(v->model) : (ctrl_device){CTRL_DEVICE_CPU, 0}, &v->opt);
    if (st == CTRL_ERR_UNSUPPORTED && v->opt_on_device)
        return ctrl_error_wrap(st,
                               "the value model under zero3 on %s: optimizer %s cannot step on the device "
                               "(add offload_optimizer to step on the host)",
                               ctrl_model_backend(v->model)->name, s->train.optimizer);
    if (st == CTRL_OK) st = train_zero_attach(v->zero, v->model);
    if (st == CTRL_OK) st = train_zero_frozen_describe(v->zero, "the value model", "as the policy");
    return st;
}

/* After the value model's first step under zero3 (a collective, once): its parameters', gradients'
 * and optimizer state's bytes per rank, the largest over the ranks, against the whole model's. */
static ctrl_status value_report(online_value *v) {
    train_zero *z = v->zero;
    v->reported = 1;
    if (z->dev) { /* on the device: what is mapped there (zero_device.c), the optimizer's state */
        double d[6] = {0};
        train_zero_device_mapped(z, d);
        d[4] = (double)(z->acc_n * sizeof(float)), d[5] = (double)train_zero_state_bytes(v->opt_ops, v->opt);
        ctrl_status st = ctrl_collective_allreduce_max_f64(d, 6);
        if (st == CTRL_OK && ctrl_collective_is_root())
            CTRL_INFO(
                "zero3: the value model per rank on the device after its first step: parameters %.0f of "
                "its %zu bytes mapped, gradients %.0f bytes mapped and %.0f of its slices' sums, "
                "optimizer state %.0f bytes",
                d[0], ctrl_model_param_bytes(v->model), d[2], d[4], d[5]);
        return st;
    }
    size_t n = 0, ng = 0;
    const float *p = ctrl_model_params(v->model, &n), *g = ctrl_model_grads(v->model, &ng);
    const double state = (double)train_zero_state_bytes(v->opt_ops, v->opt);
    double mx[3] = {(double)train_zero_resident(p, n * sizeof *p),
                    (double)(train_zero_resident(g, ng * sizeof *g) + z->acc_n * sizeof(float)), state};
    double sum = state;
    ctrl_status st = ctrl_collective_allreduce_max_f64(mx, 3);
    if (st == CTRL_OK) st = ctrl_collective_allreduce_sum_f64(&sum, 1);
    if (st == CTRL_OK && ctrl_collective_is_root())
        CTRL_INFO("zero3: the value model per rank after its first step: parameters %.0f of its %zu bytes "
                  "resident, gradients %.0f bytes (its slices' sums and the buffer; whole %zu), optimizer "
                  "state %.0f bytes (%.0f over the %d ranks)",
                  mx[0], n * sizeof *p, mx[1], ng * sizeof *g, mx[2], sum, z->size);
    return st;
}

ctrl_status online_value_create(ctrl_online *o, const ctrl_run_plugins *plugins) {
    const ctrl_run_settings *s = ctrl_config_settings(o->cfg);
    online_value *v = calloc(1, sizeof *v);
    if (!v) return ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    o->value = v;
    const char *dir = o->spec.value_model_path; /* the trainer's option, read by its create() */
    if (!dir || !dir[0]) dir = s->model.path;
    /* zero3: this rank's slices read (train_zero_load's cut; the score head and the final norm whole) */
    const int sliced = value_sliced(o);
    ctrl_status st =
        sliced ? train_zero_load_classifier(dir, plugins->attention->ops, 1, s->run.seed, &v->model)
               : ctrl_model_load_classifier(dir, plugins->attention->ops, 1, s->run.seed, &v->model);
    if (st == CTRL_OK && sliced)
        CTRL_INFO("zero3: each rank read its slices of the value model's layers and embeddings from %s (the "
                  "final norm and the score head whole), not the whole model",
                  dir);
    if (st != CTRL_OK)
        return ctrl_error_wrap(st, "[%s] value_model = %s: cannot load it as a value model", s->run.trainer,
                               dir);
    const ctrl_device dev = ctrl_model_device(o->model);
    if (sliced && dev.type != CTRL_DEVICE_CPU) /* zero3: only each rank's slices go there (zero_device.c) */
        ctrl_model_defer_device(v->model);
    if (st == CTRL_OK && dev.type != CTRL_DEVICE_CPU) /* beside the policy */
        st = ctrl_model_to_device(v->model, ctrl_model_backend(o->model), dev);
    if (st == CTRL_OK) st = ctrl_model_set_compute_like(v->model, o->model);
    v->groups = calloc((size_t)ctrl_model_view_count(v->model), sizeof *v->groups);
    if (st == CTRL_OK && !v->groups) st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    v->opt_ops = plugins->optimizer->ops;
    v->max_grad_norm = s->train.max_grad_norm;
    /* on a device the optimizer is offered the device's buffers first, as the policy's (train_optimizer.c);
     * one that cannot step there (CTRL_ERR_UNSUPPORTED), or [memory] offload_optimizer, steps the host
     * copies */
    const char *where = dev.type == CTRL_DEVICE_CPU ? "the CPU" : "the host";
    if (st == CTRL_OK && sliced) {
        st = value_zero3(o, v, offload_optimizer(plugins));
        where = v->opt_on_device              ? "the device, over its slices (zero3)"
                : dev.type != CTRL_DEVICE_CPU ? "the host, over its slices (zero3 with offload_optimizer)"
                                              : "the CPU, over its slices (zero3)";
    }
    if (st == CTRL_OK && !v->zero && dev.type != CTRL_DEVICE_CPU && !offload_optimizer(plugins)) {
        v->n_groups = train_param_groups(v->model, ctrl_model_device_params(v->model),
                                         ctrl_model_device_grads(v->model, NULL),
                                         (float)s->train.weight_decay, v->groups);
        st = v->opt_ops->create(ctrl_host_table(), o->cfg, v->groups, v->n_groups, dev, &v->opt);
        if (st == CTRL_OK) v->opt_on_device = 1, where = "the device";
        if (st == CTRL_ERR_UNSUPPORTED) st = CTRL_OK;
    }
    if (st == CTRL_OK && !v->opt && !v->zero) {
        v->n_groups =
            train_param_groups(v->model, ctrl_model_params(v->model, NULL), ctrl_model_grads(v->model, NULL),
                               (float)s->train.weight_decay, v->groups);
        st = v->opt_ops->create(ctrl_host_table(), o->cfg, v->groups, v->n_groups,
                                (ctrl_device){CTRL_DEVICE_CPU, 0}, &v->opt);
    }
    if (st == CTRL_OK)
        CTRL_INFO("value model: %s (%s), its own %s optimizer stepping on %s", dir,
                  strcmp(dir, s->model.path) ? "as given" : "the policy's weights under a fresh value head",
                  s->train.optimizer, where);
    return st;
}

/* The flat positions reading response tokens 0 .. min(len, W - 1) of completions [c0, c0 + n)
 * (t = len reads the completion's last token: the value one past the policy's last), in order. */
static int value_positions(const ctrl_online *o, int c0, int n, const int *at, int W, int32_t *out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const int len = o->gout[c0 + i].len;
        for (int t = 0; t <= len && t < W; t++) out[k++] = at[i] + t;
    }
    return k;
}

static ctrl_status grow_at(online_value *v, size_t need) {
    int32_t *a = realloc(v->at, sizeof(int32_t) * (need ? need : 1));
    if (a) v->at = a;
    float *d = realloc(v->dv_at, sizeof(float) * (need ? need : 1));
    if (d) v->dv_at = d;
    return a && d ? CTRL_OK : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for %zu values", need);
}

ctrl_status online_value_rollout(ctrl_online *o, const float *total, int bs) {
    online_value *v = o->value;
    rows_free(v);
    const int n = o->gn;
    int W = 1;
    for (int i = 0; i < n; i++) W = o->gout[i].len > W ? o->gout[i].len : W;
    v->W = W;
    const size_t N = (size_t)n * W;
    int32_t *resp = malloc(sizeof(int32_t) * N);
    float *lp = calloc(N, sizeof(float)), *ref = calloc(N, sizeof(float)), *val = calloc(N, sizeof(float));
    float *score = malloc(sizeof(float) * (size_t)n);
    v->adv = calloc((size_t)n, sizeof(float *)), v->ret = calloc((size_t)n, sizeof(float *));
    v->oval = calloc((size_t)n, sizeof(float *)), v->pm = calloc((size_t)n, sizeof(float *));
    v->vm = calloc((size_t)n, sizeof(float *));
    ctrl_status st = resp && lp && ref && val && score && v->adv && v->ret && v->oval && v->pm && v->vm
                         ? CTRL_OK
                         : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for %zu tokens", N);
    if (st == CTRL_OK) v->gn = n;
    for (int i = 0; st == CTRL_OK && i < n; i++) {
        const ctrl_gen_output *g = &o->gout[i];
        for (int t = 0; t < W; t++) {
            resp[(size_t)i * W + t] = t < g->len ? g->ids[t] : ctrl_tokenizer_pad_id(o->tok);
            if (t < g->len) lp[(size_t)i * W + t] = o->old[i][t], ref[(size_t)i * W + t] = o->ref_lp[i][t];
        }
        score[i] = isnan(total[i]) ? 0.0f : total[i];
        v->adv[i] = malloc(sizeof(float) * W), v->ret[i] = malloc(sizeof(float) * W);
        v->oval[i] = malloc(sizeof(float) * W), v->pm[i] = malloc(sizeof(float) * W);
        v->vm[i] = malloc(sizeof(float) * W);
        if (!v->adv[i] || !v->ret[i] || !v->oval[i] || !v->pm[i] || !v->vm[i])
            st = ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
    }
    /* the value model's outputs, bs completions at a time, no gradient kept */
    for (int c0 = 0; st == CTRL_OK && c0 < n; c0 += bs) {
        const int m = c0 + bs <= n ? bs : n - c0;
        online_flat f;
        if ((st = online_flat_build(o, &o->train, c0, m, &f)) != CTRL_OK) break;
        size_t need = 0;
        for (int i = 0; i < m; i++) need += (size_t)o->gout[c0 + i].len + 1;
        float *out = malloc(sizeof(float) * (need ? need : 1));
        st = out ? grow_at(v, need) : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
        if (st == CTRL_OK) {
            const int k = value_positions(o, c0, m, f.at, W, v->at);
            st = ctrl_model_score_forward_at(v->model, &f.b, k, v->at, out);
        }
        for (int i = 0, k = 0; st == CTRL_OK && i < m; i++)
            for (int t = 0; t <= o->gout[c0 + i].len && t < W; t++) val[(size_t)(c0 + i) * W + t] = out[k++];
        free(out);
        online_flat_free(&f);
    }
    if (st == CTRL_OK) {
        float *adv = malloc(sizeof(float) * N), *ret = malloc(sizeof(float) * N),
              *ov = malloc(sizeof(float) * N);
        float *pm = malloc(sizeof(float) * N), *vm = malloc(sizeof(float) * N);
        ctrl_token_rollout ro = {.size = sizeof ro,
                                 .n = n,
                                 .width = W,
                                 .pad_token_id = ctrl_tokenizer_pad_id(o->tok),
                                 .eos_token_id = ctrl_tokenizer_eos_id(o->tok),
                                 .responses = resp,
                                 .logp = lp,
                                 .ref_logp = ref,
                                 .values = val,
                                 .scores = score,
                                 .advantages = adv,
                                 .returns = ret,
                                 .old_values = ov,
                                 .policy_mask = pm,
                                 .value_mask = vm,
                                 .report = online_report,
                                 .report_ctx = o};
        st = adv && ret && ov && pm && vm ? o->ops->token_rollout(o->trainer, &ro)
                                          : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory");
        for (int i = 0; st == CTRL_OK && i < n; i++) {
            const size_t b = (size_t)i * W * sizeof(float), w = sizeof(float) * W;
            memcpy(v->adv[i], (char *)adv + b, w), memcpy(v->ret[i], (char *)ret + b, w);
            memcpy(v->oval[i], (char *)ov + b, w), memcpy(v->pm[i], (char *)pm + b, w);
            memcpy(v->vm[i], (char *)vm + b, w);
        }
        free(adv), free(ret), free(ov), free(pm), free(vm);
    }
    free(resp), free(lp), free(ref), free(val), free(score);
    return st;
}

ctrl_status online_value_batch(ctrl_online *o, int c0, int n, const online_flat *f, float *w,
                               ctrl_trainer_batch *tb) {
    online_value *v = o->value;
    const size_t T = (size_t)f->b.T;
    float *a = calloc(T, sizeof(float)), *r = calloc(T, sizeof(float)), *ov = calloc(T, sizeof(float));
    float *vals = calloc(T, sizeof(float)), *vw = calloc(T, sizeof(float)), *sw = calloc(T, sizeof(float));
    float *dv = calloc(T, sizeof(float));
    size_t need = 0;
    for (int i = 0; i < n; i++) need += (size_t)o->gout[c0 + i].len + 1;
    float *out = malloc(sizeof(float) * (need ? need : 1));
    ctrl_status st =
        a && r && ov && vals && vw && sw && dv && out
            ? grow_at(v, need)
            : ctrl_error_set(CTRL_ERR_NOMEM, "online: out of memory for a micro-batch of %zu tokens", T);
    if (st == CTRL_OK) {
        v->n_at = value_positions(o, c0, n, f->at, v->W, v->at);
        st = ctrl_model_score_forward_at(v->model, &f->b, v->n_at, v->at, out);
    }
    for (int i = 0, k = 0; st == CTRL_OK && i < n; i++) {
        const int c = c0 + i;
        for (int t = 0; t <= o->gout[c].len && t < v->W; t++, k++) {
            const int p = f->at[i] + t;
            vals[p] = out[k], sw[p] = 1, a[p] = v->adv[c][t], r[p] = v->ret[c][t], ov[p] = v->oval[c][t];
            vw[p] = v->vm[c][t];
            if (t < o->gout[c].len) w[p] = v->pm[c][t];
        }
    }
    free(out);
    if (st != CTRL_OK) {
        free(a), free(r), free(ov), free(vals), free(vw), free(sw), free(dv);
        return st;
    }
    tb->token_advantages = a, tb->returns = r, tb->old_values = ov, tb->values = vals;
    tb->value_weight = vw, tb->stat_weight = sw, tb->dvalues = dv, tb->width = v->W;
    return CTRL_OK;
}

ctrl_status online_value_backward(ctrl_online *o, ctrl_trainer_batch *tb, int run) {
    online_value *v = o->value;
    ctrl_status st = CTRL_OK;
    if (run) {
        for (int k = 0; k < v->n_at; k++) v->dv_at[k] = tb->dvalues[v->at[k]];
        st = ctrl_model_score_backward_at(v->model, v->n_at, v->at, v->dv_at);
    }
    free((void *)tb->token_advantages), free((void *)tb->returns), free((void *)tb->old_values);
    free((void *)tb->values), free((void *)tb->value_weight), free((void *)tb->stat_weight),
        free(tb->dvalues);
    return st;
}

static void swap(void *arr, size_t size, int i, int j) {
    char tmp[256], *a = (char *)arr + (size_t)i * size, *b = (char *)arr + (size_t)j * size;
    memcpy(tmp, a, size), memcpy(a, b, size), memcpy(b, tmp, size);
}

/* TRL's np.random.permutation of the batch before each epoch, from a stream of the run's seed. */
void online_value_shuffle(ctrl_online *o) {
    online_value *v = o->value;
    uint64_t s = o->seed * 0x9e3779b97f4a7c15ull + ++v->shuffles * 0xbf58476d1ce4e5b9ull;
    for (int i = o->gn - 1; i > 0; i--) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int j = (int)((s >> 33) % (uint64_t)(i + 1));
        swap(o->gout, sizeof *o->gout, i, j), swap(o->gprompt, sizeof *o->gprompt, i, j);
        swap(o->trained, sizeof *o->trained, i, j), swap(o->adv, sizeof *o->adv, i, j);
        if (o->old) swap(o->old, sizeof *o->old, i, j);
        if (o->ref_lp) swap(o->ref_lp, sizeof *o->ref_lp, i, j);
        float **rows[] = {v->adv, v->ret, v->oval, v->pm, v->vm};
        for (int k = 0; k < 5; k++) swap(rows[k], sizeof(float *), i, j);
    }
}

ctrl_status online_value_zero_grad(ctrl_online *o) {
    online_value *v = o->value; /* zero3: this rank's slices' sums (the buffer is zeroed as reduced) */
    return v->zero ? train_zero_zero_grad(v->zero, v->model) : ctrl_model_zero_grad(v->model);
}

/* zero3: the gradients reduce-scattered in the backward, this rank's slices' sums averaged; their
 * global norm the slices' sums of squares added over the ranks, clipped, the slices stepped, the
 * units kept whole (the final norm, the score head) all-gathered after (train_step.c's way). */
static ctrl_status value_step_zero3(online_value *v, double lr, long step) {
    train_zero *z = v->zero;
    double sum_sq = 0;
    ctrl_status st = train_zero_reduce_grads(z, v->model, &sum_sq);
    if (st == CTRL_OK && v->max_grad_norm > 0) {
        const double coef = v->max_grad_norm / (sqrt(sum_sq) + 1e-6);
        if (coef < 1) st = train_zero_scale_grads(z, v->model, (float)coef);
    }
    if (st == CTRL_OK) st = v->opt_ops->step(v->opt, v->groups, v->n_groups, lr, step);
    if (st == CTRL_OK) st = train_zero_gather_params(z, v->model);
    if (st == CTRL_OK && !v->reported) st = value_report(v);
    v->reported = 1, v->last_norm = sqrt(sum_sq);
    return st;
}

ctrl_status online_value_step(ctrl_online *o, double lr, long step) {
    online_value *v = o->value;
    double sum_sq = 0;
    ctrl_status st = CTRL_OK;
    if (v->zero) {
        st = value_step_zero3(v, lr, step);
        if (st == CTRL_OK) ctrl_online_report(o, "value_model/grad_norm", v->last_norm);
        return st;
    }
    if (ctrl_collective_size() >
        1) { /* the ranks' gradients averaged, as the policy's (train_dp_average_grads) */
        size_t n = 0;
        if (ctrl_model_device(v->model).type != CTRL_DEVICE_CPU) { /* where they are: over NCCL */
            float *d = ctrl_model_device_grads(v->model, &n);
            st = ctrl_collective_device_init();
            if (st == CTRL_OK) st = ctrl_collective_device_allreduce_mean_f32(d, n);
        } else {
            float *g = ctrl_model_grads(v->model, &n);
            st = ctrl_collective_allreduce_mean_f32(g, n);
        }
    }
    if (st == CTRL_OK) st = ctrl_model_grad_sum_squares(v->model, &sum_sq);
    if (st == CTRL_OK && v->max_grad_norm > 0) { /* clipped on its own, by the run's max_grad_norm */
        const double coef = v->max_grad_norm / (sqrt(sum_sq) + 1e-6);
        if (coef < 1) st = ctrl_model_scale_grads(v->model, (float)coef);
    }
    if (st == CTRL_OK && !v->opt_on_device) st = ctrl_model_grads_to_host(v->model);
    if (st == CTRL_OK) st = v->opt_ops->step(v->opt, v->groups, v->n_groups, lr, step);
    if (v->opt_on_device)
        ctrl_model_device_weights_changed(v->model);
    else
        ctrl_model_weights_changed(v->model);
    if (st == CTRL_OK) ctrl_online_report(o, "value_model/grad_norm", sqrt(sum_sq)); /* ctrl's own */
    return st;
}

/* In a checkpoint directory: the value model's weights (fp32, under their HF names, the score head's
 * `score.weight` among them) and its optimizer's state buffers. */
#define VALUE_WEIGHTS "value_model.safetensors"
#define VALUE_OPTIMIZER "value_optimizer.safetensors"

#define VALUE_OPTIMIZER_RANK "value_optimizer.rank-%d.safetensors"

/* zero3: the sliced units' ranges of rank r (its slices of the layers and the embeddings), in the
 * order both sides walk them: fn(where, bytes, peer) for each non-empty one. */
static ctrl_status value_slices(online_value *v, int r, ctrl_status (*fn)(float *, size_t, int), int peer) {
    train_zero *z = v->zero;
    float *p = ctrl_model_params(v->model, NULL) + z->first;
    ctrl_status st = CTRL_OK;
    for (int u = 0; u < z->n_units && st == CTRL_OK; u++) {
        if (z->units[u].layer == -1) continue; /* whole on every rank */
        size_t lo, hi;
        train_zero_slice(z, u, r, &lo, &hi);
        if (hi > lo) st = fn(p + lo, (hi - lo) * sizeof(float), peer);
    }
    return st;
}
static ctrl_status send_to(float *at, size_t bytes, int peer) {
    return ctrl_collective_send(at, bytes, peer);
}
static ctrl_status recv_from(float *at, size_t bytes, int peer) {
    return ctrl_collective_recv(at, bytes, peer);
}

ctrl_status online_value_serve(ctrl_online *o) {
    online_value *v = o->value;
    if (!v || !v->zero || v->zero->rank == 0) return CTRL_OK;
    /* its slices of the weights (on a device: the whole model gathered on every device, as rank 0's
     * save gathers it), then its optimizer state: in the order rank 0 receives them */
    ctrl_status st =
        v->zero->dev ? train_zero_gather_all(v->zero) : value_slices(v, v->zero->rank, send_to, 0);
    if (v->zero->dev) train_zero_release_all(v->zero);
    return st == CTRL_OK ? train_zero_send_state(v->zero, v->opt_ops, v->opt) : st;
}

ctrl_status online_value_save(ctrl_online *o, const char *dir) {
    online_value *v = o->value;
    train_zero *z = v->zero;
    char path[4400];
    snprintf(path, sizeof path, "%s/" VALUE_WEIGHTS, dir);
    /* zero3: the others' slices into rank 0's model for the write (online_value_serve sends them), the
     * pages released again after; its optimizer state one file per rank, as the policy's */
    ctrl_status st = CTRL_OK;
    if (z && z->dev) /* on a device: gathered whole there (the fp32 masters in bf16), read from it */
        st = train_zero_gather_all(z);
    for (int r = 1; z && !z->dev && r < z->size && st == CTRL_OK; r++) st = value_slices(v, r, recv_from, r);
    if (st == CTRL_OK) st = ctrl_model_save_weights(v->model, path, CTRL_F32); /* from the device first */
    if (z) train_zero_release_all(z);
    for (int r = 0; z && r < z->size && st == CTRL_OK; r++) {
        snprintf(path, sizeof path, "%s/" VALUE_OPTIMIZER_RANK, dir, r);
        st = r == 0 ? ctrl_checkpoint_save_optimizer(path, v->opt_ops, v->opt)
                    : train_zero_write_shard(z, r, path);
    }
    snprintf(path, sizeof path, "%s/" VALUE_OPTIMIZER, dir);
    if (st == CTRL_OK && !z) st = ctrl_checkpoint_save_optimizer(path, v->opt_ops, v->opt);
    return st;
}

ctrl_status online_value_load(ctrl_online *o, const char *dir, long step) {
    online_value *v = o->value;
    const ctrl_run_settings *s = ctrl_config_settings(o->cfg);
    char path[4400];
    snprintf(path, sizeof path, "%s/" VALUE_WEIGHTS, dir);
    ctrl_safetensors *sf;
    ctrl_status st = ctrl_safetensors_open(path, &sf);
    if (st != CTRL_OK)
        return ctrl_error_wrap(st,
                               "[train] resume_from_checkpoint = %s: trainer %s's value model is not there",
                               dir, s->run.trainer);
    float *params = ctrl_model_params(v->model, NULL); /* the device's copy is replaced below */
    const int n = ctrl_model_view_count(v->model);
    if (ctrl_safetensors_count(sf) != n)
        st = ctrl_error_set(CTRL_ERR_FORMAT, "%s: %d tensors, the value model has %d", path,
                            ctrl_safetensors_count(sf), n);
    for (int i = 0; st == CTRL_OK && i < n; i++) {
        const ctrl_param_view *pv = ctrl_model_view(v->model, i);
        st = ctrl_safetensors_read_f32(sf, pv->name, params + pv->offset, (int64_t)pv->numel);
    }
    ctrl_safetensors_close(sf);
    if (v->zero && v->zero->dev) { /* on a device: this rank's slices put there (a collective) */
        if (st == CTRL_OK) st = train_zero_device_reload(v->zero, v->model);
    } else {
        if (v->zero) train_zero_release_all(v->zero); /* zero3: read whole, the others' slices let go */
        ctrl_model_weights_changed(v->model);         /* onto the device before the next forward */
    }
    if (v->zero) /* zero3: this rank's own optimizer state (the same ranks as the checkpoint's) */
        snprintf(path, sizeof path, "%s/" VALUE_OPTIMIZER_RANK, dir, v->zero->rank);
    else
        snprintf(path, sizeof path, "%s/" VALUE_OPTIMIZER, dir);
    if (st == CTRL_OK) st = ctrl_checkpoint_load_optimizer(path, v->opt_ops, v->opt);
    if (st != CTRL_OK)
        return ctrl_error_wrap(
            st, "[train] resume_from_checkpoint = %s: trainer %s's value model does not fit it", dir,
            s->run.trainer);
    v->shuffles = (uint64_t)step; /* one permutation per optimizer step so far (online_value_shuffle) */
    return CTRL_OK;
}
