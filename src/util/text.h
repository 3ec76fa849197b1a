/*
 * Small text helpers shared by every parser of URLs, query strings and hex:
 * pure, bounded, no allocation.
 */
#ifndef OSR_UTIL_TEXT_H
#define OSR_UTIL_TEXT_H

#include <stddef.h>
#include <stdint.h>

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

/** Decimal digits of v written into the end of buf[20] (no NUL); returns
 *  the first digit: the text is [result, buf + 20). */
char *osr_fmt_u64(char buf[20], uint64_t v);

#endif
