/*
 * Fuzz target for the HTTP/1.1 message parser (src/net/http1_parse.c), the
 * code every byte a peer sends to our HTTP/1.1 server (request mode) or
 * client (response mode) goes through first.
 *
 * Input: byte 0 selects the mode (bit 0: response) and seeds a small PRNG
 * that decides how the rest is split into reads and which body chunks the
 * "owner" holds (as a proxy would). The remaining bytes are the stream.
 * Each execute call gets an exactly sized heap copy of the unconsumed bytes,
 * so ASan catches any read past what was "received". Deterministic: no
 * sockets, no clocks, no globals carried between runs.
 *
 * Invariants checked (trap on violation): consumed never exceeds what was
 * offered, held chunks lie inside the window, body chunks are only
 * delivered after a head, header names are lower-case tokens, values carry
 * no CR/LF, counts and sizes stay within the caps, and the loop makes
 * progress (no input makes the parser spin).
 *
 * Where llhttp is built twice (x86-64: generic and SSE4.2, see
 * subprojects/llhttp/osr_llhttp_dispatch.h), every input runs through both
 * copies and must give the same result: the same heads (a hash of every
 * field), the same body bytes, messages and final status.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "net/http1_parse.h"
#include "util/mem.h"
#ifdef OSR_LLHTTP_DISPATCH
#include "osr_llhttp_dispatch.h"
#endif

#define CHECK(x)           \
  do {                     \
    if (!(x))              \
      __builtin_trap();    \
  } while (0)

typedef struct fz_s {
  uint32_t rng;
  const char *win;     /* current execute window */
  size_t win_len;
  int is_response;
  int in_head_done;    /* a head was delivered and its message is open */
  size_t messages;
  uint64_t body;
  uint64_t hash;       /* FNV-1a of everything delivered */
} fz_t;

static void mix(fz_t *f, const void *p, size_t n)
{
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    f->hash = (f->hash ^ b[i]) * 0x100000001b3ull;
  f->hash = (f->hash ^ n) * 0x100000001b3ull;
}

static uint32_t next(fz_t *f)
{
  /* xorshift32: deterministic per input */
  uint32_t x = f->rng;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  f->rng = x ? x : 0x9e3779b9u;
  return f->rng;
}

