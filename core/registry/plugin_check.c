/* What a plugin must satisfy before the core touches it: the exact ABI, a descriptor at least as
 * large as what the core reads, the same build signature, a known kind, a well-formed name, a
 * vtable whose size field covers the kind's required slots, and a sane option table. */
#include "registry/plugin_check.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <ctrl/attention.h>
#include <ctrl/memory.h>
#include <ctrl/optimizer.h>
#include <ctrl/reward.h>
#include <ctrl/status.h>
#include <ctrl/trainer.h>

int ctrl_kind_parse(const char *name) {
    for (int k = 0; k < CTRL_KIND_COUNT; k++)
        if (!strcasecmp(name, ctrl_kind_name((ctrl_kind)k))) return k;
    return -1;
}

ctrl_status ctrl_plugin_check_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: cannot open: %s", path, strerror(errno));
    unsigned char hdr[64];
    size_t n = fread(hdr, 1, sizeof hdr, f);
    struct stat sb;
    int st_ok = fstat(fileno(f), &sb) == 0;
    fclose(f);
    if (n < 4 || memcmp(hdr,
                        "\x7f"
                        "ELF",
                        4) != 0)
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: not a shared object (no ELF header)", path);
    if (n < sizeof hdr || (st_ok && sb.st_size < 256))
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: truncated ELF file (%lld bytes)", path,
                              st_ok ? (long long)sb.st_size : (long long)n);
    if (hdr[16] != 3 /* ET_DYN, little-endian low byte */ || hdr[17] != 0)
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: ELF file is not a shared object (e_type %u)", path,
                              (unsigned)hdr[16] | ((unsigned)hdr[17] << 8));
    return CTRL_OK;
}

/* The smallest vtable size the core accepts per kind: up to and including the last slot it
 * requires. Later, optional slots may be absent in older plugins. */
static size_t min_ops_size(ctrl_kind kind) {
    switch (kind) {
    case CTRL_KIND_ATTENTION: return offsetof(ctrl_attention_ops, backward) + sizeof(void *);
    case CTRL_KIND_OPTIMIZER: return offsetof(ctrl_optimizer_ops, destroy) + sizeof(void *);
    case CTRL_KIND_TRAINER: return offsetof(ctrl_trainer_ops, destroy) + sizeof(void *);
    case CTRL_KIND_MEMORY: return offsetof(ctrl_memory_ops, destroy) + sizeof(void *);
    case CTRL_KIND_REWARD: return offsetof(ctrl_reward_ops, destroy) + sizeof(void *);
    default: return 0;
    }
}

static int valid_name(const char *s) {
    if (!s || !s[0] || strlen(s) > 64) return 0;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_')) return 0;
    return 1;
}

static ctrl_status check_options(const ctrl_plugin *p, const char *origin) {
    if (!p->options) return CTRL_OK;
    for (int i = 0; p->options[i].key; i++) {
        const ctrl_option *o = &p->options[i];
        if (i >= 512)
            return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin '%s': option table has no end marker", origin,
                                  p->name);
        if (!valid_name(o->key))
            return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin '%s': option key '%s' is not [a-z0-9_]+",
                                  origin, p->name, o->key);
        if ((unsigned)o->type > CTRL_OPT_PATH)
            return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin '%s': option '%s' has unknown type %d", origin,
                                  p->name, o->key, (int)o->type);
        if (o->type == CTRL_OPT_CHOICE && (!o->choices || !o->choices[0]))
            return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin '%s': choice option '%s' lists no choices",
                                  origin, p->name, o->key);
        for (int j = 0; j < i; j++)
            if (!strcmp(p->options[j].key, o->key))
                return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin '%s': option '%s' is declared twice",
                                      origin, p->name, o->key);
    }
    return CTRL_OK;
}

ctrl_status ctrl_plugin_check(const ctrl_plugin *p, const char *origin) {
    if (p->abi != CTRL_PLUGIN_ABI)
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "%s: plugin ABI %u, this ctrl expects %u (rebuild the plugin "
                              "against this ctrl's headers)",
                              origin, p->abi, CTRL_PLUGIN_ABI);
    if (p->size < offsetof(ctrl_plugin, ops) + sizeof(void *) || p->size > 65536)
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin descriptor size %u, this ctrl needs at least %zu",
                              origin, p->size, offsetof(ctrl_plugin, ops) + sizeof(void *));
    if (!p->signature || strcmp(p->signature, CTRL_PLUGIN_SIGNATURE) != 0)
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin built with signature '%s', this ctrl has '%s'",
                              origin, p->signature ? p->signature : "(none)", CTRL_PLUGIN_SIGNATURE);
    if ((int)p->kind < 0 || p->kind >= CTRL_KIND_COUNT)
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: unknown plugin kind %d", origin, (int)p->kind);
    if (!valid_name(p->name))
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: plugin name '%s' is not [a-z0-9_]+ (at most 64 chars)",
                              origin, p->name ? p->name : "(null)");
    if (!p->ops)
        return ctrl_error_set(CTRL_ERR_PLUGIN, "%s: %s plugin '%s' has no ops table", origin,
                              ctrl_kind_name(p->kind), p->name);
    size_t ops_size = *(const size_t *)p->ops, need = min_ops_size(p->kind);
    if (ops_size < need || ops_size > 65536)
        return ctrl_error_set(CTRL_ERR_PLUGIN,
                              "%s: %s plugin '%s': ops table size %zu, this ctrl needs at least %zu", origin,
                              ctrl_kind_name(p->kind), p->name, ops_size, need);
    return check_options(p, origin);
}
