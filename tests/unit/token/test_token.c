/*
 * Binding tokens: sign/verify round trip with every claim, forgery (every
 * single-character change of a token, payload bytes changed under a valid
 * encoding, a key of our own under the gateway's kid), expiry and leeway,
 * scope/sandbox/port checks, unknown key ids, rotation, malformed input
 * (every truncation, bad base64, hand-made msgpack payloads that are
 * correctly signed but break one rule each, oversized tokens), the
 * revocation list and its cap, the key directory (create with 0600 files,
 * reload, active key, errors naming the file) and the public-key JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <dirent.h>
#include <fcntl.h>
#include <msgpack.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "token/token.h"
#include "util/base64.h"
#include "util/mem.h"

#define NOW 1700000000

static const uint8_t seed_a[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                   17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
static const uint8_t seed_b[32] = {99, 98, 97, 96, 95, 94, 93, 92, 91, 90, 89, 88, 87, 86, 85, 84,
                                   83, 82, 81, 80, 79, 78, 77, 76, 75, 74, 73, 72, 71, 70, 69, 68};

static void claims_init(osr_token_claims_t *c)
{
  memset(c, 0, sizeof(*c));
  snprintf(c->sandbox_id, sizeof(c->sandbox_id), "%s", "abcdefghij0123456789");
  snprintf(c->tenant, sizeof(c->tenant), "%s", "acme");
  snprintf(c->provider, sizeof(c->provider), "%s", "local-1");
  snprintf(c->agent_endpoint, sizeof(c->agent_endpoint), "%s", "unix:/run/osr/sbx 1/agent.sock");
  c->scopes = OSR_SCOPE_EXEC | OSR_SCOPE_PORTS;
  c->ports[0] = 8080;
  c->ports[1] = 3000;
  c->nports = 2;
  c->iat = NOW;
  c->exp = NOW + 600;
}

static osr_keyring_t *ring_a(void)
{
  osr_keyring_t *kr = osr_keyring_new();
  assert_int_equal(osr_keyring_add_private(kr, "ka", seed_a), 0);
  return kr;
}

static int sign(const osr_keyring_t *kr, osr_token_claims_t *c, char *out)
{
  int n = osr_token_sign(kr, c, out, OSR_TOKEN_MAX + 1);
  assert_true(n > 0);
  assert_int_equal((size_t)n, strlen(out));
  return n;
}

static int verify(const osr_keyring_t *kr, const char *tok, int64_t now, osr_token_claims_t *out)
{
  return osr_token_verify(kr, tok, strlen(tok), now, 0, out);
}

/* ---- round trip ----------------------------------------------------------- */

static void test_round_trip(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  osr_token_claims_t c, d;
  char tok[OSR_TOKEN_MAX + 1];
  claims_init(&c);
  int n = sign(kr, &c, tok);
  assert_memory_equal(tok, "osr1.", 5);
  assert_string_equal(c.kid, "ka");    /* filled in from the active key */
  assert_int_equal(strlen(c.jti), 32); /* filled in at random */
  assert_int_equal(osr_token_verify(kr, tok, (size_t)n, NOW + 10, 0, &d), 0);
  assert_string_equal(d.sandbox_id, c.sandbox_id);
  assert_string_equal(d.tenant, "acme");
  assert_string_equal(d.provider, "local-1");
  assert_string_equal(d.agent_endpoint, "unix:/run/osr/sbx 1/agent.sock");
  assert_int_equal(d.scopes, OSR_SCOPE_EXEC | OSR_SCOPE_PORTS);
  assert_int_equal(d.nports, 2);
  assert_int_equal(d.ports[0], 8080);
  assert_int_equal(d.ports[1], 3000);
  assert_int_equal(d.all_ports, 0);
  assert_int_equal(d.iat, NOW);
  assert_int_equal(d.exp, NOW + 600);
  assert_string_equal(d.kid, "ka");
  assert_string_equal(d.jti, c.jti);
  /* Output NULL is fine. */
  assert_int_equal(osr_token_verify(kr, tok, (size_t)n, NOW, 0, NULL), 0);

  /* A second token for the same claims differs (fresh jti). */
  osr_token_claims_t c2;
  char tok2[OSR_TOKEN_MAX + 1];
  claims_init(&c2);
  sign(kr, &c2, tok2);
  assert_string_not_equal(tok, tok2);

  /* All ports; no ports; every field at its maximum size still fits. */
  claims_init(&c);
  c.nports = 0;
  c.all_ports = 1;
  c.scopes = OSR_SCOPE_ALL;
  sign(kr, &c, tok);
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  assert_int_equal(d.all_ports, 1);
  assert_int_equal(d.nports, 0);
  claims_init(&c);
  c.nports = 0;
  sign(kr, &c, tok);
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  assert_int_equal(d.all_ports, 0);
  assert_int_equal(d.nports, 0);
  claims_init(&c);
  memset(c.sandbox_id, 'z', sizeof(c.sandbox_id) - 1);
  memset(c.tenant, 't', sizeof(c.tenant) - 1);
  memset(c.provider, 'p', sizeof(c.provider) - 1);
  memset(c.agent_endpoint, 'e', sizeof(c.agent_endpoint) - 1);
  c.nports = OSR_TOKEN_PORTS_MAX;
  for (size_t i = 0; i < OSR_TOKEN_PORTS_MAX; i++)
    c.ports[i] = (uint16_t)(60000 + i);
  c.iat = INT64_MAX - 5;
  c.exp = INT64_MAX;
  snprintf(c.kid, sizeof(c.kid), "%s", "ka");
  n = sign(kr, &c, tok);
  assert_true(n <= OSR_TOKEN_MAX);
  assert_int_equal(verify(kr, tok, INT64_MAX - 5, &d), 0);
  assert_int_equal(d.nports, OSR_TOKEN_PORTS_MAX);
  assert_int_equal(d.ports[31], 60031);
  assert_int_equal(strlen(d.agent_endpoint), sizeof(d.agent_endpoint) - 1);
  osr_keyring_free(kr);
}

