/* Preference data for the offline sequence-level trainers (kind.h's `sequence` kind: DPO, KTO,
 * reward models): rows in TRL 1.16's formats, read from a .jsonl or .json file (row_reader.h),
 * tokenized as TRL's DPOTrainer / KTOTrainer / RewardTrainer prepare them, truncated, and laid out
 * as flat micro-batches for one forward through the fused head.
 *
 * Row formats (the prompt and KTO's completion columns are [data] prompt_field / completion_field):
 *   standard         {"prompt": str, "chosen": str, "rejected": str}: the EOS token's text is
 *                    appended to chosen and rejected unless they end with it; prompt and
 *                    prompt + chosen / prompt + rejected are tokenized (special tokens added, as
 *                    tokenizer(text)), the completion starting where the tokenized prompt and
 *                    prompt + completion diverge (the shorter of the two for a pair).
 *   conversational   the same columns as message lists: the chat template renders the prompt with
 *                    the generation prompt and prompt + completion without it (the row's tools and
 *                    chat_template_kwargs passed on); no EOS is appended.
 *   implicit prompt  {"chosen", "rejected"} only (strings or message lists): the shared prefix
 *                    becomes the prompt exactly as TRL's extract_prompt cuts it (by characters or
 *                    by messages; a space before the first difference goes to the completions).
 *   unpaired         {"prompt", "completion", "label"} (KTO; label true = desirable). Paired rows
 *                    given to KTO are unpaired as TRL does (chosen rows, then rejected rows, per
 *                    1000 rows).
 *   margin           an optional number column of paired rows (the reward trainer's).
 * The reward trainer tokenizes prompt + chosen and prompt + rejected whole (no prompt split, no
 * prompt extraction; pre-tokenized chosen_ids / rejected_ids are taken as they are) and drops pairs
 * longer than max_length (TRL's RewardTrainer filter). Each row is read on its own: where TRL
 * decides from a dataset's first row whether to extract prompts and append EOS (a file mixing
 * formats fails there), each row here follows its own format. [data] chat_template_path replaces
 * the tokenizer's template (RewardConfig's chat_template_path; for DPO and KTO, what setting
 * tokenizer.chat_template does).
 *
 * Truncation ([data] keys), in this order:
 *   1. max_prompt_length (0: off) keeps the prompt's last tokens;
 *   2. max_completion_length (0: off) keeps each completion's first tokens;
 *   3. DPO with keep_start, KTO: a row whose prompt alone is max_length tokens or more is dropped
 *      (TRL's filter: no completion token would survive);
 *   4. each prompt + completion sequence is cut to max_length: truncation_mode keep_start keeps
 *      its start, keep_end its end (DPO only; KTO keeps the start, as TRL's collator).
 * Reward rows are never truncated: a pair with a sequence over max_length is dropped.
 *
 * Bad rows (not JSON, a missing or mistyped column, mixed string/message columns, a non-boolean
 * label, a non-number margin, a chat template raising on the row's messages) are an error naming
 * file:line and the column, or are counted and skipped with [data] skip_bad_rows; a template that
 * does not load stops the run whatever skip_bad_rows says. [data] keys that mean nothing for preference data
 * (packing, dataset_text_field, ...) are refused naming where they were set. */
#ifndef CTRL_CORE_TRAIN_PREF_DATA_H
#define CTRL_CORE_TRAIN_PREF_DATA_H

#include <stdint.h>

#include <ctrl/config.h>
#include <ctrl/trainer.h>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

/* Which trainer's preparation a set follows (from the plugin's ctrl_sequence_spec:
 * ctrl_pref_task_for). */
typedef enum ctrl_pref_task {
    CTRL_PREF_DPO = 0, /* paired, prompt split off (DPOTrainer) */
    CTRL_PREF_KTO,     /* unpaired {prompt, completion, label} (KTOTrainer) */
    CTRL_PREF_REWARD,  /* paired, whole sequences (RewardTrainer) */
} ctrl_pref_task;

/* One row as prepared (steps 1-3 of the truncation applied; max_length is the batch builder's).
 * Reward rows have n_prompt = 0 and the whole sequences in chosen / rejected. */
typedef struct ctrl_pref_row {
    int32_t *prompt, *chosen, *rejected; /* chosen: KTO's completion; rejected: NULL when unpaired */
    int n_prompt, n_chosen, n_rejected;
    float label;  /* KTO: 1 desirable, 0 undesirable */
    float margin; /* the margin column (0 where absent) */
    int kl_row;   /* KTO with KL sequences: this row's prompt + row kl_row's completion (-1: none) */
    long line;    /* the row's first line in its file */
} ctrl_pref_row;

typedef struct ctrl_pref_set {
    ctrl_pref_task task;
    ctrl_pref_row *rows;
    int n;
    int paired;       /* rows have chosen and rejected */
    int has_margin;   /* a row had a margin column */
    int has_kl;       /* KTO: batches carry the KL sequences */
    long skipped_bad; /* malformed rows skipped (skip_bad_rows) */
    long dropped;     /* rows dropped by the max_length filters */
    long truncated;   /* rows cut by max_prompt_length / max_completion_length */
    /* How ctrl_pref_batch_build lays rows out ([data]): */
    int max_length; /* per-sequence truncation (0: none) */
    int keep_end;   /* truncation_mode = keep_end */
    int padded;     /* padding_free = false: rows padded to the longest, as TRL's collators */
    int pad_multiple;
    int32_t pad_id; /* the tokenizer's pad token, else its EOS (TRL) */
} ctrl_pref_set;

