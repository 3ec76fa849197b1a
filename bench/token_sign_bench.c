/*
 * CPU cost of signing one binding token, the gateway's per-create Ed25519
 * work on its loop thread (src/token/token.c), in interleaved rounds of one
 * process:
 *   build-release/bench/token_sign_bench [ROUNDS [ITERS]]
 * Rows: osr_token_sign (claims as a create mints them: encode, base64url,
 * random jti, sign), and the signature alone over the same bytes by
 * EVP_DigestSign (the TLS library) and, in a build with libsodium, by
 * crypto_sign_detached. Prints ns per call, best and median of the rounds,
 * and checks that both signers give the same 64 bytes. Numbers, not a
 * test: the machine decides the spread.
 */
#include <openssl/evp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef OSR_HAVE_SODIUM
#include <sodium.h>
#endif

#include "token/token.h"
#include "util/mem.h"

#define NROWS 3

static double now_ns(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static void claims_init(osr_token_claims_t *c)
{
  memset(c, 0, sizeof(*c));
  snprintf(c->sandbox_id, sizeof(c->sandbox_id), "%s", "sb9f3k2m1x0q7w8e5r4t");
  snprintf(c->tenant, sizeof(c->tenant), "%s", "default");
  snprintf(c->provider, sizeof(c->provider), "%s", "local");
  snprintf(c->agent_endpoint, sizeof(c->agent_endpoint), "%s",
           "unix:/var/lib/osr/sandboxes/sb9f3k2m1x0q7w8e5r4t/agent.sock");
  c->scopes = OSR_SCOPE_EXEC | OSR_SCOPE_PORTS;
  c->iat = 1800000000;
  c->exp = c->iat + 900;
}

static int evp_sign(EVP_PKEY *key, const char *msg, size_t len, uint8_t sig[64])
{
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  size_t siglen = 64;
  int ok = ctx != NULL && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key) == 1 &&
           EVP_DigestSign(ctx, sig, &siglen, (const uint8_t *)msg, len) == 1 && siglen == 64;
  EVP_MD_CTX_free(ctx);
  return ok ? 0 : -1;
}

int main(int argc, char **argv)
{
  int rounds = argc > 1 ? (int)strtol(argv[1], NULL, 10) : 9;
  int iters = argc > 2 ? (int)strtol(argv[2], NULL, 10) : 5000;
  static const uint8_t seed[32] = {7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9, 0, 4, 5, 2,
                                   3, 5, 3, 6, 0, 2, 8, 7, 4, 7, 1, 3, 5, 2, 6, 6};
  const char *names[NROWS] = {"osr_token_sign", "EVP_DigestSign", "crypto_sign_detached"};
  double *ns[NROWS];
  char tok[OSR_TOKEN_MAX + 1];
  uint8_t sig_evp[64], sig_na[64];
  volatile uint8_t sink = 0;
  osr_keyring_t *kr = osr_keyring_new();
  EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
  osr_token_claims_t c;
  size_t signed_len;
  int r, i, k, nrows = 2;

  if (rounds < 1 || iters < 1 || key == NULL || osr_keyring_add_private(kr, "bench", seed) != 0) {
    fprintf(stderr, "usage: token_sign_bench [ROUNDS [ITERS]]\n");
    return 2;
  }
  claims_init(&c);
  if (osr_token_sign(kr, &c, tok, sizeof(tok)) <= 0)
    return 1;
  signed_len = (size_t)(strrchr(tok, '.') - tok);
  if (evp_sign(key, tok, signed_len, sig_evp) != 0)
    return 1;
#ifdef OSR_HAVE_SODIUM
  uint8_t pk[32], sk[64];
  if (sodium_init() < 0 || crypto_sign_seed_keypair(pk, sk, seed) != 0)
    return 1;
  crypto_sign_detached(sig_na, NULL, (const uint8_t *)tok, signed_len, sk);
  if (memcmp(sig_evp, sig_na, 64) != 0) {
    fprintf(stderr, "the two signers disagree\n");
    return 1;
  }
  nrows = 3;
#else
  memset(sig_na, 0, sizeof(sig_na));
#endif
  for (k = 0; k < NROWS; k++)
    ns[k] = osr_xcalloc((size_t)rounds, sizeof(double));

  for (r = 0; r < rounds; r++) {
    for (k = 0; k < nrows; k++) {
      double t0 = now_ns();
      for (i = 0; i < iters; i++) {
        if (k == 0) {
          claims_init(&c);
          sink ^= (uint8_t)osr_token_sign(kr, &c, tok, sizeof(tok));
        } else if (k == 1) {
          evp_sign(key, tok, signed_len, sig_evp);
          sink ^= sig_evp[0];
        } else {
#ifdef OSR_HAVE_SODIUM
          crypto_sign_detached(sig_na, NULL, (const uint8_t *)tok, signed_len, sk);
#endif
          sink ^= sig_na[0];
        }
      }
      ns[k][r] = (now_ns() - t0) / iters;
    }
  }
  printf("token of %zu bytes (signed part %zu), %d rounds of %d, libsodium %s\n", strlen(tok),
         signed_len, rounds, iters, nrows == 3 ? "yes" : "no (not built with it)");
  for (k = 0; k < nrows; k++) {
    qsort(ns[k], (size_t)rounds, sizeof(double), cmp_double);
    printf("%-22s best %8.0f ns  median %8.0f ns\n", names[k], ns[k][0], ns[k][rounds / 2]);
  }
  if (nrows == 3)
    printf("crypto_sign_detached / EVP_DigestSign (medians): %.2f\n",
           ns[2][rounds / 2] / ns[1][rounds / 2]);
  for (k = 0; k < NROWS; k++)
    osr_free(ns[k]);
  EVP_PKEY_free(key);
  osr_keyring_free(kr);
  (void)sink;
  return 0;
}