static void test_sign_errors(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  osr_token_claims_t c;
  char tok[OSR_TOKEN_MAX + 1];

  claims_init(&c);
  assert_int_equal(osr_token_sign(kr, &c, tok, 40), OSR_E2BIG);

  /* Each broken claim in turn. */
  for (int k = 0; k < 9; k++) {
    claims_init(&c);
    switch (k) {
    case 0:
      c.sandbox_id[0] = '\0';
      break;
    case 1:
      c.tenant[1] = '\n';
      break;
    case 2:
      c.provider[0] = ' ';
      break;
    case 3:
      c.scopes = 1u << 5;
      break;
    case 4:
      c.ports[1] = 0;
      break;
    case 5:
      c.nports = OSR_TOKEN_PORTS_MAX + 1;
      break;
    case 6:
      c.exp = c.iat - 1;
      break;
    case 7:
      c.all_ports = 1;
      break; /* with a port list */
    case 8:
      snprintf(c.jti, sizeof(c.jti), "%s", "not-hex");
      break;
    }
    assert_int_equal(osr_token_sign(kr, &c, tok, sizeof(tok)), OSR_EINVAL);
  }
  /* A kid we hold no private key for, and a keyring without a signer. */
  claims_init(&c);
  snprintf(c.kid, sizeof(c.kid), "%s", "nope");
  assert_int_equal(osr_token_sign(kr, &c, tok, sizeof(tok)), OSR_ETOKEN_UNKNOWN_KEY);
  osr_keyring_t *pub = osr_keyring_new();
  uint8_t p[32];
  memset(p, 7, sizeof(p));
  assert_int_equal(osr_keyring_add_public(pub, "kp", p), 0);
  claims_init(&c);
  assert_int_equal(osr_token_sign(pub, &c, tok, sizeof(tok)), OSR_ETOKEN_UNKNOWN_KEY);
  claims_init(&c);
  snprintf(c.kid, sizeof(c.kid), "%s", "kp");
  assert_int_equal(osr_token_sign(pub, &c, tok, sizeof(tok)), OSR_ETOKEN_UNKNOWN_KEY);
  osr_keyring_free(pub);
  osr_keyring_free(kr);
}

/* ---- forgery -------------------------------------------------------------- */

/* Split a token into its decoded payload and signature. */
static size_t split(const char *tok, uint8_t *payload, size_t cap, uint8_t sig[64])
{
  const char *dot = strchr(tok + 5, '.');
  assert_non_null(dot);
  int n = osr_b64url_decode(tok + 5, (size_t)(dot - tok - 5), payload, cap);
  assert_true(n > 0);
  assert_int_equal(osr_b64url_decode(dot + 1, strlen(dot + 1), sig, 64), 64);
  return (size_t)n;
}

static void join(char *out, const uint8_t *payload, size_t plen, const uint8_t sig[64])
{
  memcpy(out, "osr1.", 5);
  int n = osr_b64url_encode(payload, plen, out + 5, OSR_TOKEN_MAX);
  assert_true(n > 0);
  out[5 + n] = '.';
  assert_int_equal(osr_b64url_encode(sig, 64, out + 6 + n, 100), 86);
}

static void test_forgery(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  osr_token_claims_t c;
  char tok[OSR_TOKEN_MAX + 1], bad[OSR_TOKEN_MAX + 1];
  claims_init(&c);
  int n = sign(kr, &c, tok);
  assert_int_equal(verify(kr, tok, NOW, NULL), 0);

  /* Every single-character change anywhere fails, whatever the reason. */
  static const char alphabet[] = "AZaz09-_.=+/ \x01\x80";
  int sig_fail = 0;
  for (int i = 0; i < n; i++) {
    for (const char *a = alphabet; *a != '\0'; a++) {
      if (tok[i] == *a)
        continue;
      memcpy(bad, tok, (size_t)n + 1);
      bad[i] = *a;
      int rv = osr_token_verify(kr, bad, (size_t)n, NOW, 0, NULL);
      assert_true(rv == OSR_ETOKEN_MALFORMED || rv == OSR_ETOKEN_SIGNATURE ||
                  rv == OSR_ETOKEN_UNKNOWN_KEY);
      sig_fail += rv == OSR_ETOKEN_SIGNATURE;
    }
  }
  assert_true(sig_fail > n); /* most changes decode fine and die at the signature */

  /* Change the tenant inside a valid encoding: "acme" → "acmf". */
  uint8_t payload[2048], sig[64];
  size_t plen = split(tok, payload, sizeof(payload), sig);
  uint8_t *t = memmem(payload, plen, "acme", 4);
  assert_non_null(t);
  t[3] = 'f';
  join(bad, payload, plen, sig);
  assert_int_equal(verify(kr, bad, NOW, NULL), OSR_ETOKEN_SIGNATURE);
  t[3] = 'e';
  /* Extend the expiry: the low byte of exp sits just before "kid". */
  uint8_t *kid = memmem(payload, plen, "\xa3kid", 4);
  assert_non_null(kid);
  kid[-1] ^= 0x01;
  join(bad, payload, plen, sig);
  assert_int_equal(verify(kr, bad, NOW, NULL), OSR_ETOKEN_SIGNATURE);
  kid[-1] ^= 0x01;
  /* One flipped bit of the signature. */
  for (int bit = 0; bit < 512; bit += 37) {
    sig[bit / 8] ^= (uint8_t)(1u << (bit % 8));
    join(bad, payload, plen, sig);
    assert_int_equal(verify(kr, bad, NOW, NULL), OSR_ETOKEN_SIGNATURE);
    sig[bit / 8] ^= (uint8_t)(1u << (bit % 8));
  }
  join(bad, payload, plen, sig);
  assert_string_equal(bad, tok); /* the helpers are exact: the failures above are real */
  assert_int_equal(verify(kr, bad, NOW, NULL), 0);

  /* An attacker's own key under the gateway's kid. */
  osr_keyring_t *evil = osr_keyring_new();
  assert_int_equal(osr_keyring_add_private(evil, "ka", seed_b), 0);
  claims_init(&c);
  c.scopes = OSR_SCOPE_ALL;
  sign(evil, &c, bad);
  assert_int_equal(verify(kr, bad, NOW, NULL), OSR_ETOKEN_SIGNATURE);
  /* A signature from another token (same key) on this payload. */
  uint8_t p2[2048], s2[64];
  sign(kr, &c, bad);
  split(bad, p2, sizeof(p2), s2);
  join(bad, payload, plen, s2);
  assert_int_equal(verify(kr, bad, NOW, NULL), OSR_ETOKEN_SIGNATURE);
  osr_keyring_free(evil);
  osr_keyring_free(kr);
}

