/*
 * osr-wsc: our WebSocket client CLI, for integration tests against
 * independent servers (npm ws) and against raw scripted peers.
 *
 *   osr-wsc [--tls] [--ca FILE | --insecure] [--sni NAME] [--subprotocol P]...
 *           [--max-message N] [--header 'k: v']... ADDR PATH
 *
 * Commands, one per line on stdin (run in order once the connection is open;
 * a send that hits backpressure waits for on_writable):
 *   text <string>          send a text message (the rest of the line)
 *   binary-file <path>     send a file's contents as one binary message
 *   binary-random <n>      send n random bytes as one binary message
 *   ping [payload]         send a ping
 *   close <code> [reason]  start the close handshake
 *   sleep <ms>             pause the command stream
 * Events on stdout, one per line:
 *   open <subprotocol|->
 *   sent text|binary <len> <sha256>
 *   message text|binary <len> <sha256>
 *   close <code> <reason>
 *   error <code> <text>    (the connection could not be opened; exit 1)
 * Exits 0 after the connection closed (whatever the code), 1 if it never
 * opened, 2 on usage errors. The file is read synchronously: this is a test
 * tool, not a server.
 */
#include <stdio.h>
#include <stdlib.h>
#include <signal.h>
#include <string.h>
#include <uv.h>

#include <openssl/rand.h>
#include <openssl/sha.h>

#include "net/tls.h"
#include "net/ws.h"
#include "util/log.h"
#include "util/mem.h"

#define MAX_PROTOS 16
#define MAX_HEADERS 16
#define MAX_LINE (1024 * 1024)

static uv_loop_t *loop;
static osr_ws_t *ws;
static int opened, closed, open_failed;
static uv_pipe_t in_pipe;
static uv_tty_t in_tty;
static uv_stream_t *in_stream;
static uv_timer_t sleep_timer;
static int sleeping;
static int blocked; /* waiting for on_writable */
static int in_eof;
static char *pending; /* lines not yet run, NUL-separated */
static size_t pending_len, pending_cap;
static char linebuf[MAX_LINE];
static size_t line_len;

static void run_commands(void);

static void hex_sha256(const void *p, size_t n, char out[65])
{
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(p, n, md);
  for (int i = 0; i < SHA256_DIGEST_LENGTH; i++)
    snprintf(out + i * 2, 3, "%02x", md[i]);
}

static void on_open(osr_ws_t *w, int status, void *data)
{
  (void)data;
  if (status != 0) {
    open_failed = 1;
    printf("error %d %s\n", status, osr_strerror(status));
    ws = NULL;
    if (in_stream != NULL && !uv_is_closing((uv_handle_t *)in_stream))
      uv_close((uv_handle_t *)in_stream, NULL);
    if (!uv_is_closing((uv_handle_t *)&sleep_timer))
      uv_close((uv_handle_t *)&sleep_timer, NULL);
    return;
  }
  opened = 1;
  const char *p = osr_ws_subprotocol(w);
  printf("open %s\n", p != NULL ? p : "-");
  run_commands();
}

static void on_message(osr_ws_t *w, int op, const osr_iovec_t *m, void *data)
{
  char hex[65];
  (void)w;
  (void)data;
  hex_sha256(m->base, m->len, hex);
  printf("message %s %zu %s\n", op == OSR_WS_TEXT ? "text" : "binary", m->len, hex);
}

static void on_writable(osr_ws_t *w, void *data)
{
  (void)w;
  (void)data;
  blocked = 0;
  run_commands();
}

static void on_close(osr_ws_t *w, int code, const osr_iovec_t *reason, void *data)
{
  (void)w;
  (void)data;
  closed = 1;
  ws = NULL;
  printf("close %d %.*s\n", code, (int)reason->len, reason->base);
  if (in_stream != NULL && !uv_is_closing((uv_handle_t *)in_stream))
    uv_close((uv_handle_t *)in_stream, NULL);
  if (!uv_is_closing((uv_handle_t *)&sleep_timer))
    uv_close((uv_handle_t *)&sleep_timer, NULL);
}

static const osr_ws_events_t events = {
    .on_open = on_open,
    .on_message = on_message,
    .on_writable = on_writable,
    .on_close = on_close,
};

static int read_file(const char *path, char **out, size_t *len)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL)
    return -1;
  size_t cap = 1 << 16, n = 0;
  char *b = osr_xmalloc(cap);
  for (;;) {
    if (n == cap) {
      cap *= 2;
      b = osr_xrealloc(b, cap);
    }
    size_t r = fread(b + n, 1, cap - n, f);
    if (r == 0)
      break;
    n += r;
  }
  fclose(f);
  *out = b;
  *len = n;
  return 0;
}

