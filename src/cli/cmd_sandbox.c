/*
 * Sandbox commands: create, plan, ls, get, kill. Requests follow the API's
 * JSON (openapi.json): POST /v1/sandboxes and POST /v1/plan take the same
 * body, which both commands build from the same flags.
 */
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "util/mem.h"

/* K=V into obj[K] = V. */
static int put_kv(json_t *obj, const char *cmd, const char *flag, const char *kv)
{
  const char *eq = strchr(kv, '=');
  if (eq == NULL || eq == kv)
    return cli_usage_error(cmd, "%s wants KEY=VALUE, got '%s'", flag, kv);
  char key[256];
  if ((size_t)(eq - kv) >= sizeof(key))
    return cli_usage_error(cmd, "%s: key too long", flag);
  snprintf(key, sizeof(key), "%.*s", (int)(eq - kv), kv);
  json_t *v = json_string(eq + 1);
  if (v == NULL)
    return cli_usage_error(cmd, "%s: value is not UTF-8", flag);
  json_object_set_new(obj, key, v);
  return CLI_OK;
}

static json_t *sub_obj(json_t *o, const char *k)
{
  json_t *s = json_object_get(o, k);
  if (s == NULL) {
    s = json_object();
    json_object_set_new(o, k, s);
  }
  return s;
}

static void add_name(json_t *b, const char *k, const char *v)
{
  json_t *pol = sub_obj(b, "policy");
  json_t *list = json_object_get(pol, k);
  if (list == NULL) {
    list = json_array();
    json_object_set_new(pol, k, list);
  }
  json_array_append_new(list, json_string(v));
}

/* Build the create/plan body from the flags. *idem gets --idempotency-key
 * (create only). Returns CLI_OK or CLI_EUSAGE (printed). */