/* ---- expiry and access checks --------------------------------------------- */

/* ---- the signature itself -------------------------------------------------- */

/* The Ed25519 signature of the token's first two parts under seed, computed
 * here with the TLS library's EVP interface (RFC 8032 signatures are
 * deterministic, so any correct signer gives the same 64 bytes). */
static void evp_sig(const uint8_t seed[32], const char *tok, uint8_t sig[64])
{
  const char *dot = strrchr(tok, '.');
  EVP_PKEY *key = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  size_t len = 64;
  assert_non_null(dot);
  assert_non_null(key);
  assert_non_null(ctx);
  assert_int_equal(EVP_DigestSignInit(ctx, NULL, NULL, NULL, key), 1);
  assert_int_equal(EVP_DigestSign(ctx, sig, &len, (const uint8_t *)tok, (size_t)(dot - tok)), 1);
  assert_int_equal(len, 64);
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(key);
}

/* Whichever library signs (libsodium when built with it, else the TLS
 * library), a token carries exactly the RFC 8032 signature of its signed
 * part, for a key added private at once and for one whose private half
 * came after its public key (the keyring's two ways to a signing key). */
static void test_signature_is_rfc8032(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  osr_token_claims_t c, d;
  char tok[OSR_TOKEN_MAX + 1];
  uint8_t want[64], got[64], payload[OSR_TOKEN_MAX];
  uint8_t pub_b[32];
  size_t publen = sizeof(pub_b);
  EVP_PKEY *kb = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed_b, 32);

  for (int i = 0; i < 3; i++) {
    claims_init(&c);
    c.exp += i; /* three different messages */
    sign(kr, &c, tok);
    split(tok, payload, sizeof(payload), got);
    evp_sig(seed_a, tok, want);
    assert_memory_equal(got, want, 64);
    assert_int_equal(verify(kr, tok, NOW, &d), 0);
  }

  assert_non_null(kb);
  assert_int_equal(EVP_PKEY_get_raw_public_key(kb, pub_b, &publen), 1);
  EVP_PKEY_free(kb);
  assert_int_equal(osr_keyring_add_public(kr, "kb", pub_b), 0);
  assert_int_equal(osr_keyring_add_private(kr, "kb", seed_b), 0);
  claims_init(&c);
  snprintf(c.kid, sizeof(c.kid), "%s", "kb");
  sign(kr, &c, tok);
  split(tok, payload, sizeof(payload), got);
  evp_sig(seed_b, tok, want);
  assert_memory_equal(got, want, 64);
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  osr_keyring_free(kr);
}

static void test_expiry(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  osr_token_claims_t c;
  char tok[OSR_TOKEN_MAX + 1];
  claims_init(&c); /* iat NOW, exp NOW + 600 */
  int n = sign(kr, &c, tok);
  size_t len = (size_t)n;
  assert_int_equal(osr_token_verify(kr, tok, len, NOW + 599, 0, NULL), 0);
  assert_int_equal(osr_token_verify(kr, tok, len, NOW + 600, 0, NULL), OSR_ETOKEN_EXPIRED);
  assert_int_equal(osr_token_verify(kr, tok, len, NOW + 10000, 0, NULL), OSR_ETOKEN_EXPIRED);
  /* Leeway: accepted up to exp + leeway (exclusive). */
  assert_int_equal(osr_token_verify(kr, tok, len, NOW + 609, 10, NULL), 0);
  assert_int_equal(osr_token_verify(kr, tok, len, NOW + 610, 10, NULL), OSR_ETOKEN_EXPIRED);
  /* Issued in the future: refused beyond the leeway. */
  assert_int_equal(osr_token_verify(kr, tok, len, NOW - 1, 0, NULL), OSR_ETOKEN_EXPIRED);
  assert_int_equal(osr_token_verify(kr, tok, len, NOW - 5, 5, NULL), 0);
  assert_int_equal(osr_token_verify(kr, tok, len, NOW - 6, 5, NULL), OSR_ETOKEN_EXPIRED);
  /* A negative leeway counts as none; extreme clocks do not overflow. */
  assert_int_equal(osr_token_verify(kr, tok, len, NOW + 600, -100, NULL), OSR_ETOKEN_EXPIRED);
  assert_int_equal(osr_token_verify(kr, tok, len, INT64_MIN, INT64_MAX, NULL), OSR_ETOKEN_EXPIRED);
  assert_int_equal(osr_token_verify(kr, tok, len, INT64_MAX, 0, NULL), OSR_ETOKEN_EXPIRED);
  /* Expired and forged: the signature is checked first. */
  tok[len - 2] = tok[len - 2] == 'A' ? 'B' : 'A';
  assert_int_equal(osr_token_verify(kr, tok, len, NOW + 10000, 0, NULL), OSR_ETOKEN_SIGNATURE);
  osr_keyring_free(kr);
}

