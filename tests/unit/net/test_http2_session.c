/*
 * Unit tests of the HTTP/2 server session in memory mode (http2_int.h):
 * client frames are written by hand, the server's output is captured as the
 * iovecs it would hand to the socket. Checks the promises that are hard to
 * see from outside: DATA payload is not copied, write callbacks wait for the
 * socket, no WINDOW_UPDATE while a body chunk is held, on_done exactly once
 * when the connection is lost, output stops at the high watermark.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "net/http2_int.h"
#include "util/log.h"
#include "util/mem.h"

/* ---- client side: frames by hand --------------------------------------- */

static const char preface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

static size_t put_frame(uint8_t *p, uint8_t type, uint8_t flags, uint32_t sid, const void *pl,
                        size_t n)
{
  p[0] = (uint8_t)(n >> 16);
  p[1] = (uint8_t)(n >> 8);
  p[2] = (uint8_t)n;
  p[3] = type;
  p[4] = flags;
  p[5] = (uint8_t)(sid >> 24);
  p[6] = (uint8_t)(sid >> 16);
  p[7] = (uint8_t)(sid >> 8);
  p[8] = (uint8_t)sid;
  if (n != 0)
    memcpy(p + 9, pl, n);
  return 9 + n;
}

static size_t put_lit(uint8_t *p, const char *name, const char *value)
{
  size_t nl = strlen(name), vl = strlen(value), o = 0;
  p[o++] = 0x00; /* literal without indexing, new name, no Huffman (< 127 bytes) */
  p[o++] = (uint8_t)nl;
  memcpy(p + o, name, nl);
  o += nl;
  p[o++] = (uint8_t)vl;
  memcpy(p + o, value, vl);
  return o + vl;
}

