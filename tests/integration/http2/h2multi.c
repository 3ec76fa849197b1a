/*
 * h2multi: drives OUR HTTP/2 client with many concurrent requests on one
 * connection against an independent server (node's http2 module, see
 * h2peer.js), for test_http2.py. It checks every byte it gets back.
 *
 *   h2multi [--tls --ca F --sni NAME] ADDR
 *
 * Requests, all in flight at the same time on one connection:
 *   - 8 x GET /bytes?n=1000000&seed=i: body compared with the pattern;
 *     request 0 holds every chunk and releases it from a timer (response
 *     flow control through osr_http_creq_hold/release);
 *   - 4 x POST /echo with 2 MB bodies written in 64 KiB slices (zero-copy
 *     request bodies, one write in flight), echo compared with what was sent;
 *   - GET /slow?ms=5000 cancelled after 100 ms: must fail with OSR_ECANCELED;
 *   - GET /reset (the server resets the stream): must fail, others unharmed.
 * Prints "ok <name>" or "FAIL <name> ..." per request, then
 * "done <n> failures <f>", and exits 0 only if everything matched.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http.h"
#include "net/tls.h"
#include "util/log.h"
#include "util/mem.h"

#define NGET     8
#define NECHO    4
#define ECHO_LEN (2u * 1024 * 1024)
#define SLICE    (64u * 1024)
#define NREQ     (NGET + NECHO + 2)

typedef struct rq_s {
  char name[64];
  char target[96];
  int kind; /* 0 bytes, 1 echo, 2 cancel, 3 reset */
  int seed;
  osr_http_creq_t *r;
  int status;
  uint64_t got;
  uint64_t want;
  int bad;
  int finished;
  /* upload */
  char *data;
  size_t off;
  /* hold/release */
  int hold;
  uv_timer_t timer;
  int timer_open;
} rq_t;

static rq_t rqs[NREQ];
static osr_http_client_t *client;
static int finished, failures;
static uv_timer_t cancel_timer, deadline;
static uv_loop_t *loop;

static unsigned char pat(uint64_t i, int seed)
{
  return (unsigned char)(((i % 251) * 31 + (uint64_t)seed * 7 + 11) & 0xFF);
}

static void all_done(void)
{
  printf("done %d failures %d\n", finished, failures);
  fflush(stdout);
  osr_http_client_close(client);
  client = NULL;
  uv_close((uv_handle_t *)&cancel_timer, NULL);
  uv_close((uv_handle_t *)&deadline, NULL);
}

static void finish(rq_t *q, int status)
{
  int ok;
  q->finished = 1;
  switch (q->kind) {
  case 0:
  case 1:
    ok = status == OSR_EOF && q->status == 200 && !q->bad && q->got == q->want;
    break;
  case 2:
    ok = status == OSR_ECANCELED;
    break;
  default:
    ok = status != OSR_EOF && status != 0;
    break;
  }
  if (ok) {
    printf("ok %s\n", q->name);
  } else {
    printf("FAIL %s status=%d http=%d got=%llu want=%llu bad=%d\n", q->name, status, q->status,
           (unsigned long long)q->got, (unsigned long long)q->want, q->bad);
    failures++;
  }
  fflush(stdout);
  if (++finished == NREQ)
    all_done();
}

static void on_response(osr_http_creq_t *r, int status, const osr_http_header_t *h, size_t n,
                        void *data)
{
  rq_t *q = data;
  (void)r;
  (void)h;
  (void)n;
  q->status = status;
}

static void on_release_timer(uv_timer_t *t)
{
  rq_t *q = t->data;
  osr_http_creq_release(q->r);
}

static void on_body(osr_http_creq_t *r, const osr_iovec_t *chunk, int status, void *data)
{
  rq_t *q = data;
  (void)r;
  if (status != 0) {
    if (q->timer_open) {
      uv_close((uv_handle_t *)&q->timer, NULL);
      q->timer_open = 0;
    }
    finish(q, status);
    return;
  }
  for (size_t i = 0; i < chunk->len && !q->bad; i++) {
    unsigned char want =
        q->kind == 1 ? (unsigned char)q->data[q->got + i] : pat(q->got + i, q->seed);
    if ((unsigned char)chunk->base[i] != want)
      q->bad = 1;
  }
  q->got += chunk->len;
  if (q->got > q->want)
    q->bad = 1;
  if (q->hold) {
    /* Keep the chunk and let the peer wait for the window until later. */
    osr_http_creq_hold(r);
    uv_timer_start(&q->timer, on_release_timer, 1, 0);
  }
}

static const osr_http_client_events_t events = {on_response, on_body};

static void upload_next(osr_http_creq_t *r, int status, void *arg)
{
  rq_t *q = arg;
  if (status != 0)
    return; /* on_body reports it */
  size_t n = ECHO_LEN - q->off > SLICE ? SLICE : ECHO_LEN - q->off;
  osr_iovec_t iov[2] = {osr_iov(q->data + q->off, n / 2),
                        osr_iov(q->data + q->off + n / 2, n - n / 2)};
  q->off += n;
  int end = q->off == ECHO_LEN;
  int rv = osr_http_creq_write(r, iov, 2, end, end ? NULL : upload_next, q);
  if (rv != 0) {
    printf("FAIL %s write %d\n", q->name, rv);
    q->bad = 1;
  }
}