static void test_allows(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  osr_token_claims_t c, d;
  char tok[OSR_TOKEN_MAX + 1];
  claims_init(&c); /* exec + ports 8080, 3000 */
  sign(kr, &c, tok);
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  const char *sid = "abcdefghij0123456789";
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_EXEC, 0), 0);
  assert_int_equal(osr_token_allows(&d, "abcdefghij0123456788", OSR_SCOPE_EXEC, 0),
                   OSR_ETOKEN_SANDBOX);
  assert_int_equal(osr_token_allows(&d, "abcdefghij012345678", OSR_SCOPE_EXEC, 0),
                   OSR_ETOKEN_SANDBOX);
  assert_int_equal(osr_token_allows(&d, "", OSR_SCOPE_EXEC, 0), OSR_ETOKEN_SANDBOX);
  assert_int_equal(osr_token_allows(&d, NULL, OSR_SCOPE_EXEC, 0), OSR_ETOKEN_SANDBOX);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_FILES, 0), OSR_ETOKEN_SCOPE);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_EXEC | OSR_SCOPE_FILES, 0),
                   OSR_ETOKEN_SCOPE);
  assert_int_equal(osr_token_allows(&d, sid, 0, 0), OSR_ETOKEN_SCOPE);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 8080), 0);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 3000), 0);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 8081), OSR_ETOKEN_PORT);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 0), OSR_ETOKEN_PORT);
  /* Sandbox is checked before scope, scope before port. */
  assert_int_equal(osr_token_allows(&d, "other", OSR_SCOPE_FILES, 1), OSR_ETOKEN_SANDBOX);

  /* All ports. */
  claims_init(&c);
  c.nports = 0;
  c.all_ports = 1;
  sign(kr, &c, tok);
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 1), 0);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 65535), 0);
  /* Ports listed but the ports scope not granted. */
  claims_init(&c);
  c.scopes = OSR_SCOPE_EXEC;
  sign(kr, &c, tok);
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 8080), OSR_ETOKEN_SCOPE);
  /* No ports at all with the ports scope. */
  claims_init(&c);
  c.nports = 0;
  sign(kr, &c, tok);
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  assert_int_equal(osr_token_allows(&d, sid, OSR_SCOPE_PORTS, 8080), OSR_ETOKEN_PORT);
  osr_keyring_free(kr);
}

/* ---- keys ----------------------------------------------------------------- */

static void test_unknown_key_and_rotation(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  osr_token_claims_t c;
  char ta[OSR_TOKEN_MAX + 1], tb[OSR_TOKEN_MAX + 1];
  claims_init(&c);
  sign(kr, &c, ta);
  assert_string_equal(osr_keyring_active(kr), "ka");

  /* Unknown kid: a verify-only keyring without "ka". */
  osr_keyring_t *other = osr_keyring_new();
  assert_int_equal(osr_keyring_add_private(other, "kb", seed_b), 0);
  assert_int_equal(verify(other, ta, NOW, NULL), OSR_ETOKEN_UNKNOWN_KEY);
  osr_keyring_t *empty = osr_keyring_new();
  assert_int_equal(verify(empty, ta, NOW, NULL), OSR_ETOKEN_UNKNOWN_KEY);
  assert_int_equal(verify(NULL, ta, NOW, NULL), OSR_ETOKEN_UNKNOWN_KEY);
  osr_keyring_free(empty);

  /* Rotation: add kb, make it active; tokens of both keys verify. */
  assert_int_equal(osr_keyring_add_private(kr, "kb", seed_b), 0);
  assert_string_equal(osr_keyring_active(kr), "ka"); /* the first stays active */
  assert_int_equal(osr_keyring_set_active(kr, "kb"), 0);
  claims_init(&c);
  sign(kr, &c, tb);
  assert_string_equal(c.kid, "kb");
  assert_int_equal(verify(kr, ta, NOW, NULL), 0);
  assert_int_equal(verify(kr, tb, NOW, NULL), 0);
  assert_int_equal(osr_keyring_count(kr), 2);
  /* Retire ka: its tokens fail closed, kb's still verify. */
  assert_int_equal(osr_keyring_remove(kr, "ka"), 0);
  assert_int_equal(osr_keyring_remove(kr, "ka"), OSR_ENOENT);
  assert_int_equal(verify(kr, ta, NOW, NULL), OSR_ETOKEN_UNKNOWN_KEY);
  assert_int_equal(verify(kr, tb, NOW, NULL), 0);
  assert_string_equal(osr_keyring_active(kr), "kb");
  /* Removing the active key leaves no signer. */
  assert_int_equal(osr_keyring_remove(kr, "kb"), 0);
  assert_null(osr_keyring_active(kr));
  claims_init(&c);
  assert_int_equal(osr_token_sign(kr, &c, ta, sizeof(ta)), OSR_ETOKEN_UNKNOWN_KEY);

  /* Key id rules; a different key under a known kid; the cap. */
  assert_int_equal(osr_keyring_add_private(kr, "", seed_a), OSR_EINVAL);
  assert_int_equal(osr_keyring_add_private(kr, "a/b", seed_a), OSR_EINVAL);
  assert_int_equal(osr_keyring_add_private(kr, "0123456789012345678901234567890123", seed_a),
                   OSR_EINVAL);
  assert_int_equal(osr_keyring_add_private(kr, "ka", seed_a), 0);
  assert_int_equal(osr_keyring_add_private(kr, "ka", seed_a), 0); /* same key: fine */
  assert_int_equal(osr_keyring_add_private(kr, "ka", seed_b), OSR_EINVAL);
  assert_int_equal(osr_keyring_set_active(kr, "zz"), OSR_ENOENT);
  for (int i = 1; i < OSR_KEYRING_MAX; i++) {
    char kid[8];
    uint8_t s[32];
    memset(s, i, sizeof(s));
    snprintf(kid, sizeof(kid), "k%d", i);
    assert_int_equal(osr_keyring_add_private(kr, kid, s), 0);
  }
  uint8_t s[32] = {0};
  assert_int_equal(osr_keyring_add_private(kr, "full", s), OSR_ETOOLARGE);
  assert_int_equal(osr_keyring_count(kr), OSR_KEYRING_MAX);
  osr_keyring_free(other);
  osr_keyring_free(kr);
}