static int is_lower_tchar(unsigned char c)
{
  if (c >= 'A' && c <= 'Z')
    return 0;
  if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
    return 1;
  return c != 0 && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

static int on_head(osr_h1p_t *p)
{
  fz_t *f = p->data;
  CHECK(p->version == 10 || p->version == 11);
  CHECK(p->num_headers <= 32);
  size_t bytes = 0;
  for (size_t i = 0; i < p->num_headers; i++) {
    const osr_http_header_t *h = &p->headers[i];
    CHECK(h->name.len > 0);
    for (size_t k = 0; k < h->name.len; k++)
      CHECK(is_lower_tchar((unsigned char)h->name.base[k]));
    for (size_t k = 0; k < h->value.len; k++)
      CHECK(h->value.base[k] != '\r' && h->value.base[k] != '\n');
    bytes += h->name.len + h->value.len;
  }
  CHECK(bytes <= 4096);
  for (size_t i = 0; i < p->num_headers; i++) {
    mix(f, p->headers[i].name.base, p->headers[i].name.len);
    mix(f, p->headers[i].value.base, p->headers[i].value.len);
  }
  int64_t nums[] = {p->version, p->method, p->status_code, p->content_length, p->chunked,
                    p->keep_alive, p->upgrade, (int64_t)p->num_headers};
  mix(f, nums, sizeof(nums));
  mix(f, p->target.base, p->target.len);
  mix(f, p->reason.base, p->reason.len);
  if (!f->is_response) {
    CHECK(p->target.len <= 1024);
    CHECK(!(p->chunked && p->content_length >= 0)); /* smuggling */
    if (p->content_length > 0)
      CHECK((uint64_t)p->content_length <= 65536);
  }
  f->in_head_done = 1;
  /* The client parses the answer to a HEAD request as bodiless. */
  return f->is_response && (next(f) & 7) == 0 ? 1 : 0;
}

static int on_body(osr_h1p_t *p, const char *at, size_t len)
{
  fz_t *f = p->data;
  CHECK(f->in_head_done);
  CHECK(at >= f->win && at + len <= f->win + f->win_len);
  f->body += len;
  mix(f, at, len);
  if (!f->is_response)
    CHECK(p->body_bytes <= 65536);
  return (next(f) & 3) == 0 ? 1 : 0; /* hold now and then */
}

static int on_complete(osr_h1p_t *p)
{
  fz_t *f = p->data;
  f->in_head_done = 0;
  f->messages++;
  return 0;
}

static const osr_h1p_events_t events = {NULL, on_head, on_body, on_complete};

/* One run over the input; *f gets what was delivered, the result is the
 * last execute/finish return code (with the status folded into f->hash). */
static int run(const uint8_t *data, size_t size, fz_t *out)
{
  fz_t f;
  int last = 0;
  memset(&f, 0, sizeof(f));
  f.is_response = data[0] & 1;
  f.rng = 0x12345u ^ ((uint32_t)data[0] << 8);
  const char *in = (const char *)data + 1;
  size_t n = size - 1;

  osr_http_limits_t lim;
  memset(&lim, 0, sizeof(lim));
  lim.max_url = 1024;
  lim.max_header_bytes = 4096;
  lim.max_headers = 32;
  osr_http_limits_defaults(&lim);

  osr_h1p_t p;
  osr__h1p_init(&p, !f.is_response, &lim, f.is_response ? 0 : 65536, &events, &f);

  size_t pos = 0;      /* consumed */
  size_t avail = 0;    /* "received" */
  size_t steps = 0;
  size_t max_steps = 4 * n + 64;
  for (;;) {
    CHECK(++steps <= max_steps); /* the parser must make progress */
    if (avail < n && (avail == pos || (next(&f) & 1))) {
      size_t k = 1 + next(&f) % 64;
      if ((data[0] & 0x80) != 0)
        k = n; /* everything at once */
      avail = avail + k > n ? n : avail + k;
    }
    size_t len = avail - pos;
    char *win = osr_try_malloc(len ? len : 1);
    if (win == NULL)
      break;
    memcpy(win, in + pos, len);
    f.win = win;
    f.win_len = len;
    size_t consumed = 0;
    int rc = osr__h1p_execute(&p, win, len, &consumed);
    last = rc;
    mix(&f, &consumed, sizeof(consumed));
    CHECK(consumed <= len);
    if (rc == OSR_H1P_HELD) {
      CHECK(consumed + p.held_len <= len);
      consumed += p.held_len; /* released at once */
    }
    osr_free(win);
    pos += consumed;
    if (rc < 0) {
      CHECK(p.status >= 400 && p.status <= 505);
      mix(&f, &p.status, sizeof(p.status));
      /* A failed parser stays failed until reset. */
      size_t c2 = 0;
      CHECK(osr__h1p_execute(&p, in, 0, &c2) < 0);
      break;
    }
    if (rc == OSR_H1P_MESSAGE && p.upgrade)
      break; /* the rest is not HTTP */
    if (rc == OSR_H1P_DONE && avail == n && pos == n) {
      last = osr__h1p_finish(&p);
      if (last == 0 && f.in_head_done)
        CHECK(f.is_response); /* only responses end with the connection */
      break;
    }
  }
  osr__h1p_dispose(&p);
  *out = f;
  return last;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (size < 1)
    return 0;
  fz_t a;
  int rc = run(data, size, &a);
#ifdef OSR_LLHTTP_DISPATCH
  /* The other llhttp copy must agree byte for byte. */
  int was = osr_llhttp_simd();
  if (osr_llhttp_simd_select(!was) >= 0) {
    fz_t b;
    int rc2 = run(data, size, &b);
    (void)osr_llhttp_simd_select(was);
    CHECK(rc2 == rc);
    CHECK(b.hash == a.hash && b.messages == a.messages && b.body == a.body);
  }
#else
  (void)rc;
#endif
  return 0;
}
