#include "util/text.h"

int osr_hexval(int c)
{
  if (c >= '0' && c <= '9')
    return c - '0';
  if (c >= 'a' && c <= 'f')
    return c - 'a' + 10;
  if (c >= 'A' && c <= 'F')
    return c - 'A' + 10;
  return -1;
}

int osr_pct_decode(const char *s, size_t n, char *out, size_t outlen)
{
  size_t o = 0;
  if (outlen == 0)
    return -1;
  for (size_t i = 0; i < n; i++) {
    int c = (unsigned char)s[i];
    if (c == '%') {
      if (i + 2 >= n)
        return -1;
      int h = osr_hexval(s[i + 1]), l = osr_hexval(s[i + 2]);
      if (h < 0 || l < 0)
        return -1;
      c = h * 16 + l;
      i += 2;
    } else if (c == '+') {
      c = ' ';
    }
    if (c == 0 || o + 1 >= outlen)
      return -1;
    out[o++] = (char)c;
  }
  out[o] = '\0';
  return (int)o;
}

char *osr_fmt_u64(char buf[20], uint64_t v)
{
  char *p = buf + 20;
  do {
    *--p = (char)('0' + v % 10);
    v /= 10;
  } while (v != 0);
  return p;
}