static void test_public_json(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  assert_int_equal(osr_keyring_add_private(kr, "kb", seed_b), 0);
  assert_int_equal(osr_keyring_set_active(kr, "kb"), 0);
  char *js = osr_keyring_public_json(kr);
  assert_non_null(js);
  assert_null(strstr(js, "0102030405")); /* no seed material */
  assert_non_null(strstr(js, "\"alg\":\"Ed25519\""));

  osr_keyring_t *dp = osr_keyring_new();
  assert_int_equal(osr_keyring_add_public_json(dp, js, strlen(js)), 0);
  assert_int_equal(osr_keyring_count(dp), 2);
  assert_null(osr_keyring_active(dp));                                  /* verify-only */
  assert_int_equal(osr_keyring_add_public_json(dp, js, strlen(js)), 0); /* refresh */
  assert_int_equal(osr_keyring_count(dp), 2);
  osr_token_claims_t c;
  char tok[OSR_TOKEN_MAX + 1];
  claims_init(&c);
  sign(kr, &c, tok);
  assert_int_equal(verify(dp, tok, NOW, NULL), 0);
  claims_init(&c);
  snprintf(c.kid, sizeof(c.kid), "%s", "ka");
  sign(kr, &c, tok);
  assert_int_equal(verify(dp, tok, NOW, NULL), 0);
  assert_int_equal(osr_token_sign(dp, &c, tok, sizeof(tok)), OSR_ETOKEN_UNKNOWN_KEY);

  /* Bad documents change nothing. */
  static const char *const bad[] = {
      "",
      "[]",
      "{\"keys\":{}}",
      "{\"keys\":[{\"kid\":\"kc\",\"alg\":\"RS256\",\"pub\":\""
      "00000000000000000000000000000000"
      "00000000000000000000000000000000\"}]}",
      "{\"keys\":[{\"kid\":\"kc\",\"alg\":\"Ed25519\",\"pub\":\"00\"}]}",
      "{\"keys\":[{\"kid\":\"k/c\",\"alg\":\"Ed25519\",\"pub\":\""
      "00000000000000000000000000000000"
      "00000000000000000000000000000000\"}]}",
      /* a good new key, then a known kid with a different key */
      "{\"keys\":[{\"kid\":\"kc\",\"alg\":\"Ed25519\",\"pub\":\""
      "11111111111111111111111111111111"
      "11111111111111111111111111111111\"},{\"kid\":\"ka\",\"alg\":\"Ed25519\",\"pub\":\""
      "22222222222222222222222222222222"
      "22222222222222222222222222222222\"}]}",
      /* the same kid twice */
      "{\"keys\":[{\"kid\":\"kc\",\"alg\":\"Ed25519\",\"pub\":\""
      "11111111111111111111111111111111"
      "11111111111111111111111111111111\"},{\"kid\":\"kc\",\"alg\":\"Ed25519\",\"pub\":\""
      "11111111111111111111111111111111"
      "11111111111111111111111111111111\"}]}",
  };
  for (size_t i = 0; i < OSR_ARRAY_SIZE(bad); i++) {
    assert_int_equal(osr_keyring_add_public_json(dp, bad[i], strlen(bad[i])), OSR_EINVAL);
    assert_int_equal(osr_keyring_count(dp), 2);
  }
  char *huge = osr_xcalloc(1, 70000);
  memset(huge, ' ', 69999);
  assert_int_equal(osr_keyring_add_public_json(dp, huge, 69999), OSR_ETOOLARGE);
  osr_free(huge);
  osr_free(js);
  osr_keyring_free(dp);
  osr_keyring_free(kr);
}

/* ---- malformed input ------------------------------------------------------ */

/* A token around an arbitrary payload, correctly signed with seed_a: only
 * the payload rules can refuse it. */
static void raw_token(const void *payload, size_t plen, char *out)
{
  memcpy(out, "osr1.", 5);
  int n = osr_b64url_encode(payload, plen, out + 5, OSR_TOKEN_MAX * 2);
  assert_true(n >= 0);
  EVP_PKEY *k = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed_a, 32);
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  uint8_t sig[64];
  size_t siglen = sizeof(sig);
  assert_int_equal(EVP_DigestSignInit(ctx, NULL, NULL, NULL, k), 1);
  assert_int_equal(EVP_DigestSign(ctx, sig, &siglen, (const uint8_t *)out, 5 + (size_t)n), 1);
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(k);
  out[5 + n] = '.';
  assert_int_equal(osr_b64url_encode(sig, 64, out + 6 + n, 100), 86);
}

static void pk_str(msgpack_packer *pk, const char *s)
{
  msgpack_pack_str(pk, strlen(s));
  msgpack_pack_str_body(pk, s, strlen(s));
}

/* Build a claims map with one deviation `k` (0 = none). */
static void build_payload(msgpack_sbuffer *sb, int k)
{
  msgpack_packer pk;
  msgpack_sbuffer_init(sb);
  msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
  int extra = (k == 1 || k == 2 || k == 14) ? 1 : 0;
  int missing = k == 3 ? 1 : 0;
  msgpack_pack_map(&pk, (size_t)(10 + extra - missing));
  pk_str(&pk, "sid");
  if (k == 4)
    msgpack_pack_uint32(&pk, 7);
  else if (k == 5)
    pk_str(&pk, "");
  else if (k == 6)
    pk_str(&pk, "0123456789012345678901234567890123456789"); /* 40 chars */
  else
    pk_str(&pk, "abcdefghij0123456789");
  pk_str(&pk, "ten");
  if (k == 7)
    msgpack_pack_bin(&pk, 4), msgpack_pack_bin_body(&pk, "acme", 4);
  else if (k == 8)
    msgpack_pack_str(&pk, 5), msgpack_pack_str_body(&pk, "ac\0me", 5);
  else
    pk_str(&pk, "acme");
  pk_str(&pk, "prv");
  pk_str(&pk, "sim");
  pk_str(&pk, "ep");
  pk_str(&pk, "http://127.0.0.1:1");
  pk_str(&pk, "scp");
  if (k == 9)
    msgpack_pack_uint32(&pk, 8);
  else if (k == 10)
    msgpack_pack_int32(&pk, -1);
  else
    msgpack_pack_uint32(&pk, 7);
  pk_str(&pk, "prt");
  if (k == 11) { /* depth 3 */
    msgpack_pack_array(&pk, 1);
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint16(&pk, 80);
  } else if (k == 12) {
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint16(&pk, 0);
    msgpack_pack_uint16(&pk, 80);
  } else if (k == 13) {
    msgpack_pack_array(&pk, 1);
    msgpack_pack_uint32(&pk, 70000);
  } else if (k == 15) {
    msgpack_pack_array(&pk, 0);
  } else if (k == 16) {
    msgpack_pack_array(&pk, 33);
    for (int i = 0; i < 33; i++)
      msgpack_pack_uint16(&pk, (uint16_t)(i + 1));
  } else {
    msgpack_pack_array(&pk, 2);
    msgpack_pack_uint16(&pk, 80);
    msgpack_pack_uint16(&pk, 443);
  }
  pk_str(&pk, "iat");
  if (k == 17)
    msgpack_pack_double(&pk, 1.5);
  else
    msgpack_pack_int64(&pk, NOW);
  pk_str(&pk, "exp");
  if (k == 18)
    msgpack_pack_uint64(&pk, UINT64_MAX);
  else if (k == 19)
    msgpack_pack_int64(&pk, NOW - 1); /* before iat */
  else
    msgpack_pack_int64(&pk, NOW + 60);
  pk_str(&pk, "kid");
  pk_str(&pk, "ka");
  if (!missing) {
    pk_str(&pk, "jti");
    pk_str(&pk, k == 20 ? "0123456789ABCDEF0123456789abcdef" : "0123456789abcdef0123456789abcdef");
  }
  if (k == 1) {
    pk_str(&pk, "sid"); /* duplicate */
    pk_str(&pk, "abcdefghij0123456789");
  } else if (k == 2) {
    pk_str(&pk, "adm"); /* unknown claim */
    msgpack_pack_true(&pk);
  } else if (k == 14) {
    msgpack_pack_uint8(&pk, 1); /* a non-string key */
    pk_str(&pk, "x");
  }
}

