/*
 * The keyring: Ed25519 keys by key id, the active signing key, the key
 * directory on disk and the public-key JSON that data planes load.
 *
 * Keys are held as EVP_PKEYs built once when added, so signing and
 * verifying never parse key material on the hot path, and both BoringSSL
 * and OpenSSL 3 take the same calls (EVP_PKEY_new_raw_*_key with
 * EVP_PKEY_ED25519); a build with libsodium also keeps a signing key's
 * seed || pub for crypto_sign_detached (token.c). A keyring is small and
 * fixed-size (OSR_KEYRING_MAX): rotation needs two or three keys at once,
 * not hundreds, and a linear kid lookup over a handful of entries is cheaper
 * than any index. Kid lookup need not be constant-time: key ids are public.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef OSR_HAVE_SODIUM
#include <sodium.h>
#endif

#include "token/token_int.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"
#include "util/fsutil.h"

#define MOD "token"

/* The public-key JSON a data plane accepts (a keyring's worth is ~2 KiB). */
#define PUBLIC_JSON_MAX (64u * 1024)
/* A key file holds 64 hex digits and a newline; anything much longer is not
 * one of ours. */
#define KEY_FILE_MAX 256

/* ---- small helpers -------------------------------------------------------- */

void osr__hex(const uint8_t *p, size_t n, char *out)
{
  static const char hex[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = hex[p[i] >> 4];
    out[2 * i + 1] = hex[p[i] & 15];
  }
  out[2 * n] = '\0';
}

int osr__unhex(const char *s, size_t slen, uint8_t *out, size_t n)
{
  if (slen != 2 * n)
    return -1;
  for (size_t i = 0; i < n; i++) {
    int hi = osr_hexval(s[2 * i]), lo = osr_hexval(s[2 * i + 1]);
    if (hi < 0 || lo < 0)
      return -1;
    out[i] = (uint8_t)(hi << 4 | lo);
  }
  return 0;
}

int osr__kid_valid(const char *kid, size_t n)
{
  if (n == 0 || n >= OSR_TOKEN_KID_MAX)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char c = kid[i];
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
          c == '_'))
      return 0;
  }
  return 1;
}

/* ---- the keyring ---------------------------------------------------------- */

osr_keyring_t *osr_keyring_new(void)
{
  osr_keyring_t *kr = osr_xcalloc(1, sizeof(*kr));
  kr->active = -1;
  return kr;
}

static void key_dispose(osr__key_t *k)
{
  EVP_PKEY_free(k->verify_key);
  EVP_PKEY_free(k->sign_key);
  OPENSSL_cleanse(k, sizeof(*k));
}

void osr_keyring_free(osr_keyring_t *kr)
{
  if (kr == NULL)
    return;
  for (size_t i = 0; i < kr->n; i++)
    key_dispose(&kr->keys[i]);
  osr_free(kr);
}

const osr__key_t *osr__keyring_find(const osr_keyring_t *kr, const char *kid, size_t n)
{
  if (kr == NULL)
    return NULL;
  for (size_t i = 0; i < kr->n; i++)
    if (strlen(kr->keys[i].kid) == n && memcmp(kr->keys[i].kid, kid, n) == 0)
      return &kr->keys[i];
  return NULL;
}

static int find_index(const osr_keyring_t *kr, const char *kid)
{
  const osr__key_t *k = osr__keyring_find(kr, kid, strlen(kid));
  return k != NULL ? (int)(k - kr->keys) : -1;
}

/* Give k the private half: `sign`, and with libsodium its seed || pub. */
static void key_set_private(osr__key_t *k, EVP_PKEY *sign, const uint8_t *sk)
{
  k->sign_key = sign;
#ifdef OSR_HAVE_SODIUM
  memcpy(k->sodium_sk, sk, sizeof(k->sodium_sk));
#else
  (void)sk;
#endif
}

/* Add (or refresh) a key. `sign` may be NULL (and then `sk`, the 64-byte
 * seed || pub, is unused); `verify` and `sign` are taken over on success and
 * freed on failure. */
