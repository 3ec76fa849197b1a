/*
 * Binding tokens: what the gateway signs and the data plane verifies offline.
 *
 * A token grants its bearer access to one sandbox's data plane (exec, files,
 * ports) until it expires. It is also what the E2B-compatible front door
 * hands out as `envdAccessToken`, so the e2b SDK sends it as X-Access-Token.
 *
 * Wire format (ASCII, URL- and header-safe):
 *     "osr1." base64url(payload) "." base64url(signature)
 * payload = a msgpack map (msgpack-c) with short keys:
 *     "sid" sandbox id, "ten" tenant, "prv" provider, "ep" agent endpoint,
 *     "scp" scope bits (uint), "prt" array of allowed ports (absent = none,
 *     [0] = all), "iat"/"exp" unix seconds, "kid" key id, "jti" token id
 * signature = Ed25519 over the bytes "osr1." base64url(payload), with the
 * key named by "kid" (EVP_PKEY_ED25519 in BoringSSL and OpenSSL 3).
 *
 * Verification is offline: a keyring of public keys (several active at once
 * for rotation); an unknown kid fails closed. Decoding is bounded (token
 * length, msgpack depth and sizes) and never trusts the payload before the
 * signature checked out.
 */
#ifndef OSR_TOKEN_TOKEN_H
#define OSR_TOKEN_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#include "osr/common.h"

/* Longest token accepted: room for an agent endpoint of 1023 bytes, which a
 * sealed upstream credential (below) can need. */
#define OSR_TOKEN_MAX     2560
#define OSR_TOKEN_KID_MAX 32
/* Longest msgpack payload osr_token_sign produces (every claim at its
 * maximum size needs about 1430 bytes); the verifier accepts what fits in
 * OSR_TOKEN_MAX. */
#define OSR_TOKEN_PAYLOAD_MAX 1536
/* Most keys one keyring holds (active + rotated-out keys still verifying). */
#define OSR_KEYRING_MAX 16

/* Token errors (the data plane maps them to 401 / 403). */
#define OSR_ETOKEN_MALFORMED   (-32001) /* 401 */
#define OSR_ETOKEN_SIGNATURE   (-32002) /* 401 */
#define OSR_ETOKEN_EXPIRED     (-32003) /* 401 */
#define OSR_ETOKEN_UNKNOWN_KEY (-32004) /* 401: kid not in the keyring */
#define OSR_ETOKEN_REVOKED     (-32005) /* 401 */
#define OSR_ETOKEN_SANDBOX     (-32006) /* 403: token for another sandbox */
#define OSR_ETOKEN_SCOPE       (-32007) /* 403: scope not granted */
#define OSR_ETOKEN_PORT        (-32008) /* 403: port not granted */

const char *osr_token_strerror(int err);

enum {
  OSR_SCOPE_EXEC = 1u << 0,
  OSR_SCOPE_FILES = 1u << 1,
  OSR_SCOPE_PORTS = 1u << 2,
  OSR_SCOPE_ALL = OSR_SCOPE_EXEC | OSR_SCOPE_FILES | OSR_SCOPE_PORTS,
};

#define OSR_TOKEN_PORTS_MAX 32

typedef struct osr_token_claims_s {
  char sandbox_id[40];
  char tenant[64];
  char provider[64];
  char agent_endpoint[1024]; /* may carry a sealed upstream credential */
  unsigned scopes;
  uint16_t ports[OSR_TOKEN_PORTS_MAX]; /* allowed ports when !all_ports */
  size_t nports;
  int all_ports;
  int64_t iat; /* unix seconds */
  int64_t exp;
  char kid[OSR_TOKEN_KID_MAX];
  char jti[33]; /* 32 hex chars */
} osr_token_claims_t;

typedef struct osr_keyring_s osr_keyring_t;

/** An empty keyring. */
osr_keyring_t *osr_keyring_new(void);
void osr_keyring_free(osr_keyring_t *kr);

/** Add a signing key (32-byte Ed25519 seed) under `kid`; the public half is
 *  derived. The first signing key added is the one osr_token_sign uses
 *  unless osr_keyring_set_active() says otherwise. */
int osr_keyring_add_private(osr_keyring_t *kr, const char *kid, const uint8_t seed[32]);
/** Add a verify-only key (32-byte Ed25519 public key). */
int osr_keyring_add_public(osr_keyring_t *kr, const char *kid, const uint8_t pub[32]);
int osr_keyring_set_active(osr_keyring_t *kr, const char *kid);
/** (Additive.) Drop the key `kid`: tokens it signed fail closed with
 *  OSR_ETOKEN_UNKNOWN_KEY from now on. Removing the active key leaves the
 *  keyring without a signing key until osr_keyring_set_active(). Returns 0 or
 *  OSR_ENOENT. */