static void test_malformed(void **state)
{
  (void)state;
  osr_keyring_t *kr = ring_a();
  char tok[OSR_TOKEN_MAX * 3];
  msgpack_sbuffer sb;

  /* The hand-made payload is accepted when nothing is wrong with it... */
  build_payload(&sb, 0);
  raw_token(sb.data, sb.size, tok);
  osr_token_claims_t d;
  assert_int_equal(verify(kr, tok, NOW, &d), 0);
  assert_int_equal(d.nports, 2);
  assert_string_equal(d.provider, "sim");
  /* ...trailing bytes after the map are not. */
  char *more = osr_xmalloc(sb.size + 1);
  memcpy(more, sb.data, sb.size);
  more[sb.size] = 0x01;
  raw_token(more, sb.size + 1, tok);
  assert_int_equal(verify(kr, tok, NOW, NULL), OSR_ETOKEN_MALFORMED);
  /* Every truncation of the payload (signed as is) is refused. */
  for (size_t cut = 0; cut < sb.size; cut++) {
    raw_token(sb.data, cut, tok);
    assert_int_equal(verify(kr, tok, NOW, NULL), OSR_ETOKEN_MALFORMED);
  }
  osr_free(more);
  msgpack_sbuffer_destroy(&sb);
  /* ...and so is each single deviation, though correctly signed. */
  for (int k = 1; k <= 20; k++) {
    build_payload(&sb, k);
    raw_token(sb.data, sb.size, tok);
    int rv = verify(kr, tok, NOW, NULL);
    if (rv != OSR_ETOKEN_MALFORMED)
      fail_msg("deviation %d: %d", k, rv);
    msgpack_sbuffer_destroy(&sb);
  }

  /* Lying container counts and other hostile msgpack (msgpack-c would
   * allocate the declared count up front). */
  static const struct {
    const char *p;
    size_t n;
  } hostile[] = {
      {"\xdd\xff\xff\xff\xff", 5},             /* array32 of 4 G */
      {"\xdf\xff\xff\xff\xff", 5},             /* map32 of 4 G */
      {"\xde\xff\xff", 3},                     /* map16 of 64 K */
      {"\x81\xa3prt\xdd\x7f\xff\xff\xff", 10}, /* ports: array32 of 2 G */
      {"\x81\xa3sid\xdb\xff\xff\xff\xff", 10}, /* str32 of 4 G */
      {"\x91\x91\x91\x91\x91\x91\x91\x90", 8}, /* deep nesting */
      {"\xc0", 1},                             /* nil */
      {"\xc1", 1},                             /* never used */
      {"\xa3sid", 4},                          /* not a map */
      {"\x80", 1},                             /* empty map */
  };
  for (size_t i = 0; i < OSR_ARRAY_SIZE(hostile); i++) {
    raw_token(hostile[i].p, hostile[i].n, tok);
    assert_int_equal(verify(kr, tok, NOW, NULL), OSR_ETOKEN_MALFORMED);
  }

  /* Every truncation of a real token. */
  osr_token_claims_t c;
  char good[OSR_TOKEN_MAX + 1];
  claims_init(&c);
  int n = sign(kr, &c, good);
  for (int cut = 0; cut < n; cut++) {
    int rv = osr_token_verify(kr, good, (size_t)cut, NOW, 0, NULL);
    /* Inside the payload there is no second part; inside the signature
     * it decodes to fewer than 64 bytes (or is 1 mod 4 long). */
    assert_int_equal(rv, OSR_ETOKEN_MALFORMED);
  }
  assert_int_equal(osr_token_verify(kr, good, (size_t)n, NOW, 0, NULL), 0);

  /* Shapes. */
  static const char *const shapes[] = {
      "",
      "osr1",
      "osr1.",
      "osr1..",
      "osr2.AAAA.AAAA",
      "OSR1.AAAA.AAAA",
      "osr1.AAAA",
      "osr1.AAAA.",
      "osr1..AAAA",
      "osr1.AA=A.AAAA",
      "osr1.AAAA.AAAA.AAAA",
      " osr1.AAAA.AAAA",
  };
  for (size_t i = 0; i < OSR_ARRAY_SIZE(shapes); i++)
    assert_int_equal(verify(kr, shapes[i], NOW, NULL), OSR_ETOKEN_MALFORMED);
  assert_int_equal(osr_token_verify(kr, NULL, 10, NOW, 0, NULL), OSR_ETOKEN_MALFORMED);
  /* The signature part: too short, too long, extra dot. */
  const char *dot = strrchr(good, '.');
  char tmp[OSR_TOKEN_MAX * 3];
  snprintf(tmp, sizeof(tmp), "%.*sAAAA", (int)(dot - good + 1), good);
  assert_int_equal(verify(kr, tmp, NOW, NULL), OSR_ETOKEN_MALFORMED);
  snprintf(tmp, sizeof(tmp), "%sAAAA", good);
  assert_int_equal(verify(kr, tmp, NOW, NULL), OSR_ETOKEN_MALFORMED);
  snprintf(tmp, sizeof(tmp), "%.*s.%s", (int)(dot - good), good, dot);
  assert_int_equal(verify(kr, tmp, NOW, NULL), OSR_ETOKEN_MALFORMED);

  /* Huge tokens: refused on length, before any decoding. */
  char *huge = osr_xmalloc(1 << 20);
  memset(huge, 'A', 1 << 20);
  memcpy(huge, "osr1.", 5);
  huge[(1 << 19)] = '.';
  assert_int_equal(osr_token_verify(kr, huge, 1 << 20, NOW, 0, NULL), OSR_ETOKEN_MALFORMED);
  assert_int_equal(osr_token_verify(kr, huge, OSR_TOKEN_MAX + 1, NOW, 0, NULL),
                   OSR_ETOKEN_MALFORMED);
  osr_free(huge);
  /* A payload as big as the cap allows (big but valid msgpack: a long
   * string claim) is still refused for its content, without a crash. */
  uint8_t big[1400];
  big[0] = 0x81;
  big[1] = 0xa2;
  big[2] = 'e';
  big[3] = 'p';
  big[4] = 0xda;
  big[5] = (uint8_t)((sizeof(big) - 7) >> 8);
  big[6] = (uint8_t)((sizeof(big) - 7) & 0xff);
  memset(big + 7, 'x', sizeof(big) - 7);
  raw_token(big, sizeof(big), tok);
  assert_true(strlen(tok) <= OSR_TOKEN_MAX);
  assert_int_equal(verify(kr, tok, NOW, NULL), OSR_ETOKEN_MALFORMED);
  osr_keyring_free(kr);
}

