/*
 * Bounded HTTP/1.1 parser on llhttp; see http1_parse.h for the contract.
 *
 * llhttp delivers every piece of the head as spans into the caller's buffer,
 * possibly split across execute calls. We count the bytes of each piece as
 * it arrives (so an endless header fails at the cap, not after eating
 * memory, as node's TrackHeader does) and copy it into `p->head`, which is
 * capped at the sum of the URL and header caps. Offsets, not pointers, are
 * kept while the head grows, because appending may move the buffer; the
 * header array is built from them once the head is complete.
 */
#include "net/http1_parse.h"

#include <string.h>
#include <strings.h>

#include "util/blockpool.h"
#include "util/mem.h"

/* Slack in the head buffer for the reason phrase of a response. */
#define HEAD_SLACK 256

static osr_h1p_t *from_ll(llhttp_t *ll)
{
  return ll->data;
}

/* Record a failure from inside a callback and stop llhttp (HPE_USER). */
static int fail(osr_h1p_t *p, int status, int err)
{
  if (p->status == 0) {
    p->status = status;
    p->err = err;
  }
  return HPE_USER;
}

/* RFC 9110 token characters: a field name is a token, so a space before the
 * colon, control bytes or separators make the request invalid (llhttp's
 * non-strict build accepts some of those). */
/* Nonzero for a token character; upper-case letters also have 0x20 set, so
 * `c | (TCHAR[c] & 0x20)` is the lower-case form of any token character. */
static const unsigned char TCHAR[256] = {
    ['a' ... 'z'] = 1, ['A' ... 'Z'] = 0x21, ['0' ... '9'] = 1, ['!'] = 1, ['#'] = 1, ['$'] = 1,
    ['%'] = 1,         ['&'] = 1,         ['\''] = 1,        ['*'] = 1, ['+'] = 1, ['-'] = 1,
    ['.'] = 1,         ['^'] = 1,         ['_'] = 1,         ['`'] = 1, ['|'] = 1, ['~'] = 1,
};

/* A table lookup: this runs for every byte of every field name. */
static int is_tchar(unsigned char c)
{
  return TCHAR[c];
}

/* Start of the collected head; never NULL (arithmetic on a NULL base is
 * undefined even with a zero offset). */
static char *head_base(osr_h1p_t *p)
{
  static char empty[1];
  return p->head.base != NULL ? osr_buf_data(&p->head) : empty;
}

/* ---- field names, eight bytes at a time ----------------------------------
 * Every name byte is checked (a token character) and lower-cased on its way
 * into the head. Names are almost always letters, digits and '-', so a word
 * of eight such bytes is checked and lower-cased at once (SWAR on a
 * uint64_t, byte lanes that never carry into each other), and a word with
 * any other byte goes through the TCHAR table byte by byte. Both paths
 * accept exactly the same names and produce the same bytes. */
#define ONES 0x0101010101010101ull
#define HIGH (0x80 * ONES)

/* 0x80 in each byte lane of `b` (all lanes < 0x80) that lies in [lo, hi]:
 * b + (0x80 - lo) reaches 0x80 iff b >= lo, b + (0x7f - hi) iff b > hi,
 * and neither sum leaves its lane. */
static inline uint64_t lanes_in(uint64_t b, unsigned lo, unsigned hi)
{
  return (b + (0x80 - lo) * ONES) & ~(b + (0x7f - hi) * ONES) & HIGH;
}

/* Lower-case the eight name bytes `w` into *out if each is a letter, digit
 * or '-'; returns 0 (nothing decided) otherwise. */
static inline int name_word(uint64_t w, uint64_t *out)
{
  if ((w & HIGH) != 0)
    return 0;
  uint64_t alpha = lanes_in(w | 0x20 * ONES, 'a', 'z');
  uint64_t x = w ^ ('-' * ONES);
  uint64_t dash = ~(x + 0x7f * ONES) & HIGH; /* lanes where x is 0 */
  if ((alpha | lanes_in(w, '0', '9') | dash) != HIGH)
    return 0;
  *out = w | (alpha >> 2); /* 0x20 in the letters' lanes */
  return 1;
}

