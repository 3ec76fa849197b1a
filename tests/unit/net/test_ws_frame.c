/*
 * Unit tests for the WebSocket module without HTTP: handshake computations
 * and parsers, sessions over the memory transport (every close code path),
 * and a client/server pair over a socketpair exercising wslay, our output
 * buffering, backpressure and the close handshake end to end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "net/sock.h"
#include "net/ws.h"
#include "net/ws_internal.h"
#include "util/mem.h"

/* ---- frame builder ---------------------------------------------------------- */

typedef struct frame_s {
  unsigned char b[1 << 17];
  size_t len;
} frame_t;

/* Append one frame; mask with a fixed key when `mask`. */
static void put(frame_t *f, int fin, int rsv, int op, int mask, const void *p, size_t n)
{
  static const unsigned char key[4] = {0x11, 0x22, 0x33, 0x44};
  unsigned char *o = f->b + f->len;
  size_t h = 0;
  o[h++] = (unsigned char)((fin ? 0x80 : 0) | (rsv << 4) | op);
  if (n < 126) {
    o[h++] = (unsigned char)((mask ? 0x80 : 0) | n);
  } else if (n < 65536) {
    o[h++] = (unsigned char)((mask ? 0x80 : 0) | 126);
    o[h++] = (unsigned char)(n >> 8);
    o[h++] = (unsigned char)n;
  } else {
    o[h++] = (unsigned char)((mask ? 0x80 : 0) | 127);
    for (int i = 7; i >= 0; i--)
      o[h++] = (unsigned char)((uint64_t)n >> (i * 8));
  }
  if (mask) {
    memcpy(o + h, key, 4);
    h += 4;
  }
  for (size_t i = 0; i < n; i++)
    o[h + i] = ((const unsigned char *)p)[i] ^ (mask ? key[i % 4] : 0);
  f->len += h + n;
}

/* ---- recorder --------------------------------------------------------------- */

typedef struct rec_s {
  int nmsg;
  int last_op;
  char last[4096];
  size_t last_len;
  size_t total;
  int closed;
  int close_code;
  char reason[128];
  int opened;
  int open_status;
  int writable;
  osr_ws_t *echo_to; /* echo messages back on this session */
  int eagain;
} rec_t;

static void r_message(osr_ws_t *ws, int op, const osr_iovec_t *m, void *data)
{
  rec_t *r = data;
  r->nmsg++;
  r->last_op = op;
  r->total += m->len;
  r->last_len = m->len;
  memcpy(r->last, m->base, m->len < sizeof(r->last) ? m->len : sizeof(r->last));
  if (r->echo_to != NULL) {
    int rv = osr_ws_send(ws, op, m->base, m->len);
    if (rv == OSR_EAGAIN)
      r->eagain++;
  }
}

static void r_close(osr_ws_t *ws, int code, const osr_iovec_t *reason, void *data)
{
  rec_t *r = data;
  (void)ws;
  r->closed++;
  r->close_code = code;
  snprintf(r->reason, sizeof(r->reason), "%.*s", (int)reason->len, reason->base);
}

static void r_writable(osr_ws_t *ws, void *data)
{
  rec_t *r = data;
  (void)ws;
  r->writable++;
}

static const osr_ws_events_t rec_ev = {
    .on_message = r_message,
    .on_writable = r_writable,
    .on_close = r_close,
};

/* Close code of the first close frame in an (unmasked) server output. */
static int out_close_code(osr_buf_t *o)
{
  const unsigned char *p = (const unsigned char *)osr_buf_data(o);
  size_t i = 0;
  while (i + 2 <= o->len) {
    int op = p[i] & 0x0f;
    size_t n = p[i + 1] & 0x7f;
    size_t h = 2;
    if (n == 126) {
      n = ((size_t)p[i + 2] << 8) | p[i + 3];
      h = 4;
    } else if (n == 127) {
      n = 0;
      for (int k = 0; k < 8; k++)
        n = (n << 8) | p[i + 2 + k];
      h = 10;
    }
    if (p[i + 1] & 0x80)
      h += 4;
    if (op == 8) {
      if (n < 2)
        return 1005;
      if (p[i + 1] & 0x80) {
        const unsigned char *k = p + i + h - 4;
        return ((p[i + h] ^ k[0]) << 8) | (p[i + h + 1] ^ k[1]);
      }
      return (p[i + h] << 8) | p[i + h + 1];
    }
    i += h + n;
  }
  return -1;
}

