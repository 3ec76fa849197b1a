/*
 * The `e2b` provider: sandboxes on E2B (e2b.dev), which runs each one in a
 * Firecracker microVM with its own envd. The adapter speaks E2B's REST API
 * (contract: /work/shared/reference/e2b-contract.md §2) with the OSR HTTP
 * client; the data plane then talks to E2B's envd directly (no osr-agent
 * runs there), see docs/adapters.md "The e2b provider".
 *
 * Config keys (docs/adapters.md, docs/configuration.md):
 *   api_url (https://api.e2b.app), api_key ({env: NAME} | {file: PATH},
 *   resolved by the configuration loader) or api_key_env | api_key_file (the
 *   key is never logged), domain (e2b.app), sandbox_url (where
 *   envd traffic goes instead of https://<port>-<id>.<domain>, like the
 *   SDK's E2B_SANDBOX_URL), templates ({osr template: E2B templateID},
 *   identity by default), regions ([]), prices, vcpus (2), memory_mib (512),
 *   expected_create_ms (500), timeout_ms (60000), sandbox_timeout_s (0),
 *   offload_bytes (OSR_REST_OFFLOAD_BYTES).
 *
 * The provider's per-sandbox credential. E2B's create answers with an
 * envdAccessToken (and maybe a trafficAccessToken) that envd and E2B's port
 * proxy require. The client must never see it, and the client's OSR token
 * must never reach E2B. The adapter seals it (token.h, osr_upstream_seal:
 * AES-256-GCM under a key derived from spec->agent_token, i.e. from the
 * agent secret gateway and data plane share) into the agent endpoint it
 * reports: "https://49983-<id>.<domain>#osr-up=<sealed>". The endpoint goes
 * wherever endpoints already go (binding row, Redis binding cache, the
 * token's "ep" claim) and the data plane opens it (dataplane/upstream.c).
 * So this provider needs the agent secret: without spec->agent_token a
 * create fails `unavailable` (placement moves on) with a log line. After a
 * crash, recovery adopts a sandbox that create never reported through
 * adopt(): GET /sandboxes/{id} (SandboxDetail carries the envdAccessToken,
 * ListedSandbox does not) sealed with the agent token the gateway derives.
 *
 * Labels: metadata osr.dev/sandbox-id and osr.dev/tenant, plus
 * osr.dev/managed=true so list() can ask E2B for OSR's sandboxes with one
 * metadata filter (E2B filters on key=value, not on a key's presence).
 *
 * Ops run on adapters/rest.h (one deadline per op, deferred exactly-once
 * delivery, one HTTP/1.1 connection per op, cancel on close); this file
 * holds only what is E2B's: targets, bodies, status mapping, answers.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adapters/rest.h"
#include "net/http.h"
#include "net/tls.h"
#include "osr/adapter.h"
#include "token/token.h"
#include "util/jsonw.h"
#include "util/log.h"
#include "util/mem.h"

#define MOD "e2b"
/* Largest answer accepted from E2B (a page of up to 100 listed sandboxes
 * with metadata is far below this). */
#define E2B_MAX_RESPONSE (8u << 20)
/* list(): pages of 100 (the "&limit=100" below), at most this many. */
#define E2B_MAX_PAGES 100
/* list_page(): E2B's own largest page. */
#define E2B_PAGE_MAX 100
/* OSR's sandboxes, running or paused; "&limit=N" follows. The metadata
 * filter is "k=v" URL-encoded as a query value. */
#define E2B_LIST_TARGET "/v2/sandboxes?metadata=osr.dev%2Fmanaged%3Dtrue&state=running%2Cpaused"
#define E2B_MANAGED   "osr.dev/managed"
/* Longest X-Next-Token kept (a list_page() cursor too), NUL included. */
#define E2B_TOKEN_MAX 512
/* Largest request body: 64 env and 64 metadata entries of 4 KiB, escaped. */
#define E2B_MAX_REQUEST (8u << 20)

typedef struct e2b_s e2b_t;
typedef struct e2b_op_s e2b_op_t;

enum {
  OP_CREATE,
  OP_DESTROY,
  OP_GET,
  OP_LIST,
  OP_PAUSE,
  OP_RESUME,
  OP_CLEANUP,
  OP_ADOPT,
  OP_LIST_PAGE
};

/* The adapter's state of one op (the rest op's user area). */
struct e2b_op_s {
  osr_rest_op_t *rop;
  e2b_t *e;
  int kind;
  char next_token[E2B_TOKEN_MAX]; /* X-Next-Token of the last list page (list_page: the cursor
                                     first) */
  char method[8];
  char target[1024];
  char *body; /* request body: osr_jw_release memory (osr_free) */
  int pages;
  int token_too_long; /* the last answer's X-Next-Token did not fit */
  /* create */
  char sid[OSR_NAME_MAX];
  char tenant[OSR_NAME_MAX];
  char region[OSR_NAME_MAX];
  char agent_tok[65];
  osr_capabilities_t caps;
  /* results */
  char provider_id[128];
  osr_resource_t res;
  osr_resource_t *list;
  size_t nlist, caplist;
  union {
    osr_provider_create_cb create;
    osr_provider_done_cb done;
    osr_provider_get_cb get;
    osr_provider_list_cb list;
    osr_provider_list_page_cb list_page;
  } cb;
  void *data;
};

struct e2b_s {
  osr_provider_t *p;
  /* configuration */
  char api_addr[300];   /* host:port to connect to */
  char api_auth[300];   /* Host header */
  char api_prefix[256]; /* path prefix of api_url ("" or "/x") */
  int api_tls;
  char api_key[256];
  char domain[256];
  char sandbox_url[300]; /* "" = https://49983-<id>.<domain> */
  json_t *templates;     /* object: OSR template -> E2B templateID */
  char regions[15][OSR_NAME_MAX];
  size_t nregions;
  double price_vcpu, price_gib, price_create, expected_ms;
  uint32_t vcpus, memory_mib;
  uint64_t timeout_ms;
  size_t offload_bytes; /* list pages this large are parsed off the loop */
  uint32_t sandbox_timeout_s; /* E2B-side lifetime at create/resume; 0 = OSR's TTL / 300 s */
  osr_tls_ctx_t *tls;
  osr_rest_t *api; /* the op queue */
  /* close */
  int closing;
  void (*close_cb)(osr_provider_t *p);
};

