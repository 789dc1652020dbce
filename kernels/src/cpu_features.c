/* cpu_features.c — CPU feature detection (filled in per architecture). */
#include "ds/kern.h"

const struct ds_cpu_features *ds_cpu_features_get(void)
{
    static const struct ds_cpu_features none;
    return &none;
}
