/*
 * Fuzz binding-token verification (osr_token_verify) and the base64url
 * codec: tokens arrive from anyone who can reach the data plane.
 *
 * The first input byte picks a mode, the rest is the data:
 *   0  the data is a token as received (osr_token_verify with a fixed
 *      keyring);
 *   1  the data is a msgpack payload, wrapped into a token and correctly
 *      signed with the keyring's key, so the claims decoder and every check
 *      after the signature are reached without the fuzzer forging Ed25519;
 *   2  the data is base64url text for the decoder.
 * Beyond "no crash, no leak" it checks the promises: verify answers only
 * OSR_ETOKEN_* codes and fills the claims only on success; accepted claims
 * are within their limits and survive a re-sign and re-verify unchanged; a
 * decoded base64url string re-encodes to exactly the input.
 */
#include <openssl/evp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "token/token.h"
#include "util/base64.h"
#include "util/mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(x)                                                                                   \
  do {                                                                                             \
    if (!(x))                                                                                      \
      __builtin_trap();                                                                            \
  } while (0)

#define NOW 1700000000

static const uint8_t seed[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};

static osr_keyring_t *ring;
static EVP_PKEY *signer;

static void cleanup(void)
{
  osr_keyring_free(ring);
  EVP_PKEY_free(signer);
}

static void setup(void)
{
  if (ring != NULL)
    return;
  ring = osr_keyring_new();
  CHECK(osr_keyring_add_private(ring, "ka", seed) == 0);
  uint8_t other[32];
  memset(other, 0x5a, sizeof(other));
  CHECK(osr_keyring_add_private(ring, "kb", other) == 0);
  signer = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
  CHECK(signer != NULL);
  atexit(cleanup);
}

static void check_claims(const osr_token_claims_t *c)
{
  CHECK(strnlen(c->sandbox_id, sizeof(c->sandbox_id)) < sizeof(c->sandbox_id));
  CHECK(c->sandbox_id[0] != '\0');
  CHECK(strnlen(c->tenant, sizeof(c->tenant)) < sizeof(c->tenant));
  CHECK(strnlen(c->provider, sizeof(c->provider)) < sizeof(c->provider));
  CHECK(strnlen(c->agent_endpoint, sizeof(c->agent_endpoint)) < sizeof(c->agent_endpoint));
  CHECK(strnlen(c->kid, sizeof(c->kid)) < sizeof(c->kid));
  CHECK(strlen(c->jti) == 32);
  CHECK((c->scopes & ~(unsigned)OSR_SCOPE_ALL) == 0);
  CHECK(c->nports <= OSR_TOKEN_PORTS_MAX);
  CHECK(!(c->all_ports && c->nports));
  for (size_t i = 0; i < c->nports; i++)
    CHECK(c->ports[i] != 0);
  CHECK(c->exp >= c->iat);
}

static int claims_equal(const osr_token_claims_t *a, const osr_token_claims_t *b)
{
  return strcmp(a->sandbox_id, b->sandbox_id) == 0 && strcmp(a->tenant, b->tenant) == 0 &&
         strcmp(a->provider, b->provider) == 0 &&
         strcmp(a->agent_endpoint, b->agent_endpoint) == 0 && a->scopes == b->scopes &&
         a->nports == b->nports &&
         memcmp(a->ports, b->ports, a->nports * sizeof(a->ports[0])) == 0 &&
         a->all_ports == b->all_ports && a->iat == b->iat && a->exp == b->exp &&
         strcmp(a->kid, b->kid) == 0 && strcmp(a->jti, b->jti) == 0;
}

static int verify_code_ok(int rv)
{
  return rv == 0 || rv == OSR_ETOKEN_MALFORMED || rv == OSR_ETOKEN_SIGNATURE ||
         rv == OSR_ETOKEN_EXPIRED || rv == OSR_ETOKEN_UNKNOWN_KEY;
}

static void verify_and_check(const char *tok, size_t len)
{
  osr_token_claims_t c, c2;
  memset(&c, 0x77, sizeof(c));
  int rv = osr_token_verify(ring, tok, len, NOW, 30, &c);
  CHECK(verify_code_ok(rv));
  if (rv != 0) {
    const uint8_t *p = (const uint8_t *)&c;
    for (size_t i = 0; i < sizeof(c); i++)
      CHECK(p[i] == 0x77); /* untouched on failure */
    return;
  }
  check_claims(&c);
  /* What verified re-signs to a token that verifies to the same claims. */
  char again[OSR_TOKEN_MAX + 1];
  osr_token_claims_t r = c;
  int n = osr_token_sign(ring, &r, again, sizeof(again));
  CHECK(n > 0);
  CHECK(osr_token_verify(ring, again, (size_t)n, NOW, 30, &c2) == 0);
  CHECK(claims_equal(&c, &c2));
  /* And the access check never accepts another sandbox. */
  CHECK(osr_token_allows(&c, "", OSR_SCOPE_EXEC, 0) == OSR_ETOKEN_SANDBOX);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  setup();
  if (size == 0)
    return 0;
  int mode = data[0] % 3;
  data++;
  size--;
  if (mode == 0) {
    /* The token as bytes off the wire: copy so the verifier cannot rely on
     * a terminator. */
    char *tok = osr_xmalloc(size ? size : 1);
    memcpy(tok, data, size);
    verify_and_check(tok, size);
    osr_free(tok);
  } else if (mode == 1) {
    if (size > OSR_TOKEN_MAX)
      return 0;
    char *tok = osr_xmalloc(OSR_TOKEN_MAX * 2 + 200);
    memcpy(tok, "osr1.", 5);
    int n = osr_b64url_encode(data, size, tok + 5, OSR_TOKEN_MAX * 2);
    CHECK(n >= 0);
    uint8_t sig[64];
    size_t siglen = sizeof(sig);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    CHECK(ctx != NULL && EVP_DigestSignInit(ctx, NULL, NULL, NULL, signer) == 1);
    CHECK(EVP_DigestSign(ctx, sig, &siglen, (const uint8_t *)tok, 5 + (size_t)n) == 1);
    EVP_MD_CTX_free(ctx);
    tok[5 + n] = '.';
    int m = osr_b64url_encode(sig, sizeof(sig), tok + 6 + n, 100);
    CHECK(m == 86);
    verify_and_check(tok, 6 + (size_t)n + 86);
    osr_free(tok);
  } else {
    uint8_t *out = osr_xmalloc(size + 1);
    int n = osr_b64url_decode((const char *)data, size, out, size + 1);
    CHECK(n == OSR_EINVAL || (n >= 0 && (size_t)n <= size));
    if (n >= 0) {
      char *enc = osr_xmalloc(size + 2);
      int e = osr_b64url_encode(out, (size_t)n, enc, size + 2);
      CHECK(e >= 0 && (size_t)e == size && memcmp(enc, data, size) == 0);
      osr_free(enc);
    }
    osr_free(out);
  }
  return 0;
}