static int sandbox_body(const char *cmd, int argc, char **argv, json_t **out, const char **idem)
{
  json_t *b = json_object();
  int rv = CLI_OK;
  uint64_t u;
  for (int i = 0; i < argc && rv == CLI_OK; i++) {
    const char *v = NULL;
    int m;
#define OPT(name) ((m = cli_opt(argc, argv, &i, name, &v)) != 0 && (m > 0 || (rv = CLI_EUSAGE, 0)))
    if (OPT("--template")) {
      json_object_set_new(b, "template", json_string(v));
    } else if (OPT("--gpu")) {
      const char *colon = strchr(v, ':');
      char num[32];
      snprintf(num, sizeof(num), "%.*s", (int)(colon ? (size_t)(colon - v) : strlen(v)), v);
      if (cli_parse_u64(num, 64, &u) != 0 || u == 0 || (colon != NULL && colon[1] == '\0')) {
        rv = cli_usage_error(cmd, "--gpu wants N or N:TYPE (N 1..64), got '%s'", v);
        break;
      }
      json_t *g = json_pack("{s:I}", "count", (json_int_t)u);
      if (colon != NULL)
        json_object_set_new(g, "type", json_string(colon + 1));
      json_object_set_new(sub_obj(b, "capabilities"), "gpu", g);
    } else if (strcmp(argv[i], "--snapshot") == 0) {
      json_object_set_new(sub_obj(b, "capabilities"), "snapshot", json_true());
    } else if (OPT("--port")) {
      if (cli_parse_u64(v, 65535, &u) != 0 || u == 0) {
        rv = cli_usage_error(cmd, "--port wants 1..65535, got '%s'", v);
        break;
      }
      json_t *caps = sub_obj(b, "capabilities");
      json_t *ports = json_object_get(caps, "ports");
      if (ports == NULL) {
        ports = json_array();
        json_object_set_new(caps, "ports", ports);
      }
      json_array_append_new(ports, json_integer((json_int_t)u));
    } else if (OPT("--memory")) {
      if (cli_parse_u64(v, 16u << 20, &u) != 0 || u == 0) {
        rv = cli_usage_error(cmd, "--memory wants MiB, got '%s'", v);
        break;
      }
      json_object_set_new(sub_obj(b, "capabilities"), "minMemoryMiB", json_integer((json_int_t)u));
    } else if (OPT("--vcpus")) {
      if (cli_parse_u64(v, 1024, &u) != 0 || u == 0) {
        rv = cli_usage_error(cmd, "--vcpus wants 1..1024, got '%s'", v);
        break;
      }
      json_object_set_new(sub_obj(b, "capabilities"), "vcpus", json_integer((json_int_t)u));
    } else if (OPT("--region")) {
      json_object_set_new(sub_obj(b, "capabilities"), "region", json_string(v));
    } else if (OPT("--isolation")) {
      if (strcmp(v, "container") != 0 && strcmp(v, "gvisor") != 0 &&
          strcmp(v, "firecracker") != 0) {
        rv =
            cli_usage_error(cmd, "--isolation wants container, gvisor or firecracker, got '%s'", v);
        break;
      }
      json_object_set_new(sub_obj(b, "capabilities"), "isolation", json_string(v));
    } else if (OPT("--strategy")) {
      json_object_set_new(sub_obj(b, "policy"), "strategy", json_string(v));
    } else if (OPT("--allow")) {
      add_name(b, "allow", v);
    } else if (OPT("--deny")) {
      add_name(b, "deny", v);
    } else if (OPT("--max-cost")) {
      char *end;
      double d = strtod(v, &end);
      if (*v == '\0' || *end != '\0' || !(d >= 0 && d < 1e9)) {
        rv = cli_usage_error(cmd, "--max-cost wants USD per hour, got '%s'", v);
        break;
      }
      json_object_set_new(sub_obj(b, "policy"), "maxCostPerHour", json_real(d));
    } else if (OPT("--timeout")) {
      if (cli_parse_u64(v, 31536000, &u) != 0 || u == 0) {
        rv = cli_usage_error(cmd, "--timeout wants seconds, got '%s'", v);
        break;
      }
      json_object_set_new(b, "timeoutSeconds", json_integer((json_int_t)u));
    } else if (OPT("--idle-timeout")) {
      if (cli_parse_u64(v, 31536000, &u) != 0) {
        rv = cli_usage_error(cmd, "--idle-timeout wants seconds, got '%s'", v);
        break;
      }
      json_object_set_new(b, "idleTimeoutSeconds", json_integer((json_int_t)u));
    } else if (OPT("--env")) {
      rv = put_kv(sub_obj(b, "env"), cmd, "--env", v);
    } else if (OPT("--meta")) {
      rv = put_kv(sub_obj(b, "metadata"), cmd, "--meta", v);
    } else if (idem != NULL && OPT("--idempotency-key")) {
      *idem = v;
    } else if (rv == CLI_OK) {
      rv = cli_usage_error(cmd, "unknown argument '%s'", argv[i]);
    }
#undef OPT
  }
  if (rv != CLI_OK) {
    json_decref(b);
    return rv;
  }
  *out = b;
  return CLI_OK;
}