/* The op queue's callbacks (rest.h), below. */
static void on_head(osr_rest_op_t *rop, int status, const osr_http_header_t *h, size_t nh);
static void on_answer(osr_rest_op_t *rop, int st, const char *body, size_t len);
static int on_work(osr_rest_op_t *rop, int st, const char *body, size_t len);
static void deliver(osr_rest_op_t *rop, int status);
static void op_release(osr_rest_op_t *rop);

/* ---- configuration ---------------------------------------------------------- */

/* "http[s]://host[:port][/prefix]" -> connect address, Host and prefix. */
static int parse_base(const char *url, int *tls, char *addr, size_t addrlen, char *auth,
                      size_t authlen, char *prefix, size_t prefixlen)
{
  size_t skip;
  if (strncmp(url, "https://", 8) == 0) {
    *tls = 1;
    skip = 8;
  } else if (strncmp(url, "http://", 7) == 0) {
    *tls = 0;
    skip = 7;
  } else {
    return -1;
  }
  const char *h = url + skip;
  size_t hn = strcspn(h, "/?#");
  if (hn == 0 || hn >= authlen || hn + 5 >= addrlen || h[hn] == '?' || h[hn] == '#')
    return -1;
  for (size_t i = 0; i < hn; i++)
    if ((unsigned char)h[i] <= ' ' || h[i] == '@')
      return -1;
  memcpy(auth, h, hn);
  auth[hn] = '\0';
  const char *colon = h[0] == '[' ? strstr(auth, "]:") : strrchr(auth, ':');
  if (colon != NULL && h[0] == '[')
    colon++;
  snprintf(addr, addrlen, "%s%s", auth, colon != NULL ? "" : (*tls ? ":443" : ":80"));
  const char *rest = h + hn;
  size_t rn = strlen(rest);
  while (rn > 0 && rest[rn - 1] == '/')
    rn--;
  if (rn >= prefixlen || memchr(rest, '?', rn) != NULL || memchr(rest, '#', rn) != NULL)
    return -1;
  memcpy(prefix, rest, rn);
  prefix[rn] = '\0';
  return 0;
}

/* A host-name label set: what E2B ids and domains consist of. */
static int name_ok(const char *s, size_t max, int dots)
{
  size_t n = strlen(s);
  if (n == 0 || n >= max)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '-' || ch == '_' || (dots && ch == '.') || (dots && ch == ':')))
      return 0;
  }
  return 1;
}

/* Tokens we forward as header values: printable ASCII, no separators that
 * would let a provider answer inject a header or a sealed-field line. */
static int token_ok(const char *s, size_t max)
{
  size_t n = strlen(s);
  if (n >= max)
    return 0;
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] <= ' ' || (unsigned char)s[i] >= 0x7f)
      return 0;
  return 1;
}

/* The API key: from the environment or a file (read here, at configuration
 * load, before any loop runs; never logged). */
static int load_key(e2b_t *e, const char *key, const char *v, char *err, size_t errlen)
{
  char buf[sizeof(e->api_key) + 2];
  size_t n = 0;
  if (strcmp(key, "api_key_env") == 0) {
    const char *s = getenv(v);
    if (s == NULL || s[0] == '\0')
      return osr_rest_cfg_err(err, errlen, key, "names an environment variable that is not set");
    n = strlen(s);
    if (n >= sizeof(buf))
      return osr_rest_cfg_err(err, errlen, key, "the key is too long");
    memcpy(buf, s, n);
  } else {
    FILE *f = fopen(v, "re");
    if (f == NULL)
      return osr_rest_cfg_err(err, errlen, key, "cannot read the file");
    n = fread(buf, 1, sizeof(buf) - 1, f);
    int more = fgetc(f) != EOF;
    fclose(f);
    if (more)
      return osr_rest_cfg_err(err, errlen, key, "the file is too long for a key");
  }
  buf[n] = '\0';
  while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
    buf[--n] = '\0';
  if (n == 0 || n >= sizeof(e->api_key) || !token_ok(buf, sizeof(e->api_key))) {
    memset(buf, 0, sizeof(buf));
    return osr_rest_cfg_err(err, errlen, key,
                            "not a usable API key (empty, or spaces/control characters)");
  }
  memcpy(e->api_key, buf, n + 1);
  memset(buf, 0, sizeof(buf));
  return 0;
}

