/* PEFT's adapter directory format (huggingface/peft: save_pretrained / from_pretrained), both
 * ways: adapter_config.json (peft_type LORA, r, lora_alpha, target_modules, ...) and
 * adapter_model.safetensors with PEFT's tensor names -- "base_model.model." + the module's name,
 * without the adapter's name: base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight, and
 * the modules_to_save in full (base_model.model.lm_head.weight; a sequence classifier's score, PEFT's
 * task_type SEQ_CLS, as base_model.model.score.weight). */
#ifndef CTRL_CORE_MODEL_PEFT_H
#define CTRL_CORE_MODEL_PEFT_H

#include <stddef.h>

#include "model/lora.h"
#include "model/model.h"

/* DIR/adapter_config.json into *out (init = NONE: the weights come from the file); `base`
 * (may be NULL) receives base_model_name_or_path ("" when null). Refuses, naming the key, what is
 * not implemented: another peft_type, bias other than none, rank/alpha patterns,
 * layers_to_transform, a regex target_modules, ... */
ctrl_status ctrl_peft_read_config(const char *dir, ctrl_lora_config *out, char *base, size_t base_len);
/* The same from the file's own path. */
ctrl_status ctrl_peft_read_config_file(const char *path, ctrl_lora_config *out, char *base, size_t base_len);
/* rank_pattern (alpha 0) or alpha_pattern (alpha 1) from a JSON object's text ({"pattern": number, ...},
 * as adapter_config.json holds it) into c; errors name `where`. */
ctrl_status ctrl_peft_patterns_from_json(ctrl_lora_config *c, const char *json, int alpha, const char *where);
/* DIR/adapter_model.safetensors into the model's adapters and modules_to_save: every one of them
 * must be in the file and every tensor of the file must be one of them, shapes equal. */
ctrl_status ctrl_peft_load_weights(ctrl_model *m, const char *dir);
/* Writes DIR/adapter_config.json and DIR/adapter_model.safetensors (fp32), atomically, as PEFT's
 * save_pretrained would for this model's adapters; `base` is base_model_name_or_path. */
ctrl_status ctrl_peft_save(ctrl_model *m, const char *dir, const char *base);
/* A PiSSA / OLoRA adapter (init_lora_weights = pissa, olora: over the base's residual) as a plain LoRA
 * adapter of the original base (PEFT's save_pretrained with path_initial_model_for_weight_conversion):
 * the initial A0, B0 recomputed from base_dir as training began, then A' = [A; A0], B' = [B, -B0], r and
 * lora_alpha doubled (rsLoRA: alpha times sqrt 2), so s B' A' = s (B A - B0 A0) and W + s B' A' = W_res +
 * s B A; written into out_dir with init_lora_weights true. */
ctrl_status ctrl_peft_convert_to_lora(const char *base_dir, const char *adapter_dir, const char *out_dir);

/* A trainable view's values (or gradients) `src` as PEFT's file holds them, into dst (view v's numel
 * floats): the same except an expert adapter's lora_B (target_parameters), which ctrl holds expert
 * after expert ([E][out, r]) and PEFT as [out, E r] with expert e's rank k in column k E + e. With
 * `to_file` 0, the other way. */
void ctrl_peft_file_layout(const ctrl_model *m, const ctrl_param_view *v, const float *src, float *dst,
                           int to_file);
/* The same for an expert lora_B of E experts, [out, E r] in PEFT's file (expert e's rank k in column
 * k E + e) <-> ctrl's [E][out, r]. */
void ctrl_peft_expert_b_layout(int64_t E, int64_t out, int64_t r, const float *src, float *dst, int to_file);

/* The base model BASE_DIR under the adapter of ADAPTER_DIR (its config and weights); attn may be
 * NULL for a model that is only merged or saved. A SEQ_CLS adapter makes a sequence classifier
 * (BASE_DIR's num_labels, 1 for a causal LM's trunk) whose score is the adapter's. */
ctrl_status ctrl_peft_load(const char *base_dir, const char *adapter_dir, const ctrl_attention_ops *attn,
                           ctrl_model **out);
/* The same for bf16 inference (ctrl generate --adapter --dtype bf16): bf16 compute, the base held as the
 * bf16 GEMM's panels layer by layer as it loads (the LM head's too; a table of bf16 values in bf16
 * alone), so the fp32 base is never whole; where it cannot be held (no bf16 GEMM kernel, QLoRA, DoRA,
 * experts) it stays fp32, as ctrl_model_hold_panels would leave it. */
ctrl_status ctrl_peft_load_bf16(const char *base_dir, const char *adapter_dir, const ctrl_attention_ops *attn,
                                ctrl_model **out);
/* Folds every adapter into its base weight, W += s B A (PEFT's merge_and_unload), and switches the
 * adapters off: the model computes what it did, and ctrl_model_save writes the merged model (the
 * modules_to_save are the model's own tensors already). */
ctrl_status ctrl_peft_merge(ctrl_model *m);
/* The model as it computes, into one safetensors file at PATH under the base's HF names (what
 * ctrl_model_save_weights writes for a model without adapters): every adapter folded into a copy of its
 * base weight (PEFT's merge_adapter), a QLoRA base dequantized, a bf16-held base widened; the model
 * itself unchanged. Server mode pushes this, as TRL pushes a PEFT model's merged weights to vLLM. */
ctrl_status ctrl_peft_save_merged_weights(ctrl_model *m, const char *path, ctrl_dtype dtype);

#endif
