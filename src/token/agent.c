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
#include "util/log.h"

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
