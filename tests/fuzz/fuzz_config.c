/* The run configuration: INI text and `--set` overrides, validated against the core's option
 * tables and the built-in plugins (loaded once from the build's plugin directory); an accepted
 * config is read back through the accessors and written out as the effective config. Input:
 * INI text FUZZ_SEPARATOR overrides, one "section.key=value" per line (docs/fuzzing.md). */
#include <stdlib.h>
#include <string.h>

#include "config/config_load.h"
#include "fuzz_common.h"

#define MAX_OVERRIDES 64

static ctrl_registry *reg;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    const char *dirs[] = {CTRL_PLUGIN_DIR};
    if (ctrl_registry_create(&reg) != CTRL_OK || ctrl_registry_load_standard(reg, dirs, 1) != CTRL_OK)
        abort();
    return 0;
}

/* Every section and key the config holds, through the public accessors. */
static void read_back(const ctrl_config *cfg) {
    for (int s = 0; s < ctrl_config_section_count(cfg); s++) {
        const char *sec = ctrl_config_section_at(cfg, s);
        if (!sec) abort();
        (void)ctrl_config_get_string(cfg, sec, "name");
        (void)ctrl_config_where(cfg, sec, "name");
    }
    (void)ctrl_config_section_at(cfg, ctrl_config_section_count(cfg));
    char path[600];
    snprintf(path, sizeof path, "%s/effective.ini", fuzz_scratch_dir());
    (void)ctrl_config_write_effective(cfg, path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part part[2];
    fuzz_split(data, size, part, 2);
    char *sets = fuzz_strdup(part[1]);
    const char *overrides[MAX_OVERRIDES];
    int n = 0;
    for (char *line = sets, *next; line && n < MAX_OVERRIDES; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (part[1].size) overrides[n++] = line;
    }
    char path[64];
    const int fd = fuzz_memfile(part[0].data, part[0].size, path, sizeof path);
    ctrl_config *cfg = NULL;
    if (fd >= 0 && ctrl_config_load(path, overrides, n, reg, &cfg) == CTRL_OK) {
        read_back(cfg);
        ctrl_config_free(cfg);
    }
    fuzz_file_close(fd);
    free(sets);
    return 0;
}
