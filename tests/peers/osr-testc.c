/*
 * osr-testc: the OSR HTTP client (HTTP/1.1 and HTTP/2, optional TLS) as a
 * command, so integration tests can drive it against independent servers
 * (node http/http2/https, openssl s_server, nginx).
 *
 *   osr-testc [--h2] [--tls] [--ca F] [--insecure] [--sni NAME] [--method M]
 *             [--header 'k: v']... [--data STR | --data-file F] [--chunked]
 *             [--repeat N] [--out F] [--timeout-ms N] [--hold-ms N] ADDR TARGET
 *
 * --h2 without --tls speaks h2c with prior knowledge; with --tls it offers
 * ALPN h2 (else only http/1.1). Prints, per request: "version 11|20",
 * "status N", "header name: value"..., "body-bytes N", "body-sha256 HEX".
 * On failure prints "error <code> <text>" and exits 1.
 * --hold-ms N holds every body chunk for N ms before releasing it (zero-copy
 * backpressure: the connection reads nothing meanwhile).
 */
#include <openssl/evp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http.h"
#include "net/tls.h"
#include "util/log.h"
#include "util/mem.h"

#define MAX_HEADERS 32

static struct {
  int h2, tls, insecure, chunked;
  const char *ca, *sni, *method, *out, *addr, *target;
  osr_http_header_t headers[MAX_HEADERS];
  size_t nheaders;
  char *data;
  size_t data_len;
  int has_data;
  unsigned long repeat;
  uint64_t timeout_ms;
  uint64_t hold_ms;
} opt;

static osr_http_client_t *client;
static unsigned long done_count;
static int exit_code;
static FILE *out_file;
static EVP_MD_CTX *md;
static uint64_t body_bytes;
static uv_timer_t deadline;
static uv_timer_t hold_timer;
static osr_http_creq_t *held_req;

static void start_request(void);

static void stop_deadline(void)
{
  if (!uv_is_closing((uv_handle_t *)&deadline))
    uv_close((uv_handle_t *)&deadline, NULL);
  if (!uv_is_closing((uv_handle_t *)&hold_timer))
    uv_close((uv_handle_t *)&hold_timer, NULL);
}

static void fail(int code, const char *what)
{
  printf("error %d %s: %s\n", code, what, osr_strerror(code));
  fflush(stdout);
  exit_code = 1;
  if (client != NULL) {
    osr_http_client_close(client);
    client = NULL;
  }
  stop_deadline();
}

static void on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                        void *data)
{
  (void)r;
  (void)data;
  printf("version %d\nstatus %d\n", osr_http_client_version(client), status);
  for (size_t i = 0; i < n; i++)
    printf("header %.*s: %.*s\n", (int)h[i].name.len, h[i].name.base, (int)h[i].value.len,
           h[i].value.base);
  md = EVP_MD_CTX_new();
  EVP_DigestInit_ex(md, EVP_sha256(), NULL);
  body_bytes = 0;
}

static void on_hold_timer(uv_timer_t *t)
{
  (void)t;
  osr_http_creq_t *r = held_req;
  held_req = NULL;
  if (r != NULL)
    osr_http_creq_release(r);
}

static void on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  (void)data;
  if (status == 0) {
    body_bytes += chunk->len;
    EVP_DigestUpdate(md, chunk->base, chunk->len);
    if (out_file != NULL && fwrite(chunk->base, 1, chunk->len, out_file) != chunk->len) {
      fail(OSR_EPIPE, "write output");
      return;
    }
    if (opt.hold_ms != 0 && chunk->len != 0) {
      osr_http_creq_hold(r);
      held_req = r;
      uv_timer_start(&hold_timer, on_hold_timer, opt.hold_ms, 0);
    }
    return;
  }
  held_req = NULL;
  uv_timer_stop(&hold_timer);
  if (status != OSR_EOF) {
    if (md != NULL) {
      EVP_MD_CTX_free(md);
      md = NULL;
    }
    fail(status, "request");
    return;
  }
  unsigned char dg[EVP_MAX_MD_SIZE];
  unsigned int dlen = 0;
  EVP_DigestFinal_ex(md, dg, &dlen);
  EVP_MD_CTX_free(md);
  md = NULL;
  printf("body-bytes %llu\nbody-sha256 ", (unsigned long long)body_bytes);
  for (unsigned i = 0; i < dlen; i++)
    printf("%02x", dg[i]);
  printf("\n");
  fflush(stdout);
  if (++done_count < opt.repeat) {
    start_request();
    return;
  }
  osr_http_client_close(client);
  client = NULL;
  stop_deadline();
}

static const osr_http_client_events_t events = {on_response, on_body};

/* Request body: written in 256 KiB slices, one write in flight. */
typedef struct upload_s {
  osr_http_creq_t *r;
  size_t off;
} upload_t;

static upload_t upload;

static void upload_next(osr_http_creq_t *r, int status, void *arg)
{
  upload_t *u = arg;
  if (status != 0)
    return; /* on_body reports the failure */
  size_t left = opt.data_len - u->off;
  size_t n = left > 256 * 1024 ? 256 * 1024 : left;
  osr_iovec_t iov = osr_iov(opt.data + u->off, n);
  u->off += n;
  int end = u->off == opt.data_len;
  int rv = osr_http_creq_write(r, &iov, 1, end, end ? NULL : upload_next, u);
  if (rv != 0)
    fail(rv, "write body");
}