/* The task a sequence-level trainer's spec calls for: needs_score -> REWARD, paired -> DPO,
 * else KTO. */
ctrl_pref_task ctrl_pref_task_for(const ctrl_sequence_spec *spec);

/* Reads, tokenizes and filters one file for `spec`'s trainer with the [data] keys of `cfg`.
 * KTO's KL sequences (spec->kl_sequences) pair each row with the completion of the row before it
 * within consecutive chunks of [train] per_device_train_batch_size rows, as TRL builds them. */
ctrl_status ctrl_pref_set_load(const char *path, const ctrl_tokenizer *tok, const ctrl_config *cfg,
                               const ctrl_sequence_spec *spec, ctrl_pref_set *out);
/* The train and eval sets of [data]: train_file, then eval_file or an eval_fraction of the train
 * rows held out (seeded with [run] seed). The eval set is empty (n = 0) when neither is set. */
ctrl_status ctrl_pref_sets_load(const ctrl_config *cfg, const ctrl_tokenizer *tok,
                                const ctrl_sequence_spec *spec, ctrl_pref_set *train, ctrl_pref_set *eval);
void ctrl_pref_set_free(ctrl_pref_set *s);
/* Logs one line about a set (`what`: "train", "eval"): its rows (pairs, or KTO's desirable and
 * undesirable completions), the rows skipped, dropped and cut, its layout. */
void ctrl_pref_set_describe(const ctrl_pref_set *s, const char *what);

/* One micro-batch of rows idx[0..n), laid out flat for the model.
 *   Paired (DPO, reward): n_seq = 2n, sequences [0, n) are prompt + chosen of the rows in order,
 *   [n, 2n) prompt + rejected (n_pairs = n).
 *   Unpaired (KTO): n_seq = n prompt + completion sequences, then (has_kl) n KL sequences
 *   (kl[s] = 1): the row's prompt + its kl_row's completion (n_pairs = 0).
 * Padding-free (the default): the sequences back to back, one trailing pad segment up to a
 * multiple of pad_multiple. Padded: each sequence padded to the longest of its group (the pairs;
 * KTO's main and KL sequences are padded apart, as TRL's collator) rounded up to pad_multiple.
 * Pad tokens are segments of their own in batch.cu_seqlens: they attend to nothing real and are
 * never trained.
 * Log-probs: the model's logp[t] is log pi(batch.targets[t] | tokens up to t), the target being the
 * next token; weight[t] = 1 where that next token is a completion token of the same sequence (TRL's
 * completion_mask shifted by one), so sum_t logp[t] * weight[t] over a sequence is TRL's logps
 * (train_sequence_sums with seq_cu). targets[t] is -100 wherever weight[t] = 0. Reward sets have
 * no completion tokens (weight 0 everywhere): their score head reads the token at last[s]. */
typedef struct ctrl_pref_batch {
    ctrl_batch batch; /* tokens, positions (restarting per sequence), cu_seqlens (pad segments
                         included), targets */
    int T, n_seq, n_pairs;
    int32_t *seq_cu;   /* [n_seq + 1] sequence s with its padding spans [seq_cu[s], seq_cu[s+1]);
                          seq_cu[n_seq] = T (the trailing pad belongs to the last sequence) */
    int *seq_len;      /* [n_seq] its real tokens, from seq_cu[s] */
    int *last;         /* [n_seq] the flat index a sequence-classification head reads: the rightmost
                          token of the sequence that is not the pad id, as transformers' *ForSequence
                          Classification picks it (the sequence's first token when all are) */
    float *weight;     /* [T] 1 on log-probs of completion tokens, else 0 */
    int *n_tokens;     /* [n_seq] completion tokens counted in weight */
    int *n_completion; /* [n_seq] completion tokens of the sequence (TRL's completion_mask sum):
                          n_tokens, plus one when the sequence starts with a completion token
                          (an empty prompt without BOS), which no log-prob predicts */
    float *label;      /* [n_seq] KTO's labels (the KL sequences carry their row's); NULL when paired */
    uint8_t *kl;       /* [n_seq] 1 for KTO's KL sequences; NULL without them */
    float *margin;     /* [n_pairs] the margin column; NULL when the set has none */
    int *row;          /* [n_seq] the set row each sequence comes from */
    long tokens;       /* TRL's num_tokens: the real (non-pad) tokens, KTO's KL sequences not counted */
} ctrl_pref_batch;

/* Builds rows idx[0..n) of `s` into *b (malloc'd; free with ctrl_pref_batch_free). CTRL_ERR_NOMEM
 * leaves *b empty. */
ctrl_status ctrl_pref_batch_build(const ctrl_pref_set *s, const int *idx, int n, ctrl_pref_batch *b);
void ctrl_pref_batch_free(ctrl_pref_batch *b);

#endif
