/*
 * The direct JSON writer (util/jsonw.h). Every function appends through
 * osr_jw_raw, which is where the sticky error lives: after one failed
 * append nothing more is written, so callers check once, at release.
 */
#include "util/jsonw.h"

#include <string.h>

void osr_jw_init(osr_jw_t *w, size_t max)
{
  osr_buf_init(&w->b, max);
  w->err = 0;
}

void osr_jw_dispose(osr_jw_t *w)
{
  osr_buf_dispose(&w->b);
  w->err = 0;
}

void osr_jw_raw(osr_jw_t *w, const char *s, size_t n)
{
  if (w->err == 0 && n > 0 && osr_buf_append(&w->b, s, n) != 0)
    w->err = 1;
}

/* jansson's dump_string: quote and backslash escaped, the five short
 * control escapes, any other control character (NUL included) as \u00XX
 * (upper-case hex), everything else (UTF-8 included) as is. Runs of bytes
 * that need nothing are appended in one piece. */
void osr_jw_strn(osr_jw_t *w, const char *s, size_t n)
{
  static const char hex[] = "0123456789ABCDEF";
  const char *end = s + n, *run = s;
  osr_jw_lit(w, "\"");
  for (; s < end; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch >= 0x20 && ch != '"' && ch != '\\')
      continue;
    osr_jw_raw(w, run, (size_t)(s - run));
    run = s + 1;
    char esc[6] = {'\\', 0, 0, 0, 0, 0};
    size_t len = 2;
    switch (ch) {
    case '"':
      esc[1] = '"';
      break;
    case '\\':
      esc[1] = '\\';
      break;
    case '\b':
      esc[1] = 'b';
      break;
    case '\f':
      esc[1] = 'f';
      break;
    case '\n':
      esc[1] = 'n';
      break;
    case '\r':
      esc[1] = 'r';
      break;
    case '\t':
      esc[1] = 't';
      break;
    default:
      esc[1] = 'u';
      esc[2] = '0';
      esc[3] = '0';
      esc[4] = hex[ch >> 4];
      esc[5] = hex[ch & 15];
      len = 6;
      break;
    }
    osr_jw_raw(w, esc, len);
  }
  osr_jw_raw(w, run, (size_t)(s - run));
  osr_jw_lit(w, "\"");
}

void osr_jw_str(osr_jw_t *w, const char *s)
{
  if (s == NULL)
    osr_jw_lit(w, "null");
  else
    osr_jw_strn(w, s, strlen(s));
}

void osr_jw_int(osr_jw_t *w, int64_t v)
{
  char tmp[24];
  size_t i = sizeof(tmp);
  /* Negate as unsigned so INT64_MIN does not overflow. */
  uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
  do {
    tmp[--i] = (char)('0' + u % 10);
    u /= 10;
  } while (u != 0);
  if (v < 0)
    tmp[--i] = '-';
  osr_jw_raw(w, tmp + i, sizeof(tmp) - i);
}

void osr_jw_bool(osr_jw_t *w, int v)
{
  if (v)
    osr_jw_lit(w, "true");
  else
    osr_jw_lit(w, "false");
}

static void put2(char *p, unsigned v)
{
  p[0] = (char)('0' + v / 10);
  p[1] = (char)('0' + v % 10);
}

/* Days since 1970-01-01 to a civil date (H. Hinnant's days_from_civil
 * inverse): a few divisions instead of gmtime_r + strftime + snprintf,
 * which cost ~2,500 instructions per timestamp and five per answer. */
void osr_jw_rfc3339(int64_t ms, char out[32])
{
  if (ms < 0)
    ms = 0;
  int64_t secs = ms / 1000, days = secs / 86400;
  unsigned sod = (unsigned)(secs % 86400);
  int64_t z = days + 719468;
  int64_t era = z / 146097;
  unsigned doe = (unsigned)(z - era * 146097);
  unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  int64_t y = (int64_t)yoe + era * 400;
  unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  unsigned mp = (5 * doy + 2) / 153;
  unsigned d = doy - (153 * mp + 2) / 5 + 1;
  unsigned m = mp < 10 ? mp + 3 : mp - 9;
  if (m <= 2)
    y++;
  if (y > 9999)
    y = 9999; /* four digits; never reached in practice */
  unsigned yy = (unsigned)y, msr = (unsigned)(ms % 1000);
  put2(out, yy / 100);
  put2(out + 2, yy % 100);
  out[4] = '-';
  put2(out + 5, m);
  out[7] = '-';
  put2(out + 8, d);
  out[10] = 'T';
  put2(out + 11, sod / 3600);
  out[13] = ':';
  put2(out + 14, sod / 60 % 60);
  out[16] = ':';
  put2(out + 17, sod % 60);
  out[19] = '.';
  out[20] = (char)('0' + msr / 100);
  put2(out + 21, msr % 100);
  out[23] = 'Z';
  out[24] = '\0';
}

void osr_jw_time(osr_jw_t *w, int64_t ms)
{
  char t[32];
  if (ms <= 0) {
    osr_jw_lit(w, "null");
    return;
  }
  osr_jw_rfc3339(ms, t);
  osr_jw_lit(w, "\"");
  osr_jw_raw(w, t, 24);
  osr_jw_lit(w, "\"");
}

char *osr_jw_release(osr_jw_t *w, size_t *len)
{
  char *s = NULL;
  if (w->err == 0 && osr_buf_append(&w->b, "", 1) == 0) {
    s = osr_buf_release(&w->b, len);
    if (s != NULL && *len > 0)
      (*len)--; /* the NUL is not part of the text */
  }
  osr_buf_dispose(&w->b);
  w->err = 0;
  return s;
}