static int add_key(osr_keyring_t *kr, const char *kid, const uint8_t pub[32], EVP_PKEY *verify,
                   EVP_PKEY *sign, const uint8_t *sk)
{
  int rv = 0;
  int i = find_index(kr, kid);
  if (i >= 0) {
    osr__key_t *k = &kr->keys[i];
    /* A kid names one key for its whole life: a different key under a
     * known kid would let old tokens verify against the wrong key. */
    if (CRYPTO_memcmp(k->pub, pub, 32) != 0) {
      rv = OSR_EINVAL;
      goto fail;
    }
    EVP_PKEY_free(verify);
    if (sign != NULL && k->sign_key == NULL) {
      key_set_private(k, sign, sk); /* the private half of a key we only verified with */
      if (kr->active < 0)
        kr->active = i;
    } else {
      EVP_PKEY_free(sign);
    }
    return 0;
  }
  if (kr->n >= OSR_KEYRING_MAX) {
    rv = OSR_ETOOLARGE;
    goto fail;
  }
  osr__key_t *k = &kr->keys[kr->n];
  memset(k, 0, sizeof(*k));
  snprintf(k->kid, sizeof(k->kid), "%s", kid);
  memcpy(k->pub, pub, 32);
  k->verify_key = verify;
  if (sign != NULL)
    key_set_private(k, sign, sk);
  if (sign != NULL && kr->active < 0)
    kr->active = (int)kr->n;
  kr->n++;
  return 0;
fail:
  EVP_PKEY_free(verify);
  EVP_PKEY_free(sign);
  return rv;
}

int osr_keyring_add_private(osr_keyring_t *kr, const char *kid, const uint8_t seed[32])
{
  if (kr == NULL || kid == NULL || !osr__kid_valid(kid, strlen(kid)))
    return OSR_EINVAL;
  EVP_PKEY *sign = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, NULL, seed, 32);
  if (sign == NULL)
    return OSR_ENOMEM;
  uint8_t pub[32];
  size_t publen = sizeof(pub);
  if (EVP_PKEY_get_raw_public_key(sign, pub, &publen) != 1 || publen != 32) {
    EVP_PKEY_free(sign);
    return OSR_EINVAL;
  }
  EVP_PKEY *verify = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, 32);
  if (verify == NULL) {
    EVP_PKEY_free(sign);
    return OSR_ENOMEM;
  }
  uint8_t sk[64];
  memcpy(sk, seed, 32);
  memcpy(sk + 32, pub, 32);
#ifdef OSR_HAVE_SODIUM
  /* sodium_init is idempotent and thread-safe; the two libraries must
   * derive the same public key from the seed, or signatures would not
   * verify against the key we publish. */
  uint8_t spk[32], ssk[64];
  int bad = sodium_init() < 0 || crypto_sign_seed_keypair(spk, ssk, seed) != 0 ||
            CRYPTO_memcmp(spk, pub, 32) != 0 || CRYPTO_memcmp(ssk, sk, 64) != 0;
  OPENSSL_cleanse(ssk, sizeof(ssk));
  if (bad) {
    OPENSSL_cleanse(sk, sizeof(sk));
    EVP_PKEY_free(verify);
    EVP_PKEY_free(sign);
    return OSR_EINVAL;
  }
#endif
  int rv = add_key(kr, kid, pub, verify, sign, sk);
  OPENSSL_cleanse(sk, sizeof(sk));
  return rv;
}

int osr_keyring_add_public(osr_keyring_t *kr, const char *kid, const uint8_t pub[32])
{
  if (kr == NULL || kid == NULL || !osr__kid_valid(kid, strlen(kid)))
    return OSR_EINVAL;
  EVP_PKEY *verify = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, pub, 32);
  if (verify == NULL)
    return OSR_EINVAL; /* BoringSSL accepts any 32 bytes; OpenSSL may refuse some */
  return add_key(kr, kid, pub, verify, NULL, NULL);
}

