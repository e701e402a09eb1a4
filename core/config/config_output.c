/* Writing configs out: the effective config of a run, option tables as text for
 * `ctrl plugins describe`, and the Markdown reference (docs/config-reference.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config/config_internal.h"

static int needs_quotes(const char *v) {
    size_t n = strlen(v);
    return n && (strpbrk(v, ";#\"") || v[0] == ' ' || v[n - 1] == ' ');
}

static void write_section(FILE *f, const ctrl_config *cfg, const char *section) {
    int header = 0;
    for (int i = 0; i < cfg->n; i++) {
        const config_entry *e = &cfg->entries[i];
        if (strcmp(e->section, section) != 0) continue;
        if (!header) {
            fprintf(f, "\n[%s]\n", section);
            header = 1;
        }
        if (needs_quotes(e->value) && !strchr(e->value, '"'))
            fprintf(f, "%s = \"%s\"", e->key, e->value);
        else
            fprintf(f, "%s = %s", e->key, e->value);
        fprintf(f, "  ; %s\n", e->where);
    }
}

ctrl_status ctrl_config_write_effective(const ctrl_config *cfg, const char *path) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) return ctrl_error_set(CTRL_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
    fprintf(f,
            "; Effective configuration of this run: %s with defaults filled in.\n"
            "; Each value's origin follows it (file:line, --set, or default).\n",
            cfg->path);
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
        write_section(f, cfg, s->name);
    /* Then the plugin sections, in the order their first key appears. */
    for (int i = 0; i < cfg->n; i++) {
        const char *sec = cfg->entries[i].section;
        int core = 0, seen = 0;
        for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++)
            if (!strcmp(s->name, sec)) core = 1;
        for (int j = 0; j < i; j++)
            if (!strcmp(cfg->entries[j].section, sec)) seen = 1;
        if (!core && !seen) write_section(f, cfg, sec);
    }
    int bad = ferror(f) != 0;
    bad |= fflush(f) != 0;
    bad |= fsync(fileno(f)) != 0;
    bad |= fclose(f) != 0;
    if (bad || rename(tmp, path) != 0) {
        int err = errno;
        unlink(tmp);
        return ctrl_error_set(CTRL_ERR_IO, "%s: cannot write: %s", path, strerror(err));
    }
    return CTRL_OK;
}

static const char *type_name(ctrl_option_type t) {
    switch (t) {
    case CTRL_OPT_STRING: return "string";
    case CTRL_OPT_INT: return "int";
    case CTRL_OPT_FLOAT: return "float";
    case CTRL_OPT_BOOL: return "bool";
    case CTRL_OPT_CHOICE: return "choice";
    case CTRL_OPT_LIST: return "list";
    case CTRL_OPT_PATH: return "path";
    }
    return "?";
}

/* "[0, 1)", ">= 1", "a|b|c", or "" */
static void range_text(const ctrl_option *o, char *out, size_t cap) {
    out[0] = '\0';
    if (o->choices) {
        snprintf(out, cap, "%s", o->choices);
        return;
    }
    int lo = (o->flags & CTRL_OPT_HAS_MIN) != 0, hi = (o->flags & CTRL_OPT_HAS_MAX) != 0;
    if (lo && hi)
        snprintf(out, cap, "%s%g, %g%s", (o->flags & CTRL_OPT_MIN_OPEN) ? "(" : "[", o->min, o->max,
                 (o->flags & CTRL_OPT_MAX_OPEN) ? ")" : "]");
    else if (lo)
        snprintf(out, cap, "%s %g", (o->flags & CTRL_OPT_MIN_OPEN) ? ">" : ">=", o->min);
    else if (hi)
        snprintf(out, cap, "%s %g", (o->flags & CTRL_OPT_MAX_OPEN) ? "<" : "<=", o->max);
}

static const char *default_text(const ctrl_option *o) {
    if (o->flags & CTRL_OPT_REQUIRED) return "(required)";
    if (!o->default_value) return "(none)";
    if (!o->default_value[0]) return "(empty)";
    return o->default_value;
}