static int parse_config(e2b_t *e, const json_t *cfg, char *err, size_t errlen)
{
  const char *key;
  json_t *v;
  const char *api_url = "https://api.e2b.app";
  int have_key = 0;
  if (cfg != NULL && !json_is_object(cfg))
    return osr_rest_cfg_err(err, errlen, "(config)", "must be an object");
  json_object_foreach((json_t *)cfg, key, v)
  {
    double d;
    if (strcmp(key, "name") == 0 || strcmp(key, "type") == 0) {
      continue;
    } else if (strcmp(key, "api_key") == 0) {
      /* The configuration loader has already resolved {env: NAME} /
       * {file: PATH} into the key itself (docs/configuration.md). */
      if (have_key)
        return osr_rest_cfg_err(err, errlen, key,
                                "give one of api_key, api_key_env and api_key_file");
      if (!json_is_string(v) || json_string_length(v) == 0 ||
          json_string_length(v) >= sizeof(e->api_key) ||
          !token_ok(json_string_value(v), sizeof(e->api_key)))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a reference {env: NAME} or {file: PATH} to a key");
      snprintf(e->api_key, sizeof(e->api_key), "%s", json_string_value(v));
      have_key = 1;
    } else if (strcmp(key, "api_key_env") == 0 || strcmp(key, "api_key_file") == 0) {
      if (!json_is_string(v) || json_string_length(v) == 0)
        return osr_rest_cfg_err(err, errlen, key, "must be a non-empty string");
      if (have_key)
        return osr_rest_cfg_err(err, errlen, key,
                                "give one of api_key, api_key_env and api_key_file");
      if (load_key(e, key, json_string_value(v), err, errlen) != 0)
        return OSR_EINVAL;
      have_key = 1;
    } else if (strcmp(key, "api_url") == 0) {
      if (!json_is_string(v))
        return osr_rest_cfg_err(err, errlen, key, "must be an http(s) URL");
      api_url = json_string_value(v);
    } else if (strcmp(key, "domain") == 0) {
      if (!json_is_string(v) || !name_ok(json_string_value(v), 200, 1))
        return osr_rest_cfg_err(err, errlen, key, "must be a DNS domain such as e2b.app");
      snprintf(e->domain, sizeof(e->domain), "%s", json_string_value(v));
    } else if (strcmp(key, "sandbox_url") == 0) {
      char a[300], h[256], pre[256];
      int tls;
      if (!json_is_string(v) ||
          parse_base(json_string_value(v), &tls, a, sizeof(a), h, sizeof(h), pre, sizeof(pre)) !=
              0 ||
          pre[0] != '\0')
        return osr_rest_cfg_err(err, errlen, key, "must be http(s)://HOST[:PORT] without a path");
      snprintf(e->sandbox_url, sizeof(e->sandbox_url), "%s://%s", tls ? "https" : "http", h);
    } else if (strcmp(key, "templates") == 0) {
      const char *tk;
      json_t *tv;
      if (!json_is_object(v))
        return osr_rest_cfg_err(err, errlen, key, "must be a map {osr template: E2B templateID}");
      json_object_foreach(v, tk, tv)
      {
        if (!json_is_string(tv) || json_string_length(tv) == 0 || json_string_length(tv) >= 128)
          return osr_rest_cfg_err(err, errlen, key,
                                  "each value must be an E2B templateID (1..127 chars)");
      }
      json_decref(e->templates);
      e->templates = json_deep_copy(v);
    } else if (strcmp(key, "regions") == 0) {
      size_t i;
      json_t *r;
      if (!json_is_array(v) || json_array_size(v) > OSR_ARRAY_SIZE(e->regions))
        return osr_rest_cfg_err(err, errlen, key, "must be a list of at most 15 region names");
      json_array_foreach(v, i, r)
      {
        if (!json_is_string(r) || json_string_length(r) == 0 ||
            json_string_length(r) >= OSR_NAME_MAX)
          return osr_rest_cfg_err(err, errlen, key, "must be a list of at most 15 region names");
        snprintf(e->regions[i], OSR_NAME_MAX, "%s", json_string_value(r));
      }
      e->nregions = json_array_size(v);
    } else if (strcmp(key, "prices") == 0) {
      const char *pk;
      json_t *pv;
      if (!json_is_object(v))
        return osr_rest_cfg_err(err, errlen, key, "must be {vcpu_per_s, gib_per_s, per_create}");
      json_object_foreach(v, pk, pv)
      {
        double *dst = strcmp(pk, "vcpu_per_s") == 0   ? &e->price_vcpu
                      : strcmp(pk, "gib_per_s") == 0  ? &e->price_gib
                      : strcmp(pk, "per_create") == 0 ? &e->price_create
                                                      : NULL;
        if (dst == NULL || osr_rest_num_in(pv, 0, 1e6, dst) != 0)
          return osr_rest_cfg_err(
              err, errlen, key,
              "must be {vcpu_per_s, gib_per_s, per_create} with non-negative USD numbers");
      }
    } else if (strcmp(key, "vcpus") == 0 || strcmp(key, "memory_mib") == 0) {
      if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 20)
        return osr_rest_cfg_err(err, errlen, key, "must be a positive integer");
      *(key[0] == 'v' ? &e->vcpus : &e->memory_mib) = (uint32_t)json_integer_value(v);
    } else if (strcmp(key, "expected_create_ms") == 0) {
      if (osr_rest_num_in(v, 0, 3600e3, &e->expected_ms))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a number of milliseconds from 0 to 3600000");
    } else if (strcmp(key, "sandbox_timeout_s") == 0) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 2592000)
        return osr_rest_cfg_err(err, errlen, key, "must be a number of seconds from 0 to 2592000");
      e->sandbox_timeout_s = (uint32_t)json_integer_value(v);
    } else if (strcmp(key, "timeout_ms") == 0) {
      if (osr_rest_num_in(v, 1, 3600e3, &d))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a number of milliseconds from 1 to 3600000");
      e->timeout_ms = (uint64_t)d;
    } else if (strcmp(key, "offload_bytes") == 0) {
      if (osr_rest_num_in(v, 0, E2B_MAX_RESPONSE, &d))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a number of bytes from 0 to the largest answer");
      e->offload_bytes = (size_t)d;
    } else {
      return osr_rest_cfg_err(err, errlen, key,
                              "unknown key for an e2b provider (see docs/adapters.md)");
    }
  }
  if (!have_key)
    return osr_rest_cfg_err(err, errlen, "api_key",
                            "missing: an e2b provider needs api_key ({env: NAME} or {file: PATH}), "
                            "api_key_env or api_key_file");
  if (parse_base(api_url, &e->api_tls, e->api_addr, sizeof(e->api_addr), e->api_auth,
                 sizeof(e->api_auth), e->api_prefix, sizeof(e->api_prefix)) != 0)
    return osr_rest_cfg_err(err, errlen, "api_url", "must be http(s)://HOST[:PORT][/PATH]");
  return 0;
}

static void e2b_free_state(e2b_t *e)
{
  json_decref(e->templates);
  if (e->tls != NULL)
    osr_tls_ctx_unref(e->tls);
  memset(e->api_key, 0, sizeof(e->api_key));
  osr_free(e);
}

static int e2b_init(osr_provider_t *p, const json_t *config, char *err, size_t errlen)
{
  e2b_t *e = osr_xcalloc(1, sizeof(*e));
  e->p = p;
  snprintf(e->domain, sizeof(e->domain), "e2b.app");
  /* E2B's list prices (docs/adapters.md cites them): allocated vCPU and
   * memory per running second, no per-create fee. */
  e->price_vcpu = 0.000014;
  e->price_gib = 0.0000045;
  e->vcpus = 2;
  e->memory_mib = 512;
  e->expected_ms = 500;
  e->timeout_ms = 60000;
  e->offload_bytes = OSR_REST_OFFLOAD_BYTES;
  int rv = parse_config(e, config, err, errlen);
  if (rv == 0 && e->api_tls) {
    /* The system trust store (SSL_CERT_FILE honoured), read once here at
     * configuration load, before the loop runs. */
    static const char *const alpn[] = {"http/1.1"};
    osr_tls_client_opts_t co = {NULL, 0, alpn, 1, NULL, NULL};
    if (osr_tls_ctx_new_client(&co, &e->tls) != 0) {
      e->tls = NULL;
      rv = osr_rest_cfg_err(err, errlen, "api_url", "no TLS client context (system CA store)");
    }
  }
  if (rv != 0) {
    e2b_free_state(e);
    return rv;
  }
  osr_rest_config_t rc = {
      .name = p->name,
      .addr = e->api_addr,
      .authority = e->api_auth,
      .tls = e->api_tls ? e->tls : NULL,
      .timeout_ms = e->timeout_ms,
      .max_response = E2B_MAX_RESPONSE,
      .headers = {{OSR_IOV_LIT("x-api-key"), osr_iov(e->api_key, strlen(e->api_key))},
                  {OSR_IOV_LIT("user-agent"), OSR_IOV_LIT("osr-e2b-adapter")}},
      .nheaders = 2,
      .user_size = sizeof(e2b_op_t),
      .on_head = on_head,
      .on_answer = on_answer,
      .on_work = on_work,
      .work_min_bytes = e->offload_bytes,
      .on_deliver = deliver,
      .on_release = op_release,
  };
  e->api = osr_rest_new(p->loop, &rc, e);
  p->impl = e;
  return 0;
}