/* Copy a name piece lower-cased into dst; 1 if a byte is not a token
 * character (dst then holds garbage the caller does not count). */
static int copy_name(char *dst, const char *at, size_t len)
{
  size_t i = 0;
  uint64_t w, o;
  if (len >= 8) {
    for (; i + 8 <= len; i += 8) {
      memcpy(&w, at + i, 8);
      if (!name_word(w, &o))
        goto bytes;
      memcpy(dst + i, &o, 8);
    }
    if (i < len) {
      /* The last word overlaps the previous one: same bytes, same result. */
      memcpy(&w, at + len - 8, 8);
      if (!name_word(w, &o))
        goto bytes;
      memcpy(dst + len - 8, &o, 8);
    }
    return 0;
  }
  if (len >= 4) {
    /* Two (possibly overlapping) halves of four make one word. */
    uint32_t a, b;
    memcpy(&a, at, 4);
    memcpy(&b, at + len - 4, 4);
    if (name_word(a | (uint64_t)b << 32, &o)) {
      a = (uint32_t)o;
      b = (uint32_t)(o >> 32);
      memcpy(dst, &a, 4);
      memcpy(dst + len - 4, &b, 4);
      return 0;
    }
  }
bytes:
  for (; i < len; i++) {
    unsigned char c = (unsigned char)at[i], t = TCHAR[c];
    if (t == 0)
      return 1;
    dst[i] = (char)(c | (t & 0x20));
  }
  return 0;
}

/* Append to the head; `token` checks that every byte is a token character
 * (returns 1 if not, nothing appended) and lower-cases it on the way.
 * Returns -1 past the head's cap. */
static int append(osr_h1p_t *p, const char *at, size_t len, int token)
{
  osr_buf_t *h = &p->head;
  char *dst;
  if (len == 0)
    return 0;
  if (h->base != NULL && h->off == 0 && h->cap - h->len >= len) {
    /* The common case, inline: room in the block (cap <= max always). */
    dst = h->base + h->len;
  } else {
    osr_iovec_t tail;
    if (h->base == NULL && h->max >= osr_block_size(OSR_BLOCK_4K)) {
      /* A head fits in one pooled block; osr__h1p_trim hands it back. */
      h->base = osr_block_get(OSR_BLOCK_4K);
      if (h->base != NULL)
        h->cap = osr_block_size(OSR_BLOCK_4K);
    }
    if (osr_buf_reserve(h, len, &tail) != 0)
      return -1;
    dst = tail.base;
  }
  if (token) {
    if (copy_name(dst, at, len) != 0)
      return 1;
  } else {
    memcpy(dst, at, len);
  }
  h->len += len;
  return 0;
}

static int cb_message_begin(llhttp_t *ll)
{
  osr_h1p_t *p = from_ll(ll);

  osr_buf_consume(&p->head, p->head.len);
  p->_nspans = 0;
  p->_url_len = 0;
  p->_header_bytes = 0;
  p->_nfields = 0;
  p->_ext_bytes = 0;
  p->_in_value = 1; /* the next field callback starts a new field */
  p->_in_trailers = 0;
  p->_begun = 1;
  p->_head_done = 0;
  p->version = 0;
  p->method = 0;
  p->status_code = 0;
  p->target = osr_iov(NULL, 0);
  p->reason = osr_iov(NULL, 0);
  p->headers = NULL;
  p->host = NULL;
  p->expect = NULL;
  p->num_headers = 0;
  p->content_length = -1;
  p->chunked = 0;
  p->keep_alive = 0;
  p->upgrade = 0;
  p->body_bytes = 0;
  if (p->_ev->on_begin != NULL && p->_ev->on_begin(p) < 0)
    return fail(p, 400, OSR_EHTTP);
  return 0;
}

