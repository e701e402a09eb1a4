/* SFT dataset rows (JSONL or a JSON array) to tokenized, truncated and packed examples with the
 * fixture tokenizer. The first byte picks one of the [data] configurations below; the rest is the
 * dataset file (docs/fuzzing.md). */
#include "fuzz_common.h"
#include "fuzz_rows_common.h"
#include "train/train.h"

/* The [data] lines of each setup (literals split over lines are parenthesised: clang warns otherwise). */
static const char *const data_configs[] = {
    "",
    ("skip_bad_rows = true\nmax_length = 12\ntruncation_mode = keep_end\ncompletion_only_loss = false"),
    ("skip_bad_rows = true\nassistant_only_loss = true\n"
     "chat_template_path = " CTRL_FIXTURE_DIR "/templates/qwen2_5_training.jinja"),
    ("skip_bad_rows = true\ndataset_text_field = t\nmessages_field = m\n"
     "prompt_field = p\ncompletion_field = c"),
};
#define N_CONFIGS (int)(sizeof data_configs / sizeof data_configs[0])
static ctrl_config *configs[N_CONFIGS];
static const char *const strategies[] = {"bfd", "bfd_split", "wrapped"};

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
    char path[64];
    const int fd = fuzz_memfile(data + 1, size - 1, path, sizeof path);
    ctrl_dataset ds = {0};
    if (fd >= 0 &&
        ctrl_dataset_load_sft(path, fuzz_rows_tokenizer(), configs[pick % N_CONFIGS], &ds) == CTRL_OK) {
        if (pick & 0x10) (void)ctrl_dataset_pack(&ds, 1 + (pick >> 5), strategies[(pick >> 2) % 3]);
        ctrl_dataset_free(&ds);
    }
    fuzz_file_close(fd);
    return 0;
}