void ctrl_option_table_print(FILE *out, const ctrl_option *options) {
    int wk = 3, wd = 7;
    for (int i = 0; options && options[i].key; i++) {
        int k = (int)strlen(options[i].key), d = (int)strlen(default_text(&options[i]));
        if (k > wk) wk = k;
        if (d > wd) wd = d;
    }
    fprintf(out, "  %-*s  %-6s  %-*s  %-16s  %s\n", wk, "KEY", "TYPE", wd, "DEFAULT", "RANGE/CHOICES", "DOC");
    for (int i = 0; options && options[i].key; i++) {
        char range[512];
        range_text(&options[i], range, sizeof range);
        fprintf(out, "  %-*s  %-6s  %-*s  %-16s  %s\n", wk, options[i].key, type_name(options[i].type), wd,
                default_text(&options[i]), range[0] ? range : "-", options[i].doc ? options[i].doc : "");
    }
}

static void md_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '|')
            fputs("\\|", f);
        else
            fputc(*s, f);
    }
}

static void md_table(FILE *f, const ctrl_option *options) {
    if (!options || !options[0].key) {
        fprintf(f, "No options.\n\n");
        return;
    }
    fprintf(f, "| key | type | default | range / choices | description |\n|---|---|---|---|---|\n");
    for (int i = 0; options[i].key; i++) {
        const ctrl_option *o = &options[i];
        char range[512];
        range_text(o, range, sizeof range);
        fprintf(f, "| `%s` | %s | ", o->key, type_name(o->type));
        const char *d = default_text(o);
        if (d[0] == '(')
            fputs(d, f);
        else {
            fputc('`', f);
            md_escape(f, d);
            fputc('`', f);
        }
        fputs(" | ", f);
        md_escape(f, range[0] ? range : "");
        fputs(" | ", f);
        md_escape(f, o->doc ? o->doc : "");
        fputs(" |\n", f);
    }
    fputc('\n', f);
}

ctrl_status ctrl_config_reference_write(const ctrl_registry *reg, FILE *f) {
    fprintf(f,
            "# Configuration reference\n\n"
            "Generated by `ctrl --plugin-dir build/plugins config reference`; do not edit by hand (a test\n"
            "compares this file with the generated one). A run is one INI file; `ctrl config check RUN.ini`\n"
            "validates it in full, and `--set section.key=value` overrides any key.\n\n"
            "Plugin options live in their own sections: the trainer's in `[NAME]` (e.g. `[grpo]`), the\n"
            "optimizer's in `[NAME]`, each memory strategy's in `[NAME]`, the attention plugin's in\n"
            "`[attention.NAME]`, and each reward function in its own `[reward.NAME]` section.\n\n"
            "## Core sections\n\n");
    for (const ctrl_config_section *s = ctrl_config_core_sections(); s->name; s++) {
        fprintf(f, "### [%s]\n\n%s\n\n", s->name, s->doc);
        md_table(f, s->options);
    }
    fprintf(f, "### [reward.NAME]\n\nOne reward function; besides these, the keys of its plugin.\n\n");
    md_table(f, config_reward_instance_options);
    fprintf(f, "## Plugins\n\n");
    for (int i = 0; i < ctrl_registry_count(reg); i++) {
        const ctrl_plugin *p = ctrl_registry_at(reg, i)->plugin;
        const char *kind = ctrl_kind_name(p->kind);
        if (p->kind == CTRL_KIND_REWARD)
            fprintf(f, "### %s/%s — in `[reward.NAME]` with `plugin = %s`\n\n", kind, p->name, p->name);
        else if (p->kind == CTRL_KIND_ATTENTION)
            fprintf(f, "### %s/%s — section `[attention.%s]`\n\n", kind, p->name, p->name);
        else
            fprintf(f, "### %s/%s — section `[%s]`\n\n", kind, p->name, p->name);
        fprintf(f, "%s\n\n", p->summary ? p->summary : "");
        md_table(f, p->options);
    }
    return ferror(f) ? ctrl_error_set(CTRL_ERR_IO, "config reference: write error") : CTRL_OK;
}