static void on_sleep_done(uv_timer_t *t)
{
  (void)t;
  sleeping = 0;
  run_commands();
}

/* Run one command; returns 0 when done, 1 to retry later (backpressure). */
static int run_one(const char *cmd)
{
  char hex[65];
  const char *arg = strchr(cmd, ' ');
  size_t clen = arg != NULL ? (size_t)(arg - cmd) : strlen(cmd);
  arg = arg != NULL ? arg + 1 : "";
#define IS(s) (clen == strlen(s) && memcmp(cmd, s, clen) == 0)

  if (IS("text")) {
    int rv = osr_ws_send(ws, OSR_WS_TEXT, arg, strlen(arg));
    if (rv == OSR_EAGAIN)
      return 1;
    hex_sha256(arg, strlen(arg), hex);
    if (rv == 0)
      printf("sent text %zu %s\n", strlen(arg), hex);
    else
      printf("send-error %d %s\n", rv, osr_strerror(rv));
  } else if (IS("binary-file") || IS("binary-random")) {
    char *buf = NULL;
    size_t n = 0;
    if (IS("binary-file")) {
      if (read_file(arg, &buf, &n) != 0) {
        printf("send-error 0 cannot read %s\n", arg);
        return 0;
      }
    } else {
      n = strtoul(arg, NULL, 10);
      buf = osr_xmalloc(n ? n : 1);
      RAND_bytes((unsigned char *)buf, (int)n);
    }
    int rv = osr_ws_send(ws, OSR_WS_BINARY, buf, n);
    if (rv != OSR_EAGAIN) {
      hex_sha256(buf, n, hex);
      if (rv == 0)
        printf("sent binary %zu %s\n", n, hex);
      else
        printf("send-error %d %s\n", rv, osr_strerror(rv));
    }
    osr_free(buf);
    return rv == OSR_EAGAIN;
  } else if (IS("ping")) {
    int rv = osr_ws_ping(ws, arg, strlen(arg));
    if (rv != 0)
      printf("send-error %d %s\n", rv, osr_strerror(rv));
  } else if (IS("close")) {
    char *end;
    long code = strtol(arg, &end, 10);
    while (*end == ' ')
      end++;
    osr_ws_close(ws, (int)code, end);
  } else if (IS("sleep")) {
    sleeping = 1;
    uv_timer_start(&sleep_timer, on_sleep_done, strtoul(arg, NULL, 10), 0);
  } else if (clen != 0) {
    fprintf(stderr, "osr-wsc: unknown command: %s\n", cmd);
  }
  return 0;
#undef IS
}

static void run_commands(void)
{
  size_t off = 0;
  while (ws != NULL && opened && !closed && !sleeping && !blocked && off < pending_len) {
    const char *cmd = pending + off;
    size_t n = strlen(cmd) + 1;
    if (run_one(cmd)) {
      blocked = 1;
      break;
    }
    off += n;
  }
  if (off != 0) {
    memmove(pending, pending + off, pending_len - off);
    pending_len -= off;
  }
  fflush(stdout);
}

static void add_line(const char *p, size_t n)
{
  if (n > 0 && p[n - 1] == '\r')
    n--;
  if (pending_len + n + 1 > pending_cap) {
    pending_cap = (pending_len + n + 1) * 2;
    pending = osr_xrealloc(pending, pending_cap);
  }
  memcpy(pending + pending_len, p, n);
  pending[pending_len + n] = '\0';
  pending_len += n + 1;
}

static void on_in_alloc(uv_handle_t *h, size_t sz, uv_buf_t *b)
{
  static char buf[65536];
  (void)h;
  (void)sz;
  b->base = buf;
  b->len = sizeof(buf);
}

static void on_in_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
  if (n < 0) {
    in_eof = 1;
    if (line_len != 0)
      add_line(linebuf, line_len);
    line_len = 0;
    uv_read_stop(s);
    run_commands();
    return;
  }
  for (ssize_t i = 0; i < n; i++) {
    if (b->base[i] == '\n') {
      add_line(linebuf, line_len);
      line_len = 0;
    } else if (line_len < sizeof(linebuf)) {
      linebuf[line_len++] = b->base[i];
    }
  }
  run_commands();
}

static void usage(void)
{
  fprintf(stderr, "usage: osr-wsc [--tls] [--ca FILE | --insecure] [--sni NAME] "
                  "[--subprotocol P]... [--max-message N] [--header 'k: v']... ADDR PATH\n");
  exit(2);
}