static int cb_url(llhttp_t *ll, const char *at, size_t len)
{
  osr_h1p_t *p = from_ll(ll);
  p->_url_len += len;
  if (p->_url_len > p->_max_url)
    return fail(p, 414, OSR_ETOOLARGE);
  if (append(p, at, len, 0) != 0)
    return fail(p, 414, OSR_ETOOLARGE);
  return 0;
}

static int cb_status(llhttp_t *ll, const char *at, size_t len)
{
  osr_h1p_t *p = from_ll(ll);
  /* The reason phrase counts as header bytes: it is peer text in the head. */
  p->_url_len += len;
  p->_header_bytes += len;
  if (p->_header_bytes > p->_max_header_bytes || p->_url_len > HEAD_SLACK)
    return fail(p, 431, OSR_ETOOLARGE);
  if (append(p, at, len, 0) != 0)
    return fail(p, 431, OSR_ETOOLARGE);
  return 0;
}

/* ---- the header index ----------------------------------------------------
 * The spans (while the head grows) and the header array (built from them)
 * of an ordinary head share one pooled 4 KiB block, taken when a head has
 * fields and given back between messages (osr__h1p_trim): an idle
 * connection holds no index, and a busy one does not malloc per message.
 * A head with more fields than the block holds moves that array to the
 * heap. */
#define INDEX_SPANS 128 /* 2 KiB of spans, the rest for headers */
#define INDEX_HDRS ((4096 - INDEX_SPANS * sizeof(struct osr_h1p_span_s)) / sizeof(osr_http_header_t))

static int in_index(const osr_h1p_t *p, const void *a)
{
  const char *b = p->_index;
  return b != NULL && (const char *)a >= b && (const char *)a < b + 4096;
}

static int index_get(osr_h1p_t *p)
{
  if (p->_index == NULL)
    p->_index = osr_block_get(OSR_BLOCK_4K);
  return p->_index != NULL ? 0 : -1;
}

static int grow_spans(osr_h1p_t *p)
{
  if (p->_spans == NULL) {
    if (index_get(p) != 0)
      return -1;
    p->_spans = p->_index;
    p->_spans_cap = INDEX_SPANS;
    return 0;
  }
  size_t ncap = p->_spans_cap * 2;
  if (ncap > p->_max_headers)
    ncap = p->_max_headers;
  if (ncap <= p->_spans_cap)
    return -1; /* cannot happen: the field count is checked first */
  struct osr_h1p_span_s *np = osr_try_malloc(ncap * sizeof(*np));
  if (np == NULL)
    return -1;
  memcpy(np, p->_spans, p->_nspans * sizeof(*np));
  if (!in_index(p, p->_spans))
    osr_free(p->_spans);
  p->_spans = np;
  p->_spans_cap = ncap;
  return 0;
}

static int grow_hdrs(osr_h1p_t *p)
{
  if (p->_hdrs == NULL && p->_nspans <= INDEX_HDRS) {
    if (index_get(p) != 0)
      return -1;
    p->_hdrs = (osr_http_header_t *)(void *)((char *)p->_index + INDEX_SPANS * sizeof(*p->_spans));
    p->_hdrs_cap = INDEX_HDRS;
    return 0;
  }
  /* Rebuilt from the spans on every head: nothing to copy. */
  osr_http_header_t *nh = osr_try_malloc(p->_nspans * sizeof(*nh));
  if (nh == NULL)
    return -1;
  if (!in_index(p, p->_hdrs))
    osr_free(p->_hdrs);
  p->_hdrs = nh;
  p->_hdrs_cap = p->_nspans;
  return 0;
}

static void index_release(osr_h1p_t *p)
{
  if (!in_index(p, p->_spans))
    osr_free(p->_spans);
  if (!in_index(p, p->_hdrs))
    osr_free(p->_hdrs);
  osr_block_put(OSR_BLOCK_4K, p->_index);
  p->_index = NULL;
  p->_spans = NULL;
  p->_hdrs = NULL;
  p->_spans_cap = 0;
  p->_hdrs_cap = 0;
  p->_nspans = 0;
}

static int count_header_bytes(osr_h1p_t *p, size_t len)
{
  p->_header_bytes += len;
  return p->_header_bytes > p->_max_header_bytes ? -1 : 0;
}

