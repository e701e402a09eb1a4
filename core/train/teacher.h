/* The teacher of a distillation run ([teacher] section): a second causal LM held by the same model
 * code as the student, frozen (no gradient buffer, no optimizer state, never written), on the
 * student's backend, optionally computing in bf16. */
#ifndef CTRL_CORE_TRAIN_TEACHER_H
#define CTRL_CORE_TRAIN_TEACHER_H

#include <ctrl/attention.h>

#include "config/config_load.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/zero.h"

/* Loads [teacher] path for `student` (tokenized by `tok`): refused naming the key when it is unset,
 * not a causal LM, of another vocabulary size, or when its own tokenizer (if it has tokenizer
 * files) maps any id to another token than the student's. The teacher keeps no activations but
 * each layer's input and one layer's internals (it never runs a backward). [teacher] dtype = bf16
 * runs its linear projections in bf16 and, on the CPU, holds its weights in bf16
 * (ctrl_model_hold_bf16: all of them rounded, the layers' stored in 2 bytes). */
ctrl_status train_teacher_load(const ctrl_config *cfg, const ctrl_model *student, const ctrl_tokenizer *tok,
                               const ctrl_attention_ops *attn, ctrl_model **out);
/* The same under zero3 on several ranks (a full or a LoRA student; on the CPU or the student's CUDA
 * device): the teacher sliced as DPO's reference (zero_ref.h: this rank's slices read, each unit
 * gathered around its use, *zout its train_zero), as TRL's GKDTrainer prepares the teacher with the
 * student's DeepSpeed ZeRO-3 config;
 * [teacher] dtype = bf16 then computes in bf16 from the fp32 slices (a layer's bf16 copy rounded
 * after its gather) instead of holding the weights in bf16. Free with train_zero_ref_free. A
 * collective (it logs the slices' resident bytes). */
ctrl_status train_teacher_load_sliced(const ctrl_config *cfg, const ctrl_model *student,
                                      const ctrl_tokenizer *tok, const ctrl_attention_ops *attn,
                                      size_t prefetch, ctrl_model **out, train_zero **zout);

#endif
