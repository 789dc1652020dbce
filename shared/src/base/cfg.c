/*
** cfg.c — table-driven INI configuration over libinih (see ds/cfg.h).
**
** Owns nothing beyond the strings it stores into the caller's struct.
*/
#include "ds/cfg.h"

#include <errno.h>
#include <ini.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ds/log.h"

static const struct ds_cfg_key *find(const struct ds_cfg_spec *sp, const char *section, const char *name)
{
    for (size_t i = 0; i < sp->n_keys; i++)
        if (strcmp(sp->keys[i].section, section) == 0 && strcmp(sp->keys[i].name, name) == 0)
            return &sp->keys[i];
    return NULL;
}

static bool section_known(const struct ds_cfg_spec *sp, const char *section)
{
    for (size_t i = 0; i < sp->n_keys; i++)
        if (strcmp(sp->keys[i].section, section) == 0) return true;
    return false;
}

/* Parse value for k into obj; on failure write the reason into err. */
static int assign(const struct ds_cfg_key *k, void *obj, const char *value, bool only_if_reloadable,
                  char *err, size_t err_len)
{
    char *field = (char *)obj + k->offset;
    char *end;
    union { char *s; uint32_t u; float f; bool b; } v;
    switch (k->type) {
    case DS_CFG_STR:
        if (strlen(value) > 4096) {
            snprintf(err, err_len, "value longer than 4096 bytes");
            return -1;
        }
        break;
    case DS_CFG_U32: {
        errno = 0;
        if (!*value || *value == '-') goto not_number;
        unsigned long long u = strtoull(value, &end, 10);
        if (errno || *end || (double)u < k->min || (double)u > k->max) goto not_number;
        v.u = (uint32_t)u;
        break;
    }
    case DS_CFG_F32: {
        errno = 0;
        float f = strtof(value, &end);
        if (!*value || errno || *end || !isfinite(f) || f < k->min || f > k->max) goto not_number;
        v.f = f;
        break;
    }
    case DS_CFG_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "on") || !strcmp(value, "1"))
            v.b = true;
        else if (!strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "off") || !strcmp(value, "0"))
            v.b = false;
        else {
            snprintf(err, err_len, "'%s' is not true or false", value);
            return -1;
        }
        break;
    }
    if (k->flags & DS_CFG_IGNORED) return 0;        /* valid, and not ours to keep */
    if (only_if_reloadable && !(k->flags & DS_CFG_RELOADABLE)) {
        bool same;
        switch (k->type) {
        case DS_CFG_STR: same = *(char **)field && strcmp(*(char **)field, value) == 0; break;
        case DS_CFG_U32: same = *(uint32_t *)field == v.u; break;
        case DS_CFG_F32: same = *(float *)field == v.f; break;
        default:         same = *(bool *)field == v.b; break;
        }
        if (!same) {
            snprintf(err, err_len, "changes only on restart (kept the running value)");
            return 1;       /* a warning, not an error */
        }
        return 0;
    }
    switch (k->type) {
    case DS_CFG_STR: {
        char *s = strdup(value);
        if (!s) {
            snprintf(err, err_len, "out of memory");
            return -1;
        }
        free(*(char **)field);
        *(char **)field = s;
        break;
    }
    case DS_CFG_U32: *(uint32_t *)field = v.u; break;
    case DS_CFG_F32: *(float *)field = v.f; break;
    case DS_CFG_BOOL: *(bool *)field = v.b; break;
    }
    return 0;
not_number:
    snprintf(err, err_len, "'%s' is not a %s in %g..%g", value,
             k->type == DS_CFG_U32 ? "whole number" : "number", k->min, k->max);
    return -1;
}

enum ds_err ds_cfg_defaults(const struct ds_cfg_spec *sp, void *obj)
{
    char err[256];
    for (size_t i = 0; i < sp->n_keys; i++) {
        const struct ds_cfg_key *k = &sp->keys[i];
        if (!k->def || (k->flags & DS_CFG_IGNORED)) continue;
        if (assign(k, obj, k->def, false, err, sizeof err) != 0) {
            DS_LOG(DS_LOG_ERROR, "config default [%s] %s: %s", k->section, k->name, err);
            return DS_ERR_INVAL;
        }
    }
    return DS_OK;
}

struct load_ctx {
    const struct ds_cfg_spec *sp;
    void                     *obj;
    const char               *path;
    bool                      reload;
    int                       errors;
    FILE                     *f;
    int                       line;        /* lines read so far = the line being handled */
};

/* Debian's libinih passes no line numbers to handlers: count them here. */
static char *read_line(char *str, int num, void *stream)
{
    struct load_ctx *c = stream;
    char *r = fgets(str, num, c->f);
    if (r) c->line++;
    return r;
}

