/*
 * Unit tests for the bounded HTTP/1.1 parser (src/net/http1_parse.c): the
 * caps, the checks llhttp's non-strict build does not make, head copying,
 * hold/resume and message boundaries, fed whole and byte by byte.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "net/http1_parse.h"

typedef struct rec_s {
  int heads, completes;
  char body[4096];
  size_t body_len;
  int hold_every;  /* hold each n-th body callback (0: never) */
  int body_calls;
  int head_ret;
  char first_target[256];
  char first_host[64];
  size_t first_nheaders;
} rec_t;

static int on_head(osr_h1p_t *p)
{
  rec_t *r = p->data;
  if (r->heads++ == 0) {
    snprintf(r->first_target, sizeof(r->first_target), "%.*s", (int)p->target.len,
             p->target.base);
    r->first_nheaders = p->num_headers;
    for (size_t i = 0; i < p->num_headers; i++) {
      if (p->headers[i].name.len == 4 && memcmp(p->headers[i].name.base, "host", 4) == 0)
        snprintf(r->first_host, sizeof(r->first_host), "%.*s", (int)p->headers[i].value.len,
                 p->headers[i].value.base);
    }
  }
  return r->head_ret;
}

static int on_body(osr_h1p_t *p, const char *at, size_t len)
{
  rec_t *r = p->data;
  assert_true(r->body_len + len <= sizeof(r->body));
  memcpy(r->body + r->body_len, at, len);
  r->body_len += len;
  r->body_calls++;
  return r->hold_every != 0 && r->body_calls % r->hold_every == 0 ? 1 : 0;
}

static int on_complete(osr_h1p_t *p)
{
  rec_t *r = p->data;
  r->completes++;
  return 0;
}

static const osr_h1p_events_t ev = {NULL, on_head, on_body, on_complete};

static osr_http_limits_t limits(void)
{
  osr_http_limits_t l;
  memset(&l, 0, sizeof(l));
  l.max_url = 64;
  l.max_header_bytes = 256;
  l.max_headers = 8;
  osr_http_limits_defaults(&l);
  return l;
}

/* Feed `s` in steps of `step` bytes (0: all at once) the way a connection
 * does: unconsumed bytes stay at the front of the buffer. Returns the last
 * result (<0 on failure). */
static int feed(osr_h1p_t *p, const char *s, size_t step)
{
  size_t n = strlen(s), pos = 0, avail = 0;
  int rc = 0;
  for (int guard = 0; guard < 100000; guard++) {
    if (avail < n && (avail == pos || step != 0))
      avail = step == 0 || avail + step > n ? n : avail + step;
    size_t consumed = 0;
    rc = osr__h1p_execute(p, s + pos, avail - pos, &consumed);
    if (rc == OSR_H1P_HELD)
      consumed += p->held_len;
    pos += consumed;
    if (rc < 0)
      return rc;
    if (pos == n && avail == n && rc == OSR_H1P_DONE)
      return rc;
  }
  fail_msg("no progress");
  return -1;
}

static int parse_req(rec_t *r, const char *s, size_t step, int *status)
{
  osr_http_limits_t l = limits();
  osr_h1p_t p;
  osr__h1p_init(&p, 1, &l, 100, &ev, r);
  int rc = feed(&p, s, step);
  *status = p.status;
  osr__h1p_dispose(&p);
  return rc;
}

static void expect_status(const char *s, int want)
{
  static const size_t steps[] = {0, 1, 3};
  for (size_t i = 0; i < 3; i++) {
    rec_t r;
    memset(&r, 0, sizeof(r));
    int status = 0;
    int rc = parse_req(&r, s, steps[i], &status);
    if (want == 0) {
      assert_true(rc >= 0);
    } else {
      assert_true(rc < 0);
      assert_int_equal(status, want);
    }
  }
}

/* Refused with 400 after `heads` heads and no complete message, at every
 * read size. */
static void expect_rejected(const char *s, int heads)
{
  static const size_t steps[] = {0, 1, 3};
  for (size_t i = 0; i < 3; i++) {
    rec_t r;
    memset(&r, 0, sizeof(r));
    int status = 0;
    assert_true(parse_req(&r, s, steps[i], &status) < 0);
    assert_int_equal(status, 400);
    assert_int_equal(r.heads, heads);
    assert_int_equal(r.completes, 0);
  }
}

