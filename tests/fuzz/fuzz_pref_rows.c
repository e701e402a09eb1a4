/* Preference dataset rows (JSONL or a JSON array) to prepared DPO / KTO / reward sets and their
 * micro-batches (core/train/pref_data.h) with the fixture tokenizer. The first byte's low 6 bits p
 * pick the trainer (p % 3: DPO, KTO with KL sequences, reward) and the [data] configuration
 * (p / 3 % 4), its 0x40 bit padded batches; the rest is the dataset file (docs/fuzzing.md). */
#include <stdlib.h>

#include "fuzz_common.h"
#include "fuzz_rows_common.h"
#include "train/pref_data.h"

/* The [data] lines of each setup (literals split over lines are parenthesised: clang warns otherwise). */
static const char *const data_configs[] = {
    "",
    ("skip_bad_rows = true\nmax_length = 12\nmax_prompt_length = 5\nmax_completion_length = 3\n"
     "pad_to_multiple_of = 8"),
    ("skip_bad_rows = true\nchat_template_path = " CTRL_FIXTURE_DIR "/templates/qwen2_5_training.jinja"),
    ("skip_bad_rows = true\nprompt_field = p\nmax_length = 6"),
};
#define N_CONFIGS (int)(sizeof data_configs / sizeof data_configs[0])
static ctrl_config *configs[N_CONFIGS];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    fuzz_rows_tokenizer();
    for (int i = 0; i < N_CONFIGS; i++) configs[i] = fuzz_rows_config(data_configs[i]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const int pick = data[0];
    const ctrl_sequence_spec specs[3] = {
        {.size = sizeof(ctrl_sequence_spec), .paired = 1},
        {.size = sizeof(ctrl_sequence_spec), .kl_sequences = 1},
        {.size = sizeof(ctrl_sequence_spec), .paired = 1, .needs_score = 1},
    };
    char path[64];
    const int fd = fuzz_memfile(data + 1, size - 1, path, sizeof path);
    ctrl_pref_set s = {0};
    if (fd >= 0 && ctrl_pref_set_load(path, fuzz_rows_tokenizer(), configs[((pick & 0x3f) / 3) % N_CONFIGS],
                                      &specs[(pick & 0x3f) % 3], &s) == CTRL_OK) {
        s.padded = (pick & 0x40) != 0;
        int idx[4];
        for (int i0 = 0; i0 < s.n; i0 += 4) { /* every row through the batch builder */
            const int n = s.n - i0 < 4 ? s.n - i0 : 4;
            for (int i = 0; i < n; i++) idx[i] = i0 + i;
            ctrl_pref_batch b;
            if (ctrl_pref_batch_build(&s, idx, n, &b) != CTRL_OK) break;
            /* the layout's invariants: every sequence inside the batch, weights only inside sequences */
            for (int k = 0; k < b.n_seq; k++)
                if (b.seq_cu[k] + b.seq_len[k] > b.seq_cu[k + 1] || b.last[k] < b.seq_cu[k] ||
                    b.last[k] >= b.seq_cu[k] + (b.seq_len[k] ? b.seq_len[k] : 1))
                    abort();
            if (b.seq_cu[b.n_seq] != b.T || b.batch.cu_seqlens[b.batch.B] != b.T) abort();
            ctrl_pref_batch_free(&b);
        }
        ctrl_pref_set_free(&s);
    }
    fuzz_file_close(fd);
    return 0;
}