static int cb_header_field(llhttp_t *ll, const char *at, size_t len)
{
  osr_h1p_t *p = from_ll(ll);

  if (p->_in_value) {
    /* A new field begins. */
    p->_in_value = 0;
    p->_field_bytes = 0;
    if (++p->_nfields > p->_max_headers)
      return fail(p, 431, OSR_ETOOLARGE);
    if (!p->_in_trailers) {
      if (p->_nspans == p->_spans_cap && grow_spans(p) != 0)
        return fail(p, 431, OSR_ENOMEM);
      struct osr_h1p_span_s *sp = &p->_spans[p->_nspans++];
      sp->name_off = (uint32_t)p->head.len;
      sp->name_len = 0;
      sp->value_off = 0;
      sp->value_len = 0;
    }
  }
  p->_field_bytes += len;
  if (count_header_bytes(p, len) != 0)
    return fail(p, 431, OSR_ETOOLARGE);
  if (p->_in_trailers) {
    for (size_t i = 0; i < len; i++) {
      if (!is_tchar((unsigned char)at[i]))
        return fail(p, 400, OSR_EHTTP);
    }
    return 0; /* counted, checked and dropped */
  }
  int rv = append(p, at, len, 1);
  if (rv != 0)
    return rv > 0 ? fail(p, 400, OSR_EHTTP) : fail(p, 431, OSR_ETOOLARGE);
  p->_spans[p->_nspans - 1].name_len += (uint32_t)len;
  return 0;
}

static int cb_header_field_complete(llhttp_t *ll)
{
  osr_h1p_t *p = from_ll(ll);
  /* llhttp (non-strict) accepts a line starting with ':' as a field with an
   * empty name; a field name is a token of at least one character. */
  if (p->_in_value || p->_field_bytes == 0)
    return fail(p, 400, OSR_EHTTP);
  return 0;
}

static int cb_header_value(llhttp_t *ll, const char *at, size_t len)
{
  osr_h1p_t *p = from_ll(ll);

  /* obs-fold: llhttp (non-strict) continues a value on a line that starts
   * with SP/HT and gives us the continuation as a separate span that begins
   * right after the LF. A value span never legitimately follows an LF, so
   * that byte identifies the fold even when the fold straddles two reads. */
  char prev = at > p->_exec_start ? at[-1] : p->_prev_byte;
  if (prev == '\n')
    return fail(p, 400, OSR_EHTTP);

  if (!p->_in_value) {
    p->_in_value = 1;
    if (!p->_in_trailers)
      p->_spans[p->_nspans - 1].value_off = (uint32_t)p->head.len;
  }
  if (count_header_bytes(p, len) != 0)
    return fail(p, 431, OSR_ETOOLARGE);
  if (p->_in_trailers)
    return 0;
  if (append(p, at, len, 0) != 0)
    return fail(p, 431, OSR_ETOOLARGE);
  p->_spans[p->_nspans - 1].value_len += (uint32_t)len;
  return 0;
}

static int cb_header_value_complete(llhttp_t *ll)
{
  osr_h1p_t *p = from_ll(ll);
  if (p->_in_trailers || p->_nspans == 0)
    return 0;
  /* llhttp strips leading whitespace but keeps trailing OWS. */
  struct osr_h1p_span_s *sp = &p->_spans[p->_nspans - 1];
  const char *v = head_base(p) + sp->value_off;
  while (sp->value_len > 0 && (v[sp->value_len - 1] == ' ' || v[sp->value_len - 1] == '\t'))
    sp->value_len--;
  return 0;
}

static int iov_eq(osr_iovec_t v, const char *s)
{
  size_t n = strlen(s);
  return v.len == n && strncasecmp(v.base, s, n) == 0;
}

/* Field names in the head are lower case already (cb_header_field). */
#define NAME_IS(n, lit) ((n).len == sizeof(lit) - 1 && memcmp((n).base, lit, sizeof(lit) - 1) == 0)

