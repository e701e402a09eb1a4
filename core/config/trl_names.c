/* What ctrl calls the settings a TRL / transformers user writes under their TrainingArguments,
 * SFTConfig, GRPOConfig or ModelConfig names: an unknown key with such a name gets a message that
 * names ctrl's key (the first minutes of a TRL user). */
#include <string.h>

#include "config/config_internal.h"

static const struct {
    const char *trl, *ctrl;
} names[] = {
    {"gradient_checkpointing",
     "[memory] strategies = checkpointing (the default; empty keeps every activation)"},
    {"bf16", "[train] dtype = bf16 (the default)"},
    {"fp16", "[train] dtype (bf16 or fp32; fp16 is not supported)"},
    {"tf32", "[train] dtype (CUDA GEMMs are true fp32 or bf16; TF32 is not used)"},
    {"half_precision_backend", "[train] dtype"},
    {"torch_dtype", "[train] dtype (the compute dtype; master weights stay fp32)"},
    {"max_seq_length", "[data] max_length"},
    {"max_seq_len", "[data] max_length"},
    {"use_liger_kernel", "nothing: the fused LM head (Liger's fused linear cross-entropy) is always on"},
    {"eval_strategy", "[train] eval_steps (N: every N steps; 0: once at the end)"},
    {"evaluation_strategy", "[train] eval_steps (N: every N steps; 0: once at the end)"},
    {"logging_strategy", "[train] logging_steps"},
    {"logging_dir", "[train] report_to = tensorboard (event files in output_dir/runs)"},
    {"report_to", "[train] report_to"},
    {"output_dir", "[run] output_dir"},
    {"ds3_gather_for_generation", "[generation] ds3_gather_for_generation"},
    {"seed", "[run] seed"},
    {"data_seed", "[run] seed"},
    {"model_name_or_path", "[model] path"},
    {"model_name", "[model] path"},
    {"attn_implementation", "[model] attention = eager | flash"},
    {"dataset_name", "[data] train_file (a file, a folder or a Hub dataset id in the local cache)"},
    {"dataset_train_split", "[data] split"},
    {"dataset_config", "[data] subset"},
    {"dataset_test_split", "[data] eval_split"},
    {"eval_dataset", "[data] eval_file"},
    {"train_dataset", "[data] train_file"},
    {"optim",
     "[train] optimizer = adamw | adamw_8bit (optim=\"adamw_bnb_8bit\") | sgd (its options in [adamw] / "
     "[adamw_8bit] / [sgd])"},
    {"adam_beta1", "[adamw] adam_beta1"},
    {"adam_beta2", "[adamw] adam_beta2"},
    {"adam_epsilon", "[adamw] adam_epsilon"},
    {"deepspeed", "[memory] strategies = zero1 | zero2 (under mpirun; docs/distributed.md)"},
    {"fsdp", "[memory] strategies = zero1 | zero2 (under mpirun; docs/distributed.md)"},
    {"use_peft", "[peft] enabled = true"},
    {"lora_r", "[peft] r"},
    {"lora_alpha", "[peft] lora_alpha"},
    {"lora_dropout", "[peft] lora_dropout"},
    {"lora_target_modules", "[peft] target_modules"},
    {"load_in_4bit", "[peft] quantization = nf4"},
    {"num_generations", "[grpo] num_generations (the trainer's own section)"},
    {"max_completion_length", "the trainer's section, e.g. [grpo] max_completion_length"},
    {"use_vllm", "[generation] mode = colocate (the default) | server"},
    {"vllm_mode", "[generation] mode = colocate | server"},
    {"vllm_server_base_url", "[generation] server_url"},
    {"vllm_gpu_memory_utilization", "[generation] gpu_memory_utilization"},
    {"push_to_hub", "nothing: ctrl never uploads (the model is saved to output_dir)"},
    {"hub_model_id", "nothing: ctrl never uploads (the model is saved to output_dir)"},
    {"dataloader_num_workers", "nothing: data is tokenized in the training process"},
    {"torch_compile", "nothing: there is no compiler step"},
};

const char *config_trl_name_hint(const char *key) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(names[i].trl, key)) return names[i].ctrl;
    return NULL;
}