int osr_keyring_set_active(osr_keyring_t *kr, const char *kid)
{
  int i = kr != NULL && kid != NULL ? find_index(kr, kid) : -1;
  if (i < 0)
    return OSR_ENOENT;
  if (kr->keys[i].sign_key == NULL)
    return OSR_EINVAL; /* a public key cannot sign */
  kr->active = i;
  return 0;
}

int osr_keyring_remove(osr_keyring_t *kr, const char *kid)
{
  int i = kr != NULL && kid != NULL ? find_index(kr, kid) : -1;
  if (i < 0)
    return OSR_ENOENT;
  key_dispose(&kr->keys[i]);
  memmove(&kr->keys[i], &kr->keys[i + 1], (kr->n - (size_t)i - 1) * sizeof(kr->keys[0]));
  kr->n--;
  memset(&kr->keys[kr->n], 0, sizeof(kr->keys[0]));
  if (kr->active == i)
    kr->active = -1;
  else if (kr->active > i)
    kr->active--;
  return 0;
}

size_t osr_keyring_count(const osr_keyring_t *kr)
{
  return kr != NULL ? kr->n : 0;
}

const char *osr_keyring_active(const osr_keyring_t *kr)
{
  return kr != NULL && kr->active >= 0 ? kr->keys[kr->active].kid : NULL;
}

/* ---- public JSON ---------------------------------------------------------- */

char *osr_keyring_public_json(const osr_keyring_t *kr)
{
  json_t *arr = json_array();
  for (size_t i = 0; kr != NULL && i < kr->n; i++) {
    char hex[65];
    osr__hex(kr->keys[i].pub, 32, hex);
    json_array_append_new(
        arr, json_pack("{s:s,s:s,s:s}", "kid", kr->keys[i].kid, "alg", "Ed25519", "pub", hex));
  }
  json_t *doc = json_pack("{s:o}", "keys", arr);
  char *s = json_dumps(doc, JSON_COMPACT);
  json_decref(doc);
  if (s == NULL)
    return NULL;
  /* Hand out memory the caller frees with osr_free, whatever allocator
   * jansson was given. */
  char *out = osr_xstrdup(s);
  osr_json_free(s);
  return out;
}

int osr_keyring_add_public_json(osr_keyring_t *kr, const char *json, size_t len)
{
  if (kr == NULL || json == NULL)
    return OSR_EINVAL;
  if (len > PUBLIC_JSON_MAX)
    return OSR_ETOOLARGE;
  json_t *doc = json_loadb(json, len, JSON_REJECT_DUPLICATES, NULL);
  json_t *keys = json_object_get(doc, "keys");
  size_t n = json_array_size(keys);
  uint8_t pubs[OSR_KEYRING_MAX][32];
  const char *kids[OSR_KEYRING_MAX];
  int rv = 0;
  if (!json_is_object(doc) || !json_is_array(keys)) {
    rv = OSR_EINVAL;
    goto out;
  }
  if (n > OSR_KEYRING_MAX) {
    rv = OSR_ETOOLARGE;
    goto out;
  }
  /* Check everything first, so a bad document leaves the keyring as it was. */
  for (size_t i = 0; i < n; i++) {
    json_t *e = json_array_get(keys, i);
    const char *kid = json_string_value(json_object_get(e, "kid"));
    const char *alg = json_string_value(json_object_get(e, "alg"));
    const char *pub = json_string_value(json_object_get(e, "pub"));
    if (kid == NULL || alg == NULL || pub == NULL || strcmp(alg, "Ed25519") != 0 ||
        !osr__kid_valid(kid, strlen(kid)) || osr__unhex(pub, strlen(pub), pubs[i], 32) != 0) {
      rv = OSR_EINVAL;
      goto out;
    }
    const osr__key_t *k = osr__keyring_find(kr, kid, strlen(kid));
    if (k != NULL && CRYPTO_memcmp(k->pub, pubs[i], 32) != 0) {
      rv = OSR_EINVAL;
      goto out;
    }
    for (size_t j = 0; j < i; j++)
      if (strcmp(kids[j], kid) == 0) {
        rv = OSR_EINVAL;
        goto out;
      }
    kids[i] = kid;
  }
  size_t fresh = 0;
  for (size_t i = 0; i < n; i++)
    if (osr__keyring_find(kr, kids[i], strlen(kids[i])) == NULL)
      fresh++;
  if (kr->n + fresh > OSR_KEYRING_MAX) {
    rv = OSR_ETOOLARGE;
    goto out;
  }
  for (size_t i = 0; i < n && rv == 0; i++)
    rv = osr_keyring_add_public(kr, kids[i], pubs[i]);
out:
  json_decref(doc);
  return rv;
}

