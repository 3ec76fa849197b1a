/*
 * Agent tokens: the credential the data plane presents to osr-agent on the
 * client's behalf (token.h, docs/tokens.md). One function derives it so the
 * gateway (which starts the agent with it) and the data plane (which sends
 * it upstream) cannot disagree.
 */
#include <errno.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "token/token_int.h"
#include "util/base64.h"
#include "util/log.h"
#include "util/mem.h"

int osr_agent_token(const uint8_t secret[OSR_AGENT_SECRET_LEN], const char *sandbox_id,
                    char out[65])
{
  out[0] = '\0';
  if (sandbox_id == NULL || sandbox_id[0] == '\0')
    return OSR_EINVAL;
  uint8_t mac[EVP_MAX_MD_SIZE];
  unsigned int mlen = 0;
  if (HMAC(EVP_sha256(), secret, OSR_AGENT_SECRET_LEN, (const uint8_t *)sandbox_id,
           strlen(sandbox_id), mac, &mlen) == NULL ||
      mlen != 32)
    return OSR_EINVAL;
  osr__hex(mac, 32, out);
  out[64] = '\0';
  OPENSSL_cleanse(mac, sizeof(mac));
  return 0;
}

/* HMAC(K, m) = H((K ^ opad) || H((K ^ ipad) || m)) with K the 32-byte
 * secret zero-padded to SHA-256's 64-byte block: the states after the two
 * pad blocks depend on the secret alone, so they are hashed once here and
 * copied per token (RFC 2104 section 4 suggests exactly this). */
struct osr_agent_key_s {
  EVP_MD_CTX *inner; /* after (K ^ ipad) */
  EVP_MD_CTX *outer; /* after (K ^ opad) */
  EVP_MD_CTX *work;  /* scratch for one token */
};

void osr_agent_key_free(osr_agent_key_t *k)
{
  if (k == NULL)
    return;
  EVP_MD_CTX_free(k->inner); /* EVP_MD_CTX_free cleanses the state */
  EVP_MD_CTX_free(k->outer);
  EVP_MD_CTX_free(k->work);
  osr_free(k);
}

osr_agent_key_t *osr_agent_key_new(const uint8_t secret[OSR_AGENT_SECRET_LEN])
{
  osr_agent_key_t *k = osr_xcalloc(1, sizeof(*k));
  k->inner = EVP_MD_CTX_new();
  k->outer = EVP_MD_CTX_new();
  k->work = EVP_MD_CTX_new();
  uint8_t ipad[64], opad[64];
  for (size_t i = 0; i < 64; i++) {
    uint8_t b = i < OSR_AGENT_SECRET_LEN ? secret[i] : 0;
    ipad[i] = (uint8_t)(b ^ 0x36);
    opad[i] = (uint8_t)(b ^ 0x5c);
  }
  int ok = k->inner != NULL && k->outer != NULL && k->work != NULL &&
           EVP_DigestInit_ex(k->inner, EVP_sha256(), NULL) == 1 &&
           EVP_DigestUpdate(k->inner, ipad, sizeof(ipad)) == 1 &&
           EVP_DigestInit_ex(k->outer, EVP_sha256(), NULL) == 1 &&
           EVP_DigestUpdate(k->outer, opad, sizeof(opad)) == 1;
  OPENSSL_cleanse(ipad, sizeof(ipad));
  OPENSSL_cleanse(opad, sizeof(opad));
  if (!ok) {
    osr_agent_key_free(k);
    return NULL;
  }
  return k;
}

int osr_agent_key_token(osr_agent_key_t *k, const char *sandbox_id, char out[65])
{
  out[0] = '\0';
  if (sandbox_id == NULL || sandbox_id[0] == '\0')
    return OSR_EINVAL;
  uint8_t ih[32], mac[32];
  unsigned int n1 = 0, n2 = 0;
  int ok = EVP_MD_CTX_copy_ex(k->work, k->inner) == 1 &&
           EVP_DigestUpdate(k->work, sandbox_id, strlen(sandbox_id)) == 1 &&
           EVP_DigestFinal_ex(k->work, ih, &n1) == 1 && n1 == 32 &&
           EVP_MD_CTX_copy_ex(k->work, k->outer) == 1 &&
           EVP_DigestUpdate(k->work, ih, sizeof(ih)) == 1 &&
           EVP_DigestFinal_ex(k->work, mac, &n2) == 1 && n2 == 32;
  if (ok) {
    osr__hex(mac, 32, out);
    out[64] = '\0';
  }
  OPENSSL_cleanse(ih, sizeof(ih));
  OPENSSL_cleanse(mac, sizeof(mac));
  return ok ? 0 : OSR_EINVAL;
}