static void e2b_describe(osr_provider_t *p, osr_provider_info_t *info)
{
  e2b_t *e = p->impl;
  memset(info, 0, sizeof(*info));
  /* Every E2B sandbox is a Firecracker microVM. */
  info->isolation_mask = 1u << OSR_ISO_FIRECRACKER;
  info->gpu_max = 0;
  info->snapshot = 0; /* E2B's snapshots are not OSR's tar snapshots */
  info->pause = 1;
  info->max_ports = OSR_MAX_PORTS;
  /* The template fixes the size: no request can get more than it has. */
  info->max_memory_mib = e->memory_mib;
  info->max_vcpus = e->vcpus;
  info->default_memory_mib = e->memory_mib;
  info->default_vcpus = e->vcpus;
  for (size_t i = 0; i < e->nregions; i++)
    info->regions[i] = e->regions[i];
  info->price_vcpu_per_s = e->price_vcpu;
  info->price_gib_per_s = e->price_gib;
  info->price_per_create = e->price_create;
  info->expected_create_ms = e->expected_ms;
}

/* ---- ops -------------------------------------------------------------------- */

static void op_send(e2b_op_t *op);

static void op_release(osr_rest_op_t *rop)
{
  e2b_op_t *op = osr_rest_user(rop);
  osr_free(op->body);
  op->body = NULL;
  osr_free(op->list);
  memset(op->agent_tok, 0, sizeof(op->agent_tok));
  memset(&op->res, 0, sizeof(op->res)); /* the sealed endpoint */
}

static void deliver(osr_rest_op_t *rop, int status)
{
  e2b_op_t *op = osr_rest_user(rop);
  osr_provider_t *p = op->e->p;
  int ok = status == 0;
  switch (op->kind) {
  case OP_CREATE:
  case OP_RESUME:
    op->cb.create(p, status, ok ? &op->res : NULL, op->data);
    break;
  case OP_GET:
  case OP_ADOPT:
    op->cb.get(p, status, ok ? &op->res : NULL, op->data);
    break;
  case OP_DESTROY:
  case OP_PAUSE:
    op->cb.done(p, status, op->data);
    break;
  case OP_LIST:
    op->cb.list(p, status, ok ? op->list : NULL, ok ? op->nlist : 0, op->data);
    break;
  case OP_LIST_PAGE:
    op->cb.list_page(p, status, ok ? op->list : NULL, ok ? op->nlist : 0,
                     ok && op->next_token[0] != '\0' ? op->next_token : NULL, op->data);
    break;
  default: /* OP_CLEANUP: internal, nobody waits */
    break;
  }
}

/* Set the result (first one wins) and deliver it on a later loop turn. */
static void op_finish(e2b_op_t *op, int status)
{
  osr_rest_finish(op->rop, status);
}

static e2b_op_t *op_new(e2b_t *e, int kind, void *data)
{
  osr_rest_op_t *rop = osr_rest_op_new(e->api, kind);
  e2b_op_t *op = osr_rest_user(rop);
  op->rop = rop;
  op->e = e;
  op->kind = kind;
  op->data = data;
  return op;
}

/* target = api prefix + head + id + tail (ids are checked by name_ok). */
static void set_target(e2b_op_t *op, const char *method, const char *head, const char *id,
                       const char *tail)
{
  snprintf(op->method, sizeof(op->method), "%s", method);
  snprintf(op->target, sizeof(op->target), "%s%s%s%s", op->e->api_prefix, head,
           id != NULL ? id : "", tail);
}

/* ---- answers ------------------------------------------------------------------ */

