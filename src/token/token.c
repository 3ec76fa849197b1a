/*
 * Binding tokens: claims ⇄ msgpack, Ed25519 signing and offline
 * verification (token.h has the wire format).
 *
 * The verifier is the part that faces attackers, so it is written to fail
 * closed at every step and to bound all work before any of it happens:
 *   1. the token's length is capped (OSR_TOKEN_MAX) and its shape checked
 *      ("osr1." b64url "." b64url, strict base64url, a 64-byte signature);
 *   2. the payload's msgpack is walked once by skim() below, which accepts
 *      only integers, strings, and arrays/maps whose element counts fit in
 *      the bytes that remain, at most two levels deep. Only then is it
 *      handed to msgpack-c: msgpack-c allocates a container's element array
 *      from the declared count before reading any element, so a 5-byte
 *      "array of 4 billion" would otherwise ask for ~100 GB;
 *   3. the map must hold exactly the known claims, once each, with the
 *      right types and sizes (decode_claims);
 *   4. the key named by "kid" must be in the keyring (unknown → fail);
 *   5. the signature is checked over the exact received bytes before any
 *      claim is returned to the caller. Steps 2-3 read the payload before
 *      the signature is known to be good, but only to find the key: nothing
 *      from it leaves this file until step 5 passed;
 *   6. expiry and issued-at are checked against the caller's clock.
 * Ed25519 verification in BoringSSL and OpenSSL runs in constant time with
 * respect to the signature and key; nothing here compares secrets with
 * memcmp.
 */
#include <msgpack.h>
#include <openssl/rand.h>
#ifdef OSR_HAVE_SODIUM
#include <sodium.h>
#endif
#include <stdio.h>
#include <string.h>

#include "token/token_int.h"
#include "util/base64.h"

#define PREFIX     "osr1."
#define PREFIX_LEN 5
#define SIG_LEN    64
/* The most claims a payload may hold (there are ten names). */
#define CLAIMS_MAX 10
/* Decoded payload buffer: whatever fits in the longest token. */
#define PAYLOAD_BUF OSR_B64URL_DEC_MAX(OSR_TOKEN_MAX)

const char *osr_token_strerror(int err)
{
  switch (err) {
  case 0:
    return "ok";
  case OSR_ETOKEN_MALFORMED:
    return "malformed token";
  case OSR_ETOKEN_SIGNATURE:
    return "bad token signature";
  case OSR_ETOKEN_EXPIRED:
    return "token expired";
  case OSR_ETOKEN_UNKNOWN_KEY:
    return "token signed by an unknown key";
  case OSR_ETOKEN_REVOKED:
    return "token revoked";
  case OSR_ETOKEN_SANDBOX:
    return "token is for another sandbox";
  case OSR_ETOKEN_SCOPE:
    return "scope not granted by the token";
  case OSR_ETOKEN_PORT:
    return "port not granted by the token";
  default:
    return osr_strerror(err);
  }
}

/* ---- claim limits (shared by the signer and the verifier) ----------------- */

/* Identifiers (sandbox id, tenant, provider, kid, jti): printable ASCII
 * without spaces. The agent endpoint may contain spaces (a unix socket
 * path) but no control characters. The terminating NUL must fit in `cap`. */
static int str_ok(const char *s, size_t n, size_t cap, int allow_space, int allow_empty)
{
  if (n >= cap || (n == 0 && !allow_empty))
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x20 || c > 0x7e || (c == ' ' && !allow_space))
      return 0;
  }
  return 1;
}

static int jti_ok(const char *s, size_t n)
{
  if (n != 32)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
      return 0;
  return 1;
}

/* Everything the verifier will insist on, checked before signing so the
 * gateway never hands out a token the data plane refuses. */
static int claims_valid(const osr_token_claims_t *c)
{
  if (!str_ok(c->sandbox_id, strnlen(c->sandbox_id, sizeof(c->sandbox_id)), sizeof(c->sandbox_id),
              0, 0) ||
      !str_ok(c->tenant, strnlen(c->tenant, sizeof(c->tenant)), sizeof(c->tenant), 0, 1) ||
      !str_ok(c->provider, strnlen(c->provider, sizeof(c->provider)), sizeof(c->provider), 0, 1) ||
      !str_ok(c->agent_endpoint, strnlen(c->agent_endpoint, sizeof(c->agent_endpoint)),
              sizeof(c->agent_endpoint), 1, 1) ||
      !osr__kid_valid(c->kid, strnlen(c->kid, sizeof(c->kid))) ||
      !jti_ok(c->jti, strnlen(c->jti, sizeof(c->jti))))
    return 0;
  if ((c->scopes & ~(unsigned)OSR_SCOPE_ALL) != 0 || c->nports > OSR_TOKEN_PORTS_MAX)
    return 0;
  if (c->all_ports && c->nports != 0)
    return 0;
  for (size_t i = 0; i < c->nports; i++)
    if (c->ports[i] == 0)
      return 0;
  return c->exp >= c->iat;
}