/* mkdir -p of the parent of `path`, 0700 for what we create (it holds
 * secrets). */
static int make_parent(const char *path)
{
  char dir[4096];
  if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
    return OSR_E2BIG;
  char *slash = strrchr(dir, '/');
  if (slash == NULL || slash == dir)
    return 0;
  *slash = '\0';
  for (char *p = dir + 1; *p != '\0'; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(dir, 0700) != 0 && errno != EEXIST)
      return -errno;
    *p = '/';
  }
  if (mkdir(dir, 0700) != 0 && errno != EEXIST)
    return -errno;
  return 0;
}

static int create_secret(const char *path, char *err, size_t errlen)
{
  uint8_t raw[OSR_AGENT_SECRET_LEN];
  char text[2 * OSR_AGENT_SECRET_LEN + 2];
  int rv = make_parent(path);
  if (rv != 0) {
    snprintf(err, errlen, "%s: %s", path, osr_strerror(rv));
    return rv;
  }
  if (RAND_bytes(raw, sizeof(raw)) != 1) {
    snprintf(err, errlen, "%s: no random bytes", path);
    return OSR_EINVAL;
  }
  osr__hex(raw, sizeof(raw), text);
  OPENSSL_cleanse(raw, sizeof(raw));
  text[2 * OSR_AGENT_SECRET_LEN] = '\n';
  text[2 * OSR_AGENT_SECRET_LEN + 1] = '\0';
  /* O_EXCL: two processes starting at once must not each write their own
   * secret; the loser reads the winner's. */
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    rv = -errno;
    OPENSSL_cleanse(text, sizeof(text));
    if (rv == -EEXIST)
      return 0;
    snprintf(err, errlen, "%s: %s", path, osr_strerror(rv));
    return rv;
  }
  size_t len = 2 * OSR_AGENT_SECRET_LEN + 1;
  errno = 0;
  ssize_t w = write(fd, text, len);
  rv = w == (ssize_t)len && fsync(fd) == 0 ? 0 : (errno != 0 ? -errno : OSR_EINVAL);
  close(fd);
  OPENSSL_cleanse(text, sizeof(text));
  if (rv != 0) {
    unlink(path);
    snprintf(err, errlen, "%s: %s", path, osr_strerror(rv));
  }
  return rv;
}

int osr_agent_secret_load(const char *path, int create, uint8_t secret[OSR_AGENT_SECRET_LEN],
                          char *err, size_t errlen)
{
  if (err != NULL && errlen > 0)
    err[0] = '\0';
  if (create) {
    int rv = create_secret(path, err, errlen);
    if (rv != 0)
      return rv;
  }
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int rv = -errno;
    snprintf(err, errlen, "%s: %s", path, osr_strerror(rv));
    return rv;
  }
  struct stat st;
  char text[256];
  ssize_t n = -1;
  if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode))
    n = read(fd, text, sizeof(text) - 1);
  close(fd);
  if (n < 0 || (size_t)n == sizeof(text) - 1) {
    snprintf(err, errlen, "%s: not a small regular file", path);
    return OSR_EINVAL;
  }
  size_t len = (size_t)n;
  while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ' ||
                     text[len - 1] == '\t'))
    len--;
  int rv = osr__unhex(text, len, secret, OSR_AGENT_SECRET_LEN);
  OPENSSL_cleanse(text, sizeof(text));
  if (rv != 0) {
    snprintf(err, errlen, "%s: not %d hex digits", path, 2 * OSR_AGENT_SECRET_LEN);
    return OSR_EINVAL;
  }
  if ((st.st_mode & 077) != 0)
    OSR_LOG_WARN("token", "%s is readable by others (mode %03o); it should be 0600", path,
                 (unsigned)(st.st_mode & 0777));
  return 0;
}

/* ---- upstream credentials (docs/tokens.md "Upstream credentials") ---------
 * A sandbox on a remote provider (E2B) is reached with that provider's own
 * per-sandbox token, which the client must never see. The adapter seals it
 * into the agent endpoint it reports; the endpoint then travels wherever
 * endpoints already go (binding row, Redis binding cache, the token's "ep"
 * claim, which the client can read) and only a holder of the agent secret
 * can open it. The key is derived from the sandbox's agent token (itself
 * HMAC(agent_secret, sandbox_id)), so the adapter needs nothing but the
 * spec->agent_token it is already given, and the data plane derives the same
 * key from the secret. AES-256-GCM with a random 96-bit nonce (one seal per
 * create: far below the 2^32 messages per key where random nonces become a
 * concern) and the sandbox id as additional data, so a sealed credential
 * cannot be replayed into another sandbox's endpoint. */