/* Preface + empty SETTINGS + HEADERS for `method path` on stream `sid`. */
static size_t request(uint8_t *out, int with_preface, uint32_t sid, const char *method,
                      const char *path, int end_stream, const char *clen)
{
  uint8_t blk[512];
  size_t b = 0, o = 0;
  if (with_preface) {
    memcpy(out, preface, sizeof(preface) - 1);
    o = sizeof(preface) - 1;
    o += put_frame(out + o, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
  }
  b += put_lit(blk + b, ":method", method);
  b += put_lit(blk + b, ":scheme", "http");
  b += put_lit(blk + b, ":path", path);
  b += put_lit(blk + b, ":authority", "unit");
  if (clen != NULL)
    b += put_lit(blk + b, "content-length", clen);
  o += put_frame(out + o, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | (end_stream ? 1 : 0), sid,
                 blk, b);
  return o;
}

/* ---- captured server output -------------------------------------------- */

typedef struct out_s {
  uint8_t bytes[1 << 20];
  size_t len;
  int saw_base; /* an iovec pointed at `watch` */
  const char *watch;
  size_t batches;
} out_t;

static out_t out;

static void on_output(void *ud, const osr_iovec_t *iov, size_t n)
{
  (void)ud;
  out.batches++;
  for (size_t i = 0; i < n; i++) {
    if (out.watch != NULL && iov[i].base >= out.watch && iov[i].base < out.watch + 4096)
      out.saw_base = 1;
    if (out.len + iov[i].len <= sizeof(out.bytes))
      memcpy(out.bytes + out.len, iov[i].base, iov[i].len);
    out.len += iov[i].len;
  }
}

/* Count frames of `type` (on stream `sid`, or any if sid < 0) in the output. */
static int count_frames(uint8_t type, long sid, size_t *payload)
{
  int n = 0;
  size_t off = 0, pl = 0;
  while (off + 9 <= out.len && off + 9 <= sizeof(out.bytes)) {
    size_t len =
        ((size_t)out.bytes[off] << 16) | ((size_t)out.bytes[off + 1] << 8) | out.bytes[off + 2];
    uint32_t s = ((uint32_t)(out.bytes[off + 5] & 0x7f) << 24) |
                 ((uint32_t)out.bytes[off + 6] << 16) | ((uint32_t)out.bytes[off + 7] << 8) |
                 out.bytes[off + 8];
    if (out.bytes[off + 3] == type && (sid < 0 || (uint32_t)sid == s)) {
      n++;
      pl += len;
    }
    off += 9 + len;
  }
  if (payload != NULL)
    *payload = pl;
  return n;
}

/* ---- the application -------------------------------------------------- */

static char body[100000];
static int done_calls, done_status, write_cbs, write_status, body_chunks, body_eof, hold_first;
static osr_http_req_t *last_req;

static void on_done(osr_http_req_t *req, int status)
{
  (void)req;
  done_calls++;
  done_status = status;
  last_req = NULL;
}

static void on_written(osr_http_req_t *req, int status, void *arg)
{
  (void)req;
  (void)arg;
  write_cbs++;
  write_status = status;
}

static void on_body(osr_http_req_t *req, const osr_iovec_t *chunk, int status)
{
  if (status == OSR_EOF) {
    body_eof++;
    return;
  }
  if (status != 0)
    return;
  (void)chunk;
  if (body_chunks++ == 0 && hold_first)
    osr_http_req_hold(req);
}

static void on_request(osr_http_req_t *req, void *data)
{
  (void)data;
  last_req = req;
  req->on_done = on_done;
  if (req->method.len == 4 && memcmp(req->method.base, "POST", 4) == 0) {
    req->on_body = on_body;
    return;
  }
  size_t n = req->path.len == 4 && memcmp(req->path.base, "/big", 4) == 0 ? sizeof(body) : 5;
  assert_int_equal(osr_http_respond(req, 200, NULL, 0, (int64_t)n), 0);
  osr_iovec_t iov = osr_iov(body, n);
  assert_int_equal(osr_http_write(req, &iov, 1, 1, on_written, NULL), 0);
}

static uv_loop_t loop;
static osr_http_server_t *srv;

static osr__h2_conn_t *setup_conn(uint32_t window)
{
  osr_http_server_opts_t o;
  memset(&o, 0, sizeof(o));
  o.handler.on_request = on_request;
  o.limits.h2_window = window;
  memset(&out, 0, sizeof(out));
  done_calls = write_cbs = body_chunks = body_eof = hold_first = 0;
  done_status = write_status = 0;
  last_req = NULL;
  memset(body, 'z', sizeof(body));
  uv_loop_init(&loop);
  srv = osr_http_server_new(&loop, &o);
  osr__h2_conn_t *c = osr__http2_server_new_mem(srv, on_output, NULL);
  assert_non_null(c);
  return c;
}

static void teardown_conn(osr__h2_conn_t *c)
{
  osr__h2_mem_destroy(c);
  osr_http_server_close(srv, 0, NULL, NULL);
  uv_loop_close(&loop);
}

/* ---- tests ------------------------------------------------------------- */

static void test_get_zero_copy_and_write_cb_after_socket(void **state)
{
  (void)state;
  uint8_t in[1024];
  osr__h2_conn_t *c = setup_conn(65535);
  out.watch = body;
  size_t n = request(in, 1, 1, "GET", "/hello", 1, NULL);
  assert_int_equal(osr__h2_mem_feed(c, in, n), 0);
  /* The DATA payload went out as an iovec pointing at the handler's buffer. */
  assert_true(out.saw_base);
  assert_int_equal(count_frames(NGHTTP2_HEADERS, 1, NULL), 1);
  size_t pl;
  assert_int_equal(count_frames(NGHTTP2_DATA, 1, &pl), 1);
  assert_int_equal(pl, 5);
  /* ... and the write callback waits until the socket took it. */
  assert_int_equal(write_cbs, 0);
  assert_int_equal(done_calls, 0);
  osr__h2_mem_complete(c);
  assert_int_equal(write_cbs, 1);
  assert_int_equal(write_status, 0);
  assert_int_equal(done_calls, 1);
  assert_int_equal(done_status, 0);
  teardown_conn(c);
}

static void test_hold_withholds_window_update(void **state)
{
  (void)state;
  uint8_t in[70000];
  osr__h2_conn_t *c = setup_conn(65535);
  hold_first = 1;
  size_t n = request(in, 1, 1, "POST", "/up", 0, "60000");
  assert_int_equal(osr__h2_mem_feed(c, in, n), 0);
  osr__h2_mem_complete(c);
  out.len = 0;
  n = put_frame(in, NGHTTP2_DATA, 0, 1, body, 16000);
  n += put_frame(in + n, NGHTTP2_DATA, 0, 1, body, 16000);
  n += put_frame(in + n, NGHTTP2_DATA, 0, 1, body, 16000);
  assert_int_equal(osr__h2_mem_feed(c, in, n), 0);
  osr__h2_mem_complete(c);
  /* First chunk held, second waits in the backlog: no credit for either. */
  assert_int_equal(body_chunks, 1);
  assert_int_equal(count_frames(NGHTTP2_WINDOW_UPDATE, 1, NULL), 0);
  assert_non_null(last_req);
  osr_http_req_release(last_req);
  osr__h2_mem_complete(c);
  /* All delivered (the backlog as one chunk) and credited now (nghttp2
   * sends WINDOW_UPDATE once half the window was consumed). */
  assert_int_equal(body_chunks, 2);
  size_t pl;
  assert_true(count_frames(NGHTTP2_WINDOW_UPDATE, -1, &pl) >= 1);
  assert_int_equal(body_eof, 0);
  assert_int_equal(done_calls, 0);
  /* Losing the connection mid-body: on_done exactly once, with an error. */
  teardown_conn(c);
  assert_int_equal(done_calls, 1);
  assert_true(done_status < 0);
}

static void test_lost_with_held_chunk_and_pending_write(void **state)
{
  (void)state;
  uint8_t in[4096];
  osr__h2_conn_t *c = setup_conn(65535);
  hold_first = 1;
  size_t n = request(in, 1, 1, "POST", "/up", 0, NULL);
  n += put_frame(in + n, NGHTTP2_DATA, 0, 1, "abc", 3);
  assert_int_equal(osr__h2_mem_feed(c, in, n), 0);
  assert_non_null(last_req);
  assert_int_equal(osr_http_respond(last_req, 200, NULL, 0, -1), 0);
  osr_iovec_t iov = osr_iov(body, 10);
  assert_int_equal(osr_http_write(last_req, &iov, 1, 0, on_written, NULL), 0);
  assert_int_equal(osr_http_write(last_req, &iov, 1, 0, on_written, NULL), OSR_EBUSY);
  /* The batch holding the write was never completed: the socket died. */
  teardown_conn(c);
  assert_int_equal(write_cbs, 1);
  assert_true(write_status < 0);
  assert_int_equal(done_calls, 1);
  assert_true(done_status < 0);
}

static void test_output_stops_at_high_watermark(void **state)
{
  (void)state;
  uint8_t in[1024];
  size_t n;
  osr__h2_conn_t *c = setup_conn(65535);
  /* Let the server send as much as it likes: big stream and connection windows. */
  uint8_t set[6] = {0, NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, 0x7f, 0xff, 0xff, 0xff};
  uint8_t wu[4] = {0x7f, 0x00, 0x00, 0x00};
  memcpy(in, preface, sizeof(preface) - 1);
  n = sizeof(preface) - 1;
  n += put_frame(in + n, NGHTTP2_SETTINGS, 0, 0, set, 6);
  n += put_frame(in + n, NGHTTP2_WINDOW_UPDATE, 0, 0, wu, 4);
  for (uint32_t sid = 1; sid <= 9; sid += 2)
    n += request(in + n, 0, sid, "GET", "/big", 1, NULL);
  assert_int_equal(osr__h2_mem_feed(c, in, n), 0);
  /* 5 x 100000 bytes queued by the handler, but while nothing completes the
   * server stops pulling frames at the watermark. */
  assert_true(out.len < OSR_H2_OUT_HIGH + 64 * 1024);
  assert_true(out.len >= OSR_H2_OUT_HIGH / 2);
  for (int i = 0; i < 100 && osr__h2_mem_complete(c) != 0; i++)
    ;
  size_t pl;
  count_frames(NGHTTP2_DATA, -1, &pl);
  assert_int_equal(pl, 5 * sizeof(body));
  assert_int_equal(write_cbs, 5);
  assert_int_equal(done_calls, 5);
  teardown_conn(c);
}

static void test_header_caps_answer_431(void **state)
{
  (void)state;
  uint8_t in[8192], blk[6000];
  size_t b = 0, n = 0;
  osr__h2_conn_t *c = setup_conn(65535);
  memcpy(in, preface, sizeof(preface) - 1);
  n = sizeof(preface) - 1;
  n += put_frame(in + n, NGHTTP2_SETTINGS, 0, 0, NULL, 0);
  b += put_lit(blk + b, ":method", "GET");
  b += put_lit(blk + b, ":scheme", "http");
  b += put_lit(blk + b, ":path", "/");
  b += put_lit(blk + b, ":authority", "unit");
  for (int i = 0; i < 150; i++) {
    char name[16];
    snprintf(name, sizeof(name), "x-%d", i);
    b += put_lit(blk + b, name, "v");
  }
  n += put_frame(in + n, NGHTTP2_HEADERS, NGHTTP2_FLAG_END_HEADERS | NGHTTP2_FLAG_END_STREAM, 1,
                 blk, b);
  assert_int_equal(osr__h2_mem_feed(c, in, n), 0);
  osr__h2_mem_complete(c);
  /* Default cap is 100 headers: answered by the layer, never dispatched. */
  assert_null(last_req);
  assert_int_equal(count_frames(NGHTTP2_HEADERS, 1, NULL), 1);
  assert_int_equal(count_frames(NGHTTP2_GOAWAY, -1, NULL), 0);
  teardown_conn(c);
}

int main(void)
{
  osr_log_set_level(OSR_LOG_OFF);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_get_zero_copy_and_write_cb_after_socket),
      cmocka_unit_test(test_hold_withholds_window_update),
      cmocka_unit_test(test_lost_with_held_chunk_and_pending_write),
      cmocka_unit_test(test_output_stops_at_high_watermark),
      cmocka_unit_test(test_header_caps_answer_431),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
