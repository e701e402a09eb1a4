/* The distillation teacher (see teacher.h). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "train/teacher.h"

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

ctrl_status train_teacher_load(const ctrl_config *cfg, const ctrl_model *student, const ctrl_tokenizer *tok,
                               const ctrl_attention_ops *attn, ctrl_model **out) {
    const ctrl_run_settings *s = ctrl_config_settings(cfg);
    *out = NULL;
    if (!s->teacher.path)
        return ctrl_error_set(CTRL_ERR_CONFIG,
                              "[teacher] path: trainer %s distils from a teacher model; set it",
                              s->run.trainer);
    const char *where = ctrl_config_where(cfg, "teacher", "path");
    ctrl_model *t = NULL;
    ctrl_status st = ctrl_model_load(s->teacher.path, attn, &t);
    if (st != CTRL_OK) return ctrl_error_wrap(st, "%s: [teacher] path", where);
    const ctrl_model_config *tc = ctrl_model_cfg(t), *sc = ctrl_model_cfg(student);
    if (tc->num_labels > 0)
        st = ctrl_error_set(CTRL_ERR_CONFIG,
                            "%s: [teacher] path: %s is a sequence classifier, not a causal LM", where,
                            s->teacher.path);
    else if (tc->vocab_size != sc->vocab_size)
        st = ctrl_error_set(
            CTRL_ERR_CONFIG,
            "%s: [teacher] path: the teacher's vocab_size is %d, the student's %d (GKD compares "
            "the teacher's full next-token distribution: one vocabulary)",
            where, tc->vocab_size, sc->vocab_size);
    if (st == CTRL_OK) st = check_tokenizer(cfg, s->teacher.path, tok);
    if (st == CTRL_OK) st = ctrl_model_freeze(t);
    /* forwards only: each layer's input and one shared set of internals, not every layer's */
    if (st == CTRL_OK) st = ctrl_model_set_recompute_all(t);
    if (st == CTRL_OK && s->teacher.bf16) st = ctrl_model_set_compute_dtype(t, CTRL_BF16);
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