/* ---- the key directory ---------------------------------------------------- */

/* First line of a small file, surrounding whitespace trimmed. Returns its
 * length or a negative error (OSR_ETOOLARGE past KEY_FILE_MAX). Symbolic
 * links are followed: Kubernetes mounts Secrets and ConfigMaps as links
 * into a "..data" directory. What they point at must be a regular file. */
static int read_small(const char *path, char *out, size_t outlen, mode_t *mode)
{
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return OSR_EINVAL;
  }
  if (mode != NULL)
    *mode = st.st_mode;
  ssize_t n = read(fd, out, outlen - 1);
  int err = errno;
  close(fd);
  if (n < 0)
    return -err;
  if ((size_t)n == outlen - 1)
    return OSR_ETOOLARGE;
  out[n] = '\0';
  char *nl = strpbrk(out, "\r\n");
  if (nl != NULL)
    *nl = '\0';
  size_t len = strlen(out);
  while (len > 0 && (out[len - 1] == ' ' || out[len - 1] == '\t'))
    out[--len] = '\0';
  size_t lead = strspn(out, " \t");
  memmove(out, out + lead, len - lead + 1);
  return (int)(len - lead);
}

/* Write `len` bytes to a new file (O_EXCL, mode 0600) and fsync it. */
static int write_new(const char *path, const char *data, size_t len)
{
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return -errno;
  errno = 0;
  ssize_t w = write(fd, data, len);
  int rv = w == (ssize_t)len && fsync(fd) == 0 ? 0 : (errno != 0 ? -errno : UV_EIO);
  close(fd);
  if (rv != 0)
    unlink(path);
  return rv;
}

static void fsync_dir(const char *dir)
{
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    (void)fsync(fd);
    close(fd);
  }
}

static int cmp_names(const void *a, const void *b)
{
  return strcmp(*(char *const *)a, *(char *const *)b);
}

typedef struct dirload_s {
  char *names[2 * OSR_KEYRING_MAX + 1];
  size_t n;
} dirload_t;

static void dirload_dispose(dirload_t *d)
{
  for (size_t i = 0; i < d->n; i++)
    osr_freep(&d->names[i]);
  d->n = 0;
}

/* The "<kid>.key" and "<kid>.pub" names in dir, sorted (so the result does
 * not depend on readdir order). Other files are ignored: editors' backups
 * and READMEs may sit beside the keys. */
static int list_dir(const char *dir, dirload_t *d, char *err, size_t errlen)
{
  DIR *dp = opendir(dir);
  if (dp == NULL) {
    int rv = -errno;
    snprintf(err, errlen, "%s: %s", dir, osr_strerror(rv));
    return rv;
  }
  struct dirent *de;
  int rv = 0;
  while ((de = readdir(dp)) != NULL) {
    size_t len = strlen(de->d_name);
    if (len < 5 ||
        (strcmp(de->d_name + len - 4, ".key") != 0 && strcmp(de->d_name + len - 4, ".pub") != 0))
      continue;
    if (!osr__kid_valid(de->d_name, len - 4)) {
      snprintf(err, errlen, "%s/%s: a key id is 1..%d characters of [A-Za-z0-9_-]", dir, de->d_name,
               OSR_TOKEN_KID_MAX - 1);
      rv = OSR_EINVAL;
      break;
    }
    if (d->n >= OSR_ARRAY_SIZE(d->names)) {
      snprintf(err, errlen, "%s: more than %d keys", dir, OSR_KEYRING_MAX);
      rv = OSR_ETOOLARGE;
      break;
    }
    d->names[d->n++] = osr_xstrdup(de->d_name);
  }
  closedir(dp);
  if (rv == 0)
    qsort(d->names, d->n, sizeof(d->names[0]), cmp_names);
  return rv;
}

