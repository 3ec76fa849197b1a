/*
 * tokcheck: verify a binding token offline, as a data plane does, for the
 * integration tests.
 *
 *   tokcheck KEYS.json TOKEN [--now UNIX_S] [--leeway S] [--allows SID SCOPE PORT]
 *
 * KEYS.json is what GET /v1/keys/signing answered. Prints one JSON line
 * {"code": n, "error": text|null, "claims": {...}|null, "allows": n|null}
 * and exits 0 when the token verified (and, with --allows, is allowed), 1
 * when it did not, 2 on usage errors.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "token/token.h"
#include "util/mem.h"

static int usage(void)
{
  fprintf(stderr,
          "usage: tokcheck KEYS.json TOKEN [--now S] [--leeway S] [--allows SID SCOPE PORT]\n");
  return 2;
}

static unsigned scope_bit(const char *s)
{
  if (strcmp(s, "exec") == 0)
    return OSR_SCOPE_EXEC;
  if (strcmp(s, "files") == 0)
    return OSR_SCOPE_FILES;
  if (strcmp(s, "ports") == 0)
    return OSR_SCOPE_PORTS;
  return 0;
}

int main(int argc, char **argv)
{
  if (argc < 3)
    return usage();
  int64_t now = (int64_t)time(NULL), leeway = 0;
  const char *asid = NULL;
  unsigned ascope = 0;
  long aport = 0;
  for (int i = 3; i < argc; i++) {
    if (strcmp(argv[i], "--now") == 0 && i + 1 < argc) {
      now = strtoll(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--leeway") == 0 && i + 1 < argc) {
      leeway = strtoll(argv[++i], NULL, 10);
    } else if (strcmp(argv[i], "--allows") == 0 && i + 3 < argc) {
      asid = argv[++i];
      ascope = scope_bit(argv[++i]);
      aport = strtol(argv[++i], NULL, 10);
      if (ascope == 0 || aport < 0 || aport > 65535)
        return usage();
    } else {
      return usage();
    }
  }
  json_error_t jerr;
  json_t *keys = json_load_file(argv[1], 0, &jerr);
  if (keys == NULL) {
    fprintf(stderr, "tokcheck: %s: %s\n", argv[1], jerr.text);
    return 2;
  }
  char *text = json_dumps(keys, JSON_COMPACT);
  json_decref(keys);
  osr_keyring_t *kr = osr_keyring_new();
  int rv = osr_keyring_add_public_json(kr, text, strlen(text));
  osr_json_free(text);
  if (rv != 0) {
    fprintf(stderr, "tokcheck: %s: not a key list (%d)\n", argv[1], rv);
    osr_keyring_free(kr);
    return 2;
  }
  osr_token_claims_t c;
  rv = osr_token_verify(kr, argv[2], strlen(argv[2]), now, leeway, &c);
  json_t *out = json_object();
  json_object_set_new(out, "code", json_integer(rv));
  json_object_set_new(out, "error", rv != 0 ? json_string(osr_token_strerror(rv)) : json_null());
  int allows = 0;
  if (rv == 0) {
    json_t *scopes = json_array();
    if (c.scopes & OSR_SCOPE_EXEC)
      json_array_append_new(scopes, json_string("exec"));
    if (c.scopes & OSR_SCOPE_FILES)
      json_array_append_new(scopes, json_string("files"));
    if (c.scopes & OSR_SCOPE_PORTS)
      json_array_append_new(scopes, json_string("ports"));
    json_t *ports = json_array();
    for (size_t i = 0; i < c.nports; i++)
      json_array_append_new(ports, json_integer(c.ports[i]));
    json_object_set_new(out, "claims",
                        json_pack("{s:s,s:s,s:s,s:s,s:o,s:o,s:b,s:I,s:I,s:s,s:s}", "sid",
                                  c.sandbox_id, "ten", c.tenant, "prv", c.provider, "ep",
                                  c.agent_endpoint, "scopes", scopes, "ports", ports, "allPorts",
                                  c.all_ports, "iat", (json_int_t)c.iat, "exp", (json_int_t)c.exp,
                                  "kid", c.kid, "jti", c.jti));
    if (asid != NULL) {
      allows = osr_token_allows(&c, asid, ascope, (uint16_t)aport);
      json_object_set_new(out, "allows", json_integer(allows));
      json_object_set_new(out, "allowsError", json_string(osr_token_strerror(allows)));
    }
  } else {
    json_object_set_new(out, "claims", json_null());
  }
  char *s = json_dumps(out, JSON_COMPACT);
  printf("%s\n", s);
  osr_json_free(s);
  json_decref(out);
  osr_keyring_free(kr);
  return rv == 0 && allows == 0 ? 0 : 1;
}
