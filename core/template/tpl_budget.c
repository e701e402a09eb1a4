/* The render's budgets: a template is untrusted input, so the work it runs, the bytes and list
 * items it builds and how deep its values nest are bounded (tpl_internal.h names the limits). Sizes
 * are checked before anything that large is built; what slips past a check (a buffer or a list that
 * reached its cap drops the rest and raises a flag) fails at the next budget check. */
#include <stdio.h>

#include "template/tpl_internal.h"

int tpl_budget(tpl_render *r, int line, uint64_t steps) {
    r->steps += steps;
    if (r->failed) return -1;
    if (r->steps > TPL_MAX_STEPS)
        return tpl_fail(r, line, "the template ran more than %llu steps (a loop too long?)",
                        (unsigned long long)TPL_MAX_STEPS);
    if (r->arena.total + r->out.cap + r->gen.cap > TPL_MAX_RENDER_BYTES)
        return tpl_fail(r, line, "the template used more than %zu MiB of memory (values and output)",
                        TPL_MAX_RENDER_BYTES >> 20);
    if (r->arena.over_items)
        return tpl_fail(r, line, "a list or dict would hold more than %d items", TPL_MAX_ITEMS);
    if (r->out.over) return tpl_fail(r, line, "the output would exceed %u MiB", TPL_MAX_STRING >> 20);
    return 0;
}

int tpl_room(tpl_render *r, int line, const char *what, uint64_t count, uint64_t size) {
    if (size && count > TPL_MAX_STRING / size)
        return tpl_fail(r, line, "%s would build a string of %llu × %llu bytes, more than the %u MiB limit",
                        what, (unsigned long long)count, (unsigned long long)size, TPL_MAX_STRING >> 20);
    return tpl_budget(r, line, count * size / 64);
}

int tpl_walk(tpl_render *r, int line, tpl_value v) {
    const uint64_t n = v.kind == V_STR    ? v.str.len / 4
                       : v.kind == V_LIST ? (uint64_t)v.list->n
                       : v.kind == V_DICT ? (uint64_t)v.dict->n
                                          : 0;
    return tpl_budget(r, line, n);
}

int tpl_room_items(tpl_render *r, int line, const char *what, uint64_t n) {
    if (n > TPL_MAX_ITEMS)
        return tpl_fail(r, line, "%s would build a list of %llu items, more than the limit %d", what,
                        (unsigned long long)n, TPL_MAX_ITEMS);
    return tpl_budget(r, line, n / 16);
}

int tpl_buf_value(tpl_render *r, int line, tpl_buf *b, tpl_value *out) {
    const int over = b->over;
    if (!over) *out = tpl_str_copy(&r->arena, b->data ? b->data : "", b->len);
    tpl_buf_free(b);
    if (over) return tpl_fail(r, line, "a string would exceed the %u MiB limit", TPL_MAX_STRING >> 20);
    return tpl_budget(r, line, 0);
}

int tpl_to_str_checked(tpl_render *r, int line, tpl_value v, tpl_value *out) {
    if (v.kind == V_STR) return *out = v, 0;
    tpl_buf b = {0};
    tpl_write_str(&b, v);
    return tpl_buf_value(r, line, &b, out);
}

int tpl_check_nesting(tpl_render *r, int line, tpl_value v) {
    if (tpl_depth(v) > TPL_MAX_NESTING)
        return tpl_fail(r, line, "lists and dicts nested deeper than %d levels", TPL_MAX_NESTING);
    return 0;
}