static void on_cancel_timer(uv_timer_t *t)
{
  (void)t;
  for (int i = 0; i < NREQ; i++) {
    if (rqs[i].kind == 2 && !rqs[i].finished)
      osr_http_creq_cancel(rqs[i].r);
  }
}

static void on_deadline(uv_timer_t *t)
{
  (void)t;
  printf("FAIL deadline (%d of %d finished)\n", finished, NREQ);
  fflush(stdout);
  exit(1);
}

static void on_connected(osr_http_client_t *c, int status, void *data)
{
  (void)data;
  if (status != 0) {
    printf("FAIL connect %d %s\n", status, osr_strerror(status));
    exit(1);
  }
  if (osr_http_client_version(c) != 20) {
    printf("FAIL version %d\n", osr_http_client_version(c));
    exit(1);
  }
  client = c;
  for (int i = 0; i < NREQ; i++) {
    rq_t *q = &rqs[i];
    osr_http_client_req_t req;
    memset(&req, 0, sizeof(req));
    if (i < NGET) {
      q->kind = 0;
      q->seed = i;
      q->want = 1000000;
      q->hold = i == 0;
      snprintf(q->target, sizeof(q->target), "/bytes?n=1000000&seed=%d", i);
      snprintf(q->name, sizeof(q->name), "get%d%s", i, q->hold ? "-held" : "");
      req.method = "GET";
    } else if (i < NGET + NECHO) {
      q->kind = 1;
      q->want = ECHO_LEN;
      q->data = osr_xmalloc(ECHO_LEN);
      for (size_t k = 0; k < ECHO_LEN; k++)
        q->data[k] = (char)((k * 131 + (size_t)i) >> 3);
      snprintf(q->target, sizeof(q->target), "/echo");
      snprintf(q->name, sizeof(q->name), "echo%d", i - NGET);
      req.method = "POST";
      req.content_length = ECHO_LEN;
    } else if (i == NGET + NECHO) {
      q->kind = 2;
      snprintf(q->target, sizeof(q->target), "/slow?ms=5000");
      snprintf(q->name, sizeof(q->name), "cancel");
      req.method = "GET";
    } else {
      q->kind = 3;
      snprintf(q->target, sizeof(q->target), "/reset");
      snprintf(q->name, sizeof(q->name), "reset");
      req.method = "GET";
    }
    if (q->hold) {
      uv_timer_init(loop, &q->timer);
      q->timer.data = q;
      q->timer_open = 1;
    }
    req.target = q->target;
    int rv = osr_http_client_request(c, &req, &events, q, &q->r);
    if (rv != 0) {
      printf("FAIL request %s %d\n", q->name, rv);
      exit(1);
    }
    if (q->kind == 1)
      upload_next(q->r, 0, q);
  }
  uv_timer_start(&cancel_timer, on_cancel_timer, 100, 0);
}

int main(int argc, char **argv)
{
  const char *ca = NULL, *sni = NULL;
  int tls = 0, i;

  for (i = 1; i < argc && strncmp(argv[i], "--", 2) == 0; i++) {
    if (strcmp(argv[i], "--tls") == 0)
      tls = 1;
    else if (strcmp(argv[i], "--ca") == 0 && i + 1 < argc)
      ca = argv[++i];
    else if (strcmp(argv[i], "--sni") == 0 && i + 1 < argc)
      sni = argv[++i];
    else
      break;
  }
  if (argc - i != 1) {
    fprintf(stderr, "usage: h2multi [--tls --ca F --sni NAME] ADDR\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (getenv("OSR_LOG_LEVEL") != NULL) {
    osr_log_level_t l;
    if (osr_log_parse_level(getenv("OSR_LOG_LEVEL"), &l) == 0)
      osr_log_set_level(l);
  }
  loop = uv_default_loop();
  osr_http_client_opts_t co;
  memset(&co, 0, sizeof(co));
  co.h2_prior_knowledge = 1;
  co.sni = sni;
  osr_tls_ctx_t *ctx = NULL;
  if (tls) {
    static const char *const alpn[] = {"h2"};
    osr_tls_client_opts_t to;
    memset(&to, 0, sizeof(to));
    to.ca_file = ca;
    to.alpn = alpn;
    to.nalpn = 1;
    int rv = osr_tls_ctx_new_client(&to, &ctx);
    if (rv != 0) {
      printf("FAIL tls context %d\n", rv);
      return 1;
    }
    co.tls = ctx;
  }
  uv_timer_init(loop, &cancel_timer);
  uv_timer_init(loop, &deadline);
  uv_timer_start(&deadline, on_deadline, 60000, 0);
  int rv = osr_http_client_connect(loop, argv[i], &co, on_connected, NULL);
  if (ctx != NULL)
    osr_tls_ctx_unref(ctx);
  if (rv != 0) {
    printf("FAIL connect %d\n", rv);
    return 1;
  }
  uv_run(loop, UV_RUN_DEFAULT);
  uv_loop_close(loop);
  for (int k = 0; k < NREQ; k++)
    osr_free(rqs[k].data);
  return failures == 0 && finished == NREQ ? 0 : 1;
}
