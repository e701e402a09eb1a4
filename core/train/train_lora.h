/* The model a run trains, with or without LoRA ([peft]); train_lora.c. */
#ifndef CTRL_CORE_TRAIN_LORA_H
#define CTRL_CORE_TRAIN_LORA_H

#include <ctrl/attention.h>

#include "config/config_load.h"
#include "model/lora.h"
#include "model/model.h"

/* With [peft] enabled: the LoRA config the run trains -- [peft] adapter_path's adapter_config.json
 * (an error naming the file when it cannot be read), else the [peft] settings made into one. Read
 * once by the run's setup, then handed to train_model_load. */
ctrl_status train_lora_config(const ctrl_run_settings *s, ctrl_lora_config *out);
/* With [peft] enabled: the base ([model] path) frozen under LoRA adapters (`lora`,
 * train_lora_config's; unused without [peft]) whose weights are
 * `ckpt`'s adapter when resuming, else [peft] adapter_path's, else initialised; without:
 * `ckpt`'s full weights, else [model] path's. num_labels > 0: a sequence classifier of that many
 * labels (ctrl_model_load_classifier; with LoRA PEFT's SEQ_CLS, the score in the adapter). */
ctrl_status train_model_load(const ctrl_run_settings *s, const ctrl_lora_config *lora,
                             const ctrl_attention_ops *attn, const char *ckpt, int num_labels,
                             ctrl_model **out);
/* Says that a LoRA run under ZeRO-3 on several ranks reads only this rank's slices of the frozen base
 * (train_zero_rank_parts; QLoRA: quantizes each NF4 weight and keeps its slice,
 * train_zero_rank_nf4_parts): set before train_model_load, 0 until then. */
void train_model_zero3_sliced(int sliced);
/* Says whether the run computes on the CPU (with bf16 its LoRA base is then held in bf16 as it
 * loads); set before train_model_load, 0 until then. */
void train_model_on_cpu(int on_cpu);
/* Says whether the run's loop decodes (online and distillation trainers): [peft] embedding_dtype =
 * auto then keeps the fp32 table (decoding multiplies the tied head by its panels, packed once from
 * fp32; from the bf16 table it would widen and pack the whole table in every decoding step). Set
 * before train_model_load, 0 until then. */
void train_model_decodes(int decodes);
/* With LoRA and [train] dtype = bf16 on the CPU: the frozen base held in bf16
 * (ctrl_model_hold_base_bf16; the numbers do not change); where it cannot be (a device, QLoRA, DoRA,
 * experts) it stays fp32 and the log says why. Nothing otherwise. */
ctrl_status train_model_hold_base(ctrl_model *m, const ctrl_run_settings *s);
/* What a run saves into DIR: with LoRA the adapter in PEFT's format (base_model_name_or_path =
 * `base`), else the full model (config.json, model.safetensors, generation_config.json). */
ctrl_status train_model_save(ctrl_model *m, const char *dir, const char *base);
/* The trained model at the end of a run: the adapter with LoRA, else the model as [train] save_dtype
 * (auto: [model] path's dtype) and save_max_shard_size say. */
ctrl_status train_model_export(ctrl_model *m, const char *dir, const ctrl_run_settings *s);

#endif