int osr_keyring_remove(osr_keyring_t *kr, const char *kid);
/** (Additive.) Number of keys (private and public-only). */
size_t osr_keyring_count(const osr_keyring_t *kr);
/** (Additive.) The kid osr_token_sign uses, or NULL without a signing key.
 *  Valid until the keyring changes. */
const char *osr_keyring_active(const osr_keyring_t *kr);

/* Key ids are 1..31 characters of [A-Za-z0-9_-] (they are file names in a
 * key directory). Adding a kid that is already present succeeds only with
 * the same public key (a refresh); a different key under a known kid is
 * OSR_EINVAL. A full keyring (OSR_KEYRING_MAX) answers OSR_ETOOLARGE.
 * Keyrings are not locked: build one, then share it read-only (verify and
 * sign may run on several threads at once); to change keys, build a new one
 * and swap the pointer. */

/**
 * Load keys from a directory (off the loop thread: call from a worker or at
 * start-up): every "<kid>.key" file holds a 64-hex-char seed (a private key)
 * and every "<kid>.pub" 64 hex chars (public). "active" (optional) names the
 * signing kid. With `create` set and no private key present, a new key is
 * generated and written (mode 0600). Returns 0 or an error naming the file
 * in `err`.
 */
int osr_keyring_load_dir(osr_keyring_t *kr, const char *dir, int create, char *err, size_t errlen);

/** Public keys as JSON text {"keys":[{"kid":..,"alg":"Ed25519","pub":hex}]}
 *  (for distributing to data planes). Heap string (osr_free). */
char *osr_keyring_public_json(const osr_keyring_t *kr);
/** Load public keys from that JSON (at most 64 KiB; every entry is checked
 *  before any is added, so a bad document changes nothing). Returns 0,
 *  OSR_EINVAL or OSR_ETOOLARGE. */
int osr_keyring_add_public_json(osr_keyring_t *kr, const char *json, size_t len);

/** Sign `c` (kid and jti are filled in if empty). `out` gets a NUL-terminated
 *  token; returns its length or an error (OSR_E2BIG if outlen is too small;
 *  OSR_EINVAL if a claim breaks the limits the verifier enforces: empty
 *  sandbox id, a string too long or with control characters, scope bits
 *  outside OSR_SCOPE_ALL, port 0 in the list, more than OSR_TOKEN_PORTS_MAX
 *  ports, exp < iat; OSR_ETOKEN_UNKNOWN_KEY if the keyring has no private
 *  key for the kid, or no active key). OSR_TOKEN_MAX + 1 bytes always
 *  suffice. */
int osr_token_sign(const osr_keyring_t *kr, osr_token_claims_t *c, char *out, size_t outlen);

/** Verify signature and expiry (with `leeway_s` seconds of clock skew) and
 *  decode the claims. Returns 0 or an OSR_ETOKEN_* code: MALFORMED (not
 *  "osr1.<b64url>.<b64url>", longer than OSR_TOKEN_MAX, a payload that is
 *  not a map of exactly the known claims with the right types and sizes),
 *  UNKNOWN_KEY, SIGNATURE, EXPIRED (now >= exp + leeway, or issued more
 *  than leeway seconds in the future). `out` (may be NULL) is written only
 *  on success. Revocation is the caller's check (osr_revocations_contains). */
int osr_token_verify(const osr_keyring_t *kr, const char *tok, size_t len, int64_t now_s,
                     int64_t leeway_s, osr_token_claims_t *out);

/** May these claims reach `sandbox_id` with `scope` (and `port`, for
 *  OSR_SCOPE_PORTS)? Returns 0 or OSR_ETOKEN_SANDBOX/SCOPE/PORT. */
int osr_token_allows(const osr_token_claims_t *c, const char *sandbox_id, unsigned scope,
                     uint16_t port);

/** Revocation list: sandbox ids killed recently. A token for a revoked
 *  sandbox is refused until its own expiry; entries expire after `ttl_s`
 *  (the longest token lifetime). Fed by the Redis invalidation channel. */
typedef struct osr_revocations_s osr_revocations_t;
/* When the list is full, adding drops the oldest entry (the one nearest to
 * expiring by itself) and counts it in osr_revocations_evicted(). Ids of 40
 * bytes or more are ignored (no token can name one). Not thread-safe. A clock that went backwards
 * keeps an entry (fails closed). */