static const char *jstr(const json_t *o, const char *k)
{
  const json_t *v = json_object_get(o, k);
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static void start_cleanup(e2b_t *e, const char *provider_id);
static int seal_endpoint(e2b_op_t *op, const json_t *j, const char *id, osr_resource_t *r);

/* Create / resume answer: a `Sandbox` object. For create, build and seal
 * the endpoint; for resume, report no endpoint (the binding keeps the one
 * sealed at create: E2B keeps a sandbox's envd token across pause). */
static int take_sandbox(e2b_op_t *op, const json_t *j)
{
  e2b_t *e = op->e;
  const char *id = jstr(j, "sandboxID");
  if (id == NULL || !name_ok(id, 100, 0))
    return OSR_PERR_UNAVAILABLE; /* E2B answered nonsense */
  osr_resource_t *r = &op->res;
  memset(r, 0, sizeof(*r));
  snprintf(r->provider_id, sizeof(r->provider_id), "%s", id);
  snprintf(op->provider_id, sizeof(op->provider_id), "%s", id);
  r->isolation = OSR_ISO_FIRECRACKER;
  r->state = OSR_RES_RUNNING;
  if (op->kind == OP_RESUME)
    return 0;
  snprintf(r->sandbox_id, sizeof(r->sandbox_id), "%s", op->sid);
  snprintf(r->region, sizeof(r->region), "%s", op->region);
  r->granted = op->caps;
  r->granted.vcpus = e->vcpus;
  r->granted.min_memory_mib = e->memory_mib;
  r->granted.isolation = OSR_ISO_FIRECRACKER;
  r->granted.gpu_count = 0;
  r->granted.gpu_type[0] = '\0';
  r->granted.snapshot = 0;
  snprintf(r->granted.region, sizeof(r->granted.region), "%s", op->region);
  return seal_endpoint(op, j, id, r);
}

/* Build r->agent_endpoint for E2B sandbox `id` from a `Sandbox` or
 * `SandboxDetail` answer `j`: E2B's Host form (or sandbox_url) with its
 * access tokens sealed under op->agent_tok for OSR sandbox op->sid. */
static int seal_endpoint(e2b_op_t *op, const json_t *j, const char *id, osr_resource_t *r)
{
  e2b_t *e = op->e;
  const char *dom = jstr(j, "domain");
  const char *envd = jstr(j, "envdAccessToken");
  const char *traffic = jstr(j, "trafficAccessToken");
  if (dom == NULL || dom[0] == '\0')
    dom = e->domain;
  if (!name_ok(dom, 200, 1) || (envd != NULL && !token_ok(envd, 400)) ||
      (traffic != NULL && !token_ok(traffic, 200))) {
    OSR_LOG_WARN(MOD, "%s: sandbox %s: unusable domain or access token in E2B's answer", e->p->name,
                 id);
    return OSR_PERR_BOOT_FAILED;
  }
  char host[300];
  snprintf(host, sizeof(host), "%s.%s", id, dom);
  host[strcspn(host, ":")] = '\0'; /* a domain "host:port" names the host */
  char plain[OSR_UPSTREAM_PLAIN_MAX + 1];
  int pn = snprintf(plain, sizeof(plain), "v1\n%s\n%s\n%s", host, envd != NULL ? envd : "",
                    traffic != NULL ? traffic : "");
  int base_n = e->sandbox_url[0] != '\0' ? snprintf(r->agent_endpoint, sizeof(r->agent_endpoint),
                                                    "%s%s", e->sandbox_url, OSR_UPSTREAM_FRAG)
                                         : snprintf(r->agent_endpoint, sizeof(r->agent_endpoint),
                                                    "https://49983-%s%s", host, OSR_UPSTREAM_FRAG);
  int sn = -1;
  if (pn > 0 && (size_t)pn < sizeof(plain) && base_n > 0 &&
      (size_t)base_n < sizeof(r->agent_endpoint))
    sn = osr_upstream_seal(op->agent_tok, op->sid, plain, (size_t)pn, r->agent_endpoint + base_n,
                           sizeof(r->agent_endpoint) - (size_t)base_n);
  memset(plain, 0, sizeof(plain));
  if (sn < 0) {
    OSR_LOG_WARN(MOD, "%s: sandbox %s: its access token does not fit a sealed endpoint", e->p->name,
                 id);
    memset(r->agent_endpoint, 0, sizeof(r->agent_endpoint));
    return OSR_PERR_BOOT_FAILED;
  }
  return 0;
}

/* A `ListedSandbox` / `SandboxDetail` as a resource (no endpoint: sealing
 * needs the sandbox's agent token, which only create and adopt are given,
 * see the file comment). 1 if it carries our label. */
static int take_listed(const json_t *j, osr_resource_t *r)
{
  memset(r, 0, sizeof(*r));
  const char *id = jstr(j, "sandboxID");
  const json_t *md = json_object_get(j, "metadata");
  const char *sid = jstr(md, OSR_LABEL_SANDBOX_ID);
  const char *state = jstr(j, "state");
  if (id == NULL || !name_ok(id, sizeof(r->provider_id), 0))
    return -1;
  snprintf(r->provider_id, sizeof(r->provider_id), "%s", id);
  if (sid != NULL)
    snprintf(r->sandbox_id, sizeof(r->sandbox_id), "%s", sid);
  r->isolation = OSR_ISO_FIRECRACKER;
  r->state = state != NULL && strcmp(state, "paused") == 0 ? OSR_RES_PAUSED : OSR_RES_RUNNING;
  const json_t *cpu = json_object_get(j, "cpuCount"), *mem = json_object_get(j, "memoryMB");
  if (json_is_integer(cpu) && json_integer_value(cpu) > 0)
    r->granted.vcpus = (uint32_t)json_integer_value(cpu);
  if (json_is_integer(mem) && json_integer_value(mem) > 0)
    r->granted.min_memory_mib = (uint32_t)json_integer_value(mem);
  r->granted.isolation = OSR_ISO_FIRECRACKER;
  return sid != NULL && sid[0] != '\0';
}

/* adopt(): a `SandboxDetail` (it carries the envdAccessToken that
 * ListedSandbox lacks) as a resource with a sealed endpoint, if it still
 * carries the label of the OSR sandbox being adopted. */
static int take_adopted(e2b_op_t *op, const json_t *j)
{
  osr_resource_t *r = &op->res;
  int mine = take_listed(j, r);
  if (mine < 0)
    return OSR_PERR_UNAVAILABLE;
  if (!mine || strcmp(r->sandbox_id, op->sid) != 0) {
    OSR_LOG_WARN(MOD, "%s: sandbox %s no longer carries the label of %s", op->e->p->name,
                 r->provider_id, op->sid);
    return OSR_PERR_NOT_FOUND;
  }
  /* Our creates ask for `secure`, so a sandbox without an envd token is
   * not ready yet (still starting): leave it pending, recovery's next pass
   * (the reaper's stale creates) asks again. */
  const char *envd = jstr(j, "envdAccessToken");
  if (envd == NULL || envd[0] == '\0') {
    OSR_LOG_INFO(MOD, "%s: sandbox %s has no envd access token yet", op->e->p->name,
                 r->provider_id);
    return OSR_PERR_UNAVAILABLE;
  }
  int rv = seal_endpoint(op, j, r->provider_id, r);
  /* The sandbox exists, so this is not a boot failure: E2B answered
   * something the data plane could not use. */
  return rv == 0 ? 0 : OSR_PERR_UNAVAILABLE;
}

static int list_page(e2b_op_t *op, const json_t *j)
{
  if (!json_is_array(j))
    return OSR_PERR_UNAVAILABLE;
  size_t i;
  json_t *it;
  json_array_foreach(j, i, it)
  {
    osr_resource_t r;
    int mine = take_listed(it, &r);
    if (mine < 0)
      return OSR_PERR_UNAVAILABLE;
    if (!mine)
      continue;
    if (op->nlist == op->caplist) {
      size_t cap = op->caplist ? op->caplist * 2 : 16;
      osr_resource_t *n = osr_try_realloc(op->list, cap * sizeof(*n));
      if (n == NULL)
        return OSR_ENOMEM;
      op->list = n;
      op->caplist = cap;
    }
    op->list[op->nlist++] = r;
  }
  return 0;
}

/* A list_page() answer. on_head took the next page's token; one it could
 * not keep would end the listing early, and a short listing reads as lost
 * sandboxes. Touches only the op (on_work runs it off the loop). */
static int take_list_page(e2b_op_t *op, const json_t *j)
{
  return op->token_too_long ? OSR_PERR_UNAVAILABLE : list_page(op, j);
}

/* One HTTP exchange is over: decide the op's outcome or its next request. */
static void on_answer(osr_rest_op_t *rop, int st, const char *body, size_t len)
{
  e2b_op_t *op = osr_rest_user(rop);
  e2b_t *e = op->e;
  json_t *j = body != NULL && len > 0 ? json_loadb(body, len, 0, NULL) : NULL;
  int status = 0;
  if (st < 200 || st > 299) {
    status = osr_rest_map_status(st); /* E2B's statuses are the contract's */
    /* pause of a paused sandbox: E2B says 409, OSR says done. */
    if (op->kind == OP_PAUSE && st == 409)
      status = 0;
    const char *msg = j != NULL ? jstr(j, "message") : NULL;
    OSR_LOG_DEBUG(MOD, "%s: %s %s: HTTP %d %s", e->p->name, op->method, op->target, st,
                  msg != NULL ? msg : "");
    if (op->kind == OP_CREATE && status != 0)
      OSR_LOG_INFO(MOD, "%s: create refused: HTTP %d (%s)", e->p->name, st,
                   osr_provider_err_name(status));
  } else if (op->kind == OP_CREATE || op->kind == OP_RESUME) {
    status = j != NULL ? take_sandbox(op, j) : OSR_PERR_UNAVAILABLE;
    if (status != 0 && op->kind == OP_CREATE && op->provider_id[0] != '\0')
      start_cleanup(e, op->provider_id); /* accepted, but unusable: do not leak it */
  } else if (op->kind == OP_GET) {
    status = j != NULL && take_listed(j, &op->res) >= 0 ? 0 : OSR_PERR_UNAVAILABLE;
  } else if (op->kind == OP_ADOPT) {
    status = j != NULL ? take_adopted(op, j) : OSR_PERR_UNAVAILABLE;
  } else if (op->kind == OP_LIST_PAGE) {
    status = take_list_page(op, j);
  } else if (op->kind == OP_LIST) {
    status = list_page(op, j);
    if (status == 0 && op->next_token[0] != '\0') {
      json_decref(j);
      if (++op->pages >= E2B_MAX_PAGES) {
        op_finish(op, OSR_E2BIG);
        return;
      }
      op_send(op); /* the next page, on the same connection */
      return;
    }
  }
  json_decref(j);
  op_finish(op, status);
}

/* A large answer (rest.h on_work, on the thread pool): a list_page() page
 * is parsed and taken here, with the op's state only; anything else goes
 * back to on_answer on the loop (it may log, clean up or send again). */
static int on_work(osr_rest_op_t *rop, int st, const char *body, size_t len)
{
  e2b_op_t *op = osr_rest_user(rop);
  if (op->kind != OP_LIST_PAGE || st < 200 || st > 299)
    return OSR_EAGAIN;
  json_t *j = json_loadb(body, len, 0, NULL);
  int status = take_list_page(op, j);
  json_decref(j);
  return status;
}

static void on_head(osr_rest_op_t *rop, int status, const osr_http_header_t *h, size_t nh)
{
  e2b_op_t *op = osr_rest_user(rop);
  (void)status;
  op->next_token[0] = '\0';
  op->token_too_long = 0;
  for (size_t i = 0; i < nh; i++) {
    if (h[i].name.len == 12 && memcmp(h[i].name.base, "x-next-token", 12) == 0) {
      if (h[i].value.len >= sizeof(op->next_token)) {
        op->token_too_long = 1;
        continue;
      }
      memcpy(op->next_token, h[i].value.base, h[i].value.len);
      op->next_token[h[i].value.len] = '\0';
    }
  }
}

/* Send the op's request (op->method/target/body, plus nextToken for the
 * next list page); rest.c connects first if needed. */
static void op_send(e2b_op_t *op)
{
  char target[sizeof(op->target) + 600];
  if ((op->kind == OP_LIST || op->kind == OP_LIST_PAGE) && op->next_token[0] != '\0') {
    /* X-Next-Token is opaque: percent-encode all but unreserved chars. */
    size_t n = (size_t)snprintf(target, sizeof(target), "%s&nextToken=", op->target);
    for (const char *s = op->next_token; *s != '\0' && n + 4 < sizeof(target); s++) {
      unsigned char ch = (unsigned char)*s;
      if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '-' || ch == '_' || ch == '.' || ch == '~')
        target[n++] = (char)ch;
      else
        n += (size_t)snprintf(target + n, sizeof(target) - n, "%%%02X", ch);
    }
    target[n] = '\0';
  } else {
    snprintf(target, sizeof(target), "%s", op->target);
  }
  osr_rest_send(op->rop, op->method, target, op->body);
}