/* Check the complete head and publish it. Returns 0 or a fail() code. */
static int finish_head(osr_h1p_t *p)
{
  llhttp_t *ll = &p->_ll;
  char *base = head_base(p);

  if (ll->http_major != 1 || ll->http_minor > 1)
    return fail(p, 505, OSR_EHTTP);
  p->version = ll->http_major * 10 + ll->http_minor;
  p->method = ll->method;
  p->status_code = ll->status_code;
  if (p->_is_request)
    p->target = osr_iov(base, p->_url_len);
  else
    p->reason = osr_iov(base, p->_url_len);

  if (p->_nspans > p->_hdrs_cap && grow_hdrs(p) != 0)
    return fail(p, 431, OSR_ENOMEM);
  size_t nhost = 0;
  const osr_iovec_t *te = NULL;
  p->host = NULL;
  p->expect = NULL;
  for (size_t i = 0; i < p->_nspans; i++) {
    const struct osr_h1p_span_s *sp = &p->_spans[i];
    osr_http_header_t *h = &p->_hdrs[i];
    h->name = osr_iov(base + sp->name_off, sp->name_len);
    h->value = osr_iov(sp->value_len != 0 ? base + sp->value_off : base, sp->value_len);
    if (!p->_is_request) {
      continue; /* Host, Transfer-Encoding and Expect are checked on requests only */
    } else if (NAME_IS(h->name, "host")) {
      nhost++;
      if (p->host == NULL)
        p->host = &h->value;
    } else if (NAME_IS(h->name, "transfer-encoding")) {
      te = &h->value;
    } else if (NAME_IS(h->name, "expect") && p->expect == NULL) {
      p->expect = &h->value;
    }
  }
  p->headers = p->_hdrs;
  p->num_headers = p->_nspans;
  p->chunked = (ll->flags & F_CHUNKED) != 0;
  p->content_length = (ll->flags & F_CONTENT_LENGTH) ? (int64_t)ll->content_length : -1;
  p->keep_alive = llhttp_should_keep_alive(ll);
  p->upgrade = ll->upgrade || (p->_is_request && ll->method == HTTP_CONNECT);

  if (p->_is_request) {
    /* RFC 9112 3.2: exactly one Host in HTTP/1.1, at most one otherwise. */
    if (nhost > 1 || (p->version == 11 && nhost == 0))
      return fail(p, 400, OSR_EHTTP);
    if (te != NULL) {
      /* RFC 9112 6.1: Transfer-Encoding on HTTP/1.0 means broken framing. */
      if (p->version == 10)
        return fail(p, 400, OSR_EHTTP);
      /* We decode no transfer coding but chunked, so "gzip, chunked" and
       * friends are not implemented rather than silently passed on. */
      if (!iov_eq(*te, "chunked"))
        return fail(p, 501, OSR_EHTTP);
    }
    if (p->_max_body != 0 && p->content_length > 0 &&
        (uint64_t)p->content_length > p->_max_body)
      return fail(p, 413, OSR_ETOOLARGE);
  }
  return 0;
}

static int cb_headers_complete(llhttp_t *ll)
{
  osr_h1p_t *p = from_ll(ll);
  if (finish_head(p) != 0)
    return -1;
  p->_head_done = 1;
  /* Trailers (if any) get fresh counters against the same caps. */
  p->_in_trailers = 1;
  p->_in_value = 1;
  p->_header_bytes = 0;
  p->_nfields = 0;

  int rv = p->_ev->on_head(p);
  if (rv < 0) {
    fail(p, 400, OSR_EHTTP);
    return -1;
  }
  /* llhttp 8.1 waits for a Content-Length body even on 1xx/204/304
   * responses; those never have one (RFC 9110 6.4.1). */
  if (!p->_is_request && (p->status_code < 200 || p->status_code == 204 || p->status_code == 304))
    rv = 1;
  return rv == 1 ? 1 : 0;
}

