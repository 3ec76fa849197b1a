/*
 * Internals of the `osr` command (src/cli/): the global options, a blocking
 * HTTP call to the gateway API for one-shot commands, argument helpers and
 * the human output helpers (aligned tables, single-object views).
 *
 * The CLI is a short-lived process: it runs a private libuv loop for each
 * call and blocks on it, which is what a command line wants. Nothing here is
 * for long-running code.
 */
#ifndef OSR_CLI_CLI_H
#define OSR_CLI_CLI_H

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes (docs/cli.md): scripts rely on them, never renumber. */
#define CLI_OK        0
#define CLI_EAPI      1 /**< the API answered with an error */
#define CLI_EUSAGE    2 /**< bad command line or configuration */
#define CLI_EUNREACH  3 /**< the gateway could not be reached */
#define CLI_ENOTFOUND 4 /**< 404 not_found */
#define CLI_EAUTH     5 /**< 401 unauthorized / 403 forbidden */

#define CLI_DEFAULT_URL  "http://127.0.0.1:7070"
#define CLI_MAX_RESPONSE (64u * 1024 * 1024)

/** Global options, from flags and the environment. */
typedef struct cli_s {
  const char *url;        /**< --url / OSR_URL / CLI_DEFAULT_URL */
  const char *key;        /**< --key / OSR_KEY / admin key file; NULL = none */
  const char *ca;         /**< --ca: PEM bundle for https */
  int json;               /**< --json: print the API's JSON exactly */
  int h2c;                /**< --h2c: HTTP/2 prior knowledge on http:// */
  uint64_t timeout_ms;    /**< --timeout seconds (default 30) */
  const char *key_source; /**< where the key came from, for doctor */
  char *key_owned;        /**< key read from a file */
} cli_t;

/** A response: status and the whole body (NUL-terminated), parsed as JSON
 *  when it is JSON. */
typedef struct cli_resp_s {
  int status;
  char *body;
  size_t len;
  json_t *json;
} cli_resp_t;

void cli_resp_dispose(cli_resp_t *r);

/** One request to the gateway. Returns 0 with the response in r, or a
 *  negative OSR_E* code (could not connect, timeout, TLS) with a human
 *  message in err. `idem_key` adds Idempotency-Key; body may be NULL. */
int cli_http(const cli_t *c, const char *method, const char *target, const char *body,
             size_t bodylen, const char *idem_key, cli_resp_t *r, char *err, size_t errlen);

/**
 * cli_http + the CLI's error conventions: a non-2xx answer prints
 * "error <code>: <message>" and its details to stderr (and, with --json,
 * the body to stdout); an unreachable gateway prints why. Returns CLI_OK
 * with r filled for 2xx, else the exit code (r is disposed).
 */
int cli_call(const cli_t *c, const char *method, const char *target, const json_t *body,
             const char *idem_key, cli_resp_t *r);

/** Exit code for an HTTP status. */
int cli_exit_for_status(int status);

/** Print the response body as-is (for --json), adding a final newline. */
void cli_print_raw(const cli_resp_t *r);

/** Resolve the API key: --key, OSR_KEY, then (for a loopback URL) the admin
 *  key file <data dir>/admin.key. */
void cli_resolve_key(cli_t *c);

/** Is url on this machine (127.0.0.0/8, ::1, localhost)? */
int cli_url_is_local(const char *url);

/* ---- arguments ------------------------------------------------------------ */

/** If argv[*i] is `name` or `name=v`, set *val (taking the next argument if
 *  needed) and advance *i. Returns 1 if matched, 0 if not, -1 on a missing
 *  value (printed; the caller exits CLI_EUSAGE). */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **val);

/** Parse a whole non-negative decimal number into *out (<= max). */
int cli_parse_u64(const char *s, uint64_t max, uint64_t *out);

/** Print "osr <cmd>: <msg>" to stderr and return CLI_EUSAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/** Percent-encode for a query string component into out. */
void cli_urlencode(const char *s, char *out, size_t outlen);

/* ---- output --------------------------------------------------------------- */

/** A value at a dotted path ("binding.provider") as display text ("-" when
 *  missing or null). Numbers and booleans are formatted; arrays are joined
 *  with ","; objects of strings as k=v,k=v. */
const char *cli_field(const json_t *o, const char *path, char *buf, size_t len);

#define CLI_TABLE_COLS 12

typedef struct cli_table_s {
  size_t ncols;
  const char *head[CLI_TABLE_COLS];
  char **cells; /* nrows * ncols copies */
  size_t nrows, cap;
} cli_table_t;

void cli_table_init(cli_table_t *t, size_t ncols, const char *const *head);
void cli_table_add(cli_table_t *t, const char *const *cells);
/** Aligned columns (two spaces apart), header first; then frees the rows. */
void cli_table_print(cli_table_t *t, FILE *f);

/** "label   value" lines, labels padded to `width`. */
void cli_kv(FILE *f, int width, const char *label, const char *value);

/* ---- commands ------------------------------------------------------------- */

int cli_cmd_serve(int argc, char **argv);
int cli_cmd_create(cli_t *c, int argc, char **argv);
int cli_cmd_plan(cli_t *c, int argc, char **argv);
int cli_cmd_ls(cli_t *c, int argc, char **argv);
int cli_cmd_get(cli_t *c, int argc, char **argv);
int cli_cmd_kill(cli_t *c, int argc, char **argv);
int cli_cmd_providers(cli_t *c, int argc, char **argv);
int cli_cmd_keys(cli_t *c, int argc, char **argv);
int cli_cmd_doctor(cli_t *c, int argc, char **argv);

#endif