static void test_valid_and_pipelined(void **state)
{
  (void)state;
  static const size_t steps[] = {0, 1, 2, 7};
  const char *s = "GET /a?b=c HTTP/1.1\r\nHost:  Example.COM  \r\nX-Mixed-Case: V\r\n\r\n"
                  "POST /p HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
                  "PUT /q HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer-X: 1\r\n\r\n";
  for (size_t i = 0; i < 4; i++) {
    rec_t r;
    memset(&r, 0, sizeof(r));
    r.hold_every = 2;
    int st;
    assert_int_equal(parse_req(&r, s, steps[i], &st), OSR_H1P_DONE);
    assert_int_equal(r.heads, 3);
    assert_int_equal(r.completes, 3);
    assert_string_equal(r.first_target, "/a?b=c");
    assert_string_equal(r.first_host, "Example.COM"); /* trimmed, case kept */
    assert_int_equal(r.first_nheaders, 2);
    assert_int_equal(r.body_len, 10);
    assert_memory_equal(r.body, "helloabcde", 10);
  }
}

static void test_header_names_lowercase(void **state)
{
  (void)state;
  osr_http_limits_t l = limits();
  osr_h1p_t p;
  rec_t r;
  memset(&r, 0, sizeof(r));
  osr__h1p_init(&p, 1, &l, 0, &ev, &r);
  const char *s = "GET / HTTP/1.1\r\nHOST: a\r\nX-Foo-BAR: Baz\r\n\r\n";
  size_t c;
  assert_int_equal(osr__h1p_execute(&p, s, strlen(s), &c), OSR_H1P_MESSAGE);
  assert_int_equal(p.num_headers, 2);
  assert_memory_equal(p.headers[1].name.base, "x-foo-bar", 9);
  assert_memory_equal(p.headers[1].value.base, "Baz", 3);
  assert_int_equal(p.version, 11);
  assert_int_equal(p.content_length, -1);
  assert_true(p.keep_alive);
  osr__h1p_dispose(&p);
}

/* RFC 9110 token characters, the reference for the parser's name check. */
static int ref_tchar(int c)
{
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         (c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL);
}

/* Field names are checked and lower-cased eight bytes at a time when every
 * byte is a letter, digit or '-', else byte by byte: for every name length
 * from 1 to 24, every byte value at every position, whole and split at that
 * position, a name is accepted exactly when all its bytes are token
 * characters, and comes out lower-cased byte for byte. */
static void test_header_name_bytes(void **state)
{
  (void)state;
  static const char base[] = "aBcDeFgHiJkLmNoPqRsTuVwXyZ-0123456789";
  osr_http_limits_t l = limits();
  for (size_t len = 1; len <= 24; len++) {
    for (size_t pos = 0; pos < len; pos++) {
      for (int c = 0; c < 256; c++) {
        if (c == ':' || (pos == 0 && (c == '\n' || c == '\r')))
          continue; /* ends the name or the head early: a different head */
        char name[32], want[32], req[96];
        memcpy(name, base + (len + pos) % 8, len);
        name[pos] = (char)c;
        for (size_t i = 0; i < len; i++) {
          unsigned char b = (unsigned char)name[i];
          want[i] = (char)(b >= 'A' && b <= 'Z' ? b + 32 : b);
        }
        /* Built byte by byte: the name may hold a NUL. */
        static const char head[] = "GET / HTTP/1.1\r\nHost: h\r\n", tail[] = ": v\r\n\r\n";
        const size_t pre = sizeof(head) - 1;
        memcpy(req, head, pre);
        memcpy(req + pre, name, len);
        memcpy(req + pre + len, tail, sizeof(tail) - 1);
        int n = (int)(pre + len + sizeof(tail) - 1);
        for (int split = 0; split < 2; split++) {
          osr_h1p_t p;
          rec_t r;
          memset(&r, 0, sizeof(r));
          osr__h1p_init(&p, 1, &l, 0, &ev, &r);
          size_t k = split ? pre + pos : (size_t)n, c1 = 0, c2 = 0;
          int rc = osr__h1p_execute(&p, req, k, &c1);
          if (rc >= 0 && k < (size_t)n)
            rc = osr__h1p_execute(&p, req + k, (size_t)n - k, &c2);
          int ok = 1;
          for (size_t i = 0; i < len; i++)
            ok = ok && ref_tchar((unsigned char)name[i]);
          if (ok) {
            assert_int_equal(rc, OSR_H1P_MESSAGE);
            assert_int_equal(p.num_headers, 2);
            assert_int_equal(p.headers[1].name.len, len);
            assert_memory_equal(p.headers[1].name.base, want, len);
          } else {
            assert_true(rc < 0);
          }
          osr__h1p_dispose(&p);
        }
      }
    }
  }
}