/* ---- encoding ------------------------------------------------------------- */

/* msgpack-c writes through a callback; this one fills a fixed buffer and
 * fails past its end, so encoding never allocates and never grows. */
typedef struct wbuf_s {
  char *p;
  size_t len, cap;
} wbuf_t;

static int wbuf_write(void *data, const char *buf, size_t len)
{
  wbuf_t *w = data;
  if (len > w->cap - w->len)
    return -1;
  memcpy(w->p + w->len, buf, len);
  w->len += len;
  return 0;
}

static int pack_str(msgpack_packer *pk, const char *s)
{
  size_t n = strlen(s);
  return msgpack_pack_str(pk, n) != 0 || msgpack_pack_str_body(pk, s, n) != 0 ? -1 : 0;
}

static int pack_kv_str(msgpack_packer *pk, const char *k, const char *v)
{
  return pack_str(pk, k) != 0 || pack_str(pk, v) != 0 ? -1 : 0;
}

/* The payload map. Keys in a fixed order (not required by the decoder, but
 * it keeps equal claims encoding to equal bytes). Returns its length. */
static int encode_claims(const osr_token_claims_t *c, char *out, size_t cap)
{
  wbuf_t w = {out, 0, cap};
  msgpack_packer pk;
  msgpack_packer_init(&pk, &w, wbuf_write);
  int has_ports = c->all_ports || c->nports > 0;
  int rv = msgpack_pack_map(&pk, has_ports ? 10 : 9);
  rv |= pack_kv_str(&pk, "sid", c->sandbox_id);
  rv |= pack_kv_str(&pk, "ten", c->tenant);
  rv |= pack_kv_str(&pk, "prv", c->provider);
  rv |= pack_kv_str(&pk, "ep", c->agent_endpoint);
  rv |= pack_str(&pk, "scp") | msgpack_pack_uint64(&pk, c->scopes);
  if (has_ports) {
    rv |= pack_str(&pk, "prt");
    if (c->all_ports) {
      rv |= msgpack_pack_array(&pk, 1) | msgpack_pack_uint16(&pk, 0);
    } else {
      rv |= msgpack_pack_array(&pk, c->nports);
      for (size_t i = 0; i < c->nports; i++)
        rv |= msgpack_pack_uint16(&pk, c->ports[i]);
    }
  }
  rv |= pack_str(&pk, "iat") | msgpack_pack_int64(&pk, c->iat);
  rv |= pack_str(&pk, "exp") | msgpack_pack_int64(&pk, c->exp);
  rv |= pack_kv_str(&pk, "kid", c->kid);
  rv |= pack_kv_str(&pk, "jti", c->jti);
  return rv != 0 ? OSR_E2BIG : (int)w.len;
}

/* ---- decoding ------------------------------------------------------------- */

static int need(size_t off, size_t n, size_t len)
{
  return n <= len - off;
}

/* Walk one msgpack object at *off without building anything: check its
 * type is one we use, that every length fits in what is left, and that
 * containers nest at most `depth` more levels. Returns 0 or -1. */