/* ---- handshake helpers ------------------------------------------------------- */

static void test_accept_key(void **state)
{
  (void)state;
  char out[OSR_WS_ACCEPT_LEN];
  /* RFC 6455 section 1.3. */
  assert_int_equal(osr__ws_accept_key("dGhlIHNhbXBsZSBub25jZQ==", 24, out), 0);
  assert_string_equal(out, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  osr_iovec_t k = OSR_IOV_LIT("dGhlIHNhbXBsZSBub25jZQ==");
  assert_true(osr__ws_key_is_valid(&k));
  osr_iovec_t bad1 = OSR_IOV_LIT("dGhlIHNhbXBsZSBub25jZQ=");
  osr_iovec_t bad2 = OSR_IOV_LIT("dGhlIHNhbXBsZSBub25j*Q==");
  osr_iovec_t bad3 = OSR_IOV_LIT("dGhlIHNhbXBsZSBub25jZQ==AAAA");
  assert_false(osr__ws_key_is_valid(&bad1));
  assert_false(osr__ws_key_is_valid(&bad2));
  assert_false(osr__ws_key_is_valid(&bad3));
}

static void test_tokens(void **state)
{
  (void)state;
  osr_iovec_t v = OSR_IOV_LIT("keep-alive, Upgrade");
  assert_true(osr__ws_has_token(&v, "upgrade"));
  assert_false(osr__ws_has_token(&v, "close"));
  osr_iovec_t w = OSR_IOV_LIT("upgraded");
  assert_false(osr__ws_has_token(&w, "upgrade"));
  osr_iovec_t e = OSR_IOV_LIT(" , ,");
  assert_false(osr__ws_has_token(&e, "upgrade"));
}

static void test_utf8(void **state)
{
  (void)state;
  assert_true(osr__ws_utf8_valid("hello", 5));
  assert_true(osr__ws_utf8_valid("\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 9));
  assert_false(osr__ws_utf8_valid("\xc0\xaf", 2));         /* overlong */
  assert_false(osr__ws_utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
  assert_false(osr__ws_utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
  assert_false(osr__ws_utf8_valid("\xe2\x82", 2));         /* truncated */
  assert_false(osr__ws_utf8_valid("\xff", 1));
}

#define H(n, v) {OSR_IOV_LIT(n), OSR_IOV_LIT(v)}

static void fake_req(osr_http_req_t *req, const char *method, const osr_http_header_t *h,
                     size_t n)
{
  memset(req, 0, sizeof(*req));
  req->version = 11;
  req->method = osr_iov(method, strlen(method));
  req->headers = h;
  req->num_headers = n;
  req->content_length = -1;
}

static void test_check_request(void **state)
{
  (void)state;
  static const char *const protos[] = {"echo.v1", "chat.v2"};
  osr_http_req_t req;
  char accept[OSR_WS_ACCEPT_LEN];
  const char *why;
  int proto;

  osr_http_header_t ok[] = {
      H("host", "x"),
      H("upgrade", "WebSocket"),
      H("connection", "keep-alive, Upgrade"),
      H("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
      H("sec-websocket-version", "13"),
      H("sec-websocket-protocol", "chat.v2"),
      H("sec-websocket-protocol", "other, echo.v1"),
  };
  fake_req(&req, "GET", ok, 7);
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 0);
  assert_string_equal(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
  assert_int_equal(proto, 0); /* the server's preference wins */

  fake_req(&req, "GET", ok, 5); /* no protocol offered */
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 0);
  assert_int_equal(proto, -1);

  osr_http_header_t none[] = {
      H("upgrade", "websocket"), H("connection", "upgrade"),
      H("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="), H("sec-websocket-version", "13"),
      H("sec-websocket-protocol", "ECHO.V1"),
  };
  fake_req(&req, "GET", none, 5);
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 0);
  assert_int_equal(proto, -1); /* names are case-sensitive */

  fake_req(&req, "POST", ok, 5);
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 400);

  osr_http_header_t nokey[] = {H("upgrade", "websocket"), H("connection", "upgrade"),
                               H("sec-websocket-version", "13")};
  fake_req(&req, "GET", nokey, 3);
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 400);

  osr_http_header_t v8[] = {H("upgrade", "websocket"), H("connection", "upgrade"),
                            H("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                            H("sec-websocket-version", "8")};
  fake_req(&req, "GET", v8, 4);
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 426);

  osr_http_header_t noup[] = {H("connection", "upgrade"),
                              H("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                              H("sec-websocket-version", "13")};
  fake_req(&req, "GET", noup, 3);
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 400);

  osr_http_header_t twokeys[] = {H("upgrade", "websocket"), H("connection", "upgrade"),
                                 H("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                                 H("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
                                 H("sec-websocket-version", "13")};
  fake_req(&req, "GET", twokeys, 5);
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 400);

  fake_req(&req, "GET", ok, 5);
  req.version = 20;
  assert_int_equal(osr__ws_check_request(&req, protos, 2, accept, &proto, &why), 400);
}

static void test_parse_response(void **state)
{
  (void)state;
  static const char *const offered[] = {"echo.v1", "chat.v2"};
  const char *acc = "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=";
  size_t hl;
  int proto, status;
  char big[OSR_WS_MAX_RESPONSE_HEAD + 16];

  const char ok[] = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                    "Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
                    "Sec-WebSocket-Protocol: chat.v2\r\n\r\n\x81\x02hi";
  assert_int_equal(osr__ws_parse_response(ok, sizeof(ok) - 1, acc, offered, 2, &hl, &proto,
                                          &status),
                   0);
  assert_int_equal(hl, sizeof(ok) - 1 - 4);
  assert_int_equal(proto, 1);
  assert_int_equal(osr__ws_parse_response(ok, 40, acc, offered, 2, &hl, &proto, &status),
                   OSR_EAGAIN);
  /* Protocol we did not offer. */
  assert_int_equal(osr__ws_parse_response(ok, sizeof(ok) - 1, acc, offered, 1, &hl, &proto,
                                          &status),
                   OSR_EWS);

  const char noproto[] = "HTTP/1.1 101 x\r\nupgrade: WebSocket\r\nconnection: upgrade\r\n"
                         "sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
  assert_int_equal(osr__ws_parse_response(noproto, sizeof(noproto) - 1, acc, offered, 2, &hl,
                                          &proto, &status),
                   0);
  assert_int_equal(proto, -1);

  const char badacc[] = "HTTP/1.1 101 x\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
                        "sec-websocket-accept: AAAAMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n";
  assert_int_equal(osr__ws_parse_response(badacc, sizeof(badacc) - 1, acc, offered, 2, &hl,
                                          &proto, &status),
                   OSR_EWS);
  const char st200[] = "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
  assert_int_equal(osr__ws_parse_response(st200, sizeof(st200) - 1, acc, offered, 2, &hl, &proto,
                                          &status),
                   OSR_EHTTP);
  assert_int_equal(status, 200);
  const char fold[] = "HTTP/1.1 101 x\r\nupgrade: websocket\r\n connection: upgrade\r\n\r\n";
  assert_int_equal(osr__ws_parse_response(fold, sizeof(fold) - 1, acc, offered, 2, &hl, &proto,
                                          &status),
                   OSR_EHTTP);
  const char ext[] = "HTTP/1.1 101 x\r\nupgrade: websocket\r\nconnection: upgrade\r\n"
                     "sec-websocket-accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"
                     "sec-websocket-extensions: permessage-deflate\r\n\r\n";
  assert_int_equal(osr__ws_parse_response(ext, sizeof(ext) - 1, acc, offered, 2, &hl, &proto,
                                          &status),
                   OSR_EWS);
  memset(big, 'a', sizeof(big));
  memcpy(big, "HTTP/1.1 101 x\r\nx: ", 19);
  assert_int_equal(osr__ws_parse_response(big, sizeof(big), acc, offered, 2, &hl, &proto,
                                          &status),
                   OSR_ETOOLARGE);
}

/* ---- memory transport sessions --------------------------------------------- */

static osr_ws_t *mem_session(int server, rec_t *r, size_t max_message, size_t max_fragments)
{
  osr_ws_opts_t o = {0};
  osr_ws_t *ws;
  o.max_message = max_message;
  o.max_fragments = max_fragments;
  memset(r, 0, sizeof(*r));
  assert_int_equal(osr__ws_mem_new(server, &o, &rec_ev, r, 1 << 20, &ws), 0);
  return ws;
}

static frame_t fr;

/* Feed `fr` to a fresh server session; return the close code it sent. */
static int server_close_for(size_t max_message, size_t max_fragments, rec_t *r)
{
  osr_ws_t *ws = mem_session(1, r, max_message, max_fragments);
  osr__ws_mem_feed(ws, fr.b, fr.len);
  int code = out_close_code(osr__ws_mem_output(ws));
  osr__ws_mem_free(ws);
  fr.len = 0;
  return code;
}

static void test_mem_server_messages(void **state)
{
  (void)state;
  rec_t r;
  osr_ws_t *ws = mem_session(1, &r, 0, 0);

  fr.len = 0;
  put(&fr, 1, 0, 1, 1, "hello", 5);
  put(&fr, 0, 0, 2, 1, "ab", 2);
  put(&fr, 1, 0, 9, 1, "pp", 2); /* a ping between fragments */
  put(&fr, 1, 0, 0, 1, "cd", 2);
  /* Byte by byte: the scanner and wslay must resume at every boundary. */
  for (size_t i = 0; i < fr.len; i++)
    assert_int_equal(osr__ws_mem_feed(ws, fr.b + i, 1), 0);
  assert_int_equal(r.nmsg, 2);
  assert_int_equal(r.last_op, OSR_WS_BINARY);
  assert_int_equal(r.last_len, 4);
  assert_memory_equal(r.last, "abcd", 4);
  /* The pong: unmasked, opcode 10, payload "pp". */
  osr_buf_t *o = osr__ws_mem_output(ws);
  assert_int_equal(o->len, 4);
  assert_memory_equal(osr_buf_data(o), "\x8a\x02pp", 4);
  osr_buf_consume(o, o->len);

  assert_int_equal(osr_ws_send(ws, OSR_WS_TEXT, "yo", 2), 0);
  assert_int_equal(o->len, 4);
  assert_memory_equal(osr_buf_data(o), "\x81\x02yo", 4);
  assert_int_equal(osr_ws_send(ws, OSR_WS_TEXT, "\xff", 1), OSR_EINVAL);
  osr_buf_consume(o, o->len);

  /* Peer closes with 4001 "bye": echoed, on_close gets the code. */
  fr.len = 0;
  put(&fr, 1, 0, 8, 1, "\x0f\xa1" "bye", 5);
  assert_int_equal(osr__ws_mem_feed(ws, fr.b, fr.len), OSR_ECLOSED);
  assert_int_equal(out_close_code(o), 4001);
  assert_int_equal(r.closed, 1);
  assert_int_equal(r.close_code, 4001);
  assert_string_equal(r.reason, "bye");
  assert_int_equal(osr_ws_send(ws, OSR_WS_TEXT, "x", 1), OSR_ECLOSED);
  osr__ws_mem_free(ws);
  assert_int_equal(r.closed, 1);
}

static void test_mem_server_errors(void **state)
{
  (void)state;
  rec_t r;
  static unsigned char big[70000];

  fr.len = 0;
  put(&fr, 1, 0, 1, 0, "unmasked", 8);
  assert_int_equal(server_close_for(0, 0, &r), 1002);
  assert_int_equal(r.nmsg, 0);
  assert_int_equal(r.closed, 1);
  assert_int_equal(r.close_code, 1006);

  put(&fr, 1, 0, 3, 1, "x", 1); /* reserved opcode */
  assert_int_equal(server_close_for(0, 0, &r), 1002);
  put(&fr, 1, 4, 1, 1, "x", 1); /* RSV1 without an extension */
  assert_int_equal(server_close_for(0, 0, &r), 1002);
  put(&fr, 1, 0, 0, 1, "x", 1); /* continuation without a start */
  assert_int_equal(server_close_for(0, 0, &r), 1002);
  put(&fr, 0, 0, 9, 1, "x", 1); /* fragmented ping: the scanner's 1002 */
  assert_int_equal(server_close_for(0, 0, &r), 1002);
  put(&fr, 1, 0, 9, 1, big, 126); /* control frame > 125 */
  assert_int_equal(server_close_for(0, 0, &r), 1002);
  /* Non-minimal 16-bit length (5 encoded in 2 bytes). */
  memcpy(fr.b, "\x81\xfe\x00\x05\x00\x00\x00\x00hello", 13);
  fr.len = 13;
  assert_int_equal(server_close_for(0, 0, &r), 1002);
  /* 64-bit length with the top bit set. */
  memcpy(fr.b, "\x82\xff\x80\x00\x00\x00\x00\x00\x00\x01", 10);
  fr.len = 10;
  assert_int_equal(server_close_for(0, 0, &r), 1002);

  put(&fr, 1, 0, 1, 1, "\xc3\x28", 2); /* invalid UTF-8 */
  assert_int_equal(server_close_for(0, 0, &r), 1007);
  put(&fr, 0, 0, 1, 1, "\xe2\x82", 2); /* UTF-8 split across fragments is fine */
  put(&fr, 1, 0, 0, 1, "\xac", 1);
  assert_int_equal(server_close_for(0, 0, &r), -1);
  assert_int_equal(r.nmsg, 1);
  assert_int_equal(r.last_len, 3);

  put(&fr, 1, 0, 2, 1, big, 1025); /* one frame over max_message */
  assert_int_equal(server_close_for(1024, 0, &r), 1009);
  put(&fr, 0, 0, 2, 1, big, 600); /* fragments adding up over it */
  put(&fr, 1, 0, 0, 1, big, 600);
  assert_int_equal(server_close_for(1024, 0, &r), 1009);
  assert_int_equal(r.nmsg, 0);
  put(&fr, 0, 0, 2, 1, "a", 1);
  put(&fr, 0, 0, 0, 1, "b", 1);
  put(&fr, 0, 0, 0, 1, "c", 1);
  put(&fr, 1, 0, 0, 1, "d", 1);
  assert_int_equal(server_close_for(0, 3, &r), 1008);
  put(&fr, 1, 0, 2, 1, big, sizeof(big)); /* 64-bit length, fits the default cap */
  assert_int_equal(server_close_for(0, 0, &r), -1);
  assert_int_equal(r.nmsg, 1);
  assert_int_equal(r.last_len, sizeof(big));
  put(&fr, 1, 0, 8, 1, "\x03\xed", 2); /* close code 1005 must not be sent */
  assert_int_equal(server_close_for(0, 0, &r), 1002);
}

static void test_mem_client(void **state)
{
  (void)state;
  rec_t r;
  osr_ws_t *ws = mem_session(0, &r, 0, 0);

  fr.len = 0;
  put(&fr, 1, 0, 1, 0, "hi", 2);
  assert_int_equal(osr__ws_mem_feed(ws, fr.b, fr.len), 0);
  assert_int_equal(r.nmsg, 1);
  /* Client frames are masked. */
  assert_int_equal(osr_ws_send(ws, OSR_WS_BINARY, "abc", 3), 0);
  osr_buf_t *o = osr__ws_mem_output(ws);
  assert_int_equal(o->len, 2 + 4 + 3);
  assert_int_equal((unsigned char)o->base[o->off + 1], 0x83);
  osr_buf_consume(o, o->len);
  /* A masked frame from the server is a protocol error. */
  fr.len = 0;
  put(&fr, 1, 0, 1, 1, "hi", 2);
  assert_int_equal(osr__ws_mem_feed(ws, fr.b, fr.len), OSR_ECLOSED);
  assert_int_equal(out_close_code(o), 1002);
  assert_int_equal(r.nmsg, 1);
  assert_int_equal(r.closed, 1);
  osr__ws_mem_free(ws);
}

static void test_mem_user_close(void **state)
{
  (void)state;
  rec_t r;
  osr_ws_t *ws = mem_session(1, &r, 0, 0);
  osr_ws_close(ws, 4002, "requested");
  osr_buf_t *o = osr__ws_mem_output(ws);
  assert_int_equal(out_close_code(o), 4002);
  assert_int_equal(r.closed, 0); /* waiting for the peer's close */
  assert_int_equal(osr_ws_send(ws, OSR_WS_TEXT, "x", 1), OSR_ECLOSED);
  /* Data still arriving from the peer before its close is delivered. */
  fr.len = 0;
  put(&fr, 1, 0, 1, 1, "late", 4);
  put(&fr, 1, 0, 8, 1, "\x0f\xa2", 2);
  assert_int_equal(osr__ws_mem_feed(ws, fr.b, fr.len), OSR_ECLOSED);
  assert_int_equal(r.nmsg, 1);
  assert_int_equal(r.closed, 1);
  assert_int_equal(r.close_code, 4002);
  osr__ws_mem_free(ws);
}

/* ---- socketpair: client and server sessions over real sockets ---------------- */

static osr_sock_t *sock_on_fd(uv_loop_t *loop, int fd)
{
  osr_sock_t *s;
  assert_int_equal(osr__sock_new(loop, 1, &s), 0);
  assert_int_equal(uv_pipe_open(&s->_h.pipe, fd), 0);
  return s;
}

typedef struct pair_s {
  uv_loop_t loop;
  osr_ws_t *srv, *cli;
  rec_t rs, rc;
} pair_t;

static void pair_open(pair_t *p, const osr_ws_opts_t *so, const osr_ws_opts_t *co)
{
  int fds[2];
  memset(p, 0, sizeof(*p));
  assert_int_equal(uv_loop_init(&p->loop), 0);
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  osr__ws_new_on_sock(sock_on_fd(&p->loop, fds[0]), 1, so, &rec_ev, &p->rs, &p->srv);
  osr__ws_new_on_sock(sock_on_fd(&p->loop, fds[1]), 0, co, &rec_ev, &p->rc, &p->cli);
}

/* Run the loop until cond or a bounded number of iterations. */
#define RUN_UNTIL(p, cond)                                 \
  do {                                                     \
    for (int i_ = 0; i_ < 200000 && !(cond); i_++)         \
      uv_run(&(p)->loop, UV_RUN_ONCE);                     \
    assert_true(cond);                                     \
  } while (0)

static void pair_close_loop(pair_t *p)
{
  uv_run(&p->loop, UV_RUN_DEFAULT);
  assert_int_equal(uv_loop_close(&p->loop), 0);
}

static void test_pair_echo_and_close(void **state)
{
  (void)state;
  static unsigned char big[3 * 1024 * 1024];
  pair_t p;

  for (size_t i = 0; i < sizeof(big); i++)
    big[i] = (unsigned char)(i * 7 + (i >> 11));
  pair_open(&p, NULL, NULL);
  p.rs.echo_to = p.srv;
  assert_int_equal(osr_ws_send(p.cli, OSR_WS_TEXT, "hello", 5), 0);
  RUN_UNTIL(&p, p.rc.nmsg == 1);
  assert_int_equal(p.rc.last_op, OSR_WS_TEXT);
  assert_memory_equal(p.rc.last, "hello", 5);

  assert_int_equal(osr_ws_send(p.cli, OSR_WS_BINARY, big, sizeof(big)), 0);
  RUN_UNTIL(&p, p.rc.nmsg == 2);
  assert_int_equal(p.rc.last_len, sizeof(big));
  assert_memory_equal(p.rc.last, big, sizeof(p.rc.last));
  assert_int_equal(osr_ws_ping(p.cli, "x", 1), 0);

  osr_ws_close(p.cli, 4001, "bye");
  RUN_UNTIL(&p, p.rs.closed && p.rc.closed);
  assert_int_equal(p.rs.close_code, 4001);
  assert_string_equal(p.rs.reason, "bye");
  assert_int_equal(p.rc.close_code, 4001); /* the echo */
  pair_close_loop(&p);
}

static void test_pair_backpressure(void **state)
{
  (void)state;
  static unsigned char chunk[64 * 1024];
  osr_ws_opts_t so = {0};
  pair_t p;
  int sent = 0, eagain = 0;

  so.max_queued = 256 * 1024;
  pair_open(&p, &so, NULL);
  osr_ws_read_stop(p.cli); /* the client does not read */
  for (int i = 0; i < 4096 && !eagain; i++) {
    int rv = osr_ws_send(p.srv, OSR_WS_BINARY, chunk, sizeof(chunk));
    if (rv == OSR_EAGAIN)
      eagain = 1;
    else {
      assert_int_equal(rv, 0);
      sent++;
    }
    uv_run(&p.loop, UV_RUN_NOWAIT);
  }
  assert_true(eagain);
  assert_true(sent < 4096);
  assert_int_equal(p.rs.writable, 0);
  osr_ws_read_start(p.cli);
  RUN_UNTIL(&p, p.rs.writable == 1 && p.rc.nmsg == sent);
  osr_ws_close(p.srv, 1000, NULL);
  RUN_UNTIL(&p, p.rs.closed && p.rc.closed);
  assert_int_equal(p.rc.close_code, 1000);
  assert_int_equal(p.rs.close_code, 1000);
  pair_close_loop(&p);
}

/* A peer that floods us with pings and never reads: our pongs pile up only
 * to max_queued, then we stop reading it. */
static void test_pair_ping_flood(void **state)
{
  (void)state;
  osr_ws_opts_t so = {0};
  pair_t p;

  so.max_queued = 64 * 1024;
  pair_open(&p, &so, NULL);
  osr_ws_read_stop(p.cli);
  static unsigned char payload[125];
  for (int i = 0; i < 20000; i++) {
    osr_ws_ping(p.cli, payload, sizeof(payload));
    uv_run(&p.loop, UV_RUN_NOWAIT);
  }
  for (int i = 0; i < 1000; i++)
    uv_run(&p.loop, UV_RUN_NOWAIT);
  /* 20000 pongs would be 2.5 MB; the server must have stopped reading. */
  osr_sock_t *ss = NULL;
  (void)ss;
  assert_true(osr_ws_send(p.srv, OSR_WS_TEXT, "x", 1) == OSR_EAGAIN);
  osr_ws_read_start(p.cli);
  RUN_UNTIL(&p, p.rs.writable == 1);
  osr_ws_close(p.cli, 1001, "done");
  RUN_UNTIL(&p, p.rs.closed && p.rc.closed);
  assert_int_equal(p.rs.close_code, 1001);
  pair_close_loop(&p);
}

/* A close right after a large send must not overtake it (wslay sends
 * control frames first and nothing after a close). */
static void test_pair_close_after_send(void **state)
{
  (void)state;
  static unsigned char big[2 * 1024 * 1024];
  pair_t p;
  pair_open(&p, NULL, NULL);
  assert_int_equal(osr_ws_send(p.srv, OSR_WS_BINARY, big, sizeof(big)), 0);
  assert_int_equal(osr_ws_send(p.srv, OSR_WS_TEXT, "last", 4), 0);
  osr_ws_close(p.srv, 4005, "after");
  assert_int_equal(osr_ws_send(p.srv, OSR_WS_TEXT, "x", 1), OSR_ECLOSED);
  RUN_UNTIL(&p, p.rs.closed && p.rc.closed);
  assert_int_equal(p.rc.nmsg, 2);
  assert_int_equal(p.rc.total, sizeof(big) + 4);
  assert_memory_equal(p.rc.last, "last", 4);
  assert_int_equal(p.rc.close_code, 4005);
  assert_string_equal(p.rc.reason, "after");
  pair_close_loop(&p);
}

/* Keepalive: pings every interval; a peer that answers stays, one that does
 * not (reading paused) is dropped. Idle timeout: close 1001. */
static void test_pair_keepalive_and_idle(void **state)
{
  (void)state;
  osr_ws_opts_t so = {0};
  pair_t p;

  so.ping_interval_ms = 20;
  pair_open(&p, &so, NULL);
  /* ~10 intervals with the client reading: still open. */
  uint64_t until = uv_now(&p.loop) + 200;
  while (uv_now(&p.loop) < until) {
    uv_run(&p.loop, UV_RUN_ONCE);
    uv_update_time(&p.loop);
  }
  assert_int_equal(p.rs.closed, 0);
  assert_int_equal(p.rc.closed, 0);
  osr_ws_read_stop(p.cli); /* pongs stop */
  RUN_UNTIL(&p, p.rs.closed);
  assert_int_equal(p.rs.close_code, 1006);
  osr_ws_read_start(p.cli); /* now it sees the EOF */
  RUN_UNTIL(&p, p.rc.closed);
  assert_int_equal(p.rc.close_code, 1006);
  pair_close_loop(&p);

  osr_ws_opts_t io = {0};
  io.idle_timeout_ms = 50;
  pair_open(&p, &io, NULL);
  RUN_UNTIL(&p, p.rs.closed && p.rc.closed);
  assert_int_equal(p.rc.close_code, 1001);
  assert_string_equal(p.rc.reason, "idle timeout");
  pair_close_loop(&p);
}

/* The peer vanishes without a close frame: 1006. */
static void test_pair_abrupt(void **state)
{
  (void)state;
  pair_t p;
  int fds[2];
  memset(&p, 0, sizeof(p));
  assert_int_equal(uv_loop_init(&p.loop), 0);
  assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  osr__ws_new_on_sock(sock_on_fd(&p.loop, fds[0]), 1, NULL, &rec_ev, &p.rs, &p.srv);
  close(fds[1]);
  RUN_UNTIL(&p, p.rs.closed);
  assert_int_equal(p.rs.close_code, 1006);
  pair_close_loop(&p);
}

int main(void)
{
  signal(SIGPIPE, SIG_IGN); /* a peer that went away is an error return, not a kill */
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_accept_key),
      cmocka_unit_test(test_tokens),
      cmocka_unit_test(test_utf8),
      cmocka_unit_test(test_check_request),
      cmocka_unit_test(test_parse_response),
      cmocka_unit_test(test_mem_server_messages),
      cmocka_unit_test(test_mem_server_errors),
      cmocka_unit_test(test_mem_client),
      cmocka_unit_test(test_mem_user_close),
      cmocka_unit_test(test_pair_echo_and_close),
      cmocka_unit_test(test_pair_backpressure),
      cmocka_unit_test(test_pair_ping_flood),
      cmocka_unit_test(test_pair_close_after_send),
      cmocka_unit_test(test_pair_keepalive_and_idle),
      cmocka_unit_test(test_pair_abrupt),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