/* The single-object view of a sandbox. */
static void print_sandbox(const json_t *s)
{
  static const struct {
    const char *label, *path;
  } rows[] = {
      {"id", "id"},
      {"state", "state"},
      {"tenant", "tenant"},
      {"template", "template"},
      {"provider", "binding.provider"},
      {"provider id", "binding.providerId"},
      {"region", "binding.region"},
      {"isolation", "binding.isolation"},
      {"attempt", "binding.attempt"},
      {"vcpus", "binding.capabilities.vcpus"},
      {"memory MiB", "binding.capabilities.minMemoryMiB"},
      {"gpu", "binding.capabilities.gpu"},
      {"ports", "binding.capabilities.ports"},
      {"data plane", "dataplaneUrl"},
      {"token", "token"},
      {"token expires", "tokenExpiresAt"},
      {"created", "createdAt"},
      {"expires", "expiresAt"},
      {"idle timeout s", "idleTimeoutSeconds"},
      {"last activity", "lastActivityAt"},
      {"metadata", "metadata"},
      {"ended", "endedAt"},
      {"end reason", "endReason"},
  };
  char buf[1024];
  for (size_t i = 0; i < OSR_ARRAY_SIZE(rows); i++) {
    cli_field(s, rows[i].path, buf, sizeof(buf));
    /* Skip what the answer does not carry rather than printing a wall of "-". */
    if (strcmp(buf, "-") == 0 && i > 3)
      continue;
    cli_kv(stdout, 14, rows[i].label, buf);
  }
  json_t *e = json_object_get(s, "error");
  if (e != NULL && !json_is_null(e)) {
    char *d = json_dumps(e, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
    cli_kv(stdout, 14, "error", d ? d : "?");
    osr_json_free(d);
  }
}

int cli_cmd_create(cli_t *c, int argc, char **argv)
{
  json_t *body;
  const char *idem = NULL;
  int rv = sandbox_body("create", argc, argv, &body, &idem);
  if (rv != CLI_OK)
    return rv;
  cli_resp_t r;
  rv = cli_call(c, "POST", "/v1/sandboxes", body, idem, &r);
  json_decref(body);
  if (rv != CLI_OK)
    return rv;
  if (c->json)
    cli_print_raw(&r);
  else
    print_sandbox(r.json);
  cli_resp_dispose(&r);
  return CLI_OK;
}

static void print_plan(const json_t *plan)
{
  const json_t *provs = json_object_get(plan, "providers");
  static const char *const head[] = {"ORDER",     "PROVIDER", "TYPE",   "ELIGIBLE",
                                     "ISOLATION", "REGION",   "COST/H", "SCORE",
                                     "COST",      "LATENCY",  "RELIAB", "REGION-AFF"};
  cli_table_t t;
  cli_table_init(&t, 12, head);
  size_t i;
  json_t *p;
  json_array_foreach(provs, i, p)
  {
    char b[12][128];
    const char *row[12] = {
        cli_field(p, "order", b[0], 128),
        cli_field(p, "name", b[1], 128),
        cli_field(p, "type", b[2], 128),
        cli_field(p, "eligible", b[3], 128),
        cli_field(p, "isolation", b[4], 128),
        cli_field(p, "region", b[5], 128),
        cli_field(p, "costPerHour", b[6], 128),
        cli_field(p, "score.total", b[7], 128),
        cli_field(p, "score.cost", b[8], 128),
        cli_field(p, "score.latency", b[9], 128),
        cli_field(p, "score.reliability", b[10], 128),
        cli_field(p, "score.region", b[11], 128),
    };
    cli_table_add(&t, row);
  }
  cli_table_print(&t, stdout);

  printf("\nfilters:\n");
  json_array_foreach(provs, i, p)
  {
    char nb[128];
    printf("  %s:", cli_field(p, "name", nb, sizeof(nb)));
    const json_t *fl = json_object_get(p, "filters");
    size_t j;
    json_t *f;
    json_array_foreach(fl, j, f)
    {
      char fb[64], rb[256];
      json_t *passed = json_object_get(f, "passed");
      const char *mark = json_is_true(passed) ? "ok" : json_is_false(passed) ? "FAILED" : "skipped";
      printf(" %s=%s", cli_field(f, "name", fb, sizeof(fb)), mark);
      if (json_is_false(passed))
        printf(" (%s)", cli_field(f, "reason", rb, sizeof(rb)));
    }
    printf("\n");
  }
  char ob[1024];
  const json_t *order = json_object_get(plan, "order");
  printf("\norder: %s\n", json_array_size(order) ? cli_field(plan, "order", ob, sizeof(ob))
                                                 : "none (no capable provider)");
}

int cli_cmd_plan(cli_t *c, int argc, char **argv)
{
  json_t *body;
  int rv = sandbox_body("plan", argc, argv, &body, NULL);
  if (rv != CLI_OK)
    return rv;
  cli_resp_t r;
  rv = cli_call(c, "POST", "/v1/plan", body, NULL, &r);
  json_decref(body);
  if (rv != CLI_OK)
    return rv;
  if (c->json)
    cli_print_raw(&r);
  else
    print_plan(r.json);
  cli_resp_dispose(&r);
  return CLI_OK;
}

static void append(char *q, size_t qlen, const char *k, const char *v)
{
  size_t n = strlen(q);
  char enc[1024];
  cli_urlencode(v, enc, sizeof(enc));
  snprintf(q + n, qlen - n, "%s%s=%s", n ? "&" : "?", k, enc);
}

int cli_cmd_ls(cli_t *c, int argc, char **argv)
{
  char q[4096] = "", target[8192];
  int all = 0, rv = CLI_OK;
  uint64_t u;
  for (int i = 0; i < argc; i++) {
    const char *v = NULL;
    int m;
    if ((m = cli_opt(argc, argv, &i, "--state", &v)) != 0) {
      if (m < 0)
        return CLI_EUSAGE;
      append(q, sizeof(q), "state", v);
    } else if ((m = cli_opt(argc, argv, &i, "--meta", &v)) != 0) {
      if (m < 0)
        return CLI_EUSAGE;
      const char *eq = strchr(v, '=');
      if (eq == NULL || eq == v)
        return cli_usage_error("ls", "--meta wants KEY=VALUE, got '%s'", v);
      char key[300], kenc[900];
      snprintf(key, sizeof(key), "%.*s", (int)(eq - v), v);
      cli_urlencode(key, kenc, sizeof(kenc));
      char k2[1000];
      snprintf(k2, sizeof(k2), "metadata.%s", kenc);
      append(q, sizeof(q), k2, eq + 1);
    } else if ((m = cli_opt(argc, argv, &i, "--limit", &v)) != 0) {
      if (m < 0)
        return CLI_EUSAGE;
      if (cli_parse_u64(v, 1000, &u) != 0 || u == 0)
        return cli_usage_error("ls", "--limit wants 1..1000, got '%s'", v);
      append(q, sizeof(q), "limit", v);
    } else if ((m = cli_opt(argc, argv, &i, "--tenant", &v)) != 0) {
      if (m < 0)
        return CLI_EUSAGE;
      append(q, sizeof(q), "tenant", v);
    } else if (strcmp(argv[i], "--all-pages") == 0) {
      all = 1;
    } else {
      return cli_usage_error("ls", "unknown argument '%s'", argv[i]);
    }
  }

  json_t *items = json_array();
  char *cursor = NULL;
  cli_resp_t r;
  memset(&r, 0, sizeof(r));
  /* Every page is bounded by --limit; the page count by the gateway's own
   * data, and a cursor that repeats ends the loop. */
  for (int page = 0; page < 100000; page++) {
    if (cursor != NULL) {
      char enc[1024];
      cli_urlencode(cursor, enc, sizeof(enc));
      snprintf(target, sizeof(target), "/v1/sandboxes%s%scursor=%s", q, q[0] ? "&" : "?", enc);
    } else {
      snprintf(target, sizeof(target), "/v1/sandboxes%s", q);
    }
    rv = cli_call(c, "GET", target, NULL, NULL, &r);
    if (rv != CLI_OK)
      break;
    if (c->json && !all) {
      cli_print_raw(&r);
      cli_resp_dispose(&r);
      break;
    }
    json_array_extend(items, json_object_get(r.json, "items"));
    const char *next = json_string_value(json_object_get(r.json, "nextCursor"));
    int again =
        all && next != NULL && next[0] != '\0' && (cursor == NULL || strcmp(cursor, next) != 0);
    osr_free(cursor);
    cursor = again ? osr_xstrdup(next) : NULL;
    if (!again && !all && next != NULL && !c->json)
      fprintf(stderr, "(more: osr ls --all-pages, or --limit)\n");
    cli_resp_dispose(&r);
    if (!again)
      break;
  }
  osr_free(cursor);
  if (rv == CLI_OK && c->json && all) {
    /* The pages merged into one answer of the API's shape. */
    json_t *j = json_pack("{s:O,s:n}", "items", items, "nextCursor");
    char *s = json_dumps(j, JSON_COMPACT);
    printf("%s\n", s ? s : "");
    osr_json_free(s);
    json_decref(j);
  } else if (rv == CLI_OK && !c->json) {
    static const char *const head[] = {"ID",        "STATE",    "PROVIDER", "REGION",
                                       "ISOLATION", "TEMPLATE", "CREATED",  "EXPIRES"};
    cli_table_t t;
    cli_table_init(&t, 8, head);
    size_t i;
    json_t *s;
    json_array_foreach(items, i, s)
    {
      char b[8][128];
      const char *row[8] = {cli_field(s, "id", b[0], 128),
                            cli_field(s, "state", b[1], 128),
                            cli_field(s, "binding.provider", b[2], 128),
                            cli_field(s, "binding.region", b[3], 128),
                            cli_field(s, "binding.isolation", b[4], 128),
                            cli_field(s, "template", b[5], 128),
                            cli_field(s, "createdAt", b[6], 128),
                            cli_field(s, "expiresAt", b[7], 128)};
      cli_table_add(&t, row);
    }
    cli_table_print(&t, stdout);
  }
  json_decref(items);
  return rv;
}

static int valid_id(const char *id)
{
  size_t n = strlen(id);
  if (n == 0 || n >= 64)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = id[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '-' || ch == '_'))
      return 0;
  }
  return 1;
}