/* Load every key file of `dir` into kr. Returns the number of private keys
 * or a negative error. */
static int load_files(osr_keyring_t *kr, const char *dir, char *err, size_t errlen)
{
  dirload_t d;
  memset(&d, 0, sizeof(d));
  int rv = list_dir(dir, &d, err, errlen);
  int nprivate = 0;
  /* ".key" sorts before ".pub" for the same kid, so a public file beside
   * its private key is checked against the derived public key. */
  for (size_t i = 0; rv == 0 && i < d.n; i++) {
    char path[4200], text[KEY_FILE_MAX], kid[OSR_TOKEN_KID_MAX];
    uint8_t raw[32];
    mode_t mode = 0;
    size_t len = strlen(d.names[i]);
    int is_private = strcmp(d.names[i] + len - 4, ".key") == 0;
    snprintf(kid, sizeof(kid), "%.*s", (int)(len - 4), d.names[i]);
    snprintf(path, sizeof(path), "%s/%s", dir, d.names[i]);
    int n = read_small(path, text, sizeof(text), &mode);
    if (n < 0 || osr__unhex(text, (size_t)n, raw, 32) != 0) {
      snprintf(err, errlen, "%s: %s", path,
               n < 0 && n != OSR_ETOOLARGE ? osr_strerror(n) : "not 64 hex digits");
      rv = n < 0 && n != OSR_ETOOLARGE ? n : OSR_EINVAL;
    } else if (is_private) {
      if ((mode & 077) != 0)
        OSR_LOG_WARN(MOD, "%s is readable by group/others (chmod 600 it)", path);
      rv = osr_keyring_add_private(kr, kid, raw);
      nprivate += rv == 0;
    } else {
      rv = osr_keyring_add_public(kr, kid, raw);
    }
    if (rv != 0 && err[0] == '\0')
      snprintf(err, errlen, "%s: %s", path,
               rv == OSR_ETOOLARGE ? "too many keys"
                                   : "does not match the key already loaded under that id");
    OPENSSL_cleanse(text, sizeof(text));
    OPENSSL_cleanse(raw, sizeof(raw));
  }
  dirload_dispose(&d);
  return rv != 0 ? rv : nprivate;
}

/* Generate a key into dir and name it active. Returns 0, OSR_EAGAIN when
 * another process created the active key first (load again), or an error. */
static int create_key(const char *dir, char *err, size_t errlen)
{
  uint8_t seed[32], r[5];
  char kid[OSR_TOKEN_KID_MAX], text[66], path[4200], apath[4200];
  if (RAND_bytes(seed, sizeof(seed)) != 1 || RAND_bytes(r, sizeof(r)) != 1) {
    snprintf(err, errlen, "%s: no randomness for a new key", dir);
    return OSR_EINVAL;
  }
  kid[0] = 'k';
  osr__hex(r, sizeof(r), kid + 1);
  osr__hex(seed, sizeof(seed), text);
  text[64] = '\n';
  text[65] = '\0';
  snprintf(path, sizeof(path), "%s/%s.key", dir, kid);
  snprintf(apath, sizeof(apath), "%s/active", dir);
  int rv = write_new(path, text, 65);
  OPENSSL_cleanse(seed, sizeof(seed));
  OPENSSL_cleanse(text, sizeof(text));
  if (rv != 0) {
    snprintf(err, errlen, "%s: %s", path, osr_strerror(rv));
    return rv;
  }
  /* "active" is the lock two gateways starting on one fresh directory race
   * for: the loser removes its key and loads the winner's. */
  char line[OSR_TOKEN_KID_MAX + 1];
  int n = snprintf(line, sizeof(line), "%s\n", kid);
  rv = write_new(apath, line, (size_t)n);
  if (rv == UV_EEXIST) {
    unlink(path);
    return OSR_EAGAIN;
  }
  if (rv != 0) {
    unlink(path);
    snprintf(err, errlen, "%s: %s", apath, osr_strerror(rv));
    return rv;
  }
  fsync_dir(dir);
  OSR_LOG_INFO(MOD, "signing key %s generated into %s (mode 0600)", kid, path);
  return 0;
}