static int cb_body(llhttp_t *ll, const char *at, size_t len)
{
  osr_h1p_t *p = from_ll(ll);
  /* Resumed with no new bytes (osr__h1p_execute after a held chunk), llhttp
   * closes its body span with an empty one: not a chunk for anyone. */
  if (len == 0)
    return 0;
  p->body_bytes += len;
  if (p->_max_body != 0 && p->body_bytes > p->_max_body)
    return fail(p, 413, OSR_ETOOLARGE);
  int rv = p->_ev->on_body(p, at, len);
  if (rv < 0)
    return fail(p, 400, OSR_EHTTP);
  if (rv == 1) {
    p->_held = 1;
    p->held_len = len;
    return HPE_PAUSED;
  }
  return 0;
}

static int cb_chunk_header(llhttp_t *ll)
{
  from_ll(ll)->_ext_bytes = 0;
  return 0;
}

static int cb_chunk_ext(llhttp_t *ll, const char *at, size_t len)
{
  osr_h1p_t *p = from_ll(ll);
  (void)at;
  p->_ext_bytes += len;
  if (p->_ext_bytes > OSR_H1P_MAX_CHUNK_EXT)
    return fail(p, 400, OSR_EHTTP);
  return 0;
}

static int cb_message_complete(llhttp_t *ll)
{
  osr_h1p_t *p = from_ll(ll);
  p->_begun = 0;
  p->_msg_done = 1;
  if (p->_ev->on_complete != NULL && p->_ev->on_complete(p) < 0) {
    fail(p, 400, OSR_EHTTP);
    return -1;
  }
  /* Stop at the message boundary: the owner finishes this exchange before
   * the next pipelined message is looked at. */
  return HPE_PAUSED;
}

static const llhttp_settings_t *settings(void)
{
  static llhttp_settings_t s;
  static int done;
  if (!done) {
    llhttp_settings_init(&s);
    s.on_message_begin = cb_message_begin;
    s.on_url = cb_url;
    s.on_status = cb_status;
    s.on_header_field = cb_header_field;
    s.on_header_field_complete = cb_header_field_complete;
    s.on_header_value = cb_header_value;
    s.on_header_value_complete = cb_header_value_complete;
    s.on_headers_complete = cb_headers_complete;
    s.on_body = cb_body;
    s.on_chunk_header = cb_chunk_header;
    s.on_chunk_extension_name = cb_chunk_ext;
    s.on_chunk_extension_value = cb_chunk_ext;
    s.on_message_complete = cb_message_complete;
    done = 1;
  }
  return &s;
}

void osr__h1p_init(osr_h1p_t *p, int is_request, const osr_http_limits_t *limits,
                   uint64_t max_body, const osr_h1p_events_t *ev, void *data)
{
  memset(p, 0, sizeof(*p));
  p->data = data;
  p->_ev = ev;
  p->_is_request = is_request;
  p->_max_url = is_request ? limits->max_url : 0;
  p->_max_header_bytes = limits->max_header_bytes;
  p->_max_headers = limits->max_headers;
  p->_max_body = max_body;
  p->content_length = -1;
  osr_buf_init(&p->head, p->_max_url + p->_max_header_bytes + HEAD_SLACK);
  llhttp_init(&p->_ll, is_request ? HTTP_REQUEST : HTTP_RESPONSE, settings());
  p->_ll.data = p;
}

/* Give the head's block and the header index back; the results go with
 * them. */
static void release_head(osr_h1p_t *p)
{
  if (p->head.base != NULL && p->head.cap == osr_block_size(OSR_BLOCK_4K)) {
    osr_block_put(OSR_BLOCK_4K, p->head.base);
    p->head.base = NULL;
  }
  osr_buf_dispose(&p->head);
  index_release(p);
  p->headers = NULL;
  p->host = NULL;
  p->expect = NULL;
  p->num_headers = 0;
  p->target = osr_iov(NULL, 0);
  p->reason = osr_iov(NULL, 0);
}

void osr__h1p_dispose(osr_h1p_t *p)
{
  release_head(p);
}

void osr__h1p_trim(osr_h1p_t *p)
{
  if (!p->_begun)
    release_head(p);
}