static int skim(const uint8_t *p, size_t len, size_t *off, int depth)
{
  if (*off >= len)
    return -1;
  uint8_t t = p[(*off)++];
  size_t n = 0, count = 0;
  int container = 0; /* 1 array, 2 map */
  if (t <= 0x7f || t >= 0xe0)
    return 0; /* fixint */
  if ((t & 0xe0) == 0xa0) {
    n = t & 0x1f; /* fixstr */
  } else if ((t & 0xf0) == 0x90) {
    container = 1;
    count = t & 0x0f;
  } else if ((t & 0xf0) == 0x80) {
    container = 2;
    count = t & 0x0f;
  } else {
    size_t w; /* width of the value or length that follows */
    if (t >= 0xcc && t <= 0xcf)
      w = (size_t)1 << (t - 0xcc); /* uint8, 16, 32, 64 */
    else if (t >= 0xd0 && t <= 0xd3)
      w = (size_t)1 << (t - 0xd0); /* int8, 16, 32, 64 */
    else if (t == 0xd9)
      w = 1; /* str8 */
    else if (t == 0xda || t == 0xdc || t == 0xde)
      w = 2; /* str16, array16, map16 */
    else if (t == 0xdb || t == 0xdd || t == 0xdf)
      w = 4; /* str32, array32, map32 */
    else
      return -1; /* nil, bool, float, bin, ext: never in a token */
    if (!need(*off, w, len))
      return -1;
    if (t >= 0xcc && t <= 0xd3) {
      *off += w;
      return 0;
    }
    size_t v = 0;
    for (size_t i = 0; i < w; i++)
      v = v << 8 | p[*off + i];
    *off += w;
    if (t == 0xdc || t == 0xdd) {
      container = 1;
      count = v;
    } else if (t == 0xde || t == 0xdf) {
      container = 2;
      count = v;
    } else {
      n = v;
    }
  }
  if (!container) {
    if (!need(*off, n, len))
      return -1;
    *off += n;
    return 0;
  }
  /* Every element takes at least one byte: a count larger than what is
   * left is a lie, refused before anything is allocated for it. */
  if (depth <= 0 || count > (len - *off) / (size_t)container)
    return -1;
  for (size_t i = 0; i < count * (size_t)container; i++)
    if (skim(p, len, off, depth - 1) != 0)
      return -1;
  return 0;
}

/* Copy a msgpack string into a fixed field after the same checks the
 * signer applies. */
static int take_str(const msgpack_object *o, char *dst, size_t cap, int allow_space,
                    int allow_empty)
{
  if (o->type != MSGPACK_OBJECT_STR ||
      !str_ok(o->via.str.ptr, o->via.str.size, cap, allow_space, allow_empty))
    return -1;
  memcpy(dst, o->via.str.ptr, o->via.str.size);
  dst[o->via.str.size] = '\0';
  return 0;
}

static int take_int(const msgpack_object *o, int64_t *out)
{
  if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
    if (o->via.u64 > (uint64_t)INT64_MAX)
      return -1;
    *out = (int64_t)o->via.u64;
    return 0;
  }
  if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
    *out = o->via.i64;
    return 0;
  }
  return -1;
}

static int take_ports(const msgpack_object *o, osr_token_claims_t *c)
{
  if (o->type != MSGPACK_OBJECT_ARRAY || o->via.array.size == 0 ||
      o->via.array.size > OSR_TOKEN_PORTS_MAX)
    return -1;
  for (uint32_t i = 0; i < o->via.array.size; i++) {
    const msgpack_object *e = &o->via.array.ptr[i];
    if (e->type != MSGPACK_OBJECT_POSITIVE_INTEGER || e->via.u64 > 65535)
      return -1;
    if (e->via.u64 == 0) {
      /* [0] means every port; 0 beside real ports is ambiguous. */
      if (o->via.array.size != 1)
        return -1;
      c->all_ports = 1;
      return 0;
    }
    c->ports[c->nports++] = (uint16_t)e->via.u64;
  }
  return 0;
}

enum {
  C_SID = 1 << 0,
  C_TEN = 1 << 1,
  C_PRV = 1 << 2,
  C_EP = 1 << 3,
  C_SCP = 1 << 4,
  C_PRT = 1 << 5,
  C_IAT = 1 << 6,
  C_EXP = 1 << 7,
  C_KID = 1 << 8,
  C_JTI = 1 << 9,
  C_REQUIRED = C_SID | C_TEN | C_PRV | C_EP | C_SCP | C_IAT | C_EXP | C_KID | C_JTI,
};

static int claim_bit(const msgpack_object *k)
{
  static const char *const names[] = {"sid", "ten", "prv", "ep",  "scp",
                                      "prt", "iat", "exp", "kid", "jti"};
  if (k->type != MSGPACK_OBJECT_STR)
    return 0;
  for (size_t i = 0; i < OSR_ARRAY_SIZE(names); i++)
    if (k->via.str.size == strlen(names[i]) &&
        memcmp(k->via.str.ptr, names[i], k->via.str.size) == 0)
      return 1 << i;
  return 0;
}