int main(int argc, char **argv)
{
  const char *protos[MAX_PROTOS];
  osr_http_header_t headers[MAX_HEADERS];
  size_t nprotos = 0, nheaders = 0;
  int tls = 0, insecure = 0;
  const char *ca = NULL, *sni = NULL, *addr = NULL, *path = NULL;
  size_t max_message = 0;

  setvbuf(stdout, NULL, _IOLBF, 0);
  signal(SIGPIPE, SIG_IGN); /* a peer that went away is an error return, not a kill */
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--tls") == 0) {
      tls = 1;
    } else if (strcmp(a, "--insecure") == 0) {
      insecure = 1;
    } else if (strcmp(a, "--ca") == 0 && i + 1 < argc) {
      ca = argv[++i];
    } else if (strcmp(a, "--sni") == 0 && i + 1 < argc) {
      sni = argv[++i];
    } else if (strcmp(a, "--subprotocol") == 0 && i + 1 < argc && nprotos < MAX_PROTOS) {
      protos[nprotos++] = argv[++i];
    } else if (strcmp(a, "--max-message") == 0 && i + 1 < argc) {
      max_message = strtoul(argv[++i], NULL, 10);
    } else if (strcmp(a, "--header") == 0 && i + 1 < argc && nheaders < MAX_HEADERS) {
      char *h = argv[++i];
      char *c = strchr(h, ':');
      if (c == NULL)
        usage();
      const char *v = c + 1;
      while (*v == ' ')
        v++;
      headers[nheaders].name = osr_iov(h, (size_t)(c - h));
      headers[nheaders].value = osr_iov(v, strlen(v));
      nheaders++;
    } else if (strcmp(a, "--log-level") == 0 && i + 1 < argc) {
      osr_log_level_t l;
      if (osr_log_parse_level(argv[++i], &l) == 0)
        osr_log_set_level(l);
    } else if (a[0] == '-') {
      usage();
    } else if (addr == NULL) {
      addr = a;
    } else if (path == NULL) {
      path = a;
    } else {
      usage();
    }
  }
  if (addr == NULL || path == NULL)
    usage();

  loop = uv_default_loop();
  uv_timer_init(loop, &sleep_timer);

  osr_ws_connect_opts_t o;
  memset(&o, 0, sizeof(o));
  o.ws.subprotocols = protos;
  o.ws.nsubprotocols = nprotos;
  o.ws.max_message = max_message;
  o.sni = sni;
  o.headers = headers;
  o.nheaders = nheaders;
  osr_tls_ctx_t *ctx = NULL;
  if (tls) {
    static const char *const alpn[] = {"http/1.1"};
    osr_tls_client_opts_t to;
    memset(&to, 0, sizeof(to));
    to.ca_file = ca;
    to.insecure_skip_verify = insecure;
    to.alpn = alpn;
    to.nalpn = 1;
    int rv = osr_tls_ctx_new_client(&to, &ctx);
    if (rv != 0) {
      printf("error %d %s\n", rv, osr_strerror(rv));
      return 1;
    }
    o.tls = ctx;
  }

  /* Commands from stdin: a pipe or a terminal; anything else is read
   * whole now (e.g. a file redirected into stdin). */
  uv_handle_type t = uv_guess_handle(0);
  if (t == UV_NAMED_PIPE) {
    uv_pipe_init(loop, &in_pipe, 0);
    if (uv_pipe_open(&in_pipe, 0) == 0)
      in_stream = (uv_stream_t *)&in_pipe;
  } else if (t == UV_TTY) {
    if (uv_tty_init(loop, &in_tty, 0, 1) == 0)
      in_stream = (uv_stream_t *)&in_tty;
  } else if (t == UV_FILE) {
    char *all;
    size_t n;
    if (read_file("/dev/stdin", &all, &n) == 0) {
      size_t s = 0;
      for (size_t i = 0; i <= n; i++) {
        if (i == n || all[i] == '\n') {
          if (i > s)
            add_line(all + s, i - s);
          s = i + 1;
        }
      }
      osr_free(all);
    }
  }
  if (in_stream != NULL)
    uv_read_start(in_stream, on_in_alloc, on_in_read);

  int rv = osr_ws_connect(loop, addr, path, &o, &events, NULL, &ws);
  if (ctx != NULL)
    osr_tls_ctx_unref(ctx); /* the connection holds its own reference */
  if (rv != 0) {
    printf("error %d %s\n", rv, osr_strerror(rv));
    return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT);
  osr_free(pending);
  uv_loop_close(loop);
  return open_failed || !opened ? 1 : 0;
}
