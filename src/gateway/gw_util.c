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