/* ---- revocations ---------------------------------------------------------- */

static void test_revocations(void **state)
{
  (void)state;
  osr_revocations_t *r = osr_revocations_new(4, 100);
  assert_false(osr_revocations_contains(r, "s1", NOW));
  osr_revocations_add(r, "s1", NOW);
  assert_true(osr_revocations_contains(r, "s1", NOW));
  assert_true(osr_revocations_contains(r, "s1", NOW + 99));
  assert_false(osr_revocations_contains(r, "s1", NOW + 100)); /* expired */
  assert_true(osr_revocations_contains(r, "s1", NOW - 50));   /* clock went back: closed */
  assert_false(osr_revocations_contains(r, "s2", NOW));
  assert_false(osr_revocations_contains(r, "s", NOW));
  assert_false(osr_revocations_contains(r, NULL, NOW));
  /* Killed again later: the window restarts. */
  osr_revocations_add(r, "s1", NOW + 50);
  assert_true(osr_revocations_contains(r, "s1", NOW + 120));
  assert_int_equal(osr_revocations_count(r), 1);
  /* Over-long and empty ids are ignored. */
  osr_revocations_add(r, "0123456789012345678901234567890123456789", NOW);
  osr_revocations_add(r, "", NOW);
  assert_int_equal(osr_revocations_count(r), 1);
  /* The cap: the oldest goes first. */
  osr_revocations_add(r, "s2", NOW + 51);
  osr_revocations_add(r, "s3", NOW + 52);
  osr_revocations_add(r, "s4", NOW + 53);
  assert_int_equal(osr_revocations_count(r), 4);
  osr_revocations_add(r, "s5", NOW + 54);
  assert_int_equal(osr_revocations_count(r), 4);
  assert_int_equal(osr_revocations_evicted(r), 1);
  assert_false(osr_revocations_contains(r, "s1", NOW + 60));
  for (const char *const *s = (const char *const[]){"s2", "s3", "s4", "s5", NULL}; *s; s++)
    assert_true(osr_revocations_contains(r, *s, NOW + 60));
  /* Expired entries make room before anything is evicted. */
  osr_revocations_add(r, "s6", NOW + 152);
  assert_int_equal(osr_revocations_evicted(r), 1);
  assert_false(osr_revocations_contains(r, "s3", NOW + 152));
  assert_true(osr_revocations_contains(r, "s6", NOW + 152));
  osr_revocations_free(r);

  /* Many ids through a small list: the last `cap` are exactly what it
   * holds, whatever the hash collisions and deletions did. */
  r = osr_revocations_new(64, 1000000);
  char id[40];
  for (int i = 0; i < 5000; i++) {
    snprintf(id, sizeof(id), "sbx%05d", (i * 7919) % 100000);
    osr_revocations_add(r, id, NOW);
  }
  assert_int_equal(osr_revocations_count(r), 64);
  assert_int_equal(osr_revocations_evicted(r), 5000 - 64);
  for (int i = 0; i < 5000; i++) {
    snprintf(id, sizeof(id), "sbx%05d", (i * 7919) % 100000);
    assert_int_equal(osr_revocations_contains(r, id, NOW), i >= 5000 - 64);
  }
  osr_revocations_free(r);
  osr_revocations_free(NULL);
}

/* ---- the key directory ---------------------------------------------------- */

static char tmpdir[256];

static void rm_rf(const char *dir)
{
  DIR *d = opendir(dir);
  if (d == NULL)
    return;
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
      continue;
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
    rm_rf(p);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static void put_file(const char *dir, const char *name, const char *text, mode_t mode)
{
  char p[600];
  snprintf(p, sizeof(p), "%s/%s", dir, name);
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, mode);
  assert_true(fd >= 0);
  assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
}

static size_t count_suffix(const char *dir, const char *suffix, char *name_out)
{
  DIR *d = opendir(dir);
  assert_non_null(d);
  struct dirent *e;
  size_t n = 0;
  while ((e = readdir(d)) != NULL) {
    size_t l = strlen(e->d_name);
    if (l > strlen(suffix) && strcmp(e->d_name + l - strlen(suffix), suffix) == 0) {
      n++;
      if (name_out != NULL)
        snprintf(name_out, 64, "%s", e->d_name);
    }
  }
  closedir(d);
  return n;
}

