/* Prompt rows for the online trainers (GRPO, RLOO): JSONL or a JSON array of objects with a text
 * or conversational "prompt" and extra columns, tokenized with the fixture tokenizer (docs/fuzzing.md). */
#include "fuzz_common.h"
#include "fuzz_rows_common.h"
#include "train/online.h"

static ctrl_config *cfg;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    fuzz_rows_tokenizer();
    cfg = fuzz_rows_config("");
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[64];
    const int fd = fuzz_memfile(data, size, path, sizeof path);
    ctrl_prompt_set ps;
    if (fd >= 0 && ctrl_prompt_set_load(path, fuzz_rows_tokenizer(), cfg, &ps) == CTRL_OK)
        ctrl_prompt_set_free(&ps);
    fuzz_file_close(fd);
    return 0;
}
