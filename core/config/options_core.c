/* The core's own sections and keys. Key names follow TRL / transformers' TrainingArguments
 * wherever they have one, with their defaults (SFT's where trainers differ). */
#include <float.h>

#include "config/config_internal.h"

/* Each range macro ends at .max so that the positional initialisers after it continue at .choices. */
#define RANGE(lo, hi) .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_HAS_MAX, .min = (lo), .max = (hi)
#define MIN(lo) .flags = CTRL_OPT_HAS_MIN, .min = (lo), .max = 0
#define POSITIVE .flags = CTRL_OPT_HAS_MIN | CTRL_OPT_MIN_OPEN, .min = 0, .max = 0

static const ctrl_option run_options[] = {
    {"trainer", CTRL_OPT_STRING, "sft", 0, 0, 0, NULL,
     "Trainer plugin (sft, dpo, grpo, ...); its options go in a section named after it."},
    {"output_dir", CTRL_OPT_PATH, NULL, 0, 0, 0, NULL,
     "Where checkpoints, metrics and the effective config go (default: runs/<config file name>)."},
    {"seed", CTRL_OPT_INT, "42", MIN(0), NULL, "Random seed for initialisation, shuffling and sampling."},
    {"device", CTRL_OPT_STRING, "auto", 0, 0, 0, NULL,
     "auto (a GPU when one exists), cpu, cuda, or cuda:N. Every trainer (sft, dpo, kto, reward, gkd, grpo, "
     "rloo, "
     "online_dpo, ppo) runs on cuda."},
    {"log_level", CTRL_OPT_CHOICE, "info", 0, 0, 0, "trace|debug|info|warn|error",
     "Logging verbosity of `ctrl train` (the command line's --log-level, when given, wins)."},
    CTRL_OPTION_END,
};

static const ctrl_option model_options[] = {
    {"path", CTRL_OPT_PATH, NULL, CTRL_OPT_REQUIRED, 0, 0, NULL,
     "Hugging Face model directory (config.json, safetensors, tokenizer files)."},
    {"attention", CTRL_OPT_STRING, "flash", 0, 0, 0, NULL,
     "Attention plugin (eager, flash, ...); its options go in [attention.NAME]."},
    CTRL_OPTION_END,
};

