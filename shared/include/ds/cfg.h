/*
** ds/cfg.h — INI configuration (libinih) driven by a key table: defaults,
** then the file, then command-line overrides, each value checked by type and
** range, errors reported as "file:line: [section] key: reason".
**
** A table row names a section, a key, a type, where the value lives in the
** caller's struct (offsetof), its default, its range and whether SIGHUP may
** change it. Sections that repeat with a name ("[model stories]") go to a
** callback instead of the table.
**
** Ownership: string values are OWNED by the config struct (strdup); free
**            them with ds_cfg_cleanup(). The table is BORROWED.
** Threads:   none; load before starting threads, or under the caller's lock.
*/
#ifndef DS_CFG_H
#define DS_CFG_H

#include <stdbool.h>
#include <stdio.h>

#include "ds/common.h"
#include "ds/err.h"

enum ds_cfg_type { DS_CFG_STR, DS_CFG_U32, DS_CFG_F32, DS_CFG_BOOL };

#define DS_CFG_RELOADABLE 1u
/* Accepted and type-checked, never stored (offset unused): a key another
** program sharing the file reads. Not described, no default. */
#define DS_CFG_IGNORED    2u

struct ds_cfg_key {
    const char      *section;     /* "mqtt" */
    const char      *name;        /* "uri" */
    enum ds_cfg_type type;
    size_t           offset;      /* offsetof(struct ..., field): char *, uint32_t, float or bool */
    const char      *def;         /* default as text; NULL = no default (strings only) */
    double           min, max;    /* numeric range, inclusive */
    unsigned         flags;       /* DS_CFG_RELOADABLE, DS_CFG_IGNORED */
    const char      *help;
};

/* Called for keys of sections not in the table, e.g. section "model stories".
** Return 0 to accept, or write a reason into err and return -1. */
typedef int (*ds_cfg_section_fn)(void *ud, const char *section, const char *key, const char *value,
                                 char *err, size_t err_len);

struct ds_cfg_spec {
    const struct ds_cfg_key *keys;
    size_t                   n_keys;
    ds_cfg_section_fn        on_other;   /* NULL: unknown sections are errors */
    void                    *ud;
    int                     *key_lines;  /* optional, n_keys entries: line of each key's last assignment */
    int                     *line;       /* optional: the line being handled (for on_other) */
};

/* Set every key of the table to its default. */
DS_MUST_CHECK enum ds_err ds_cfg_defaults(const struct ds_cfg_spec *spec, void *obj);
/* Load an INI file over obj. reload: only DS_CFG_RELOADABLE keys may differ
** from obj's current values (others are reported and left as they are). */
DS_MUST_CHECK enum ds_err ds_cfg_load(const struct ds_cfg_spec *spec, void *obj, const char *path,
                                      bool reload);
/* One "section.key=value" override (command line). */
DS_MUST_CHECK enum ds_err ds_cfg_set(const struct ds_cfg_spec *spec, void *obj, const char *assignment);
/* Free the strings the table's STR keys hold. */
void ds_cfg_cleanup(const struct ds_cfg_spec *spec, void *obj);
/* Print the table (key, type, default, range, help) for --help. */
void ds_cfg_describe(const struct ds_cfg_spec *spec, FILE *f);

#endif
