/*
 * base64url without padding. A hand-written codec because neither BoringSSL
 * nor OpenSSL offers the url-safe alphabet (EVP_EncodeBlock is standard
 * base64 with padding), and a translation pass over their output would
 * still need the same bounds checks as a direct implementation.
 */
#include "util/base64.h"

#include <limits.h>
#include <stdint.h>

static const char enc_tab[64] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/* 0..63 for alphabet characters, 0xff for everything else (including '+',
 * '/' and '=' of standard base64: accepting those would give one token two
 * spellings). */
static uint8_t dec_val(unsigned char c)
{
  if (c >= 'A' && c <= 'Z')
    return (uint8_t)(c - 'A');
  if (c >= 'a' && c <= 'z')
    return (uint8_t)(c - 'a' + 26);
  if (c >= '0' && c <= '9')
    return (uint8_t)(c - '0' + 52);
  if (c == '-')
    return 62;
  if (c == '_')
    return 63;
  return 0xff;
}

int osr_b64url_encode(const void *in, size_t len, char *out, size_t outlen)
{
  const uint8_t *p = in;
  /* The int return value bounds what we can report. */
  if (len > (size_t)INT_MAX / 4 * 3 - 3 || outlen == 0 || OSR_B64URL_ENC_LEN(len) >= outlen) {
    if (outlen > 0)
      out[0] = '\0';
    return OSR_E2BIG;
  }
  size_t o = 0, i = 0;
  for (; i + 3 <= len; i += 3) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8 | p[i + 2];
    out[o++] = enc_tab[v >> 18];
    out[o++] = enc_tab[(v >> 12) & 63];
    out[o++] = enc_tab[(v >> 6) & 63];
    out[o++] = enc_tab[v & 63];
  }
  if (len - i == 1) {
    uint32_t v = (uint32_t)p[i] << 16;
    out[o++] = enc_tab[v >> 18];
    out[o++] = enc_tab[(v >> 12) & 63];
  } else if (len - i == 2) {
    uint32_t v = (uint32_t)p[i] << 16 | (uint32_t)p[i + 1] << 8;
    out[o++] = enc_tab[v >> 18];
    out[o++] = enc_tab[(v >> 12) & 63];
    out[o++] = enc_tab[(v >> 6) & 63];
  }
  out[o] = '\0';
  return (int)o;
}

int osr_b64url_decode(const char *in, size_t len, void *out, size_t outlen)
{
  uint8_t *q = out;
  /* A single trailing character carries only 6 bits: never a whole byte. */
  if (len % 4 == 1 || len > (size_t)INT_MAX)
    return OSR_EINVAL;
  if (OSR_B64URL_DEC_MAX(len) > outlen)
    return OSR_E2BIG;
  size_t o = 0, i = 0;
  for (; i + 4 <= len; i += 4) {
    uint8_t a = dec_val((unsigned char)in[i]), b = dec_val((unsigned char)in[i + 1]);
    uint8_t c = dec_val((unsigned char)in[i + 2]), d = dec_val((unsigned char)in[i + 3]);
    if ((a | b | c | d) & 0xc0)
      return OSR_EINVAL;
    uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6 | d;
    q[o++] = (uint8_t)(v >> 16);
    q[o++] = (uint8_t)(v >> 8);
    q[o++] = (uint8_t)v;
  }
  size_t rest = len - i;
  if (rest >= 2) {
    uint8_t a = dec_val((unsigned char)in[i]), b = dec_val((unsigned char)in[i + 1]);
    uint8_t c = rest == 3 ? dec_val((unsigned char)in[i + 2]) : 0;
    if ((a | b | c) & 0xc0)
      return OSR_EINVAL;
    uint32_t v = (uint32_t)a << 18 | (uint32_t)b << 12 | (uint32_t)c << 6;
    /* Canonical form: the bits below the last whole byte must be zero. */
    if ((rest == 2 && (v & 0xffff)) || (rest == 3 && (v & 0xff)))
      return OSR_EINVAL;
    q[o++] = (uint8_t)(v >> 16);
    if (rest == 3)
      q[o++] = (uint8_t)(v >> 8);
  }
  return (int)o;
}
