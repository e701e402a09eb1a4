/* The fixture tokenizer and validated configs the dataset-row targets share. */
#ifndef CTRL_FUZZ_ROWS_COMMON_H
#define CTRL_FUZZ_ROWS_COMMON_H

#include "config/config_load.h"
#include "tokenizer/tokenizer.h"

/* tests/fixtures' byte-level BPE (with a ChatML chat template), loaded once. */
const ctrl_tokenizer *fuzz_rows_tokenizer(void);
/* A config whose [data] section holds `data_lines` (and a [run] and [model] that validate),
 * validated against the built-in plugins; aborts when it does not load (a broken target). */
ctrl_config *fuzz_rows_config(const char *data_lines);

#endif
