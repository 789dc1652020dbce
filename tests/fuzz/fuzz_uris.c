/*
** fuzz_uris.c — libFuzzer target for broker URI lists ([mqtt] uri, the CLI's
** -b/--broker): ds_mqtt_check_uris and the split the MQTT wrapper connects
** with (mqtt_net.c).
**
** Input: the bytes as the list's text (cut at the first NUL). Whatever it
** is, the check and the split agree; a list they take holds 1 to
** DS_MQTT_MAX_URIS URIs, each of which parses on its own and shares the
** first one's TLS; a refusal says why.
**
** Built with -DDS_FUZZ=ON (clang) as fuzz_uris, and replayed over
** corpus/fuzz_uris/ by the fuzz.replay ctest in every build.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ds/mqtt.h"
#include "fuzz_util.h"
#include "net/mqtt_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ds_log_set(fuzz_quiet, NULL, DS_LOG_ERROR);
    if (size > 8192) return 0;
    char *list = malloc(size + 1);
    char (*uris)[DS_MQTT__URI_MAX] = malloc(DS_MQTT_MAX_URIS * sizeof *uris);
    if (!list || !uris) goto done;
    memcpy(list, data, size);
    list[size] = '\0';
    char why[DS_WHY_MAX], why2[DS_WHY_MAX];
    size_t n = 0;
    enum ds_err rc = ds_mqtt_check_uris(list, why);
    enum ds_err rc2 = ds_mqtt__split_uris(list, uris, &n, why2);
    if (rc != rc2) abort();
    if (rc != DS_OK) {
        if (!why[0] || !memchr(why, '\0', sizeof why)) abort();
        goto done;
    }
    if (n < 1 || n > DS_MQTT_MAX_URIS) abort();
    bool tls = ds_mqtt_uri_is_tls(list);
    for (size_t i = 0; i < n; i++) {
        struct ds_mqtt__peer peer;
        if (ds_mqtt__parse_uri(uris[i], &peer) != DS_OK || ds_mqtt_uri_is_tls(uris[i]) != tls) abort();
        if (strpbrk(uris[i], DS_MQTT__URI_SEP)) abort();
    }
done:
    free(uris);
    free(list);
    return 0;
}