#define UP_NONCE 12
#define UP_TAG   16

static int up_key(const char *agent_tok, uint8_t key[32])
{
  static const char label[] = "osr upstream credential v1";
  unsigned int klen = 0;
  size_t tl = agent_tok != NULL ? strlen(agent_tok) : 0;
  if (tl != 64)
    return OSR_EINVAL;
  if (HMAC(EVP_sha256(), agent_tok, (int)tl, (const uint8_t *)label, sizeof(label) - 1, key,
           &klen) == NULL ||
      klen != 32)
    return OSR_EINVAL;
  return 0;
}

int osr_upstream_seal(const char *agent_tok, const char *sandbox_id, const char *plain,
                      size_t len, char *out, size_t outlen)
{
  if (outlen > 0)
    out[0] = '\0';
  if (sandbox_id == NULL || sandbox_id[0] == '\0' || len == 0 || len > OSR_UPSTREAM_PLAIN_MAX)
    return OSR_EINVAL;
  uint8_t key[32];
  uint8_t raw[UP_NONCE + OSR_UPSTREAM_PLAIN_MAX + UP_TAG];
  if (up_key(agent_tok, key) != 0)
    return OSR_EINVAL;
  int rv = OSR_EINVAL, n = 0, fin = 0;
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  if (ctx == NULL || RAND_bytes(raw, UP_NONCE) != 1)
    goto out;
  if (EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, UP_NONCE, NULL) != 1 ||
      EVP_EncryptInit_ex(ctx, NULL, NULL, key, raw) != 1 ||
      EVP_EncryptUpdate(ctx, NULL, &n, (const uint8_t *)sandbox_id, (int)strlen(sandbox_id)) != 1 ||
      EVP_EncryptUpdate(ctx, raw + UP_NONCE, &n, (const uint8_t *)plain, (int)len) != 1 ||
      EVP_EncryptFinal_ex(ctx, raw + UP_NONCE + n, &fin) != 1 ||
      (size_t)(n + fin) != len ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, UP_TAG, raw + UP_NONCE + len) != 1)
    goto out;
  rv = osr_b64url_encode(raw, UP_NONCE + len + UP_TAG, out, outlen);
out:
  EVP_CIPHER_CTX_free(ctx);
  OPENSSL_cleanse(key, sizeof(key));
  OPENSSL_cleanse(raw, sizeof(raw));
  return rv;
}

int osr_upstream_open(const char *agent_tok, const char *sandbox_id, const char *sealed,
                      size_t len, char *out, size_t outlen)
{
  if (outlen > 0)
    out[0] = '\0';
  if (sandbox_id == NULL || sandbox_id[0] == '\0')
    return OSR_EINVAL;
  uint8_t key[32];
  uint8_t raw[UP_NONCE + OSR_UPSTREAM_PLAIN_MAX + UP_TAG];
  int m = osr_b64url_decode(sealed, len, raw, sizeof(raw));
  if (m < UP_NONCE + UP_TAG + 1)
    return OSR_EINVAL;
  size_t plen = (size_t)m - UP_NONCE - UP_TAG;
  if (plen + 1 > outlen)
    return OSR_E2BIG;
  if (up_key(agent_tok, key) != 0)
    return OSR_EINVAL;
  int rv = OSR_EINVAL, n = 0, fin = 0;
  EVP_CIPHER_CTX *ctx = EVP_CIPHER_CTX_new();
  if (ctx == NULL)
    goto out;
  if (EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), NULL, NULL, NULL) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_IVLEN, UP_NONCE, NULL) != 1 ||
      EVP_DecryptInit_ex(ctx, NULL, NULL, key, raw) != 1 ||
      EVP_DecryptUpdate(ctx, NULL, &n, (const uint8_t *)sandbox_id, (int)strlen(sandbox_id)) != 1 ||
      EVP_DecryptUpdate(ctx, (uint8_t *)out, &n, raw + UP_NONCE, (int)plen) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, UP_TAG, raw + UP_NONCE + plen) != 1 ||
      EVP_DecryptFinal_ex(ctx, (uint8_t *)out + n, &fin) != 1 || (size_t)(n + fin) != plen) {
    OPENSSL_cleanse(out, plen < outlen ? plen : outlen);
    out[0] = '\0';
    goto out;
  }
  out[plen] = '\0';
  rv = (int)plen;
out:
  EVP_CIPHER_CTX_free(ctx);
  OPENSSL_cleanse(key, sizeof(key));
  return rv;
}