void osr__h1p_reset(osr_h1p_t *p)
{
  llhttp_reset(&p->_ll);
  p->_ll.data = p;
  p->status = 0;
  p->err = 0;
  p->_failed = 0;
  p->_paused = 0;
  p->_held = 0;
  p->_begun = 0;
  p->_head_done = 0;
  p->_msg_done = 0;
  p->_prev_byte = 0;
}

static int failed(osr_h1p_t *p, llhttp_errno_t e)
{
  p->_failed = 1;
  if (p->status == 0) {
    /* llhttp's own verdicts. An unsupported version is 505, everything
     * else (smuggling attempts included: CL+TE, duplicate Content-Length,
     * bad chunk sizes, bare LF) a plain 400. */
    p->status = e == HPE_INVALID_VERSION ? 505 : 400;
    p->err = OSR_EHTTP;
  }
  return p->err;
}

int osr__h1p_execute(osr_h1p_t *p, const char *data, size_t len, size_t *consumed)
{
  static const char nothing[1] = {0};
  *consumed = 0;
  if (p->_failed)
    return p->err;
  /* Paused inside a message (a held body chunk): llhttp may still owe the
   * message-complete callback for a body that ended with that chunk, and it
   * fires it when resumed even with no new bytes. Paused at a message
   * boundary, or not paused: nothing to do without bytes. */
  int resume_mid_message = p->_paused && p->_held;
  if (p->_paused) {
    llhttp_resume(&p->_ll);
    p->_paused = 0;
  }
  p->_held = 0;
  p->_msg_done = 0;
  p->held_len = 0;
  if (len == 0) {
    if (!resume_mid_message)
      return OSR_H1P_DONE;
    data = nothing;
  }
  p->_exec_start = data;

  llhttp_errno_t e = llhttp_execute(&p->_ll, data, len);
  if (e == HPE_OK) {
    *consumed = len;
    if (len > 0)
      p->_prev_byte = data[len - 1];
    return OSR_H1P_DONE;
  }
  if (e == HPE_PAUSED) {
    size_t n = (size_t)(llhttp_get_error_pos(&p->_ll) - data);
    p->_paused = 1;
    if (n > 0)
      p->_prev_byte = data[n - 1];
    if (p->_held) {
      *consumed = n - p->held_len;
      return OSR_H1P_HELD;
    }
    *consumed = n;
    return OSR_H1P_MESSAGE;
  }
  /* HPE_PAUSED_UPGRADE/HPE_PAUSED_H2_UPGRADE: bytes after an Upgrade or
   * CONNECT message, or a PRI request that was not the connection preface.
   * The owner stops feeding us after an upgrade message, so either one is
   * invalid here. */
  return failed(p, e);
}

int osr__h1p_finish(osr_h1p_t *p)
{
  if (p->_failed)
    return p->err;
  if (p->_paused) {
    llhttp_resume(&p->_ll);
    p->_paused = 0;
  }
  p->_msg_done = 0;
  llhttp_errno_t e = llhttp_finish(&p->_ll);
  if (e == HPE_OK || e == HPE_PAUSED) {
    p->_paused = e == HPE_PAUSED;
    return 0;
  }
  p->_failed = 1;
  if (p->status == 0) {
    p->status = 400;
    p->err = OSR_EPROTO;
  }
  return OSR_EPROTO;
}

int osr__h1p_in_message(const osr_h1p_t *p)
{
  return p->_begun;
}

int osr__h1p_in_body(const osr_h1p_t *p)
{
  return p->_begun && p->_head_done;
}

uint64_t osr__h1p_body_left(const osr_h1p_t *p)
{
  if (!osr__h1p_in_body(p) || p->chunked || p->content_length < 0 || p->_failed)
    return 0;
  return p->_ll.content_length; /* llhttp counts it down as it consumes */
}

void osr__h1p_skip_body(osr_h1p_t *p, uint64_t n)
{
  if (n >= osr__h1p_body_left(p))
    return; /* the caller's contract; never complete a message unseen */
  p->_ll.content_length -= n;
  p->body_bytes += n;
}