/* Heads with more fields than the pooled index block holds (128 spans, 64
 * headers) move their arrays to the heap; trimming between messages gives
 * everything back (ASan: no leak, no use after trim), and the next head on
 * the same parser works from a fresh block. */
static void test_many_headers_and_trim(void **state)
{
  (void)state;
  static const size_t counts[] = {3, 70, 200, 1, 0, 130};
  osr_http_limits_t l;
  memset(&l, 0, sizeof(l));
  l.max_url = 64;
  l.max_header_bytes = 64 * 1024;
  l.max_headers = 300;
  osr_http_limits_defaults(&l);
  osr_h1p_t p;
  rec_t r;
  memset(&r, 0, sizeof(r));
  osr__h1p_init(&p, 1, &l, 0, &ev, &r);
  for (size_t k = 0; k < OSR_ARRAY_SIZE(counts); k++) {
    char req[16384];
    size_t n = (size_t)snprintf(req, sizeof(req), "GET /%zu HTTP/1.1\r\nHost: h\r\n", k);
    for (size_t i = 0; i < counts[k]; i++)
      n += (size_t)snprintf(req + n, sizeof(req) - n, "X-H%zu: v%zu\r\n", i, i);
    n += (size_t)snprintf(req + n, sizeof(req) - n, "\r\n");
    assert_true(n < sizeof(req));
    size_t c;
    assert_int_equal(osr__h1p_execute(&p, req, n, &c), OSR_H1P_MESSAGE);
    assert_int_equal(c, n);
    assert_int_equal(p.num_headers, counts[k] + 1);
    for (size_t i = 0; i < counts[k]; i++) {
      char name[32], value[32];
      snprintf(name, sizeof(name), "x-h%zu", i);
      snprintf(value, sizeof(value), "v%zu", i);
      const osr_http_header_t *h = &p.headers[i + 1];
      assert_int_equal(h->name.len, strlen(name));
      assert_memory_equal(h->name.base, name, strlen(name));
      assert_int_equal(h->value.len, strlen(value));
      assert_memory_equal(h->value.base, value, strlen(value));
    }
    osr__h1p_reset(&p);
    osr__h1p_trim(&p);
    assert_null(p.headers);
  }
  osr__h1p_dispose(&p);
}

static void test_caps(void **state)
{
  (void)state;
  char buf[1024];
  snprintf(buf, sizeof(buf), "GET /%065d HTTP/1.1\r\nHost: a\r\n\r\n", 1);
  expect_status(buf, 414);
  snprintf(buf, sizeof(buf), "GET / HTTP/1.1\r\nHost: a\r\nX: %0300d\r\n\r\n", 1);
  expect_status(buf, 431);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n"
                "F: 1\r\nG: 1\r\nH: 1\r\n\r\n",
                431);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\n"
                "F: 1\r\nG: 1\r\n\r\n",
                0);
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 101\r\n\r\n", 413);
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                "40\r\n0123456789012345678901234567890123456789012345678901234567890123\r\n"
                "40\r\n0123456789012345678901234567890123456789012345678901234567890123\r\n0\r\n\r\n",
                413);
  /* Trailers count against the header caps too. */
  snprintf(buf, sizeof(buf), "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
           "0\r\nT: %0300d\r\n\r\n", 1);
  expect_status(buf, 431);
  /* Chunk extensions are capped. */
  char ext[2048];
  memset(ext, 'e', sizeof(ext));
  ext[sizeof(ext) - 1] = '\0';
  snprintf(buf, sizeof(buf), "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;");
  char big[4096];
  snprintf(big, sizeof(big), "%s%s\r\na\r\n0\r\n\r\n", buf, ext);
  expect_status(big, 400);
}