/* ---- request bodies ------------------------------------------------------------- */

/* Request bodies are written with util/jsonw, byte for byte what the former
 * json_pack + json_dumps(JSON_COMPACT) gave (test_e2b compares the bytes E2B
 * receives), at a fraction of the instructions on the loop thread. All
 * return osr_free memory, or NULL when out of memory. */

/* {} (timeout < 0: pause) or {"timeout":N} (connect). */
static char *small_body(int64_t timeout)
{
  osr_jw_t w;
  size_t len;
  osr_jw_init(&w, 64);
  if (timeout < 0) {
    osr_jw_lit(&w, "{}");
  } else {
    osr_jw_lit(&w, "{\"timeout\":");
    osr_jw_int(&w, timeout);
    osr_jw_lit(&w, "}");
  }
  return osr_jw_release(&w, &len);
}

/* One member "key":"value" of an object being written; `*n` counts the
 * members so far (the comma). Keys are C strings, as json_object_set
 * took them. */
static void put_member(osr_jw_t *w, size_t *n, const char *key, const char *val, size_t vlen)
{
  if ((*n)++ > 0)
    osr_jw_lit(w, ",");
  osr_jw_str(w, key);
  osr_jw_lit(w, ":");
  osr_jw_strn(w, val, vlen);
}

