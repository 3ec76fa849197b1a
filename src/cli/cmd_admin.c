/* `osr providers` and `osr keys`: GET /v1/providers and /v1/keys. */
#include <string.h>

#include "cli/cli.h"
#include "util/mem.h"

int cli_cmd_providers(cli_t *c, int argc, char **argv)
{
  if (argc > 0)
    return cli_usage_error("providers", "unknown argument '%s'", argv[0]);
  cli_resp_t r;
  int rv = cli_call(c, "GET", "/v1/providers", NULL, NULL, &r);
  if (rv != CLI_OK)
    return rv;
  if (c->json) {
    cli_print_raw(&r);
    cli_resp_dispose(&r);
    return CLI_OK;
  }
  static const char *const head[] = {"NAME",    "TYPE",    "BREAKER", "ISOLATION", "REGIONS",
                                     "GPU MAX", "LAT(ms)", "SUCCESS", "OK",        "FAILED"};
  cli_table_t t;
  cli_table_init(&t, 10, head);
  size_t i;
  json_t *p;
  json_array_foreach(json_object_get(r.json, "providers"), i, p)
  {
    char b[10][256];
    const char *row[10] = {
        cli_field(p, "name", b[0], 256),
        cli_field(p, "type", b[1], 256),
        cli_field(p, "health.breaker", b[2], 256),
        cli_field(p, "capabilities.isolation", b[3], 256),
        cli_field(p, "capabilities.regions", b[4], 256),
        cli_field(p, "capabilities.gpu.max", b[5], 256),
        cli_field(p, "health.latencyEwmaMs", b[6], 256),
        cli_field(p, "health.successEwma", b[7], 256),
        cli_field(p, "health.createsOk", b[8], 256),
        cli_field(p, "health.createsFailed", b[9], 256),
    };
    cli_table_add(&t, row);
  }
  cli_table_print(&t, stdout);
  cli_resp_dispose(&r);
  return CLI_OK;
}

static void print_key(const json_t *k)
{
  static const struct {
    const char *label, *path;
  } rows[] = {{"key id", "keyId"}, {"tenant", "tenant"},     {"role", "role"},
              {"name", "name"},    {"created", "createdAt"}, {"revoked", "revokedAt"}};
  char buf[512];
  for (size_t i = 0; i < OSR_ARRAY_SIZE(rows); i++) {
    cli_field(k, rows[i].path, buf, sizeof(buf));
    if (strcmp(buf, "-") != 0 || i < 4)
      cli_kv(stdout, 8, rows[i].label, buf);
  }
}

static int keys_create(cli_t *c, int argc, char **argv)
{
  const char *tenant = NULL, *name = NULL, *v;
  int admin = 0, m;
  for (int i = 0; i < argc; i++) {
    if ((m = cli_opt(argc, argv, &i, "--tenant", &v)) != 0) {
      if (m < 0)
        return CLI_EUSAGE;
      tenant = v;
    } else if ((m = cli_opt(argc, argv, &i, "--name", &v)) != 0) {
      if (m < 0)
        return CLI_EUSAGE;
      name = v;
    } else if (strcmp(argv[i], "--admin") == 0) {
      admin = 1;
    } else {
      return cli_usage_error("keys create", "unknown argument '%s'", argv[i]);
    }
  }
  if (tenant == NULL)
    return cli_usage_error("keys create", "--tenant is required");
  json_t *body = json_pack("{s:s,s:s}", "tenant", tenant, "role", admin ? "admin" : "tenant");
  if (body == NULL)
    return cli_usage_error("keys create", "--tenant is not UTF-8");
  if (name != NULL)
    json_object_set_new(body, "name", json_string(name));
  cli_resp_t r;
  int rv = cli_call(c, "POST", "/v1/keys", body, NULL, &r);
  json_decref(body);
  if (rv != CLI_OK)
    return rv;
  if (c->json) {
    cli_print_raw(&r);
  } else {
    char buf[512];
    print_key(r.json);
    cli_kv(stdout, 8, "key", cli_field(r.json, "key", buf, sizeof(buf)));
    fprintf(stderr,
            "Store the key now: it is shown only once (the gateway keeps only its hash).\n");
  }
  cli_resp_dispose(&r);
  return CLI_OK;
}

static int keys_ls(cli_t *c, int argc, char **argv)
{
  char target[512] = "/v1/keys";
  const char *v;
  int m;
  for (int i = 0; i < argc; i++) {
    if ((m = cli_opt(argc, argv, &i, "--tenant", &v)) != 0) {
      if (m < 0)
        return CLI_EUSAGE;
      char enc[300];
      cli_urlencode(v, enc, sizeof(enc));
      snprintf(target, sizeof(target), "/v1/keys?tenant=%s", enc);
    } else {
      return cli_usage_error("keys ls", "unknown argument '%s'", argv[i]);
    }
  }
  cli_resp_t r;
  int rv = cli_call(c, "GET", target, NULL, NULL, &r);
  if (rv != CLI_OK)
    return rv;
  if (c->json) {
    cli_print_raw(&r);
    cli_resp_dispose(&r);
    return CLI_OK;
  }
  static const char *const head[] = {"KEY ID", "TENANT", "ROLE", "NAME", "CREATED", "REVOKED"};
  cli_table_t t;
  cli_table_init(&t, 6, head);
  size_t i;
  json_t *k;
  json_array_foreach(json_object_get(r.json, "items"), i, k)
  {
    char b[6][128];
    const char *row[6] = {
        cli_field(k, "keyId", b[0], 128),     cli_field(k, "tenant", b[1], 128),
        cli_field(k, "role", b[2], 128),      cli_field(k, "name", b[3], 128),
        cli_field(k, "createdAt", b[4], 128), cli_field(k, "revokedAt", b[5], 128)};
    cli_table_add(&t, row);
  }
  cli_table_print(&t, stdout);
  cli_resp_dispose(&r);
  return CLI_OK;
}

static int keys_revoke(cli_t *c, int argc, char **argv)
{
  if (argc != 1 || argv[0][0] == '-')
    return cli_usage_error("keys revoke", "wants exactly one key id");
  char enc[256], target[300];
  cli_urlencode(argv[0], enc, sizeof(enc));
  snprintf(target, sizeof(target), "/v1/keys/%s", enc);
  cli_resp_t r;
  int rv = cli_call(c, "DELETE", target, NULL, NULL, &r);
  if (rv != CLI_OK)
    return rv;
  if (c->json)
    cli_print_raw(&r);
  else
    printf("revoked %s\n", argv[0]);
  cli_resp_dispose(&r);
  return CLI_OK;
}

int cli_cmd_keys(cli_t *c, int argc, char **argv)
{
  if (argc == 0)
    return cli_usage_error("keys", "wants a subcommand: create, ls or revoke");
  if (strcmp(argv[0], "create") == 0)
    return keys_create(c, argc - 1, argv + 1);
  if (strcmp(argv[0], "ls") == 0 || strcmp(argv[0], "list") == 0)
    return keys_ls(c, argc - 1, argv + 1);
  if (strcmp(argv[0], "revoke") == 0)
    return keys_revoke(c, argc - 1, argv + 1);
  return cli_usage_error("keys", "unknown subcommand '%s'", argv[0]);
}