static void test_smuggling_and_syntax(void **state)
{
  (void)state;
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
                "0\r\n\r\n", 400);
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400);
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nz\r\n", 400);
  expect_status("GET / HTTP/1.1\nHost: a\n\n", 400);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n c\r\n\r\n", 400);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nX: b\r\n\tc\r\n\r\n", 400);
  expect_status("GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\n: empty-name\r\n\r\n", 400);
  /* Strict llhttp (subprojects/llhttp): a line that starts with a bare CR
   * does not end the head (the loose parser ended it there, answered the
   * request and read the rest as a next message); control bytes in a
   * value and a bare CR after chunk data are refused before any message
   * is complete. */
  expect_rejected("GET / HTTP/1.1\r\nHost: h\r\n\r: v\r\n\r\n", 0);
  expect_rejected("GET / HTTP/1.1\r\nHost: h\r\n\rGET /x HTTP/1.1\r\nHost: h\r\n\r\n", 0);
  expect_rejected("GET / HTTP/1.1\r\nHost: h\r\nX: a\rb\r\n\r\n", 0);
  expect_rejected("GET / HTTP/1.1\r\nHost: h\r\nX: a\nTransfer-Encoding: chunked\r\n\r\n", 0);
  expect_rejected("GET / HTTP/1.1\r\nHost: h\r\nX: a\x01b\r\n\r\n", 0);
  expect_rejected("GET / HTTP/1.1\r\nHost: h\r\nX: a\x7f\r\n\r\n", 0);
  expect_rejected("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
                  "1\r\na\r0\r\n\r\n", 1);
  expect_status("GET / HTTP/1.1\r\nHo(st: a\r\n\r\n", 400);
  expect_status("GET / HTTP/2.0\r\nHost: a\r\n\r\n", 505);
  expect_status("GET / HTTP/1.2\r\nHost: a\r\n\r\n", 505);
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", 501);
  expect_status("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 501);
  expect_status("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400);
  expect_status("GET / HTTP/1.1\r\n\r\n", 400);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400);
  expect_status("GET / HTTP/1.0\r\n\r\n", 0);
  expect_status("GET / HTTP/1.1\r\nHost: a\r\nX: a b\t c\r\n\r\n", 0);
}

static void test_failed_stays_failed(void **state)
{
  (void)state;
  osr_http_limits_t l = limits();
  osr_h1p_t p;
  rec_t r;
  memset(&r, 0, sizeof(r));
  osr__h1p_init(&p, 1, &l, 0, &ev, &r);
  size_t c;
  const char *bad = "GET / HTTP/1.1\nHost: a\n\n";
  assert_true(osr__h1p_execute(&p, bad, strlen(bad), &c) < 0);
  const char *good = "GET / HTTP/1.1\r\nHost: a\r\n\r\n";
  assert_true(osr__h1p_execute(&p, good, strlen(good), &c) < 0);
  osr__h1p_reset(&p);
  assert_int_equal(osr__h1p_execute(&p, good, strlen(good), &c), OSR_H1P_MESSAGE);
  assert_int_equal(c, strlen(good));
  osr__h1p_dispose(&p);
}

/* A parser whose owner holds every body chunk. */
static void init_holding(osr_h1p_t *p, rec_t *r, const osr_http_limits_t *l, int is_request)
{
  memset(r, 0, sizeof(*r));
  r->hold_every = 1;
  osr__h1p_init(p, is_request, l, 0, &ev, r);
}

static void test_hold_position(void **state)
{
  (void)state;
  osr_http_limits_t l = limits();
  osr_h1p_t p;
  rec_t r;
  init_holding(&p, &r, &l, 1);
  const char *s = "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET";
  size_t head = strlen(s) - 8;
  size_t c;
  assert_int_equal(osr__h1p_execute(&p, s, strlen(s), &c), OSR_H1P_HELD);
  assert_int_equal(c, head);       /* the chunk is not consumed */
  assert_int_equal(p.held_len, 5); /* it is the next 5 bytes */
  assert_memory_equal(s + c, "hello", 5);
  size_t c2;
  assert_int_equal(osr__h1p_execute(&p, s + c + 5, 3, &c2), OSR_H1P_MESSAGE);
  assert_int_equal(c2, 0);
  assert_int_equal(r.completes, 1);
  assert_int_equal(osr__h1p_execute(&p, s + c + 5, 3, &c2), OSR_H1P_DONE);
  assert_true(osr__h1p_in_message(&p));
  osr__h1p_dispose(&p);
}