/* A key's length as jansson stores it: 2.14 keeps one (a key may hold a
 * NUL byte), 2.13's keys are C strings. */
static size_t key_len(const char *key)
{
#if JANSSON_VERSION_HEX >= 0x020e00
  return json_object_iter_key_len(json_object_key_to_iter(key));
#else
  return strlen(key);
#endif
}

/* The environment as json_deep_copy + json_dumps wrote it: keys as
 * stored, strings (what the gateway passes) written directly, any other
 * value by jansson itself. */
static void put_env(osr_jw_t *w, const json_t *env)
{
  const char *k;
  size_t n = 0;
  json_t *v;
  osr_jw_lit(w, ",\"envVars\":{");
  json_object_foreach((json_t *)env, k, v)
  {
    if (n++ > 0)
      osr_jw_lit(w, ",");
    osr_jw_strn(w, k, key_len(k));
    osr_jw_lit(w, ":");
    if (json_is_string(v)) {
      osr_jw_strn(w, json_string_value(v), json_string_length(v));
    } else {
      char *t = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
      if (t != NULL)
        osr_jw_raw(w, t, strlen(t));
      else
        osr_jw_fail(w); /* out of memory */
      osr_json_free(t);
    }
  }
  osr_jw_lit(w, "}");
}

/* POST /v2/sandboxes: {"templateID","timeout","metadata":{user entries
 * outside OSR's "osr." namespace, then our labels},"secure":true,
 * "allow_internet_access":true[,"envVars":{...}]}. */
static char *create_body(const osr_sandbox_spec_t *spec, const char *template_id, uint32_t ttl,
                         const char *tenant)
{
  osr_jw_t w;
  size_t len, n = 0;
  const char *k;
  json_t *v;
  osr_jw_init(&w, E2B_MAX_REQUEST);
  osr_jw_lit(&w, "{\"templateID\":");
  osr_jw_str(&w, template_id);
  osr_jw_lit(&w, ",\"timeout\":");
  osr_jw_int(&w, ttl);
  osr_jw_lit(&w, ",\"metadata\":{");
  if (json_is_object(spec->metadata))
    json_object_foreach((json_t *)spec->metadata, k, v)
    {
      if (json_is_string(v) && strncmp(k, "osr.", 4) != 0) /* OSR's own namespace */
        put_member(&w, &n, k, json_string_value(v), json_string_length(v));
    }
  put_member(&w, &n, OSR_LABEL_SANDBOX_ID, spec->sandbox_id, strlen(spec->sandbox_id));
  put_member(&w, &n, OSR_LABEL_TENANT, tenant, strlen(tenant));
  put_member(&w, &n, E2B_MANAGED, "true", 4);
  osr_jw_lit(&w, "},\"secure\":true,\"allow_internet_access\":true");
  if (json_is_object(spec->env) && json_object_size(spec->env) > 0)
    put_env(&w, spec->env);
  osr_jw_lit(&w, "}");
  return osr_jw_release(&w, &len);
}

/* ---- operations ------------------------------------------------------------------ */

/* Ids go into a URL path: accept only what an E2B id can contain. */
static int start_simple(osr_provider_t *p, int kind, const char *provider_id, void *cb, void *data)
{
  e2b_t *e = p->impl;
  if (e == NULL || e->closing)
    return OSR_ECLOSED;
  if ((cb == NULL && kind != OP_CLEANUP) || (kind != OP_LIST && provider_id == NULL))
    return OSR_EINVAL;
  e2b_op_t *op = op_new(e, kind, data);
  switch (kind) {
  case OP_DESTROY:
  case OP_PAUSE:
    op->cb.done = (osr_provider_done_cb)cb;
    break;
  case OP_GET:
    op->cb.get = (osr_provider_get_cb)cb;
    break;
  case OP_RESUME:
    op->cb.create = (osr_provider_create_cb)cb;
    break;
  case OP_LIST:
    op->cb.list = (osr_provider_list_cb)cb;
    break;
  default:
    break;
  }
  if (kind != OP_LIST && !name_ok(provider_id, 100, 0)) {
    op_finish(op, OSR_PERR_NOT_FOUND); /* no such id can exist */
    return 0;
  }
  switch (kind) {
  case OP_DESTROY:
  case OP_CLEANUP:
    set_target(op, "DELETE", "/sandboxes/", provider_id, "");
    break;
  case OP_GET:
    set_target(op, "GET", "/sandboxes/", provider_id, "");
    break;
  case OP_PAUSE:
    set_target(op, "POST", "/sandboxes/", provider_id, "/pause");
    op->body = small_body(-1); /* E2B wants a JSON body; NULL: sent without one */
    break;
  case OP_RESUME:
    set_target(op, "POST", "/sandboxes/", provider_id, "/connect");
    /* connect resumes a paused sandbox; E2B requires a timeout here. */
    op->body = small_body(e->sandbox_timeout_s ? e->sandbox_timeout_s : 300);
    break;
  default:
    set_target(op, "GET", E2B_LIST_TARGET, NULL, "&limit=100");
    break;
  }
  op_send(op);
  return 0;
}

static void start_cleanup(e2b_t *e, const char *provider_id)
{
  OSR_LOG_WARN(MOD, "%s: destroying sandbox %s (created, but not usable)", e->p->name, provider_id);
  (void)start_simple(e->p, OP_CLEANUP, provider_id, NULL, NULL);
}

