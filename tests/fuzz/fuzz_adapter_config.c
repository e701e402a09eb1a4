/* adapter_config.json (PEFT's LoraConfig, a stranger's file: ctrl generate --adapter, ctrl serve --lora,
 * [peft] adapter_path) -> the LoRA config; one that reads is then asked, for every module of a few
 * layers, whether it gets an adapter and with which rank and scale (lora_match.c: its regular
 * expressions run on module names, where a pathological one must be refused, not hang). */
#include "fuzz_common.h"
#include "model/lora.h"
#include "model/peft.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ctrl_lora_config c; /* large (the target list): not on the stack */
    char path[64];
    const int fd = fuzz_memfile(data, size, path, sizeof path);
    if (fd >= 0 && ctrl_peft_read_config_file(path, &c, NULL, 0) == CTRL_OK)
        for (int l = 0; l < 3; l++)
            for (int mod = 0; mod < LORA_N_MODULES; mod++) {
                int on, r;
                float s;
                if (ctrl_lora_module_choice(&c, l, mod, &on, &r, &s) == CTRL_OK && on && (r < 1 || s != s))
                    __builtin_trap(); /* a targeted module has a rank >= 1 and a scale */
            }
    fuzz_file_close(fd);
    return 0;
}