static int on_ini(void *user, const char *section, const char *name, const char *value)
{
    struct load_ctx *c = user;
    int line = c->line;
    char err[256] = "";
    int r;
    const struct ds_cfg_key *k = find(c->sp, section, name);
    if (c->sp->line) *c->sp->line = line;
    if (k && c->sp->key_lines) c->sp->key_lines[k - c->sp->keys] = line;
    if (k) {
        r = assign(k, c->obj, value, c->reload, err, sizeof err);
    } else if (!section_known(c->sp, section) && c->sp->on_other) {
        r = c->sp->on_other(c->sp->ud, section, name, value, err, sizeof err);
    } else {
        snprintf(err, sizeof err, "unknown %s", section_known(c->sp, section) ? "key" : "section");
        r = -1;
    }
    if (r < 0) {
        DS_LOG(DS_LOG_ERROR, "%s:%d: [%s] %s: %s", c->path, line, section, name, err);
        c->errors++;
    } else if (r > 0) {
        DS_LOG(DS_LOG_WARN, "%s:%d: [%s] %s: %s", c->path, line, section, name, err);
    }
    return 1;          /* keep going: report every bad line at once */
}

enum ds_err ds_cfg_load(const struct ds_cfg_spec *sp, void *obj, const char *path, bool reload)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        DS_LOG(DS_LOG_ERROR, "%s: cannot open config: %s", path, strerror(errno));
        return errno == ENOENT ? DS_ERR_NOT_FOUND : DS_ERR_IO;
    }
    struct load_ctx c = { sp, obj, path, reload, 0, f, 0 };
    int r = ini_parse_stream(read_line, &c, on_ini, &c);
    fclose(f);
    if (r > 0 && c.errors == 0) {
        DS_LOG(DS_LOG_ERROR, "%s:%d: not INI syntax (want [section] and key = value lines)", path, r);
        return DS_ERR_FORMAT;
    }
    return c.errors || r != 0 ? DS_ERR_FORMAT : DS_OK;
}

enum ds_err ds_cfg_set(const struct ds_cfg_spec *sp, void *obj, const char *assignment)
{
    const char *dot = strchr(assignment, '.'), *eq = strchr(assignment, '=');
    if (!dot || !eq || dot > eq) {
        DS_LOG(DS_LOG_ERROR, "override '%s': want section.key=value", assignment);
        return DS_ERR_INVAL;
    }
    char section[64], name[64];
    snprintf(section, sizeof section, "%.*s", (int)DS_MIN((size_t)(dot - assignment), sizeof section - 1), assignment);
    snprintf(name, sizeof name, "%.*s", (int)DS_MIN((size_t)(eq - dot - 1), sizeof name - 1), dot + 1);
    const struct ds_cfg_key *k = find(sp, section, name);
    char err[256];
    if (!k) {
        DS_LOG(DS_LOG_ERROR, "override '%s': unknown key [%s] %s", assignment, section, name);
        return DS_ERR_INVAL;
    }
    if (assign(k, obj, eq + 1, false, err, sizeof err) != 0) {
        DS_LOG(DS_LOG_ERROR, "override [%s] %s: %s", section, name, err);
        return DS_ERR_INVAL;
    }
    return DS_OK;
}

void ds_cfg_cleanup(const struct ds_cfg_spec *sp, void *obj)
{
    for (size_t i = 0; obj && i < sp->n_keys; i++)
        if (sp->keys[i].type == DS_CFG_STR && !(sp->keys[i].flags & DS_CFG_IGNORED)) {
            char **s = (char **)((char *)obj + sp->keys[i].offset);
            free(*s);
            *s = NULL;
        }
}

void ds_cfg_describe(const struct ds_cfg_spec *sp, FILE *f)
{
    static const char *const tn[] = { "text", "count", "number", "bool" };
    int wk = 0, wd = 0;                 /* columns as wide as the widest key and default */
    for (size_t i = 0; i < sp->n_keys; i++) {
        const struct ds_cfg_key *k = &sp->keys[i];
        if (k->flags & DS_CFG_IGNORED) continue;
        int n = (int)(strlen(k->section) + strlen(k->name) + 3), d = (int)strlen(k->def ? k->def : "(none)");
        wk = n > wk ? n : wk;
        wd = d > wd ? d : wd;
    }
    for (size_t i = 0; i < sp->n_keys; i++) {
        const struct ds_cfg_key *k = &sp->keys[i];
        if (k->flags & DS_CFG_IGNORED) continue;
        char key[256];
        snprintf(key, sizeof key, "[%s] %s", k->section, k->name);
        fprintf(f, "  %-*s %-6s default %-*s %s%s\n", wk, key, tn[k->type], wd, k->def ? k->def : "(none)",
                k->help ? k->help : "", k->flags & DS_CFG_RELOADABLE ? " (SIGHUP reloads)" : "");
    }
}
