/*
 * Small text helpers shared by every parser of URLs, query strings and hex:
 * pure, bounded, no allocation.
 */
#ifndef OSR_UTIL_TEXT_H
#define OSR_UTIL_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/**
 * Copy the string src into dst[0..size) (size > 0), truncated to size - 1
 * bytes and always NUL-terminated: exactly snprintf(dst, size, "%s", src),
 * without the format machinery, which cost ~550 instructions a call on the
 * create path (30 such copies a create). src and dst must not overlap.
 * Returns the bytes copied.
 */
static inline size_t osr_str_copy(char *dst, size_t size, const char *src)
{
  /* A loop, not strnlen: GCC rejects a bound larger than a literal src. */
  size_t n = 0;
  while (n + 1 < size && src[n] != '\0')
    n++;
  memcpy(dst, src, n);
  dst[n] = '\0';
  return n;
}

/** Value of one hex digit (either case), or -1. */
int osr_hexval(int c);

/**
 * Percent-decode [s, s+n) into out as a form value ('+' is a space) and
 * NUL-terminate it. Returns the decoded length, or -1 if a %-escape is
 * malformed, the result would hold a NUL byte, or it does not fit in
 * outlen - 1 bytes.
 */
int osr_pct_decode(const char *s, size_t n, char *out, size_t outlen);

/** Whether [s, s+n) is the lower-case ASCII text lc[0..lc_len) in any
 *  ASCII case (HTTP field names), without strncasecmp's locale tables. */
static inline int osr_ascii_ieq_lower(const char *s, size_t n, const char *lc, size_t lc_len)
{
  if (n != lc_len)
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c >= 'A' && c <= 'Z')
      c = (unsigned char)(c + ('a' - 'A'));
    if (c != (unsigned char)lc[i])
      return 0;
  }
  return 1;
}

/** Whether [s, s+n) holds a CR, LF or NUL byte (what must never reach a
 *  head we write: response splitting); eight bytes per step. */
static inline int osr_has_crlf_nul(const char *s, size_t n)
{
  const uint64_t ones = 0x0101010101010101ull, high = 0x8080808080808080ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w, a, b;
    __builtin_memcpy(&w, s + i, 8);
    a = w ^ (0x0a * ones);
    b = w ^ (0x0d * ones);
    /* (x - 1) & ~x & 0x80 per byte is nonzero iff some byte of x is 0 */
    if ((((w - ones) & ~w) | ((a - ones) & ~a) | ((b - ones) & ~b)) & high)
      return 1;
  }
  for (; i < n; i++) {
    if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0')
      return 1;
  }
  return 0;
}

/** FNV-1a, the hash of OSR's small in-memory tables (not keyed: for our own
 *  ids and addresses, never for keys a client picks freely). Start with
 *  OSR_FNV1A_INIT, feed bytes with osr_fnv1a or one value with
 *  osr_fnv1a_step; osr_fnv1a_str hashes a NUL-terminated string. */
#define OSR_FNV1A_INIT 2166136261u
static inline uint32_t osr_fnv1a_step(uint32_t h, uint32_t v)
{
  return (h ^ v) * 16777619u;
}

static inline uint32_t osr_fnv1a(uint32_t h, const void *p, size_t n)
{
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++)
    h = osr_fnv1a_step(h, b[i]);
  return h;
}

static inline uint32_t osr_fnv1a_str(const char *s)
{
  uint32_t h = OSR_FNV1A_INIT;
  for (; *s != '\0'; s++)
    h = osr_fnv1a_step(h, (unsigned char)*s);
  return h;
}

/** Decimal digits of v written into the end of buf[20] (no NUL); returns
 *  the first digit: the text is [result, buf + 20). */
char *osr_fmt_u64(char buf[20], uint64_t v);

#endif
