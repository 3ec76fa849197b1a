/* Small helpers shared by the gateway modules (declared in gateway/gw.h). */
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

#include "gateway/gw.h"

int64_t osr_now_ms(void)
{
  struct timeval tv;
  gettimeofday(&tv, NULL);
  return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

void osr_sha256_hex(const void *p, size_t len, char out[65])
{
  static const char hex[] = "0123456789abcdef";
  unsigned char md[SHA256_DIGEST_LENGTH];
  SHA256(p, len, md);
  for (size_t i = 0; i < SHA256_DIGEST_LENGTH; i++) {
    out[2 * i] = hex[md[i] >> 4];
    out[2 * i + 1] = hex[md[i] & 15];
  }
  out[64] = '\0';
}

void osr_random_bytes(void *out, size_t n)
{
  /* A CSPRNG failure leaves no safe way to mint ids or keys. */
  if (RAND_bytes(out, (int)n) != 1)
    abort();
}

/* 2024-01-01T00:00:00Z in ms: the epoch of the ids' time prefix. */
#define ID_EPOCH_MS 1704067200000LL

void osr_sandbox_id_new(char out[21])
{
  static const char alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyz"; /* in ASCII order */
  unsigned char r[12];
  struct timespec ts;
  int64_t ms;
  size_t i;

  /* 8 characters of time, then 12 random ones (62 bits). Ids made later
   * sort later, so the store's primary key index takes each new id at its
   * right edge, in the page the previous create touched, instead of in a
   * random leaf per create (one more page written to the WAL per create,
   * and reads of leaves that fell out of the cache). The first character
   * is a letter (E2B ids start with one; some resolvers refuse DNS labels
   * that start with a digit): 'a' + ms / 36^7, enough until 2088. */
  clock_gettime(CLOCK_REALTIME, &ts);
  ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 - ID_EPOCH_MS;
  if (ms < 0)
    ms = 0;
  for (i = 8; i-- > 1;) {
    out[i] = alphabet[ms % 36];
    ms /= 36;
  }
  out[0] = (char)('a' + (ms < 26 ? ms : 25));
  osr_random_bytes(r, sizeof(r));
  /* 252 = 7 * 36: reject the top values so every character is uniform. */
  for (i = 0; i < 12; i++) {
    while (r[i] >= 252)
      osr_random_bytes(&r[i], 1);
    out[8 + i] = alphabet[r[i] % 36];
  }
  out[20] = '\0';
}

/* ------------------------------------------------------------------------ */
/* Direct JSON writing (sandboxes.h)                                         */

#include <string.h>

#include "gateway/sandboxes.h"
#include "util/mem.h"

void osr__jw_init(osr__jw_t *w, size_t max)
{
  osr_buf_init(&w->b, max);
  w->err = 0;
}

void osr__jw_dispose(osr__jw_t *w)
{
  osr_buf_dispose(&w->b);
}

void osr__jw_raw(osr__jw_t *w, const char *s, size_t n)
{
  if (w->err == 0 && n > 0 && osr_buf_append(&w->b, s, n) != 0)
    w->err = 1;
}

/* jansson's dump_string: quote and backslash escaped, the five short
 * control escapes, any other control character as \u00XX (upper-case hex),
 * everything else (UTF-8 included) as is. */
void osr__jw_str(osr__jw_t *w, const char *s)
{
  static const char hex[] = "0123456789ABCDEF";
  if (s == NULL) {
    osr__jw_lit(w, "null");
    return;
  }
  osr__jw_lit(w, "\"");
  const char *run = s;
  for (; *s != '\0'; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch >= 0x20 && ch != '"' && ch != '\\')
      continue;
    osr__jw_raw(w, run, (size_t)(s - run));
    run = s + 1;
    char esc[6] = {'\\', 0, 0, 0, 0, 0};
    size_t n = 2;
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
      n = 6;
      break;
    }
    osr__jw_raw(w, esc, n);
  }
  osr__jw_raw(w, run, (size_t)(s - run));
  osr__jw_lit(w, "\"");
}

void osr__jw_int(osr__jw_t *w, int64_t v)
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
  osr__jw_raw(w, tmp + i, sizeof(tmp) - i);
}

static void put2(char *p, unsigned v)
{
  p[0] = (char)('0' + v / 10);
  p[1] = (char)('0' + v % 10);
}

/* Days since 1970-01-01 to a civil date (H. Hinnant's days_from_civil
 * inverse): a few divisions instead of gmtime_r + strftime + snprintf,
 * which cost ~2,500 instructions per timestamp and five per answer. */
void osr__rfc3339(int64_t ms, char out[32])
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
    y = 9999; /* as osr_gw_rfc3339, four digits; never reached in practice */
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

void osr__jw_time(osr__jw_t *w, int64_t ms)
{
  char t[32];
  if (ms <= 0) {
    osr__jw_lit(w, "null");
    return;
  }
  osr__rfc3339(ms, t);
  osr__jw_lit(w, "\"");
  osr__jw_raw(w, t, 24);
  osr__jw_lit(w, "\"");
}

char *osr__jw_release(osr__jw_t *w, size_t *len)
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