static int e2b_create(osr_provider_t *p, const osr_sandbox_spec_t *spec, osr_provider_create_cb cb,
                      void *data)
{
  e2b_t *e = p->impl;
  if (e == NULL || e->closing)
    return OSR_ECLOSED;
  if (spec == NULL || cb == NULL || spec->sandbox_id == NULL || spec->sandbox_id[0] == '\0' ||
      strlen(spec->sandbox_id) >= OSR_NAME_MAX ||
      (spec->tenant != NULL && strlen(spec->tenant) >= OSR_NAME_MAX))
    return OSR_EINVAL;
  e2b_op_t *op = op_new(e, OP_CREATE, data);
  op->cb.create = cb;
  snprintf(op->sid, sizeof(op->sid), "%s", spec->sandbox_id);
  snprintf(op->tenant, sizeof(op->tenant), "%s", spec->tenant != NULL ? spec->tenant : "");
  snprintf(op->region, sizeof(op->region), "%s", spec->region != NULL ? spec->region : "");
  op->caps = spec->caps;
  set_target(op, "POST", "/v2/sandboxes", NULL, "");

  /* Only a holder of the agent secret can seal E2B's token for the data
   * plane; without it this provider cannot serve, and another may. */
  if (spec->agent_token == NULL || strlen(spec->agent_token) != 64) {
    OSR_LOG_ERROR(MOD,
                  "%s: no agent secret configured: cannot carry E2B's access token to "
                  "the data plane (docs/adapters.md)",
                  p->name);
    op_finish(op, OSR_PERR_UNAVAILABLE);
    return 0;
  }
  memcpy(op->agent_tok, spec->agent_token, 65);
  if (spec->isolation != OSR_ISO_FIRECRACKER || spec->caps.gpu_count > 0 || spec->caps.snapshot ||
      spec->caps.vcpus > e->vcpus || spec->caps.min_memory_mib > e->memory_mib) {
    op_finish(op, OSR_PERR_INVALID); /* placement checked the manifest: never downgrade */
    return 0;
  }

  const char *tpl = spec->template_id != NULL && spec->template_id[0] ? spec->template_id : "base";
  const char *mapped = jstr(e->templates, tpl);
  /* E2B kills a sandbox at its own timeout, which OSR cannot move later
   * (the adapter interface has no timeout operation): sandbox_timeout_s
   * lets an operator give E2B a longer lifetime than the OSR TTL, so an
   * OSR setTimeout/connect extension holds; OSR's reaper still ends the
   * sandbox at OSR's deadline. */
  uint32_t ttl = spec->timeout_s > 0 ? spec->timeout_s : 300;
  if (e->sandbox_timeout_s > ttl)
    ttl = e->sandbox_timeout_s;
  op->body = create_body(spec, mapped != NULL ? mapped : tpl, ttl, op->tenant);
  if (op->body == NULL) {
    op_finish(op, OSR_ENOMEM);
    return 0;
  }
  op_send(op);
  return 0;
}

static int e2b_destroy(osr_provider_t *p, const char *id, osr_provider_done_cb cb, void *data)
{
  return start_simple(p, OP_DESTROY, id, (void *)cb, data);
}

static int e2b_get(osr_provider_t *p, const char *id, osr_provider_get_cb cb, void *data)
{
  return start_simple(p, OP_GET, id, (void *)cb, data);
}

static int e2b_list(osr_provider_t *p, osr_provider_list_cb cb, void *data)
{
  return start_simple(p, OP_LIST, NULL, (void *)cb, data);
}

/* One GET /v2/sandboxes page: the cursor is E2B's X-Next-Token. */
static int e2b_list_page(osr_provider_t *p, const char *cursor, size_t limit,
                         osr_provider_list_page_cb cb, void *data)
{
  e2b_t *e = p->impl;
  if (e == NULL || e->closing)
    return OSR_ECLOSED;
  if (cb == NULL || limit == 0 || (cursor != NULL && strlen(cursor) >= E2B_TOKEN_MAX))
    return OSR_EINVAL;
  e2b_op_t *op = op_new(e, OP_LIST_PAGE, data);
  op->cb.list_page = cb;
  char tail[32];
  snprintf(tail, sizeof(tail), "&limit=%zu", limit < E2B_PAGE_MAX ? limit : (size_t)E2B_PAGE_MAX);
  set_target(op, "GET", E2B_LIST_TARGET, NULL, tail);
  snprintf(op->next_token, sizeof(op->next_token), "%s", cursor != NULL ? cursor : "");
  op_send(op);
  return 0;
}

static int e2b_pause(osr_provider_t *p, const char *id, osr_provider_done_cb cb, void *data)
{
  return start_simple(p, OP_PAUSE, id, (void *)cb, data);
}

static int e2b_resume(osr_provider_t *p, const char *id, osr_provider_create_cb cb, void *data)
{
  return start_simple(p, OP_RESUME, id, (void *)cb, data);
}

/* Crash recovery found a sandbox of ours that create never reported: fetch
 * its detail (the only answer that carries the envdAccessToken) and seal an
 * endpoint with the agent token the gateway derives for it, exactly as
 * create does. */
static int e2b_adopt(osr_provider_t *p, const char *id, const char *sandbox_id,
                     const char *agent_token, osr_provider_get_cb cb, void *data)
{
  e2b_t *e = p->impl;
  if (e == NULL || e->closing)
    return OSR_ECLOSED;
  if (cb == NULL || id == NULL || sandbox_id == NULL || sandbox_id[0] == '\0' ||
      strlen(sandbox_id) >= OSR_NAME_MAX || agent_token == NULL || strlen(agent_token) != 64)
    return OSR_EINVAL;
  e2b_op_t *op = op_new(e, OP_ADOPT, data);
  op->cb.get = cb;
  snprintf(op->sid, sizeof(op->sid), "%s", sandbox_id);
  memcpy(op->agent_tok, agent_token, 65);
  if (!name_ok(id, 100, 0)) {
    op_finish(op, OSR_PERR_NOT_FOUND); /* no such id can exist */
    return 0;
  }
  set_target(op, "GET", "/sandboxes/", id, "");
  op_send(op);
  return 0;
}

/* ---- close -------------------------------------------------------------------------- */

static void on_api_closed(void *owner)
{
  e2b_t *e = owner;
  osr_provider_t *p = e->p;
  void (*cb)(osr_provider_t *) = e->close_cb;
  e2b_free_state(e);
  p->impl = NULL;
  if (cb != NULL)
    cb(p);
}

static void e2b_close(osr_provider_t *p, void (*cb)(osr_provider_t *p))
{
  e2b_t *e = p->impl;
  if (e == NULL || e->closing)
    return;
  e->closing = 1;
  e->close_cb = cb;
  /* Every op ends OSR_ECANCELED; the api calls back once all are gone. */
  osr_rest_close(e->api, on_api_closed);
}

const osr_adapter_t osr_adapter_e2b = {
    .version = OSR_ADAPTER_VERSION,
    .type = "e2b",
    .init = e2b_init,
    .describe = e2b_describe,
    .create = e2b_create,
    .destroy = e2b_destroy,
    .get = e2b_get,
    .list = e2b_list,
    .list_page = e2b_list_page,
    .pause = e2b_pause,
    .resume = e2b_resume,
    .close = e2b_close,
    .adopt = e2b_adopt,
};
