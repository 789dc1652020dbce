/*
** sec_env.h — the secured broker integration.tls and integration.acl share:
** a lab PKI made by deploy/pki/mkpki.sh in the test's temp dir (plus an
** expired and a wrong-host broker certificate and an unrelated CA), an ACL
** made by deploy/mosquitto/mkacl.sh, a mosquitto_passwd file, and a real
** mosquitto with no anonymous access and four TLS listeners on free
** loopback ports: password (server-verified TLS), mutual TLS with the
** certificate CN as username, and the expired and wrong-host certificates.
** Static functions: included by one test file each.
*/
#ifndef DS_TEST_SEC_ENV_H
#define DS_TEST_SEC_ENV_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ds/mqtt.h"
#include "support/broker.h"
#include "support/itest.h"
#include "support/testutil.h"

#define SEC_IDENTITIES "edge-1:edge center-1:center dev-1:device dev-2:device ops:ops publisher:publisher"

struct sec_env {
    char             *dir;
    char              pki[512], conf[16384];
    struct tb_broker *b;
    uint16_t          tls_port, mtls_port, expired_port, wronghost_port;
    char              tls_uri[64], mtls_uri[64], expired_uri[64], wronghost_uri[64];
};

/* A secret file (mode 0600) holding text. */
static inline void sec_write_secret(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f) abort();
    fprintf(f, "%s\n", text);
    fclose(f);
    chmod(path, 0600);
}

static int sec_sh(const char *cmd)
{
    int st = -1;
    char *out = tu_run(cmd, &st);
    if (st != 0) fprintf(stderr, "sec_env: '%s' failed (%d): %s\n", cmd, st, out ? out : "");
    free(out);
    return st;
}

/* extra_ids: more "NAME:ROLE" certificates (mkpki.sh); extra_acl: lines
** appended to the ACL for them (test-only identities); NULL = none.
** Exits 77 when mosquitto, mosquitto_passwd or openssl is missing. */
static bool sec_env_start(struct sec_env *e, const char *extra_acl, const char *extra_ids)
{
    memset(e, 0, sizeof *e);
    if (access("/usr/bin/mosquitto_passwd", X_OK) != 0 || system("openssl version >/dev/null 2>&1") != 0) {
        fprintf(stderr, "sec_env: mosquitto_passwd or openssl missing: skipped\n");
        exit(77);
    }
    e->dir = tu_tmpdir();
    snprintf(e->pki, sizeof e->pki, "%s/pki", e->dir);
    char cmd[16384];
    snprintf(cmd, sizeof cmd,
             "MKPKI_EXPIRED=1 MKPKI_WRONGHOST=1 MKPKI_OTHERCA=1 sh %s/deploy/pki/mkpki.sh %s %s %s >/dev/null && "
             "sh %s/deploy/mosquitto/mkacl.sh %s > %s/acl && "
             "mosquitto_passwd -c -b %s/passwd dev-1 pw-dev-1 && mosquitto_passwd -b %s/passwd dev-2 pw-dev-2 && "
             "mosquitto_passwd -b %s/passwd ops pw-ops && mosquitto_passwd -b %s/passwd edge-1 pw-edge-1",
             DS_SOURCE_DIR, e->pki, SEC_IDENTITIES, extra_ids ? extra_ids : "", DS_SOURCE_DIR,
             SEC_IDENTITIES, e->dir, e->dir, e->dir, e->dir, e->dir);
    if (sec_sh(cmd) != 0) return false;
    if (extra_acl) {
        char p[4300];
        snprintf(p, sizeof p, "%s/acl", e->dir);
        FILE *f = fopen(p, "a");
        if (!f) return false;
        fprintf(f, "%s\n", extra_acl);
        fclose(f);
    }
    e->tls_port = tb_free_port();
    e->mtls_port = tb_free_port();
    e->expired_port = tb_free_port();
    e->wronghost_port = tb_free_port();
    if (!e->tls_port || e->mtls_port == e->tls_port) return false;
    const char *p = e->pki;
    snprintf(e->conf, sizeof e->conf,
             "password_file %s/passwd\nacl_file %s/acl\n"
             "listener %u 127.0.0.1\ncafile %s/ca.crt\ncertfile %s/broker.crt\nkeyfile %s/broker.key\n"
             "tls_version tlsv1.2\n"
             "listener %u 127.0.0.1\ncafile %s/ca.crt\ncertfile %s/broker.crt\nkeyfile %s/broker.key\n"
             "tls_version tlsv1.2\nrequire_certificate true\nuse_identity_as_username true\n"
             "listener %u 127.0.0.1\ncafile %s/ca.crt\ncertfile %s/expired.crt\nkeyfile %s/expired.key\n"
             "listener %u 127.0.0.1\ncafile %s/ca.crt\ncertfile %s/wronghost.crt\nkeyfile %s/wronghost.key\n",
             e->dir, e->dir, e->tls_port, p, p, p, e->mtls_port, p, p, p, e->expired_port, p, p, p,
             e->wronghost_port, p, p, p);
    struct tb_broker_opts bo = { .extra_conf = e->conf, .no_anonymous = true };
    if (!(e->b = tb_broker_start_or_skip(&bo))) return false;
    snprintf(e->tls_uri, sizeof e->tls_uri, "ssl://127.0.0.1:%u", e->tls_port);
    snprintf(e->mtls_uri, sizeof e->mtls_uri, "ssl://127.0.0.1:%u", e->mtls_port);
    snprintf(e->expired_uri, sizeof e->expired_uri, "ssl://127.0.0.1:%u", e->expired_port);
    snprintf(e->wronghost_uri, sizeof e->wronghost_uri, "ssl://127.0.0.1:%u", e->wronghost_port);
    return true;
}

/* TLS options of a certificate identity on the mTLS listener. */
static inline struct ds_mqtt_tls sec_mtls(const struct sec_env *e, const char *id, char cafile[600],
                                   char cert[600], char key[600])
{
    snprintf(cafile, 600, "%s/ca.crt", e->pki);
    snprintf(cert, 600, "%s/%s.crt", e->pki, id);
    snprintf(key, 600, "%s/%s.key", e->pki, id);
    return (struct ds_mqtt_tls){ .cafile = cafile, .certfile = cert, .keyfile = key,
                                 .verify_hostname = true };
}

/* A client of certificate identity id on the mTLS listener, as client_id,
** subscribed to topic (QoS 1) before it connects when topic is not NULL,
** its messages into in when in is not NULL; connected, or NULL. */
static inline struct ds_mqtt *sec_mtls_client(const struct sec_env *e, const char *id, const char *client_id,
                                              struct it_inbox *in, const char *topic)
{
    char ca[600], cert[600], key[600];      /* ds_mqtt_create copies them */
    struct ds_mqtt_opts o;
    ds_mqtt_opts_init(&o);
    o.tls = sec_mtls(e, id, ca, cert, key);
    if (in) {
        o.on_message = it_inbox_on_msg;
        o.ud = in;
    }
    struct ds_mqtt *c = NULL;
    if (ds_mqtt_create(e->mtls_uri, client_id, &o, &c) != DS_OK) return NULL;
    if ((topic && ds_mqtt_subscribe(c, topic, 1) != DS_OK) || ds_mqtt_connect(c) != DS_OK ||
        ds_mqtt_wait_connected(c, 20000) != DS_OK) {
        ds_mqtt_destroy(c);
        return NULL;
    }
    return c;
}

static void sec_env_stop(struct sec_env *e)
{
    tb_broker_destroy(e->b);
    if (e->dir) tu_rmdir(e->dir);
    e->b = NULL;
    e->dir = NULL;
}

#endif