static void start_request(void)
{
  osr_http_client_req_t req;
  memset(&req, 0, sizeof(req));
  req.method = opt.method != NULL ? opt.method : (opt.has_data ? "POST" : "GET");
  req.target = opt.target;
  req.headers = opt.headers;
  req.nheaders = opt.nheaders;
  req.content_length = !opt.has_data ? 0 : opt.chunked ? -1 : (int64_t)opt.data_len;

  int rv = osr_http_client_request(client, &req, &events, NULL, &upload.r);
  if (rv != 0) {
    fail(rv, "request");
    return;
  }
  if (opt.has_data) {
    upload.off = 0;
    upload_next(upload.r, 0, &upload);
  }
}

static void on_connected(osr_http_client_t *c, int status, void *data)
{
  (void)data;
  if (status != 0) {
    fail(status, "connect");
    return;
  }
  client = c;
  start_request();
}

static void on_deadline(uv_timer_t *t)
{
  (void)t;
  fail(OSR_ETIMEDOUT, "deadline");
}

static void usage(void)
{
  fprintf(stderr, "usage: osr-testc [--h2] [--tls] [--ca F] [--insecure] [--sni NAME] [--method M]\n"
                  "                 [--header 'k: v']... [--data STR | --data-file F] [--chunked]\n"
                  "                 [--repeat N] [--out F] [--timeout-ms N] [--hold-ms N]\n"
                  "                 ADDR TARGET\n");
  exit(2);
}

static void read_file(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    exit(2);
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  opt.data = osr_xmalloc(n > 0 ? (size_t)n : 1);
  if (n > 0 && fread(opt.data, 1, (size_t)n, f) != (size_t)n) {
    perror(path);
    exit(2);
  }
  fclose(f);
  opt.data_len = (size_t)n;
  opt.has_data = 1;
}

int main(int argc, char **argv)
{
  int i;
  opt.repeat = 1;
  opt.timeout_ms = 60000;
  for (i = 1; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
    const char *a = argv[i];
    int has_val = i + 1 < argc;
    if (strcmp(a, "--h2") == 0)
      opt.h2 = 1;
    else if (strcmp(a, "--tls") == 0)
      opt.tls = 1;
    else if (strcmp(a, "--insecure") == 0)
      opt.insecure = 1;
    else if (strcmp(a, "--chunked") == 0)
      opt.chunked = 1;
    else if (!has_val)
      usage();
    else if (strcmp(a, "--ca") == 0)
      opt.ca = argv[++i];
    else if (strcmp(a, "--sni") == 0)
      opt.sni = argv[++i];
    else if (strcmp(a, "--method") == 0)
      opt.method = argv[++i];
    else if (strcmp(a, "--out") == 0)
      opt.out = argv[++i];
    else if (strcmp(a, "--repeat") == 0)
      opt.repeat = strtoul(argv[++i], NULL, 10);
    else if (strcmp(a, "--timeout-ms") == 0)
      opt.timeout_ms = strtoull(argv[++i], NULL, 10);
    else if (strcmp(a, "--hold-ms") == 0)
      opt.hold_ms = strtoull(argv[++i], NULL, 10);
    else if (strcmp(a, "--data") == 0) {
      opt.data = osr_xstrdup(argv[++i]);
      opt.data_len = strlen(opt.data);
      opt.has_data = 1;
    } else if (strcmp(a, "--data-file") == 0)
      read_file(argv[++i]);
    else if (strcmp(a, "--header") == 0) {
      const char *h = argv[++i];
      const char *colon = strchr(h, ':');
      if (colon == NULL || opt.nheaders == MAX_HEADERS)
        usage();
      const char *v = colon + 1;
      while (*v == ' ')
        v++;
      opt.headers[opt.nheaders].name = osr_iov(h, (size_t)(colon - h));
      opt.headers[opt.nheaders].value = osr_iov(v, strlen(v));
      opt.nheaders++;
    } else
      usage();
  }
  if (argc - i != 2 || opt.repeat == 0)
    usage();
  opt.addr = argv[i];
  opt.target = argv[i + 1];
  if (opt.out != NULL && (out_file = fopen(opt.out, "wb")) == NULL) {
    perror(opt.out);
    return 2;
  }
  if (getenv("OSR_LOG_LEVEL") != NULL) {
    osr_log_level_t l;
    if (osr_log_parse_level(getenv("OSR_LOG_LEVEL"), &l) == 0)
      osr_log_set_level(l);
  }
  signal(SIGPIPE, SIG_IGN);

  uv_loop_t *loop = uv_default_loop();
  osr_http_client_opts_t co;
  memset(&co, 0, sizeof(co));
  co.h2_prior_knowledge = opt.h2;
  co.sni = opt.sni;
  osr_tls_ctx_t *tls = NULL;
  if (opt.tls) {
    static const char *const alpn_h2[] = {"h2", "http/1.1"};
    static const char *const alpn_h1[] = {"http/1.1"};
    osr_tls_client_opts_t to;
    memset(&to, 0, sizeof(to));
    to.ca_file = opt.ca;
    to.insecure_skip_verify = opt.insecure;
    to.alpn = opt.h2 ? alpn_h2 : alpn_h1;
    to.nalpn = opt.h2 ? 2 : 1;
    int rv = osr_tls_ctx_new_client(&to, &tls);
    if (rv != 0) {
      printf("error %d tls context: %s\n", rv, osr_strerror(rv));
      return 1;
    }
    co.tls = tls;
  }
  uv_timer_init(loop, &deadline);
  uv_timer_init(loop, &hold_timer);
  uv_timer_start(&deadline, on_deadline, opt.timeout_ms, 0);
  int rv = osr_http_client_connect(loop, opt.addr, &co, on_connected, NULL);
  if (tls != NULL)
    osr_tls_ctx_unref(tls);
  if (rv != 0) {
    printf("error %d connect: %s\n", rv, osr_strerror(rv));
    return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  if (out_file != NULL)
    fclose(out_file);
  osr_free(opt.data);
  return exit_code;
}
