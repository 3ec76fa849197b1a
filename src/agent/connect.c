/*
 * Connect envelopes, error codes and base64 (see connect.h).
 */
#include "agent/connect.h"

#include <errno.h>
#include <string.h>

void osr_cx_parser_init(osr_cx_parser_t *p, size_t max)
{
  memset(p, 0, sizeof(*p));
  p->max = max;
  /* The buffer cap is the message cap: a peer cannot make us hold more
   * than one maximal message (STYLE 13). */
  osr_buf_init(&p->_msg, max > 0 ? max : 1);
}

void osr_cx_parser_dispose(osr_cx_parser_t *p)
{
  osr_buf_dispose(&p->_msg);
  p->_hdr_len = 0;
  p->_have_msg = 0;
}

int osr_cx_parser_is_idle(const osr_cx_parser_t *p)
{
  return p->_hdr_len == 0;
}

int osr_cx_parse(osr_cx_parser_t *p, const void *data, size_t len, size_t *consumed,
                 osr_cx_msg_t *out)
{
  const uint8_t *in = data;
  size_t used = 0;
  *consumed = 0;

  /* The previous call returned a message: it is released now. */
  if (p->_have_msg) {
    p->_have_msg = 0;
    p->_hdr_len = 0;
    osr_buf_consume(&p->_msg, p->_msg.len);
  }

  if (p->_hdr_len < OSR_CX_HEADER_LEN) {
    size_t take = OSR_CX_HEADER_LEN - p->_hdr_len;
    if (take > len)
      take = len;
    if (take > 0)
      memcpy(p->_hdr + p->_hdr_len, in, take);
    p->_hdr_len += take;
    used += take;
    if (p->_hdr_len < OSR_CX_HEADER_LEN) {
      *consumed = used;
      return 0;
    }
    uint8_t flags = p->_hdr[0];
    /* Only the end-of-stream bit is legal from a peer we never offered
     * compression to; reject the rest before trusting the length. */
    if ((flags & ~OSR_CX_FLAG_END_STREAM) != 0) {
      *consumed = used;
      return OSR_EPROTO;
    }
    p->_msg_len = (uint32_t)p->_hdr[1] << 24 | (uint32_t)p->_hdr[2] << 16 |
                  (uint32_t)p->_hdr[3] << 8 | (uint32_t)p->_hdr[4];
    if (p->_msg_len > p->max) {
      *consumed = used;
      return OSR_ETOOLARGE;
    }
  }

  size_t want = p->_msg_len - p->_msg.len;
  size_t avail = len - used;
  size_t take = want < avail ? want : avail;
  if (take > 0) {
    int rv = osr_buf_append(&p->_msg, in + used, take);
    if (rv != 0) {
      *consumed = used;
      return rv;
    }
    used += take;
  }
  *consumed = used;
  if (p->_msg.len < p->_msg_len)
    return 0;
  p->_have_msg = 1;
  out->flags = p->_hdr[0];
  out->data = p->_msg_len > 0 ? osr_buf_data(&p->_msg) : "";
  out->len = p->_msg_len;
  return 1;
}

void osr_cx_frame_header(uint8_t out[OSR_CX_HEADER_LEN], uint8_t flags, uint32_t len)
{
  out[0] = flags;
  out[1] = (uint8_t)(len >> 24);
  out[2] = (uint8_t)(len >> 16);
  out[3] = (uint8_t)(len >> 8);
  out[4] = (uint8_t)len;
}

/* ---- error codes ---------------------------------------------------------- */

static const struct {
  const char *name;
  int http;
} codes[] = {
    [OSR_CX_CANCELED] = {"canceled", 499},
    [OSR_CX_UNKNOWN] = {"unknown", 500},
    [OSR_CX_INVALID_ARGUMENT] = {"invalid_argument", 400},
    [OSR_CX_DEADLINE_EXCEEDED] = {"deadline_exceeded", 504},
    [OSR_CX_NOT_FOUND] = {"not_found", 404},
    [OSR_CX_ALREADY_EXISTS] = {"already_exists", 409},
    [OSR_CX_PERMISSION_DENIED] = {"permission_denied", 403},
    [OSR_CX_RESOURCE_EXHAUSTED] = {"resource_exhausted", 429},
    [OSR_CX_FAILED_PRECONDITION] = {"failed_precondition", 400},
    [OSR_CX_ABORTED] = {"aborted", 409},
    [OSR_CX_OUT_OF_RANGE] = {"out_of_range", 400},
    [OSR_CX_UNIMPLEMENTED] = {"unimplemented", 501},
    [OSR_CX_INTERNAL] = {"internal", 500},
    [OSR_CX_UNAVAILABLE] = {"unavailable", 503},
    [OSR_CX_DATA_LOSS] = {"data_loss", 500},
    [OSR_CX_UNAUTHENTICATED] = {"unauthenticated", 401},
};