int cli_cmd_get(cli_t *c, int argc, char **argv)
{
  if (argc != 1 || argv[0][0] == '-')
    return cli_usage_error("get", "wants exactly one sandbox ID");
  if (!valid_id(argv[0]))
    return cli_usage_error("get", "'%s' is not a sandbox id", argv[0]);
  char target[128];
  snprintf(target, sizeof(target), "/v1/sandboxes/%s", argv[0]);
  cli_resp_t r;
  int rv = cli_call(c, "GET", target, NULL, NULL, &r);
  if (rv != CLI_OK)
    return rv;
  if (c->json)
    cli_print_raw(&r);
  else
    print_sandbox(r.json);
  cli_resp_dispose(&r);
  return CLI_OK;
}

int cli_cmd_kill(cli_t *c, int argc, char **argv)
{
  if (argc == 0)
    return cli_usage_error("kill", "wants at least one sandbox ID");
  for (int i = 0; i < argc; i++) {
    if (argv[i][0] == '-')
      return cli_usage_error("kill", "unknown argument '%s'", argv[i]);
    if (!valid_id(argv[i]))
      return cli_usage_error("kill", "'%s' is not a sandbox id", argv[i]);
  }
  /* Kill what can be killed; the exit code is the worst outcome, with
   * "unreachable" and "unauthorized" outranking "not found". */
  int worst = CLI_OK;
  static const int rank[] = {0, 3, 0, 5, 2, 4}; /* by exit code */
  for (int i = 0; i < argc; i++) {
    char target[128];
    snprintf(target, sizeof(target), "/v1/sandboxes/%s", argv[i]);
    cli_resp_t r;
    int rv = cli_call(c, "DELETE", target, NULL, NULL, &r);
    if (rv == CLI_OK) {
      if (c->json)
        cli_print_raw(&r);
      else
        printf("killed %s\n", argv[i]);
      cli_resp_dispose(&r);
    }
    if (rv > 0 && rv < (int)OSR_ARRAY_SIZE(rank) && rank[rv] > rank[worst])
      worst = rv;
    if (rv == CLI_EUNREACH)
      break;
  }
  return worst;
}