static int decode_claims(const uint8_t *p, size_t len, osr_token_claims_t *c)
{
  size_t off = 0;
  /* Depth 2: the claims map, and the ports array inside it. */
  if (skim(p, len, &off, 2) != 0 || off != len || len == 0 || (p[0] & 0xf0) != 0x80)
    return -1;
  memset(c, 0, sizeof(*c));
  msgpack_unpacked up;
  msgpack_unpacked_init(&up);
  off = 0;
  int rv = -1;
  if (msgpack_unpack_next(&up, (const char *)p, len, &off) != MSGPACK_UNPACK_SUCCESS ||
      off != len || up.data.type != MSGPACK_OBJECT_MAP || up.data.via.map.size > CLAIMS_MAX)
    goto out;
  int seen = 0;
  for (uint32_t i = 0; i < up.data.via.map.size; i++) {
    const msgpack_object *k = &up.data.via.map.ptr[i].key;
    const msgpack_object *v = &up.data.via.map.ptr[i].val;
    int bit = claim_bit(k);
    if (bit == 0 || (seen & bit) != 0)
      goto out; /* an unknown claim could be a restriction we would miss */
    seen |= bit;
    int64_t n = 0;
    int bad = 0;
    switch (bit) {
    case C_SID:
      bad = take_str(v, c->sandbox_id, sizeof(c->sandbox_id), 0, 0);
      break;
    case C_TEN:
      bad = take_str(v, c->tenant, sizeof(c->tenant), 0, 1);
      break;
    case C_PRV:
      bad = take_str(v, c->provider, sizeof(c->provider), 0, 1);
      break;
    case C_EP:
      bad = take_str(v, c->agent_endpoint, sizeof(c->agent_endpoint), 1, 1);
      break;
    case C_KID:
      bad = take_str(v, c->kid, sizeof(c->kid), 0, 0);
      break;
    case C_JTI:
      bad = take_str(v, c->jti, sizeof(c->jti), 0, 0);
      break;
    case C_SCP:
      bad = v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > OSR_SCOPE_ALL;
      if (!bad)
        c->scopes = (unsigned)v->via.u64;
      break;
    case C_PRT:
      bad = take_ports(v, c);
      break;
    case C_IAT:
      bad = take_int(v, &n);
      c->iat = n;
      break;
    case C_EXP:
      bad = take_int(v, &n);
      c->exp = n;
      break;
    default:
      bad = 1;
      break;
    }
    if (bad)
      goto out;
  }
  if ((seen & C_REQUIRED) != C_REQUIRED || !claims_valid(c))
    goto out;
  rv = 0;
out:
  msgpack_unpacked_destroy(&up);
  return rv;
}

/* ---- signing -------------------------------------------------------------- */

/* With libsodium the signature costs 0.63x EVP_DigestSign's CPU, the same
 * bytes (bench/README.md, "Token signing with libsodium"). */
static int ed25519_sign(const osr__key_t *key, const char *msg, size_t len, uint8_t sig[SIG_LEN])
{
#ifdef OSR_HAVE_SODIUM
  int rv = crypto_sign_detached(sig, NULL, (const uint8_t *)msg, len, key->sodium_sk);
  return rv == 0 ? 0 : OSR_ENOMEM;
#else
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  size_t siglen = SIG_LEN;
  int ok = ctx != NULL && EVP_DigestSignInit(ctx, NULL, NULL, NULL, key->sign_key) == 1 &&
           EVP_DigestSign(ctx, sig, &siglen, (const uint8_t *)msg, len) == 1 && siglen == SIG_LEN;
  EVP_MD_CTX_free(ctx);
  return ok ? 0 : OSR_ENOMEM;
#endif
}

static int ed25519_verify(EVP_PKEY *key, const char *msg, size_t len, const uint8_t sig[SIG_LEN])
{
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  int ok = ctx != NULL && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, key) == 1 &&
           EVP_DigestVerify(ctx, sig, SIG_LEN, (const uint8_t *)msg, len) == 1;
  EVP_MD_CTX_free(ctx);
  return ok;
}