static const ctrl_option data_options[] = {
    {"train_file", CTRL_OPT_PATH, NULL, 0, 0, 0, NULL,
     "Training data: a .jsonl, .json, .parquet or .arrow file, a folder of them (Hub shards, a local copy "
     "of a dataset repository, a `datasets` save_to_disk folder), or a Hub dataset id ORG/NAME[@REVISION] "
     "in the local Hugging Face cache."},
    {"eval_file", CTRL_OPT_PATH, NULL, 0, 0, 0, NULL,
     "Evaluation data (as train_file); or hold out eval_fraction of train_file."},
    {"split", CTRL_OPT_STRING, "train", 0, 0, 0, NULL,
     "The split read when train_file is a folder or a Hub dataset id (file names as the Hub names "
     "them: data/train-00000-of-00001.parquet, train/..., test.jsonl; a folder without split names is "
     "all train)."},
    {"subset", CTRL_OPT_STRING, NULL, 0, 0, 0, NULL,
     "A Hub dataset's configuration (TRL's dataset_config, datasets' name) when train_file / eval_file is a "
     "folder or a Hub dataset id: only the files under its folder SUBSET/ (as push_to_hub(config_name=...) "
     "and the Hub's parquet conversion lay them out; default is also data/)."},
    {"eval_split", CTRL_OPT_STRING, "test", 0, 0, 0, NULL,
     "The split read when eval_file is a folder or a Hub dataset id (TRL's dataset_test_split)."},
    {"eval_fraction", CTRL_OPT_FLOAT, "0", RANGE(0, 0.5), NULL,
     "Fraction of train_file held out for evaluation when eval_file is not set."},
    {"dataset_text_field", CTRL_OPT_STRING, "text", 0, 0, 0, NULL, "Column holding plain text rows."},
    {"messages_field", CTRL_OPT_STRING, "messages", 0, 0, 0, NULL,
     "Column holding conversations (lists of {role, content}); ShareGPT `conversations` are converted."},
    {"prompt_field", CTRL_OPT_STRING, "prompt", 0, 0, 0, NULL,
     "Column holding the prompt (string or messages)."},
    {"completion_field", CTRL_OPT_STRING, "completion", 0, 0, 0, NULL,
     "Column holding the completion (string or messages)."},
    {"chat_template_path", CTRL_OPT_PATH, NULL, 0, 0, 0, NULL,
     "A Jinja chat template file used instead of the tokenizer's (e.g. one with {% generation %} blocks)."},
    {"max_length", CTRL_OPT_INT, "1024", MIN(1), NULL,
     "Truncate tokenized examples to this length (the pack length when packing; preference data: each "
     "prompt + completion, rows whose prompt fills it dropped, reward pairs over it dropped)."},
    {"truncation_mode", CTRL_OPT_CHOICE, "keep_start", 0, 0, 0, "keep_start|keep_end",
     "Which end of a too-long example is kept."},
    {"max_prompt_length", CTRL_OPT_INT, "0", MIN(0), NULL,
     "Preference data (dpo, kto): keep only the prompt's last this many tokens, before max_length (0 = "
     "off)."},
    {"max_completion_length", CTRL_OPT_INT, "0", MIN(0), NULL,
     "Preference data (dpo, kto): keep only each completion's first this many tokens, before max_length "
     "(0 = off)."},
    {"packing", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL, "Pack several examples into each sequence."},
    {"packing_strategy", CTRL_OPT_CHOICE, "bfd", 0, 0, 0, "bfd|bfd_split|wrapped",
     "bfd: best-fit decreasing (overflow dropped); bfd_split: long examples split first; wrapped: cut a "
     "stream."},
    {"padding_free", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL,
     "Flat variable-length batches (no padding); false pads rows to the longest, as TRL's padded batches "
     "(bfd/bfd_split packing forces it on, as TRL)."},
    {"pad_to_multiple_of", CTRL_OPT_INT, "0", MIN(0), NULL,
     "Pad each padded row, or the flat padding-free batch, to a multiple of this (0 = off); pads are never "
     "trained or attended."},
    {"completion_only_loss", CTRL_OPT_CHOICE, "auto", 0, 0, 0, "auto|true|false",
     "Train only on completion tokens (auto: on for prompt-completion data, as TRL)."},
    {"assistant_only_loss", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Train only on assistant tokens marked by {% generation %} in the chat template."},
    {"eval_packing", CTRL_OPT_BOOL, NULL, 0, 0, 0, NULL,
     "Pack the evaluation set (unset: as `packing` says, like TRL's eval_packing = None)."},
    {"shuffle", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL, "Shuffle the training rows with the seed each epoch."},
    {"skip_bad_rows", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Skip and count malformed rows instead of stopping with file:line."},
    CTRL_OPTION_END,
};

static const ctrl_option train_options[] = {
    {"optimizer", CTRL_OPT_STRING, "adamw", 0, 0, 0, NULL,
     "Optimizer plugin (adamw; adamw_8bit, bitsandbytes' 8-bit AdamW; sgd); its options go in a "
     "section named after it."},
    {"learning_rate", CTRL_OPT_FLOAT, "2e-5", POSITIVE, NULL, "Peak learning rate."},
    {"lr_scheduler_type", CTRL_OPT_CHOICE, "linear", 0, 0, 0,
     "constant|constant_with_warmup|linear|cosine|cosine_with_min_lr", "Learning-rate schedule."},
    {"min_lr_rate", CTRL_OPT_FLOAT, "0", RANGE(0, 1), NULL,
     "cosine_with_min_lr: the floor as a fraction of learning_rate."},
    {"warmup_steps", CTRL_OPT_INT, "0", MIN(0), NULL,
     "Linear warmup steps (overrides warmup_ratio when > 0)."},
    {"warmup_ratio", CTRL_OPT_FLOAT, "0", RANGE(0, 1), NULL, "Warmup as a fraction of the total steps."},
    {"num_train_epochs", CTRL_OPT_FLOAT, "3", POSITIVE, NULL, "Epochs over the training data."},
    {"max_steps", CTRL_OPT_INT, "-1", MIN(-1), NULL,
     "Optimizer steps to run; overrides num_train_epochs when > 0."},
    {"per_device_train_batch_size", CTRL_OPT_INT, "8", MIN(1), NULL, "Examples per micro-batch per device."},
    {"per_device_eval_batch_size", CTRL_OPT_INT, "8", MIN(1), NULL,
     "Examples per evaluation batch per device (with N ranks each evaluates every N-th batch). The online "
     "trainers: completions, in whole groups of num_generations (per_device_eval_batch_size / "
     "num_generations prompts a batch, at least one)."},
    {"gradient_accumulation_steps", CTRL_OPT_INT, "1", MIN(1), NULL, "Micro-batches per optimizer step."},
    {"max_grad_norm", CTRL_OPT_FLOAT, "1.0", MIN(0), NULL, "Clip the global gradient norm (0 = off)."},
    {"weight_decay", CTRL_OPT_FLOAT, "0", MIN(0), NULL, "Decoupled weight decay (not on norms and biases)."},
    {"router_aux_loss_coef", CTRL_OPT_FLOAT, NULL, MIN(0), NULL,
     "Mixture-of-experts models: the weight of the router load-balancing loss added to the policy's loss "
     "(coef x aux / accumulation steps per micro-batch) by sft, dpo, kto and the online trainers (grpo, "
     "rloo; ppo and online_dpo too, where TRL's do not add it), logged as aux_loss; unset: the model "
     "config's "
     "router_aux_loss_coef; 0 turns it off. Refused when > 0 on a dense model (as TRL) and with gkd or a "
     "reward model, which do not add it."},
    {"dtype", CTRL_OPT_CHOICE, "bf16", 0, 0, 0, "bf16|fp16|fp32",
     "Compute dtype (master weights, gradients and optimizer state stay fp32). bf16 on the CPU: the linear "
     "projections in bf16 with fp32 accumulation, as torch.autocast; with AMX or AVX-512 BF16 (checked at "
     "run "
     "time; CTRL_NO_AMX=1 turns AMX off, CTRL_NO_AVX512BF16=1 both) a blocked GEMM on AMX tiles (tdpbf16ps) "
     "or "
     "vdpbf16ps that rounds as it packs, the LM head in bf16 too and no rounded copy of the weights; without "
     "them (an AVX2-only CPU) bf16 has no fast path and the training products run in plain fp32, as fast as "
     "dtype = fp32 (bf16_fallback says; the log says once which path runs), or with bf16_fallback = rounded "
     "as SGEMM on bf16-rounded inputs (bf16's numbers, no faster than fp32), each "
     "projection rounding its weights as it runs (a rounded copy only for few-token forwards); decoding (and "
     "prefill calls of up to 256 tokens) on its own bf16 panels where the CPU has AVX2 (packed once per "
     "weight change, 2 bytes a "
     "weight: faster "
     "than fp32 decoding); on "
     "CUDA bf16 cuBLASLt GEMMs where libctrl_cuda has them (refused "
     "naming this key where not); fp16: not supported. With [peft] LoRA, bf16 on the CPU also holds the "
     "frozen base's layer weights in bf16 (with AMX or AVX-512 BF16 as the GEMM's packed panels, multiplied "
     "by the forward, the backward's dX and decoding; else 2 bytes each, widened to fp32 one layer at a "
     "time: the same numbers either way); not with DoRA, QLoRA or experts. Online trainers in bf16 also "
     "train on the panels decoding packed in the same step (the weights unchanged until the optimizer "
     "step; CTRL_NO_PACKED_TRAIN=1 turns that off: the same numbers). An input several projections read "
     "(q/k/v's, gate/up's, a LoRA adapter's with its base's) is packed once for all of them "
     "(CTRL_NO_SHARED_OPERANDS=1: per product, the same numbers), and a head that trains packs its "
     "weights once a step, not per chunk of tokens (CTRL_HEAD_PACK_PER_CHUNK=1: per chunk)."},
    {"bf16_fallback", CTRL_OPT_CHOICE, "fp32", 0, 0, 0, "fp32|rounded",
     "dtype = bf16 on a CPU without a bf16 kernel (no AVX-512 BF16 or AMX, e.g. an AVX2-only CPU, or with "
     "them turned off by CTRL_NO_AVX512BF16): fp32 multiplies the forwards' and backwards' linear "
     "products in plain fp32 (fp32's numbers and speed: emulating bf16 there is slower and no more "
     "exact; weights held as bf16 values -- a LoRA run's frozen base, [peft] embedding_dtype = bf16, "
     "[teacher] dtype = bf16 -- keep them, only the activations are no longer rounded); rounded emulates "
     "torch.autocast's bf16 numbers (inputs and weights rounded to bf16, fp32 SGEMM), for runs that must "
     "match a bf16 run on another machine. The log says once which runs. Decoding keeps its bf16 products "
     "either way; on a CPU with AVX-512 BF16 or AMX, on CUDA and with dtype = fp32 this key changes "
     "nothing. Applies to the run's reference, value and teacher models too."},
    {"logging_steps", CTRL_OPT_INT, "10", MIN(1), NULL, "Log metrics every N optimizer steps."},
    {"report_to", CTRL_OPT_LIST, "png", 0, 0, 0, "none|all|jsonl|png|tensorboard",
     "Where logged metrics go besides output_dir/metrics.jsonl (always written): png (output_dir/"
     "metrics.png at the end, gnuplot), tensorboard (event files in output_dir/runs/, tags as the HF "
     "Trainer's: train/loss, eval/loss, ...), all (both), none (neither); jsonl is accepted and always on."},
    {"eval_steps", CTRL_OPT_INT, "0", MIN(0), NULL, "Evaluate every N steps (0 = at the end only)."},
    {"save_steps", CTRL_OPT_INT, "500", MIN(0), NULL,
     "Write output_dir/checkpoint-STEP every N steps and at the end (0 = at the end only)."},
    {"save_strategy", CTRL_OPT_CHOICE, "steps", 0, 0, 0, "steps|no",
     "steps: checkpoints as save_steps says (TRL's default); no: none, except when interrupted (the model "
     "is saved to output_dir either way)."},
    {"save_total_limit", CTRL_OPT_INT, "0", MIN(0), NULL, "Keep at most N checkpoints (0 = all)."},
    {"save_dtype", CTRL_OPT_CHOICE, "auto", 0, 0, 0, "auto|fp32|bf16|fp16",
     "The dtype of the model saved to output_dir at the end: auto = [model] path's (config.json's dtype or "
     "torch_dtype, else its weights'): a bf16 model stays bf16, as save_pretrained keeps a model's dtype; "
     "config.json's dtype says which. Checkpoints keep the fp32 master weights (an exact resume). Not with "
     "[peft] enabled (the adapter is saved as PEFT saves it)."},
    {"save_max_shard_size", CTRL_OPT_STRING, "50GB", 0, 0, 0, NULL,
     "transformers' max_shard_size for the model saved to output_dir at the end: above it the weights are "
     "split into model-0000K-of-0000N.safetensors with model.safetensors.index.json, as save_pretrained "
     "splits them (5GB, 500MB, 200KB: powers of 1000; or a number of bytes; a tensor larger than it gets a "
     "shard of its own). Checkpoints use save_pretrained's default, 50GB, as the HF Trainer's do."},
    {"resume_from_checkpoint", CTRL_OPT_STRING, NULL, 0, 0, 0, NULL,
     "A checkpoint directory, or 'last' for the newest in output_dir."},
    {"ddp_timeout", CTRL_OPT_INT, "1800", MIN(1), NULL,
     "Data parallel (mpirun/srun): seconds a collective may wait for the other ranks before the job is "
     "ended with an error (a rank stopped or far behind; checkpoint saves and the slowest "
     "rank's share of an evaluation must fit in it), as TrainingArguments.ddp_timeout."},
    {"ddp_shared_memory", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL,
     "Data parallel on the CPU with every rank on one node (no [memory] strategy): the gradients live in "
     "memory all ranks map, and their mean is summed slice by slice there (each rank its slice, then "
     "copies the others') instead of MPI_Allreduce's copies through MPI's buffers: the same values (bit "
     "for bit with two ranks), about a third of the memory traffic. false: MPI_Allreduce. Ranks on several "
     "nodes, CUDA models "
     "and ZeRO use their collectives either way (logged)."},
    CTRL_OPTION_END,
};

static const ctrl_option memory_options[] = {
    {"strategies", CTRL_OPT_LIST, "checkpointing", 0, 0, 0, NULL,
     "Memory-strategy plugins applied around each layer (checkpointing: recompute activations in backward, "
     "TRL's default gradient_checkpointing; empty: keep every activation), and at most one ZeRO stage for "
     "data-parallel runs, DeepSpeed's: zero1 partitions the optimizer state over the ranks, zero2 also "
     "reduce-scatters the gradients, zero3 also slices each layer's parameters, gathered around its forward "
     "and backward (SFT, the preference trainers, GRPO/RLOO and GKD colocated or through a server, on the "
     "CPU and cuda, fp32 or bf16, LoRA too; QLoRA on the CPU: each rank keeps its slice of the NF4 store, a "
     "layer's gathered around its "
     "use); "
     "offload_optimizer: on a CUDA run the optimizer state and step in host memory; offload_activations: the "
     "checkpointed layers' inputs kept out of the compute memory between forward and backward -- on a CUDA "
     "run in host memory, on the CPU in a file (offload_dir) -- (e.g. checkpointing, zero2; "
     "docs/distributed.md)."},
    {"reduce_bucket_size", CTRL_OPT_STRING, "auto", 0, 0, 0, NULL,
     "zero2 (CPU and CUDA) and zero3: gradient floats reduce-scattered together as the backward makes "
     "them -- consecutive layers, at most this many floats (a larger layer alone), each rank keeping only "
     "its slices' averages, as DeepSpeed's reduce_bucket_size. auto: hidden_size^2, what the HF Trainer "
     "fills in for DeepSpeed's auto (each decoder layer a bucket of its own for any model whose layers are "
     "larger); a number of floats >= 1 (5e8, DeepSpeed's own default, is accepted: at Qwen2.5-0.5B's size "
     "one bucket of every layer, the whole gradient buffer resident until the backward ends). Smaller: less "
     "gradient memory during the backward, more collectives."},
    {"prefetch_bucket_size", CTRL_OPT_STRING, "auto", 0, 0, 0, NULL,
     "zero3: before each layer's forward or backward, the gathers of the layers the pass takes next are "
     "started while fewer than this many floats are in flight (DeepSpeed's stage3_prefetch_bucket_size, in "
     "elements: at least the next layer when above 0), and completed when the layer is reached. auto: 0.9 x "
     "hidden_size^2, what the HF Trainer fills in for DeepSpeed's auto (one layer ahead for any model whose "
     "layers are larger); a number of floats (5e7, DeepSpeed's own default, is accepted); 0: each layer "
     "gathered when reached."},
    {"stage3_param_persistence_threshold", CTRL_OPT_STRING, "0", 0, 0, 0, NULL,
     "zero3: a parameter tensor of fewer elements than this (a norm weight, a bias; at a large "
     "value whole layers) stays whole on every rank, never released nor gathered around its layer's "
     "uses, which gather the layer's larger tensors only; its gradient is reduced and its optimizer state "
     "sliced as the others', and the ranks' updated slices of all of them are all-gathered in one "
     "collective after each step (DeepSpeed's stage3_param_persistence_threshold, in elements; DeepSpeed's "
     "own default is 1e5). auto: 10 x hidden_size, what the HF Trainer fills in for DeepSpeed's auto. 0 "
     "(the default): none kept whole -- ctrl gathers each layer in one collective, so the small tensors "
     "cost no collectives of their own, while keeping them whole cuts a layer's gather into one per run of "
     "larger tensors (docs/distributed.md). On [run] device = cuda the kept tensors stay mapped on every "
     "rank's device and are all-gathered over NCCL (in bf16 holding their bf16 values, as a gathered "
     "layer's: the threshold changes no number). Refused without zero3."},
    {"overlap_comm", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "zero2 and zero3: a bucket's reduce-scatters are started and left in flight while the backward "
     "goes on, finished when the next bucket is reduced or the backward ends (DeepSpeed's overlap_comm; "
     "one more bucket of gradients held). On [run] device = cuda they are queued on the NCCL "
     "communication stream after the kernels that wrote the bucket, and the compute stream waits for "
     "each (an event) before its slice is read: there the results are bit for bit those of false. Refused "
     "without ZeRO, with zero1, and with zero2 + offload_optimizer on a device (nothing reduced during the "
     "backward)."},
    {"offload_overlap", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL,
     "offload_optimizer on a CUDA run (without ZeRO, or with zero3: each rank's slices): the host's "
     "optimizer step (adamw; one that cannot step a layer at a time, a LoRA model, or zero3 with a "
     "persistence threshold is stepped whole, as the log says) "
     "runs on a host thread one layer at a time in forward order while the device runs the next step's "
     "forward, each layer's updated weights uploaded on a stream of their own as soon as stepped and "
     "waited for just before that layer's forward (zero3: its gather) -- exact, the same weights bit for "
     "bit as false. false: the whole model stepped on the host, then copied to the device before the next "
     "forward (for debugging). Set anywhere else (no offload_optimizer, zero1 or zero2, the CPU) it is "
     "refused (docs/distributed.md)."},
    {"offload_dir", CTRL_OPT_PATH, NULL, 0, 0, 0, NULL,
     "offload_activations on the CPU: the directory of the file that holds the checkpointed layers' inputs "
     "between forward and backward (DeepSpeed's nvme_path; unset: [run] output_dir). The file is unlinked as "
     "soon as it is made, so nothing is left there on exit or on an error."},
    CTRL_OPTION_END,
};

static const ctrl_option generation_options[] = {
    {"mode", CTRL_OPT_CHOICE, "colocate", 0, 0, 0, "colocate|server",
     "colocate: generate in the training process from the live weights; server: HTTP to ctrl serve, "
     "the weights pushed at the start and after every optimizer step (with [peft]: the base with the "
     "adapters folded in, a QLoRA base dequantized, as TRL pushes a PEFT model to vLLM)."},
    {"server_url", CTRL_OPT_STRING, "http://127.0.0.1:8000", 0, 0, 0, NULL,
     "The ctrl serve address (mode = server)."},
    {"max_num_seqs", CTRL_OPT_INT, "256", MIN(1), NULL, "Sequences decoded together at most."},
    {"max_num_batched_tokens", CTRL_OPT_INT, "8192", MIN(1), NULL, "Token budget of one engine step."},
    {"kv_cache_bytes", CTRL_OPT_INT, "0", MIN(0), NULL,
     "KV-cache pool size in bytes (0 = from gpu_memory_utilization)."},
    {"gpu_memory_utilization", CTRL_OPT_FLOAT, "0.3", RANGE(0.01, 1), NULL,
     "Fraction of memory for the KV cache when kv_cache_bytes = 0: of the GPU's for a model on cuda (at most "
     "half of what is free there), of the host's on the CPU."},
    {"block_size", CTRL_OPT_INT, "16", RANGE(1, 1024), NULL, "Tokens per KV-cache block."},
    {"attention", CTRL_OPT_STRING, "paged", 0, 0, 0, NULL,
     "Attention plugin that decodes over the paged KV cache (colocate mode)."},
    {"kv_cache_dtype", CTRL_OPT_CHOICE, "auto", 0, 0, 0, "auto|fp32|bf16",
     "KV-cache values: auto = the model's compute dtype ([train] dtype); bf16 holds twice the tokens."},
    {"decode_threads", CTRL_OPT_INT, "0", RANGE(0, 4096), NULL,
     "OpenMP threads of a generation engine step (decoding and drawing): 0 = every thread (OMP_NUM_THREADS); "
     "N: N of them. On a machine whose cores are busy with other work, 1 spends less CPU time on a "
     "decoding step of a few sequences (no barrier waits between its many short parallel regions) for the "
     "same user time, at the cost of wall clock when cores are free (docs/performance.md). The tokens are "
     "the same at any count."},
    {"temperature", CTRL_OPT_FLOAT, "1.0", MIN(0), NULL, "Sampling temperature (0 = greedy)."},
    {"top_p", CTRL_OPT_FLOAT, "1.0", RANGE(0, 1), NULL, "Nucleus sampling mass."},
    {"top_k", CTRL_OPT_INT, "0", MIN(0), NULL, "Sample among the k most likely tokens (0 = off)."},
    {"min_p", CTRL_OPT_FLOAT, "0", RANGE(0, 1), NULL, "Drop tokens below min_p times the top probability."},
    {"repetition_penalty", CTRL_OPT_FLOAT, "1.0", RANGE(FLT_MIN, FLT_MAX), NULL,
     "Penalty on tokens already present (1 = off; a normal positive float: a subnormal one would overflow "
     "the "
     "logits)."},
    {"sleep", CTRL_OPT_INT, "0", RANGE(0, 2), NULL,
     "colocate: 1 releases the KV pool between generation phases, 2 also inference-only buffers (on a GPU "
     "the memory goes back to the driver)."},
    {"log_completions", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Online trainers: append every generated completion with its rewards and advantage to "
     "output_dir/completions.jsonl."},
    {"ds3_gather_for_generation", CTRL_OPT_BOOL, "true", 0, 0, 0, NULL,
     "zero3, colocate: the whole model gathered on every rank for each generation phase and released "
     "after it (TRL's ds3_gather_for_generation, DeepSpeed ZeRO-3); false: each forward pass of the "
     "generation (prefill chunk, decoding step) gathers one layer at a time and releases it after, the "
     "ranks stepping in lockstep -- slower, far less memory (refused without zero3)."},
    CTRL_OPTION_END,
};

static const ctrl_option peft_options[] = {
    {"enabled", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Train LoRA adapters (PEFT's LoraConfig semantics) instead of the full model: the base weights are "
     "frozen "
     "(no gradients, no optimizer state) and output_dir receives a PEFT adapter (adapter_config.json, "
     "adapter_model.safetensors) instead of a model. Another [peft] key set while this one is not is refused "
     "naming it (it would be ignored); enabled = false, set explicitly, switches LoRA off and leaves them "
     "unread."},
    {"r", CTRL_OPT_INT, "16", MIN(1), NULL, "LoRA rank."},
    {"lora_alpha", CTRL_OPT_FLOAT, "32", POSITIVE, NULL,
     "LoRA scaling numerator (scale = lora_alpha / r, or lora_alpha / sqrt(r) with use_rslora)."},
    {"lora_dropout", CTRL_OPT_FLOAT, "0.05", RANGE(0, 0.999), NULL,
     "Dropout on the adapters' input while training (off in evaluation and generation); seeded by [run] seed "
     "and the step (a resumed run draws the same masks). On CUDA the masks are applied on the host (a copy "
     "each way per adapter: slower; 0 avoids it)."},
    {"target_modules", CTRL_OPT_LIST, "q_proj,k_proj,v_proj,o_proj", 0, 0, 0,
     "q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj|qkv_proj|gate_up_proj|all-linear",
     "Linear layers that get adapters; all-linear: every linear layer but the output head (as PEFT). "
     "Phi-3's fused qkv_proj and gate_up_proj get one adapter each over their whole output, as PEFT puts it "
     "(q_proj etc. name nothing there); a list that names no layer of the model is refused."},
    {"target_modules_regex", CTRL_OPT_STRING, NULL, 0, 0, 0, NULL,
     "target_modules as PEFT's string form: a regular expression (Python re syntax, run by PCRE2) that must "
     "match a module's whole name (re.fullmatch), e.g. .*\\.layers\\.[0-3]\\.self_attn\\.(q|v)_proj; instead "
     "of "
     "target_modules' list (setting both is refused). Saved as PEFT saves it (target_modules a string)."},
    {"exclude_modules", CTRL_OPT_LIST, NULL, 0, 0, 0, NULL,
     "Modules that get no adapter though target_modules names them (PEFT's exclude_modules as a list): each "
     "entry matches as a target_modules entry (a module name, or its whole name model.layers.N....)."},
    {"exclude_modules_regex", CTRL_OPT_STRING, NULL, 0, 0, 0, NULL,
     "exclude_modules as PEFT's string form: a regular expression that excludes every module whose whole "
     "name it matches (re.fullmatch)."},
    {"layers_to_transform", CTRL_OPT_LIST, NULL, 0, 0, 0, NULL,
     "Layer indices that get adapters (PEFT's layers_to_transform): the others keep none. The index is read "
     "from the module's name as PEFT reads it (after layers_pattern's name, or the first numbered part). Not "
     "with all-linear or target_modules_regex (PEFT refuses those)."},
    {"layers_pattern", CTRL_OPT_LIST, NULL, 0, 0, 0, NULL,
     "The name(s) before the layer index in module names (PEFT's layers_pattern, e.g. layers); only with "
     "layers_to_transform."},
    {"rank_pattern", CTRL_OPT_STRING, NULL, 0, 0, 0, NULL,
     "Ranks of their own for some modules, as a JSON object {\"pattern\": rank, ...} (PEFT's rank_pattern): "
     "the first pattern, in the order written, that matches the end of a module's name (re.match of "
     "(.*\\.)?(pattern)$) gives its r, e.g. {\"q_proj\": 8, \"layers\\\\.0\\\\.mlp\\\\.down_proj\": 32}."},
    {"alpha_pattern", CTRL_OPT_STRING, NULL, 0, 0, 0, NULL,
     "lora_alpha of their own for some modules, as rank_pattern gives ranks (PEFT's alpha_pattern); each "
     "module's scale is its alpha / its r (or / sqrt(r) with use_rslora)."},
    {"trainable_token_indices", CTRL_OPT_LIST, NULL, 0, 0, 0, NULL,
     "Token ids whose rows of the input embedding train beside the adapters (PEFT's trainable_token_indices: "
     "e.g. new chat-template tokens), the rest of the table frozen: one [n, hidden] tensor of their values, "
     "starting as the rows, saved in the adapter as PEFT saves it "
     "(model.embed_tokens.token_adapter.trainable_tokens_delta). With tied embeddings the LM head's rows are "
     "the same values. Turning the adapters off (a reference model) gives the base's rows back; merging "
     "writes "
     "the trained rows into the table. The table then stays fp32 (embedding_dtype = bf16 is refused); not "
     "with modules_to_save = embed_tokens (as PEFT), zero3, or in `ctrl serve --lora`'s bank (merge such an "
     "adapter)."},
    {"trainable_token_indices_lm_head", CTRL_OPT_LIST, NULL, 0, 0, 0, NULL,
     "Token ids whose rows of an untied LM head train beside the adapters (PEFT's trainable_token_indices = "
     "{\"embed_tokens\": [...], \"lm_head\": [...]}, e.g. Llama-3's new special tokens, whose input rows "
     "trainable_token_indices lists), saved as lm_head.token_adapter.trainable_tokens_delta. On tied "
     "embeddings the head is the table: only trainable_token_indices' own list is accepted (as PEFT ties "
     "them). Not with modules_to_save = lm_head, zero3, or the serving bank."},
    {"target_parameters", CTRL_OPT_LIST, "", 0, 0, 0, "experts.gate_up_proj|experts.down_proj",
     "LoRA on a mixture-of-experts model's experts (PEFT's target_parameters: Qwen3-MoE, Mixtral, OLMoE): "
     "each expert's weight W_e + s B_e A_e, saved as PEFT's ParamWrapper saves it (mlp.experts[.base_layer]"
     ".lora_A / lora_B). Needs lora_dropout = 0 and no use_dora (as PEFT); target_modules then names "
     "attention projections only (all-linear or gate/up/down_proj on an MoE model, which PEFT 0.21 "
     "converts with a doubled rank and the router, are refused)."},
    {"use_rslora", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "Rank-stabilised LoRA: scale = lora_alpha / sqrt(r)."},
    {"lora_bias", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "PEFT's lora_bias: lora_B gets a trainable bias b (lora_B.bias in the adapter), the adapter adding s (x "
     "A^T "
     "B^T + b); zero at init_lora_weights = true. Not with use_dora, target_parameters or the other inits "
     "(as "
     "PEFT); merging folds s b into the base's bias, refused where the base layer has none (as PEFT)."},
    {"init_lora_weights", CTRL_OPT_CHOICE, "true", 0, 0, 0, "true|false|gaussian|pissa|olora|orthogonal",
     "true: A Kaiming-uniform (a = sqrt(5)), B zero (PEFT's default); gaussian: A ~ N(0, 1/r), B zero; "
     "false: both Kaiming-uniform (the adapter changes the model from the first step; for tests); pissa "
     "(PiSSA): A and B from each adapted weight's top-r singular values and vectors (W = V S U^T: A = "
     "sqrt(S_r "
     "/ s) U_r^T, B = V_r sqrt(S_r / s)), the frozen base becoming the residual W - s B A; olora (OLoRA): A "
     "and B "
     "from W's QR (A = R's first r rows, B = Q's first r columns), the base W - s B A. Both as PEFT computes "
     "them (float32 SVD / QR, LAPACK), as each weight loads (before a bf16 or NF4 base is narrowed: QPiSSA); "
     "the saved adapter says so, and PEFT (or ctrl) loading it over the original base recomputes the "
     "residual. "
     "The SVD of every adapted weight takes a while on large models; not with zero3's sliced loading. "
     "orthogonal "
     "(PEFT's, even r): A and B random with orthonormal mixing such that B A = 0 (neither is zero)."},
    {"modules_to_save", CTRL_OPT_LIST, "", 0, 0, 0, "embed_tokens|lm_head|score|classifier",
     "Modules trained in full beside the adapters and saved in the adapter file (with tied embeddings only "
     "together with ensure_weight_tying = true: PEFT would otherwise untie them). "
     "score (or classifier): a sequence classifier's head, which the reward trainer trains with LoRA "
     "anyway (PEFT's task_type SEQ_CLS adds it); refused with a trainer of a causal LM."},
    {"ensure_weight_tying", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "PEFT's ensure_weight_tying: on a model with tied embeddings, modules_to_save embed_tokens and / or "
     "lm_head train one copy of the table that is both the embedding and the LM head (saved under both "
     "names, as PEFT saves it). Without it such a modules_to_save is refused (PEFT would untie the two)."},
    {"bias", CTRL_OPT_CHOICE, "none", 0, 0, 0, "none|all|lora_only",
     "Which biases train: none (the only one implemented; the others are refused)."},
    {"use_dora", CTRL_OPT_BOOL, "false", 0, 0, 0, NULL,
     "DoRA (PEFT's use_dora): each adapted layer's weight split into a trainable magnitude per output row "
     "(lora_magnitude_vector, starting at the row norms of W + s B A) and a direction W + s B A; the "
     "norm is a constant in backward, as PEFT computes it. With quantization = nf4 (QDoRA, as PEFT runs DoRA "
     "over bitsandbytes' Linear4bit): W is the dequantized NF4 weight, W A^T its tile-by-tile NF4 product "
     "and ||W|| of each row computed once from the NF4 store, never a whole weight dequantized."},
    {"quantization", CTRL_OPT_CHOICE, "none", 0, 0, 0, "none|nf4",
     "QLoRA: nf4 holds the frozen base's projection weights (q/k/v/o/gate/up/down) in 4-bit NormalFloat as "
     "bitsandbytes does (load_in_4bit, bnb_4bit_quant_type nf4, blocks of 64, double-quantized absmax), "
     "dequantized a tile at a time inside the GEMMs of forward and backward (never a whole weight; on a CPU "
     "with AVX-512 BF16 decoding's products of up to 8 sequences decode W's rows in registers, with no "
     "panels at all), multiplied in [train] dtype; on the CPU and on CUDA. As transformers quantizes every "
     "nn.Linear: "
     "Phi-3's fused qkv_proj / gate_up_proj each one NF4 tensor; a mixture of experts' experts and router "
     "stay fp32 (bitsandbytes leaves them: not nn.Linear); the start-up log says which are which. With "
     "use_dora: QDoRA. With [memory] strategies = zero3 each rank keeps only its slice of the NF4 store (cut "
     "on 16,384-value super-blocks; on CUDA in device memory), a layer's weights all-gathered just before "
     "its forward and backward and freed after (DeepSpeed ZeRO-3 + QLoRA)."},
    {"embedding_dtype", CTRL_OPT_CHOICE, "auto", 0, 0, 0, "auto|fp32|bf16",
     "How a LoRA run's frozen input embedding (and the LM head tied to it) is held. bf16: in bf16 alone, as "
     "a model loaded with torch_dtype = bfloat16 holds it: where the head is tied and an AVX-512 BF16 or AMX "
     "GEMM runs, as the head's bf16 GEMM panels, its only copy (the lookups read rows out of them; the "
     "head is never packed again), else as bf16 values: 260 instead of 519 MiB at Qwen2.5-0.5B's 151,936 "
     "x 896 either way; the lookups return the rows rounded to bf16 (the one change in the numbers: "
     "the same curve as TRL + PEFT under autocast with the table's values rounded to bf16); a tied head's "
     "logits do not change (its bf16 products round W anyway), in training and decoding; both forms give "
     "the same numbers bit for bit. Needs [peft] enabled, [train] dtype = bf16 on the CPU and the "
     "embedding frozen (not in modules_to_save); refused otherwise, and with [memory] strategies = zero3. "
     "fp32: as transformers holds an fp32 model under autocast (torch.autocast's exact numbers). auto (the "
     "default): bf16 wherever bf16 would be accepted, except a tied table in the trainers that generate "
     "(GRPO, RLOO, PPO, online DPO, GKD) where no bf16 GEMM kernel runs (an AVX2-only CPU), whose decoding "
     "would pack the head from the bf16 values in every step (+55% generation CPU): fp32 there and "
     "elsewhere (fp32 compute, CUDA, zero3, a trained embedding), never an error; the start-up log says "
     "when and how the table is held in bf16. Why bf16 by default: it moves TRL + PEFT's own 20-step bf16 "
     "curve by 1.3e-4 relative, less than loading the base in bf16 does (1.5e-4), and takes 15% off the "
     "peak RSS of a LoRA SFT and 28% off a LoRA-GRPO's at Qwen2.5-0.5B's shape (docs/performance.md)."},
    {"adapter_path", CTRL_OPT_STRING, NULL, 0, 0, 0, NULL,
     "A PEFT adapter directory (adapter_config.json + adapter_model.safetensors, e.g. from PEFT's "
     "save_pretrained) "
     "to continue training from: its config replaces r, lora_alpha, target_modules, use_rslora, use_dora and "
     "modules_to_save, which must then be left unset."},
    CTRL_OPTION_END,
};

static const ctrl_option teacher_options[] = {
    {"path", CTRL_OPT_PATH, NULL, 0, 0, 0, NULL,
     "Distillation (trainer = gkd): the teacher, a Hugging Face causal LM directory of the student's "
     "vocabulary "
     "(and tokenizer, when it has tokenizer files); any size. Held frozen: no gradients, no optimizer "
     "state."},
    {"dtype", CTRL_OPT_CHOICE, "fp32", 0, 0, 0, "fp32|bf16",
     "The teacher's compute dtype: bf16 runs its linear projections in bf16 (fp32 accumulation, as "
     "torch.autocast), whatever the student's [train] dtype, and on the CPU holds its weights in bf16 "
     "(rounded once; the layers' in 2 bytes each, widened to fp32 one layer at a time); under zero3 on "
     "several ranks the teacher is sliced instead, its slices held in fp32 (on the CPU a layer's bf16 copy "
     "rounded after its gather; on cuda its layers gathered as bf16 values on the devices)."},
    CTRL_OPTION_END,
};

const ctrl_option config_reward_instance_options[] = {
    {"plugin", CTRL_OPT_STRING, NULL, CTRL_OPT_REQUIRED, 0, 0, NULL, "Reward plugin this function runs."},
    {"weight", CTRL_OPT_FLOAT, "1.0", 0, 0, 0, NULL, "Weight of this reward in the total."},
    CTRL_OPTION_END,
};

static const ctrl_config_section core_sections[] = {
    {"run", "What to run and where its outputs go.", run_options},
    {"model", "The model to train.", model_options},
    {"data", "Datasets, tokenization, truncation and packing.", data_options},
    {"train", "The training loop: optimizer, schedule, batches, logging and checkpoints.", train_options},
    {"memory", "Memory strategies.", memory_options},
    {"generation", "The generation engine (online trainers).", generation_options},
    {"peft", "LoRA adapters.", peft_options},
    {"teacher", "The teacher model of a distillation trainer (gkd).", teacher_options},
    {NULL, NULL, NULL},
};

const ctrl_config_section *ctrl_config_core_sections(void) { return core_sections; }