static void test_key_dir(void **state)
{
  (void)state;
  char err[512], dir[400], name[64], p[600];
  snprintf(tmpdir, sizeof(tmpdir), "/tmp/osr-token-test-XXXXXX");
  assert_non_null(mkdtemp(tmpdir));
  snprintf(dir, sizeof(dir), "%s/a/keys", tmpdir);

  /* Without create, a missing directory is an error naming it. */
  osr_keyring_t *kr = osr_keyring_new();
  assert_true(osr_keyring_load_dir(kr, dir, 0, err, sizeof(err)) < 0);
  assert_non_null(strstr(err, dir));

  /* First start: a fresh key, mode 0600, named active; directory 0700. */
  assert_int_equal(osr_keyring_load_dir(kr, dir, 1, err, sizeof(err)), 0);
  assert_int_equal(osr_keyring_count(kr), 1);
  assert_non_null(osr_keyring_active(kr));
  assert_int_equal(count_suffix(dir, ".key", name), 1);
  struct stat st;
  snprintf(p, sizeof(p), "%s/%s", dir, name);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(st.st_size, 65);
  snprintf(p, sizeof(p), "%s/active", dir);
  assert_int_equal(stat(p, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0600);
  assert_int_equal(stat(dir, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  char kid[OSR_TOKEN_KID_MAX];
  snprintf(kid, sizeof(kid), "%s", osr_keyring_active(kr));
  assert_int_equal(strlen(name), strlen(kid) + 4);
  assert_memory_equal(name, kid, strlen(kid));

  osr_token_claims_t c;
  char tok[OSR_TOKEN_MAX + 1];
  claims_init(&c);
  sign(kr, &c, tok);

  /* Second start: the same key, nothing new written. */
  osr_keyring_t *kr2 = osr_keyring_new();
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), 0);
  assert_string_equal(osr_keyring_active(kr2), kid);
  assert_int_equal(verify(kr2, tok, NOW, NULL), 0);
  assert_int_equal(count_suffix(dir, ".key", NULL), 1);
  osr_keyring_free(kr2);

  /* Rotation on disk: a second private key, "active" names it; the old
   * one keeps verifying. A public-only key is loaded verify-only. */
  char hex[80];
  for (int i = 0; i < 32; i++)
    snprintf(hex + 2 * i, 3, "%02x", seed_b[i]);
  hex[64] = '\n';
  hex[65] = '\0';
  put_file(dir, "kb.key", hex, 0600);
  put_file(dir, "kp.pub", "  abababababababababababababababababababababababababababababababab \n",
           0644);
  put_file(dir, "README", "not a key", 0644);
  put_file(dir, "active", "kb\n", 0600);
  kr2 = osr_keyring_new();
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), 0);
  assert_int_equal(osr_keyring_count(kr2), 3);
  assert_string_equal(osr_keyring_active(kr2), "kb");
  assert_int_equal(verify(kr2, tok, NOW, NULL), 0);
  osr_keyring_free(kr2);

  /* Errors name the file and leave the keyring untouched. */
  kr2 = osr_keyring_new();
  assert_int_equal(osr_keyring_add_private(kr2, "mine", seed_a), 0);
  put_file(dir, "active", "kp\n", 0600); /* a public key cannot sign */
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), OSR_EINVAL);
  assert_non_null(strstr(err, "active"));
  assert_int_equal(osr_keyring_count(kr2), 1);
  assert_string_equal(osr_keyring_active(kr2), "mine");
  snprintf(p, sizeof(p), "%s/active", dir);
  unlink(p);
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), OSR_EINVAL);
  assert_non_null(strstr(err, "several private keys"));
  put_file(dir, "active", "kb\n", 0600);
  put_file(dir, "kq.pub", "abcd\n", 0644);
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), OSR_EINVAL);
  assert_non_null(strstr(err, "kq.pub"));
  snprintf(p, sizeof(p), "%s/kq.pub", dir);
  unlink(p);
  put_file(dir, "bad.id.key", hex, 0600);
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), OSR_EINVAL);
  assert_non_null(strstr(err, "bad.id.key"));
  snprintf(p, sizeof(p), "%s/bad.id.key", dir);
  unlink(p);
  /* A .pub that contradicts its .key. */
  put_file(dir, "kb.pub", "abababababababababababababababababababababababababababababababab\n",
           0644);
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), OSR_EINVAL);
  assert_non_null(strstr(err, "kb.pub"));
  snprintf(p, sizeof(p), "%s/kb.pub", dir);
  unlink(p);
  assert_int_equal(osr_keyring_count(kr2), 1);
  assert_int_equal(osr_keyring_load_dir(kr2, dir, 1, err, sizeof(err)), 0);
  assert_int_equal(osr_keyring_count(kr2), 3); /* replaced, not merged */
  osr_keyring_free(kr2);

  /* A public-only directory (what a data plane may mount). */
  char pubdir[400];
  snprintf(pubdir, sizeof(pubdir), "%s/pub", tmpdir);
  assert_int_equal(mkdir(pubdir, 0700), 0);
  char *js = osr_keyring_public_json(kr);
  const char *ph = strstr(js, "\"pub\":\"");
  assert_non_null(ph);
  char line[80];
  snprintf(line, sizeof(line), "%.64s\n", ph + 7);
  snprintf(name, sizeof(name), "%s.pub", kid);
  /* As Kubernetes mounts a Secret: the file is a link into "..data". */
  char datadir[450], target[600], link[600];
  snprintf(datadir, sizeof(datadir), "%s/..data", pubdir);
  assert_int_equal(mkdir(datadir, 0700), 0);
  put_file(datadir, name, line, 0644);
  snprintf(target, sizeof(target), "..data/%s", name);
  snprintf(link, sizeof(link), "%s/%s", pubdir, name);
  assert_int_equal(symlink(target, link), 0);
  kr2 = osr_keyring_new();
  assert_int_equal(osr_keyring_load_dir(kr2, pubdir, 0, err, sizeof(err)), 0);
  assert_null(osr_keyring_active(kr2));
  assert_int_equal(verify(kr2, tok, NOW, NULL), 0);
  osr_keyring_free(kr2);
  osr_free(js);

  osr_keyring_free(kr);
  rm_rf(tmpdir);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_round_trip),  cmocka_unit_test(test_sign_errors),
      cmocka_unit_test(test_forgery),     cmocka_unit_test(test_expiry),
      cmocka_unit_test(test_allows),      cmocka_unit_test(test_unknown_key_and_rotation),
      cmocka_unit_test(test_public_json), cmocka_unit_test(test_malformed),
      cmocka_unit_test(test_revocations), cmocka_unit_test(test_key_dir),
      cmocka_unit_test(test_signature_is_rfc8032),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