int osr_token_sign(const osr_keyring_t *kr, osr_token_claims_t *c, char *out, size_t outlen)
{
  if (kr == NULL || c == NULL || out == NULL)
    return OSR_EINVAL;
  const osr__key_t *key;
  if (c->kid[0] == '\0') {
    if (kr->active < 0)
      return OSR_ETOKEN_UNKNOWN_KEY;
    key = &kr->keys[kr->active];
    snprintf(c->kid, sizeof(c->kid), "%s", key->kid);
  } else {
    key = osr__keyring_find(kr, c->kid, strnlen(c->kid, sizeof(c->kid)));
    if (key == NULL || key->sign_key == NULL)
      return OSR_ETOKEN_UNKNOWN_KEY;
  }
  if (c->jti[0] == '\0') {
    uint8_t r[16];
    if (RAND_bytes(r, sizeof(r)) != 1)
      return OSR_ENOMEM;
    osr__hex(r, sizeof(r), c->jti);
  }
  if (!claims_valid(c))
    return OSR_EINVAL;

  char payload[OSR_TOKEN_PAYLOAD_MAX];
  int plen = encode_claims(c, payload, sizeof(payload));
  if (plen < 0)
    return OSR_EINVAL; /* cannot happen within the field sizes; fail safe */
  size_t need_len = PREFIX_LEN + OSR_B64URL_ENC_LEN((size_t)plen) + 1 + OSR_B64URL_ENC_LEN(SIG_LEN);
  if (need_len >= outlen)
    return OSR_E2BIG;
  memcpy(out, PREFIX, PREFIX_LEN);
  int n = osr_b64url_encode(payload, (size_t)plen, out + PREFIX_LEN, outlen - PREFIX_LEN);
  if (n < 0)
    return n;
  size_t signed_len = PREFIX_LEN + (size_t)n;
  uint8_t sig[SIG_LEN];
  int rv = ed25519_sign(key, out, signed_len, sig);
  if (rv != 0)
    return rv;
  out[signed_len] = '.';
  n = osr_b64url_encode(sig, SIG_LEN, out + signed_len + 1, outlen - signed_len - 1);
  if (n < 0)
    return n;
  return (int)(signed_len + 1 + (size_t)n);
}

/* ---- verification --------------------------------------------------------- */

int osr_token_verify(const osr_keyring_t *kr, const char *tok, size_t len, int64_t now_s,
                     int64_t leeway_s, osr_token_claims_t *out)
{
  if (tok == NULL || len <= PREFIX_LEN || len > OSR_TOKEN_MAX ||
      memcmp(tok, PREFIX, PREFIX_LEN) != 0)
    return OSR_ETOKEN_MALFORMED;
  const char *body = tok + PREFIX_LEN;
  const char *dot = memchr(body, '.', len - PREFIX_LEN);
  if (dot == NULL)
    return OSR_ETOKEN_MALFORMED;
  size_t blen = (size_t)(dot - body);
  size_t slen = len - PREFIX_LEN - blen - 1;

  uint8_t payload[PAYLOAD_BUF], sig[SIG_LEN];
  int plen = osr_b64url_decode(body, blen, payload, sizeof(payload));
  if (plen <= 0 || osr_b64url_decode(dot + 1, slen, sig, sizeof(sig)) != SIG_LEN)
    return OSR_ETOKEN_MALFORMED; /* a third '.' fails the strict alphabet */

  osr_token_claims_t c;
  if (decode_claims(payload, (size_t)plen, &c) != 0)
    return OSR_ETOKEN_MALFORMED;
  const osr__key_t *key = osr__keyring_find(kr, c.kid, strlen(c.kid));
  if (key == NULL)
    return OSR_ETOKEN_UNKNOWN_KEY;
  if (!ed25519_verify(key->verify_key, tok, PREFIX_LEN + blen, sig))
    return OSR_ETOKEN_SIGNATURE;

  /* Clock skew between gateway and data plane is tolerated up to leeway_s
   * in both directions; overflow-safe since exp comes from the token. */
  if (leeway_s < 0)
    leeway_s = 0;
  int64_t late, early;
  if (__builtin_sub_overflow(now_s, leeway_s, &late) || late >= c.exp)
    return OSR_ETOKEN_EXPIRED;
  if (!__builtin_add_overflow(now_s, leeway_s, &early) && c.iat > early)
    return OSR_ETOKEN_EXPIRED; /* not valid yet */
  if (out != NULL)
    *out = c;
  return 0;
}

int osr_token_allows(const osr_token_claims_t *c, const char *sandbox_id, unsigned scope,
                     uint16_t port)
{
  if (c == NULL || sandbox_id == NULL || strcmp(c->sandbox_id, sandbox_id) != 0)
    return OSR_ETOKEN_SANDBOX;
  if (scope == 0 || (c->scopes & scope) != scope)
    return OSR_ETOKEN_SCOPE;
  if (scope & OSR_SCOPE_PORTS) {
    if (c->all_ports)
      return 0;
    for (size_t i = 0; i < c->nports && i < OSR_TOKEN_PORTS_MAX; i++)
      if (c->ports[i] == port && port != 0)
        return 0;
    return OSR_ETOKEN_PORT;
  }
  return 0;
}
