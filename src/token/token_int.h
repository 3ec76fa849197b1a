/*
 * Private seam between the token files: the keyring (keyring.c) and the
 * signer/verifier (token.c). Nothing here is used outside src/token/.
 */
#ifndef OSR_TOKEN_TOKEN_INT_H
#define OSR_TOKEN_TOKEN_INT_H

#include <openssl/evp.h>

#include "token/token.h"

typedef struct osr__key_s {
  char kid[OSR_TOKEN_KID_MAX];
  uint8_t pub[32];
  EVP_PKEY *verify_key; /* always set */
  EVP_PKEY *sign_key;   /* NULL for a verify-only key */
#ifdef OSR_HAVE_SODIUM
  /* With libsodium, tokens are signed by crypto_sign_detached, which takes
   * the key as seed || pub: 0.6x the CPU of EVP_DigestSign, the same
   * (deterministic) signature. Set exactly when sign_key is; wiped on
   * removal. */
  uint8_t sodium_sk[64];
#endif
} osr__key_t;

struct osr_keyring_s {
  osr__key_t keys[OSR_KEYRING_MAX];
  size_t n;
  int active; /* index into keys of the signing key, -1 if none */
};

/** The key named `kid` (n bytes, not NUL-terminated), or NULL. */
const osr__key_t *osr__keyring_find(const osr_keyring_t *kr, const char *kid, size_t n);

/** 1 if `kid` is 1..OSR_TOKEN_KID_MAX-1 characters of [A-Za-z0-9_-]. */
int osr__kid_valid(const char *kid, size_t n);

/** Lower-case hex of n bytes into out (2n + 1 bytes). */
void osr__hex(const uint8_t *p, size_t n, char *out);
/** Parse exactly 2n hex digits into n bytes. Returns 0 or -1. */
int osr__unhex(const char *s, size_t slen, uint8_t *out, size_t n);

#endif