const char *osr_cx_code_name(osr_cx_code_t code)
{
  if ((int)code < OSR_CX_CANCELED || (int)code > OSR_CX_UNAUTHENTICATED)
    return "unknown";
  return codes[code].name;
}

int osr_cx_code_http_status(osr_cx_code_t code)
{
  if ((int)code < OSR_CX_CANCELED || (int)code > OSR_CX_UNAUTHENTICATED)
    return 500;
  return codes[code].http;
}

osr_cx_code_t osr_cx_code_from_errno(int err)
{
  switch (err) {
  case UV_ENOENT:
    return OSR_CX_NOT_FOUND;
  case UV_EEXIST:
  case UV_ENOTEMPTY:
    return OSR_CX_ALREADY_EXISTS;
  case UV_EACCES:
  case UV_EPERM:
  case UV_EROFS:
    return OSR_CX_PERMISSION_DENIED;
  case UV_ENOSPC:
  case UV_EMFILE:
  case UV_ENFILE:
  case UV_ENOMEM:
  case OSR_ETOOLARGE:
    return OSR_CX_RESOURCE_EXHAUSTED;
  case UV_EINVAL:
  case UV_ENOTDIR:
  case UV_EISDIR:
  case UV_ENAMETOOLONG:
  case UV_ELOOP:
    return OSR_CX_INVALID_ARGUMENT;
  default:
    return OSR_CX_INTERNAL;
  }
}

/* ---- base64 ---------------------------------------------------------------- */

static const char b64_alpha[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t osr_b64_encode(const void *in, size_t n, char *out, int pad)
{
  const uint8_t *s = in;
  size_t o = 0, i = 0;
  for (; i + 3 <= n; i += 3) {
    uint32_t v = (uint32_t)s[i] << 16 | (uint32_t)s[i + 1] << 8 | s[i + 2];
    out[o++] = b64_alpha[v >> 18];
    out[o++] = b64_alpha[(v >> 12) & 63];
    out[o++] = b64_alpha[(v >> 6) & 63];
    out[o++] = b64_alpha[v & 63];
  }
  if (i < n) {
    uint32_t v = (uint32_t)s[i] << 16;
    if (i + 1 < n)
      v |= (uint32_t)s[i + 1] << 8;
    out[o++] = b64_alpha[v >> 18];
    out[o++] = b64_alpha[(v >> 12) & 63];
    if (i + 1 < n)
      out[o++] = b64_alpha[(v >> 6) & 63];
    else if (pad)
      out[o++] = '=';
    if (pad)
      out[o++] = '=';
  }
  return o;
}

static int b64_val(unsigned char c)
{
  if (c >= 'A' && c <= 'Z')
    return c - 'A';
  if (c >= 'a' && c <= 'z')
    return c - 'a' + 26;
  if (c >= '0' && c <= '9')
    return c - '0' + 52;
  if (c == '+' || c == '-')
    return 62;
  if (c == '/' || c == '_')
    return 63;
  return -1;
}

long osr_b64_decode(const char *in, size_t len, void *out)
{
  uint8_t *d = out;
  size_t o = 0;
  uint32_t acc = 0;
  int bits = 0;
  /* Padding may only appear at the end: strip it first. */
  while (len > 0 && in[len - 1] == '=')
    len--;
  if (len % 4 == 1)
    return OSR_EINVAL;
  for (size_t i = 0; i < len; i++) {
    int v = b64_val((unsigned char)in[i]);
    if (v < 0)
      return OSR_EINVAL;
    acc = (acc << 6) | (uint32_t)v;
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      d[o++] = (uint8_t)(acc >> bits);
    }
  }
  return (long)o;
}
