/* Small helpers shared by the gateway modules (declared in gateway/gw.h). */
#include <openssl/rand.h>
#include <openssl/sha.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

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

void osr_sandbox_id_new(char out[21])
{
  static const char alphabet[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char r[20];
  osr_random_bytes(r, sizeof(r));
  /* 252 = 7 * 36: reject the top values so every character is uniform. */
  for (size_t i = 0; i < 20; i++) {
    while (r[i] >= 252)
      osr_random_bytes(&r[i], 1);
    out[i] = alphabet[r[i] % 36];
  }
  /* E2B ids start with a letter; so do ours (DNS labels may not start with
   * a digit in some resolvers' eyes). */
  if (out[0] >= '0' && out[0] <= '9')
    out[0] = (char)('a' + (out[0] - '0'));
  out[20] = '\0';
}
