/*
 * dp-mint: test helper that makes signing keys and binding tokens with the
 * real token module (src/token), so the data plane tests need no gateway.
 *
 *   dp-mint genkey DIR KID        writes DIR/KID.key (hex seed, 0600)
 *   dp-mint sign DIR KID SID EP SCOPES PORTS TTL_S
 *        SCOPES: comma list of exec,files,ports (or "none")
 *        PORTS:  comma list, "all" or "none"
 *        TTL_S:  seconds from now to expiry (negative: already expired)
 *   prints the token on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include <openssl/rand.h>

#include "token/token.h"

static int genkey(const char *dir, const char *kid)
{
  uint8_t seed[32];
  if (RAND_bytes(seed, sizeof(seed)) != 1)
    return 1;
  char path[4096];
  snprintf(path, sizeof(path), "%s/%s.key", dir, kid);
  FILE *f = fopen(path, "w");
  if (f == NULL)
    return 1;
  for (int i = 0; i < 32; i++)
    fprintf(f, "%02x", seed[i]);
  fprintf(f, "\n");
  fclose(f);
  chmod(path, 0600);
  return 0;
}

int main(int argc, char **argv)
{
  if (argc == 4 && strcmp(argv[1], "genkey") == 0)
    return genkey(argv[2], argv[3]);
  if (argc != 9 || strcmp(argv[1], "sign") != 0) {
    fprintf(stderr, "usage: dp-mint genkey DIR KID | sign DIR KID SID EP SCOPES PORTS TTL_S\n");
    return 2;
  }
  osr_keyring_t *kr = osr_keyring_new();
  char err[256] = "";
  if (osr_keyring_load_dir(kr, argv[2], 0, err, sizeof(err)) != 0) {
    fprintf(stderr, "dp-mint: %s\n", err);
    return 1;
  }
  if (osr_keyring_set_active(kr, argv[3]) != 0) {
    fprintf(stderr, "dp-mint: no key %s\n", argv[3]);
    return 1;
  }
  osr_token_claims_t c;
  memset(&c, 0, sizeof(c));
  snprintf(c.sandbox_id, sizeof(c.sandbox_id), "%s", argv[4]);
  snprintf(c.tenant, sizeof(c.tenant), "t1");
  snprintf(c.provider, sizeof(c.provider), "local");
  snprintf(c.agent_endpoint, sizeof(c.agent_endpoint), "%s", argv[5]);
  if (strstr(argv[6], "exec") != NULL)
    c.scopes |= OSR_SCOPE_EXEC;
  if (strstr(argv[6], "files") != NULL)
    c.scopes |= OSR_SCOPE_FILES;
  if (strstr(argv[6], "ports") != NULL)
    c.scopes |= OSR_SCOPE_PORTS;
  if (strcmp(argv[7], "all") == 0) {
    c.all_ports = 1;
  } else if (strcmp(argv[7], "none") != 0) {
    char *save = NULL;
    for (char *p = strtok_r(argv[7], ",", &save); p != NULL && c.nports < OSR_TOKEN_PORTS_MAX;
         p = strtok_r(NULL, ",", &save))
      c.ports[c.nports++] = (uint16_t)atoi(p);
  }
  time_t now = time(NULL);
  long ttl = atol(argv[8]);
  c.iat = (int64_t)now - (ttl < 0 ? 3600 : 0);
  c.exp = (int64_t)now + ttl;
  char tok[OSR_TOKEN_MAX + 1];
  int n = osr_token_sign(kr, &c, tok, sizeof(tok));
  if (n < 0) {
    fprintf(stderr, "dp-mint: sign: %s\n", osr_token_strerror(n));
    return 1;
  }
  printf("%s\n", tok);
  osr_keyring_free(kr);
  return 0;
}
