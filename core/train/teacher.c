/* The distillation teacher (see teacher.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "train/teacher.h"
#include "train/zero_ref.h"

/* The teacher's tokenizer files, when it has any, must give every id the student's token. */
static ctrl_status check_tokenizer(const ctrl_config *cfg, const char *dir, const ctrl_tokenizer *tok) {
    char path[4200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (access(path, R_OK) != 0) return CTRL_OK; /* weights only: the vocabulary size was checked */
    ctrl_tokenizer *tt = NULL;
    ctrl_status st = ctrl_tokenizer_load(dir, &tt);
    if (st != CTRL_OK)
        return ctrl_error_wrap(st, "%s: [teacher] path: its tokenizer",
                               ctrl_config_where(cfg, "teacher", "path"));
    const int n = ctrl_tokenizer_vocab_size(tok);
    if (ctrl_tokenizer_vocab_size(tt) != n)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "%s: [teacher] path: its tokenizer has %d tokens, the student's %d",
                            ctrl_config_where(cfg, "teacher", "path"), ctrl_tokenizer_vocab_size(tt), n);
    for (int32_t id = 0; st == CTRL_OK && id < n; id++) {
        const char *a = ctrl_tokenizer_id_to_token(tok, id), *b = ctrl_tokenizer_id_to_token(tt, id);
        if ((a == NULL) != (b == NULL) || (a && strcmp(a, b) != 0))
            st = ctrl_error_set(
                CTRL_ERR_CONFIG,
                "%s: [teacher] path: its tokenizer is not the student's (id %d is '%s' there, "
                "'%s' for the student): GKD compares distributions over one vocabulary",
                ctrl_config_where(cfg, "teacher", "path"), id, b ? b : "(none)", a ? a : "(none)");
    }
    ctrl_tokenizer_free(tt);
    return st;
}

/* What a teacher must be: a causal LM of the student's vocabulary and tokenizer. */
static ctrl_status check_teacher(const ctrl_config *cfg, const ctrl_model *t, const ctrl_model *student,
                                 const ctrl_tokenizer *tok) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    const char *where = ctrl_config_where(cfg, "teacher", "path");
    const ctrl_model_config *tc = ctrl_model_cfg(t), *sc = ctrl_model_cfg(student);
    if (tc->num_labels > 0)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "%s: [teacher] path: %s is a sequence classifier, not a causal LM", where,
                              s->teacher.path);
    if (tc->vocab_size != sc->vocab_size)
        return ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: [teacher] path: the teacher's vocab_size is %d, the student's %d (GKD compares "
            "the teacher's full next-token distribution: one vocabulary)",
            where, tc->vocab_size, sc->vocab_size);
    return check_tokenizer(cfg, s->teacher.path, tok);
}

static ctrl_bf16_fallback fallback(const ctrl_run_settings *s) {
    return s->train.bf16_fallback_fp32 ? CTRL_BF16_FALLBACK_FP32 : CTRL_BF16_FALLBACK_ROUNDED;
}

static ctrl_status need_path(const ctrl_run_settings *s) {
    return s->teacher.path ? CTRL_OK
                           : ctrl_error_set(CTRL_ERR_CONFIG,
                                            "[teacher] path: trainer %s distils from a teacher model; set it",
                                            s->run.trainer);
}

ctrl_status train_teacher_load(const ctrl_config *cfg, const ctrl_model *student, const ctrl_tokenizer *tok,
                               const ctrl_attention_ops *attn, ctrl_model **out) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    *out = NULL;
    ctrl_status st = need_path(s);
    if (st != CTRL_OK) return st;
    ctrl_model *t = NULL;
    st = ctrl_model_load(s->teacher.path, attn, &t);
    if (st != CTRL_OK)
        return ctrl_error_wrap(st, "%s: [teacher] path", ctrl_config_where(cfg, "teacher", "path"));
    st = check_teacher(cfg, t, student, tok);
    if (st == CTRL_OK) st = ctrl_model_freeze(t);
    /* forwards only: each layer's input and one shared set of internals, not every layer's */
    if (st == CTRL_OK) st = ctrl_model_set_recompute_all(t);
    if (st == CTRL_OK && s->teacher.bf16) st = ctrl_model_set_compute_dtype(t, CTRL_BF16);
    ctrl_model_set_bf16_fallback(t, fallback(s)); /* [train] bf16_fallback: the run's products */
    if (st == CTRL_OK) st = ctrl_model_place_like(t, student);
    /* bf16 on the CPU: the weights held as bf16, one layer widened at a time (on a device the
     * teacher computes from its device copy) */
    if (st == CTRL_OK && s->teacher.bf16 && ctrl_model_device(t).type == CTRL_DEVICE_CPU)
        st = ctrl_model_hold_bf16(t);
    if (st != CTRL_OK) {
        ctrl_model_free(t);
        return st;
    }
    *out = t;
    return CTRL_OK;
}

ctrl_status train_teacher_load_sliced(const ctrl_config *cfg, const ctrl_model *student,
                                      const ctrl_tokenizer *tok, const ctrl_attention_ops *attn,
                                      size_t prefetch, ctrl_model **out, train_zero **zout) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    *out = NULL, *zout = NULL;
    ctrl_status st = need_path(s);
    if (st != CTRL_OK) return st;
    ctrl_model *t = NULL;
    train_zero *z = NULL;
    /* no ctrl_model_freeze: the gradient buffer is never touched (no pages), and the slices are cut
     * over the parameters as a policy's would be */
    st = train_zero_frozen_load(s->teacher.path, attn, student, s->teacher.bf16 ? CTRL_BF16 : CTRL_F32,
                                prefetch, &t, &z);
    if (st != CTRL_OK)
        return ctrl_error_wrap(st, "%s: [teacher] path (sliced for zero3)",
                               ctrl_config_where(cfg, "teacher", "path"));
    ctrl_model_set_bf16_fallback(t, fallback(s));
    st = check_teacher(cfg, t, student, tok);
    if (st == CTRL_OK) st = train_zero_frozen_describe(z, "the teacher", "over the ranks as the student");
    if (st != CTRL_OK) {
        train_zero_ref_free(z, t);
        return st;
    }
    *out = t, *zout = z;
    return CTRL_OK;
}
