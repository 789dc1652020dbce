/*
** cmd_http_key.c — `dspark http-key`: a new API key for a node's HTTP server.
** The key is printed once, for the client; the keys file ([http] keys_file)
** gets only its BLAKE2b hash, in the line this prints (or appends with -f).
*/
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "cli.h"
#include "ds/http_keys.h"
#include "ds/log.h"

static void http_key_usage(FILE *f)
{
    fprintf(f,
        "usage: dspark http-key --client NAME [--tier high|normal|low] [--quota N/UNIT] [-f FILE]\n"
        "\n"
        "Make an API key for the HTTP server of dspark-edge and dspark-center. The key\n"
        "is printed once, for the client (Authorization: Bearer KEY); the keys file\n"
        "([http] keys_file, mode 0600) holds only its hash, in the line printed after\n"
        "it.\n"
        "\n"
        "      --client NAME      the client's name (1..64 of A-Z a-z 0-9 . _ -): the\n"
        "                         requests' client in logs, metrics and client_max\n"
        "      --tier high|normal|low  the highest tier its requests get (default normal)\n"
        "      --quota N/UNIT     requests it may start per s, min, h or d; - for no\n"
        "                         quota (default -)\n"
        "  -f, --file FILE        append the line to this keys file (made mode 0600;\n"
        "                         one readable by others is refused)\n"
        "  -h, --help             this text\n"
        "\n" CLI_GLOBAL_HELP);
}

/* Append line to path, creating it 0600; an existing file must be 0600 or stricter. */
static int append_line(const char *path, const char *line)
{
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd < 0) {
        fprintf(stderr, "dspark http-key: %s: %s\n", path, strerror(errno));
        return 1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 077)) {
        fprintf(stderr, "dspark http-key: %s is not a regular file of mode 0600 (run: chmod 600 %s); "
                "nothing written\n", path, path);
        close(fd);
        return 1;
    }
    size_t n = strlen(line);
    int rc = write(fd, line, n) == (ssize_t)n && fsync(fd) == 0 ? 0 : 1;
    if (rc) fprintf(stderr, "dspark http-key: %s: write failed: %s\n", path, strerror(errno));
    close(fd);
    return rc;
}

int cmd_http_key(int argc, char **argv)
{
    enum { O_TIER = 256, O_QUOTA, O_CLIENT };
    static const int common[] = { CLI_F_FILE, 0 };
    static const struct option own[] = {
        { "client", required_argument, 0, O_CLIENT }, { "tier", required_argument, 0, O_TIER },
        { "quota", required_argument, 0, O_QUOTA },   { 0, 0, 0, 0 },
    };
    static const struct cli_spec spec = { "http-key", common, own, NULL };
    struct cli_parser p;
    const char *tier = "normal", *quota = "-", *file = NULL, *client = NULL;
    int c;
    ds_log_set(NULL, NULL, DS_LOG_ERROR);
    cli_parser_init(&p, &spec, argc, argv, NULL);
    while ((c = cli_parser_next(&p)) != CLI_END) {
        switch (c) {
        case CLI_STOP: return p.status;
        case O_TIER: tier = optarg; break;
        case O_QUOTA: quota = optarg; break;
        case CLI_F_FILE: file = optarg; break;
        case CLI_F_HELP: http_key_usage(stdout); return 0;
        case O_CLIENT: client = optarg; break;
        default: return 2;
        }
    }
    if (!cli_parser_done(&p)) return p.status;
    if (!client) {
        fprintf(stderr, "dspark http-key: need --client NAME\n\n");
        http_key_usage(stderr);
        return 2;
    }
    for (const char *const *v = (const char *const[]){ client, tier, quota, NULL }; *v; v++)
        if (!**v || strpbrk(*v, " \t\r\n#"))
            return cli_usage_error("http-key", "'%s': a value without spaces or '#'", *v);
    char key[DS_HTTP_KEY_GEN_LEN + 1], hashed[8 + 2 * DS_HTTP_KEY_HASHBYTES + 1], line[512];
    if (ds_http_key_generate(key, hashed) != DS_OK) {
        fprintf(stderr, "dspark http-key: libsodium failed to start\n");
        return 1;
    }
    snprintf(line, sizeof line, "%s %s %s %s\n", hashed, client, tier, quota);
    /* The line is checked as the node will read it. */
    struct ds_http_keys *k = NULL;
    char why[DS_WHY_MAX] = "";
    if (ds_http_keys_parse(line, strlen(line), "(new line)", &k, why) != DS_OK) {
        const char *at = strstr(why, "line 1: ");   /* past "keys file (new line) line 1: " */
        fprintf(stderr, "dspark http-key: %s\n", at ? at + 8 : why);
        sodium_memzero(key, sizeof key);
        return 2;
    }
    ds_http_keys_destroy(k);
    int rc = file ? append_line(file, line) : 0;
    if (rc == 0) {
        printf("key: %s\n", key);
        printf("  give it to the client (Authorization: Bearer KEY); it is shown once and stored nowhere\n");
        if (file) printf("appended to %s (the node reads it at start):\n", file);
        else printf("add this line to the keys file ([http] keys_file, mode 0600), then restart the node:\n");
        printf("%s", line);
    }
    sodium_memzero(key, sizeof key);
    return rc;
}