static void test_responses(void **state)
{
  (void)state;
  osr_http_limits_t l = limits();
  osr_h1p_t p;
  rec_t r;
  memset(&r, 0, sizeof(r));
  osr__h1p_init(&p, 0, &l, 0, &ev, &r);
  /* 1xx, then 204 with a bogus Content-Length (no body), then read-until-close. */
  const char *s = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n"
                  "HTTP/1.1 200 OK\r\n\r\nuntil close";
  assert_int_equal(feed(&p, s, 0), OSR_H1P_DONE);
  assert_int_equal(r.completes, 2);
  assert_true(osr__h1p_in_body(&p));
  assert_int_equal(osr__h1p_finish(&p), 0);
  assert_int_equal(r.completes, 3);
  assert_int_equal(r.body_len, 11);
  osr__h1p_dispose(&p);

  /* A truncated Content-Length body is an error at EOF. */
  memset(&r, 0, sizeof(r));
  osr__h1p_init(&p, 0, &l, 0, &ev, &r);
  assert_int_equal(feed(&p, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", 0), OSR_H1P_DONE);
  assert_int_equal(osr__h1p_finish(&p), OSR_EPROTO);
  osr__h1p_dispose(&p);

  /* HEAD: the owner says there is no body. */
  memset(&r, 0, sizeof(r));
  r.head_ret = 1;
  osr__h1p_init(&p, 0, &l, 0, &ev, &r);
  assert_int_equal(feed(&p, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n", 0), OSR_H1P_DONE);
  assert_int_equal(r.completes, 1);
  osr__h1p_dispose(&p);
}

/* osr__h1p_body_left / osr__h1p_skip_body, as the HTTP/1.1 client's body
 * pass-through uses them: a held chunk, bytes taken off the wire unseen,
 * then the rest (the last byte) completes the message, and the next
 * response on the connection parses normally. */
static void test_skip_body(void **state)
{
  (void)state;
  osr_http_limits_t l = limits();
  osr_h1p_t p;
  rec_t r;
  init_holding(&p, &r, &l, 0);
  assert_int_equal(osr__h1p_body_left(&p), 0); /* outside a message */
  const char *s = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc";
  size_t c;
  assert_int_equal(osr__h1p_execute(&p, s, strlen(s), &c), OSR_H1P_HELD);
  assert_int_equal(p.held_len, 3);
  assert_int_equal(osr__h1p_body_left(&p), 7); /* after the held chunk */
  osr__h1p_skip_body(&p, 7);                   /* all of it: refused */
  assert_int_equal(osr__h1p_body_left(&p), 7);
  osr__h1p_skip_body(&p, 6); /* "defghi" went past the parser */
  assert_int_equal(osr__h1p_body_left(&p), 1);
  assert_int_equal(p.body_bytes, 9);
  r.hold_every = 0;
  size_t c2;
  assert_int_equal(osr__h1p_execute(&p, "", 0, &c2), OSR_H1P_DONE); /* resume after the hold */
  assert_int_equal(r.completes, 0);
  const char *rest = "jHTTP/1.1 204 No Content\r\n\r\n";
  assert_int_equal(feed(&p, rest, 0), OSR_H1P_DONE);
  assert_int_equal(r.completes, 2);
  assert_int_equal(r.body_len, 4); /* "abc" + "j": the skipped bytes were never delivered */
  assert_memory_equal(r.body, "abcj", 4);
  assert_int_equal(osr__h1p_body_left(&p), 0);
  osr__h1p_dispose(&p);

  /* Chunked and read-until-close bodies have no known rest. */
  static const char *const unknown[] = {
      "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
      "HTTP/1.1 200 OK\r\n\r\nuntil close",
  };
  for (size_t i = 0; i < 2; i++) {
    init_holding(&p, &r, &l, 0);
    assert_int_equal(osr__h1p_execute(&p, unknown[i], strlen(unknown[i]), &c), OSR_H1P_HELD);
    assert_int_equal(osr__h1p_body_left(&p), 0);
    osr__h1p_dispose(&p);
  }
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid_and_pipelined),
      cmocka_unit_test(test_header_names_lowercase),
      cmocka_unit_test(test_header_name_bytes),
      cmocka_unit_test(test_many_headers_and_trim),
      cmocka_unit_test(test_caps),
      cmocka_unit_test(test_smuggling_and_syntax),
      cmocka_unit_test(test_failed_stays_failed),
      cmocka_unit_test(test_hold_position),
      cmocka_unit_test(test_responses),
      cmocka_unit_test(test_skip_body),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
