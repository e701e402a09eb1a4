/* What the dpo parity tests share (dpo_case.c): a fixture case of tests/reference/
 * make_dpo_fixtures.py laid out flat as the sequence kind lays a micro-batch out, the dpo trainer
 * configured as the case says, and TRL's metrics compared. */
#ifndef CTRL_TESTS_DPO_CASE_H
#define CTRL_TESTS_DPO_CASE_H

#include <stdint.h>

#include <ctrl/trainer.h>

#include "fixture.h"
#include "model/model.h"
#include "registry/registry.h"
#include "train/kind_sequence.h"

/* config: loss_type, second loss_type (-1: none), their weights, beta, label_smoothing,
 * f_divergence_type, f_alpha_divergence_coef, use_weighting, ld_alpha (-1: None), discopop_tau,
 * precomputed reference */
#define DPO_CONFIG_N 12

/* Micro-batch mb of a case: its 2B sequences (chosen, then rejected) back to back, unpadded;
 * per-token arrays [T] hold TRL's values at the position predicting each completion token (0
 * elsewhere). */
typedef struct dpo_flat {
    int T, n_seq;
    int32_t *cu, *tokens, *positions, *targets, *correct;
    float *weight, *logp, *dlogp, *ref_logp, *entropy, *mean_logit, *log_sum_sq;
    ctrl_batch batch;
} dpo_flat;

void dpo_flat_build(dpo_flat *x, const fixture *f, int mb);
void dpo_flat_free(dpo_flat *x);
/* What the sequence kind reduces of x's first S sequences: the log-prob sums weighted by w into
 * sum[S], the mean logits over each one's completion tokens into ml[S] (their counts in n_tok[S]),
 * and the reference sums weighted by w into ref[S], or with pre (a precomputed reference) the
 * fixture's mbN_ref_sum of micro-batch mb (n_ref values). */
void dpo_flat_sums(const dpo_flat *x, const fixture *f, int mb, int S, const float *w, int pre, long n_ref,
                   double *sum, double *ml, int *n_tok, double *ref);

/* The dpo trainer created from the case's config (NULL and a failed check when it cannot be). */
const ctrl_trainer_ops *dpo_case_trainer(ctrl_registry *reg, const fixture *f, ctrl_trainer **out);
/* The [dpo] section of the case's config, as INI lines. */
void dpo_case_ini(const fixture *f, char *buf, size_t cap);

/* Every metric reported is one TRL logged, with its mean over the calls within rel; returns how many. */
int dpo_compare_metrics(const fixture *f, const fixture_metrics *got, const char *name, double rel);

/* The tiny Qwen2 fixture policy and tests/fixtures/dpo/ref_model, both on the flash attention
 * plugin (a failed check when either cannot be loaded). */
void dpo_case_models(ctrl_registry *reg, ctrl_model **policy, ctrl_model **ref);

/* One case of tests/fixtures/DIR/NAME.bin run through the models (test_dpo, test_kto): the fixture,
 * the tiny policy and reference (dpo_case_models), the trainer `make` creates from the case's
 * config, its sequence spec, and a step reporting into `got` (keep the struct in place). */
typedef const ctrl_trainer_ops *(*seq_case_trainer_fn)(ctrl_registry *reg, const fixture *f,
                                                       ctrl_trainer **out);
typedef struct seq_case {
    fixture *f;
    ctrl_model *m, *ref;
    ctrl_trainer *t;
    const ctrl_trainer_ops *ops;
    ctrl_sequence_spec spec;
    fixture_metrics got;
    seq_step step;
} seq_case;
/* 1 when every part could be had (close it after), the policy's gradients zeroed; else 0 after a
 * failed check, the case closed. */
int seq_case_open(seq_case *c, ctrl_registry *reg, const char *dir, const char *name,
                  seq_case_trainer_fn make);
/* One training micro-batch of the case through the kind (num_items: the step's loss denominator);
 * its loss must be TRL's want (a failed check naming the case and micro-batch mb otherwise). */
void seq_case_train(seq_case *c, const seq_micro_batch *run, double num_items, const char *name, int mb,
                    double want);
/* With a precomputed reference: micro-batch mb's reference sums by the precompute pass's function
 * into pre[run->n_seq], their worst relative error against the fixture's mbN_ref_sum folded into
 * *worst, and run->ref_sum = pre. Nothing without one. */
void seq_case_ref_sums(seq_case *c, seq_micro_batch *run, int mb, double *pre, double *worst);
void seq_case_close(seq_case *c);

/* The worst relative error of the model's gradients against a safetensors file of TRL's. */
double dpo_compare_grads(ctrl_model *m, const char *path);

#endif