osr_revocations_t *osr_revocations_new(size_t max_entries, int64_t ttl_s);
void osr_revocations_free(osr_revocations_t *r);
void osr_revocations_add(osr_revocations_t *r, const char *sandbox_id, int64_t now_s);
int osr_revocations_contains(osr_revocations_t *r, const char *sandbox_id, int64_t now_s);
/** (Additive.) Entries held (expired ones included until they are pushed
 *  out) / entries dropped because the list was full. */
size_t osr_revocations_count(const osr_revocations_t *r);
uint64_t osr_revocations_evicted(const osr_revocations_t *r);

/* ---- agent tokens (docs/tokens.md "The agent's token") ----------------------
 * The token osr-agent checks (X-Access-Token) is not the client's binding
 * token: it is hex(HMAC-SHA256(agent_secret, sandbox_id)), derived by the
 * gateway (spec->agent_token at create) and by every data plane (added
 * upstream) from one 32-byte secret they share, so no per-sandbox secret is
 * stored or distributed and a client never learns it. */

#define OSR_AGENT_SECRET_LEN 32
/* The file name next to the signing keys (<keys_dir>/agent.secret). */
#define OSR_AGENT_SECRET_FILE "agent.secret"

/** (Additive.) The agent token of `sandbox_id`: 64 lower-case hex chars +
 *  NUL in `out`. Returns 0 or OSR_EINVAL (empty id). */
int osr_agent_token(const uint8_t secret[OSR_AGENT_SECRET_LEN], const char *sandbox_id,
                    char out[65]);

/** (Additive.) An agent secret with its HMAC-SHA256 key blocks hashed once
 *  (the inner and outer pad states), so each osr_agent_key_token costs two
 *  hash blocks instead of four; same tokens as osr_agent_token. Not
 *  thread-safe (it keeps a scratch context): one thread uses a key, as the
 *  gateway's loop does. */
typedef struct osr_agent_key_s osr_agent_key_t;

/** (Additive.) A key for `secret` (copied into the pad states; the caller
 *  keeps and cleanses its own copy), or NULL if the digest fails.
 *  Free with osr_agent_key_free. */
osr_agent_key_t *osr_agent_key_new(const uint8_t secret[OSR_AGENT_SECRET_LEN]);

/** (Additive.) Free `k` (NULL is a no-op), cleansing its pad states. */
void osr_agent_key_free(osr_agent_key_t *k);

/** (Additive.) osr_agent_token(secret, sandbox_id, out) for k's secret. */
int osr_agent_key_token(osr_agent_key_t *k, const char *sandbox_id, char out[65]);

/** (Additive.) Read the agent secret from `path` (64 hex digits; blocking:
 *  call at start-up). With `create` set and no file there, generate one
 *  (mode 0600, parent directories 0700). Returns 0 or an error described
 *  in `err` (OSR_ENOENT / -ENOENT when absent and !create). */
int osr_agent_secret_load(const char *path, int create, uint8_t secret[OSR_AGENT_SECRET_LEN],
                          char *err, size_t errlen);

/* ---- upstream credentials (docs/tokens.md "Upstream credentials") ---------
 * A remote provider's per-sandbox credential (E2B's envdAccessToken) rides
 * sealed inside the agent endpoint ("<url>#osr-up=<sealed>"), which the
 * client can read in its token's "ep" claim: AES-256-GCM under a key derived
 * from the sandbox's agent token (osr_agent_token), with the sandbox id as
 * additional data. The adapter seals with spec->agent_token; the data plane
 * opens with the token it derives from the agent secret. */
#define OSR_UPSTREAM_PLAIN_MAX 640 /* longest plaintext sealed */
#define OSR_UPSTREAM_FRAG      "#osr-up=" /* marks a sealed credential in an endpoint */

/** (Additive.) Seal `len` bytes of `plain` for `sandbox_id` under the key
 *  derived from `agent_tok` (the 64-hex-char agent token). Writes base64url
 *  text + NUL into out; returns its length, OSR_E2BIG (out too small:
 *  4/3 * (len + 28) + 1 bytes suffice) or OSR_EINVAL (no agent token, empty
 *  id, len 0 or above OSR_UPSTREAM_PLAIN_MAX). */
int osr_upstream_seal(const char *agent_tok, const char *sandbox_id, const char *plain,
                      size_t len, char *out, size_t outlen);
/** (Additive.) Open what osr_upstream_seal wrote (`len` characters): the
 *  plaintext + NUL into out; returns its length, OSR_E2BIG, or OSR_EINVAL
 *  (malformed, wrong key or sandbox, tampered: out is then ""). */
int osr_upstream_open(const char *agent_tok, const char *sandbox_id, const char *sealed,
                      size_t len, char *out, size_t outlen);
#endif
