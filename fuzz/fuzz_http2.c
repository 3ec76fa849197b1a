/*
 * Fuzz target: the HTTP/2 server session (http2.c + http2_conn.c on
 * nghttp2) fed arbitrary client bytes from memory, with no socket.
 *
 * Input: if the first byte is odd the client connection preface is
 * prepended (so the fuzzer spends its time on frames, not on the magic);
 * the first byte also picks the size of the pieces the input is fed in,
 * which exercises frames split across reads. Between pieces every queued
 * output batch is completed (as if the socket wrote it) and held request
 * body chunks are released, so write callbacks, flow control and stream
 * finalisation all run. At the end the connection is "lost": every open
 * stream must be finalised exactly once and everything freed (LeakSanitizer
 * checks).
 *
 * The handler behaves like a small real application: GET answers at once
 * (osr_http_send), /stream answers with two streamed writes, /abort resets
 * the stream, POST reads the body holding every other chunk and answers
 * after the end, /big answers with a response larger than the windows.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http2_int.h"
#include "util/log.h"
#include "util/mem.h"

#define MAX_HELD 64

typedef struct fz_req_s {
  osr_http_req_t *req;
  int held;
  int writes;
  uint64_t body;
} fz_req_t;

static fz_req_t *held[MAX_HELD];
static size_t nheld;
static uint64_t out_bytes;
static unsigned long nrequests, ndone;
static int verbose; /* FUZZ_HTTP2_VERBOSE=1: one summary line per input */
static char big[200000];
static volatile unsigned sink;

static void unlist(fz_req_t *f)
{
  for (size_t i = 0; i < nheld; i++) {
    if (held[i] == f) {
      held[i] = held[--nheld];
      return;
    }
  }
}

static void on_done(osr_http_req_t *req, int status)
{
  fz_req_t *f = req->data;
  (void)status;
  ndone++;
  if (f == NULL)
    return;
  unlist(f);
  osr_free(f);
  req->data = NULL;
}

static void on_written(osr_http_req_t *req, int status, void *arg)
{
  fz_req_t *f = req->data;
  (void)arg;
  if (status != 0 || f == NULL)
    return;
  if (++f->writes == 1) {
    static const char tail[] = "second and last\n";
    if (osr_http_write(req, &(osr_iovec_t){(char *)tail, sizeof(tail) - 1}, 1, 1, on_written,
                       NULL) != 0)
      osr_http_abort(req);
  }
}

static void respond_stream(osr_http_req_t *req)
{
  static const char head[] = "first\n";
  osr_iovec_t iov[2] = {osr_iov(head, 3), osr_iov(head + 3, sizeof(head) - 4)};
  if (osr_http_respond(req, 200, NULL, 0, -1) != 0)
    return;
  if (osr_http_write(req, iov, 2, 0, on_written, NULL) != 0)
    osr_http_abort(req);
}

static void on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  fz_req_t *f = req->data;
  if (status == 0) {
    /* Touch every byte: a dangling chunk shows up under ASan. */
    unsigned sum = 0;
    for (size_t i = 0; i < chunk->len; i++)
      sum += (unsigned char)chunk->base[i];
    sink += sum;
    f->body += chunk->len;
    if ((f->body & 1) == 0 && !f->held && nheld < MAX_HELD) {
      osr_http_req_hold(req);
      f->held = 1;
      held[nheld++] = f;
    }
    return;
  }
  if (status == OSR_EOF)
    respond_stream(req);
}

static void on_request(osr_http_req_t *req, void *data)
{
  (void)data;
  nrequests++;
  fz_req_t *f = osr_xcalloc(1, sizeof(*f));
  f->req = req;
  req->data = f;
  req->on_done = on_done;
  if (req->path.len == 6 && memcmp(req->path.base, "/abort", 6) == 0) {
    osr_http_abort(req);
  } else if (req->path.len == 7 && memcmp(req->path.base, "/stream", 7) == 0) {
    respond_stream(req);
  } else if (req->path.len == 4 && memcmp(req->path.base, "/big", 4) == 0) {
    if (osr_http_respond(req, 200, NULL, 0, (int64_t)sizeof(big)) == 0)
      osr_http_write(req, &(osr_iovec_t){big, sizeof(big)}, 1, 1, NULL, NULL);
  } else if (req->method.len == 4 && memcmp(req->method.base, "POST", 4) == 0) {
    req->on_body = on_body;
  } else {
    osr_http_header_t h[1];
    h[0].name = OSR_IOV_LIT("X-Fuzz");
    h[0].value = OSR_IOV_LIT("1");
    if (osr_http_respond(req, 200, h, 1, 5) == 0)
      osr_http_write(req, &(osr_iovec_t){(char *)"hello", 5}, 1, 1, NULL, NULL);
  }
}

static void on_output(void *ud, const osr_iovec_t *iov, size_t n)
{
  (void)ud;
  for (size_t i = 0; i < n; i++)
    out_bytes += iov[i].len;
}

static void release_all(void)
{
  while (nheld != 0) {
    fz_req_t *f = held[--nheld];
    f->held = 0;
    osr_http_req_release(f->req); /* may deliver more body, hold again */
  }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
  (void)argc;
  (void)argv;
  osr_log_set_level(OSR_LOG_OFF);
  verbose = getenv("FUZZ_HTTP2_VERBOSE") != NULL;
  memset(big, 'b', sizeof(big));
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  static const uint8_t preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  uv_loop_t loop;
  osr_http_server_opts_t o;

  if (size == 0 || size > 1024 * 1024)
    return 0;
  if (big[0] != 'b')
    LLVMFuzzerInitialize(NULL, NULL); /* replay driver without Initialize */
  memset(&o, 0, sizeof(o));
  o.handler.on_request = on_request;
  o.limits.max_headers = 32;
  o.limits.max_header_bytes = 4096;
  o.limits.max_url = 512;
  o.limits.max_body = 100000;
  o.limits.h2_max_streams = 16;
  o.limits.h2_window = 65535;
  uv_loop_init(&loop);
  osr_http_server_t *srv = osr_http_server_new(&loop, &o);
  osr__h2_conn_t *c = osr__http2_server_new_mem(srv, on_output, NULL);
  if (c == NULL) {
    osr_http_server_close(srv, 0, NULL, NULL);
    uv_loop_close(&loop);
    return 0;
  }

  uint8_t mode = data[0];
  data++;
  size--;
  size_t piece = ((size_t)(mode >> 1) % 32 + 1) * 23;
  int alive = 1;
  if (mode & 1)
    alive = osr__h2_mem_feed(c, preface, sizeof(preface) - 1) == 0;
  for (size_t off = 0; alive && off < size; off += piece) {
    size_t n = size - off < piece ? size - off : piece;
    alive = osr__h2_mem_feed(c, data + off, n) == 0;
    for (int round = 0; round < 8; round++) {
      release_all();
      if (osr__h2_mem_complete(c) == 0 && nheld == 0)
        break;
    }
  }
  if (alive) {
    release_all();
    osr__h2_mem_complete(c);
  }
  osr__h2_mem_destroy(c); /* frees the server connection */
  if (verbose)
    fprintf(stderr, "fuzz_http2: %zu bytes in, %llu out, %lu requests, %lu done\n", size,
            (unsigned long long)out_bytes, nrequests, ndone);
  /* every request is finalised exactly once, whatever the input */
  if (nrequests != ndone || nheld != 0)
    abort();
  out_bytes = 0;
  nrequests = ndone = 0;
  nheld = 0;
  osr_http_server_close(srv, 0, NULL, NULL);
  uv_loop_close(&loop);
  return 0;
}