static void keyring_clear(osr_keyring_t *kr)
{
  for (size_t i = 0; i < kr->n; i++)
    key_dispose(&kr->keys[i]);
  kr->n = 0;
  kr->active = -1;
}

int osr_keyring_load_dir(osr_keyring_t *kr, const char *dir, int create, char *err, size_t errlen)
{
  char scratch[2];
  if (err == NULL || errlen == 0) {
    err = scratch;
    errlen = sizeof(scratch);
  }
  err[0] = '\0';
  if (kr == NULL || dir == NULL || dir[0] == '\0') {
    snprintf(err, errlen, "no key directory");
    return OSR_EINVAL;
  }
  if (create) {
    int rv = osr_mkdir_p(dir, 0700);
    if (rv != 0) {
      snprintf(err, errlen, "%s: %s", dir, osr_strerror(rv));
      return rv;
    }
  }
  /* Load into a scratch keyring and copy over only on success, so a bad
   * directory leaves `kr` as it was. Two rounds at most: the second one
   * after losing the creation race to another process. */
  osr_keyring_t *tmp = osr_keyring_new();
  int rv = 0;
  for (int round = 0; round < 3; round++) {
    keyring_clear(tmp);
    err[0] = '\0';
    int nprivate = load_files(tmp, dir, err, errlen);
    if (nprivate < 0) {
      rv = nprivate;
      break;
    }
    char apath[4200], active[KEY_FILE_MAX];
    snprintf(apath, sizeof(apath), "%s/active", dir);
    int n = read_small(apath, active, sizeof(active), NULL);
    if (nprivate == 0 && create && n == OSR_ENOENT) {
      rv = create_key(dir, err, errlen);
      if (rv == 0 || rv == OSR_EAGAIN) {
        rv = 0;
        continue; /* load what is now there */
      }
      break;
    }
    if (n >= 0) {
      if (osr_keyring_set_active(tmp, active) != 0) {
        snprintf(err, errlen, "%s: names \"%.*s\", which has no private key (%.*s.key) here", apath,
                 OSR_TOKEN_KID_MAX, active, OSR_TOKEN_KID_MAX, active);
        rv = OSR_EINVAL;
      }
    } else if (n != OSR_ENOENT) {
      snprintf(err, errlen, "%s: %s", apath, osr_strerror(n));
      rv = n;
    } else if (nprivate > 1) {
      snprintf(err, errlen,
               "%s: several private keys and no \"active\" file naming the signing one", dir);
      rv = OSR_EINVAL;
    } else if (nprivate == 0 && create) {
      /* "active" appeared between the two reads: load again. */
      continue;
    }
    if (rv == 0) {
      /* Success: move the keys over (the EVP_PKEYs change owner). */
      keyring_clear(kr);
      *kr = *tmp;
      tmp->n = 0;
      tmp->active = -1;
    }
    osr_keyring_free(tmp);
    return rv;
  }
  if (rv == 0 && err[0] == '\0') {
    snprintf(err, errlen, "%s: could not settle on a signing key", dir);
    rv = OSR_EAGAIN;
  }
  osr_keyring_free(tmp);
  return rv;
}
