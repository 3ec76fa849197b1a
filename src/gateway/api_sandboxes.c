/*
 * The sandbox routes of the API: validation of create/plan bodies, list, get,
 * kill, timeout, plan and the provider table. The create flow itself (intent
 * row, failover, idempotent replays) lives in create.c.
 *
 * Reads of one binding go to Redis first when it is configured, then to the
 * store: that is what keeps GET answering while PostgreSQL is down, for the
 * bindings that are cached. Writes always go to the store first, and the
 * cache is updated (or invalidated) only after the store said yes, so the
 * cache never holds something the store does not.
 *
 * Tenancy: another tenant's sandbox answers 404, exactly like a missing one,
 * so ids cannot be probed across tenants.
 */
#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gateway/api.h"
#include "gateway/metrics.h"
#include "gateway/sandboxes.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD "api"

/* ------------------------------------------------------------------------ */
/* Validation                                                                */

static int fail(char *err, size_t errlen, const char *field, const char *what)
{
  snprintf(err, errlen, "%s: %s", field, what);
  return OSR_EINVAL;
}

/* Only the fields in `known` may appear in `obj`; the first other one is
 * named in the error, so a typo ("timeoutSecond") is not silently ignored. */
static int check_known(const json_t *obj, const char *prefix, const char *const *known,
                       char *err, size_t errlen)
{
  const char *k;
  json_t *v;
  json_object_foreach((json_t *)obj, k, v) {
    int ok = 0;
    for (size_t i = 0; known[i] != NULL; i++)
      if (strcmp(k, known[i]) == 0)
        ok = 1;
    if (!ok) {
      snprintf(err, errlen, "unknown field %s%.*s", prefix, 128, k);
      return OSR_EINVAL;
    }
  }
  return 0;
}

static int get_uint(const json_t *v, const char *field, uint64_t lo, uint64_t hi, uint64_t *out,
                    char *err, size_t errlen)
{
  if (!json_is_integer(v)) {
    snprintf(err, errlen, "%s: must be an integer", field);
    return OSR_EINVAL;
  }
  json_int_t n = json_integer_value(v);
  if (n < 0 || (uint64_t)n < lo || (uint64_t)n > hi) {
    snprintf(err, errlen, "%s: must be between %llu and %llu", field, (unsigned long long)lo,
             (unsigned long long)hi);
    return OSR_EINVAL;
  }
  *out = (uint64_t)n;
  return 0;
}

/* Names we hand to providers and store in fixed buffers: printable, no
 * spaces, bounded. */
static int name_ok(const char *s, size_t max, const char *extra)
{
  size_t n = strlen(s);
  if (n == 0 || n >= max)
    return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!isalnum(c) && strchr(extra, c) == NULL)
      return 0;
  }
  return 1;
}

static int provider_exists(osr_gw_t *gw, const char *name)
{
  return gw->providers != NULL && osr_providers_find(gw->providers, name, NULL) != NULL;
}

/* env / metadata: an object of strings, bounded in count and sizes. */
static int parse_string_map(const json_t *v, const char *field, json_t **out, char *err,
                            size_t errlen)
{
  if (!json_is_object(v)) {
    snprintf(err, errlen, "%s: must be an object of strings", field);
    return OSR_EINVAL;
  }
  if (json_object_size(v) > OSR_SBX_MAP_MAX) {
    snprintf(err, errlen, "%s: at most %d entries", field, OSR_SBX_MAP_MAX);
    return OSR_EINVAL;
  }
  const char *k;
  json_t *e;
  json_object_foreach((json_t *)v, k, e) {
    if (strlen(k) == 0 || strlen(k) > OSR_SBX_KEY_MAX) {
      snprintf(err, errlen, "%s: keys must be 1..%d bytes", field, OSR_SBX_KEY_MAX);
      return OSR_EINVAL;
    }
    if (!json_is_string(e)) {
      snprintf(err, errlen, "%s.%.128s: must be a string", field, k);
      return OSR_EINVAL;
    }
    if (json_string_length(e) > OSR_SBX_VALUE_MAX) {
      snprintf(err, errlen, "%s.%.128s: at most %d bytes", field, k, OSR_SBX_VALUE_MAX);
      return OSR_EINVAL;
    }
    /* Values go to providers as labels and environment: an embedded NUL
     * would be cut differently by each of them. */
    if (strlen(json_string_value(e)) != json_string_length(e)) {
      snprintf(err, errlen, "%s.%.128s: must not contain NUL", field, k);
      return OSR_EINVAL;
    }
  }
  *out = json_incref((json_t *)v);
  return 0;
}

static int parse_caps(osr_gw_t *gw, const json_t *v, osr_capabilities_t *c, char *err,
                      size_t errlen)
{
  static const char *const known[] = {"gpu",    "snapshot", "ports",     "minMemoryMiB",
                                      "vcpus",  "region",   "isolation", NULL};
  (void)gw;
  uint64_t n;
  json_t *f;
  if (!json_is_object(v))
    return fail(err, errlen, "capabilities", "must be an object");
  if (check_known(v, "capabilities.", known, err, errlen) != 0)
    return OSR_EINVAL;

  if ((f = json_object_get(v, "gpu")) != NULL) {
    /* {"count": n, "type": "a100"} or just a count. */
    if (json_is_integer(f)) {
      if (get_uint(f, "capabilities.gpu", 0, OSR_SBX_GPU_MAX, &n, err, errlen) != 0)
        return OSR_EINVAL;
      c->gpu_count = (uint32_t)n;
    } else if (json_is_object(f)) {
      static const char *const gknown[] = {"count", "type", NULL};
      if (check_known(f, "capabilities.gpu.", gknown, err, errlen) != 0)
        return OSR_EINVAL;
      json_t *cnt = json_object_get(f, "count"), *ty = json_object_get(f, "type");
      c->gpu_count = 1;
      if (cnt != NULL) {
        if (get_uint(cnt, "capabilities.gpu.count", 0, OSR_SBX_GPU_MAX, &n, err, errlen) != 0)
          return OSR_EINVAL;
        c->gpu_count = (uint32_t)n;
      }
      if (ty != NULL) {
        if (!json_is_string(ty) || !name_ok(json_string_value(ty), OSR_NAME_MAX, "-_.:"))
          return fail(err, errlen, "capabilities.gpu.type",
                      "must be a name of 1..63 characters [A-Za-z0-9-_.:]");
        snprintf(c->gpu_type, sizeof(c->gpu_type), "%s", json_string_value(ty));
      }
    } else {
      return fail(err, errlen, "capabilities.gpu", "must be an object or an integer");
    }
  }
  if ((f = json_object_get(v, "snapshot")) != NULL) {
    if (!json_is_boolean(f))
      return fail(err, errlen, "capabilities.snapshot", "must be a boolean");
    c->snapshot = json_is_true(f);
  }
  if ((f = json_object_get(v, "ports")) != NULL) {
    if (!json_is_array(f))
      return fail(err, errlen, "capabilities.ports", "must be an array of ports");
    if (json_array_size(f) > OSR_MAX_PORTS) {
      snprintf(err, errlen, "capabilities.ports: at most %d ports", OSR_MAX_PORTS);
      return OSR_EINVAL;
    }
    for (size_t i = 0; i < json_array_size(f); i++) {
      char name[48];
      snprintf(name, sizeof(name), "capabilities.ports[%zu]", i);
      if (get_uint(json_array_get(f, i), name, 1, 65535, &n, err, errlen) != 0)
        return OSR_EINVAL;
      int dup = 0;
      for (size_t j = 0; j < c->nports; j++)
        dup |= c->ports[j] == (uint16_t)n;
      if (!dup)
        c->ports[c->nports++] = (uint16_t)n;
    }
  }
  if ((f = json_object_get(v, "minMemoryMiB")) != NULL) {
    if (get_uint(f, "capabilities.minMemoryMiB", 0, OSR_SBX_MEMORY_MAX, &n, err, errlen) != 0)
      return OSR_EINVAL;
    c->min_memory_mib = (uint32_t)n;
  }
  if ((f = json_object_get(v, "vcpus")) != NULL) {
    if (get_uint(f, "capabilities.vcpus", 0, OSR_SBX_VCPUS_MAX, &n, err, errlen) != 0)
      return OSR_EINVAL;
    c->vcpus = (uint32_t)n;
  }
  if ((f = json_object_get(v, "region")) != NULL) {
    if (!json_is_string(f) || !name_ok(json_string_value(f), OSR_NAME_MAX, "-_."))
      return fail(err, errlen, "capabilities.region",
                  "must be a region name of 1..63 characters [A-Za-z0-9-_.]");
    snprintf(c->region, sizeof(c->region), "%s", json_string_value(f));
  }
  if ((f = json_object_get(v, "isolation")) != NULL) {
    if (!json_is_string(f) || osr_isolation_parse(json_string_value(f)) == OSR_ISO_NONE)
      return fail(err, errlen, "capabilities.isolation",
                  "must be one of container, gvisor, firecracker");
    c->isolation = osr_isolation_parse(json_string_value(f));
  }
  return 0;
}

static int parse_name_list(osr_gw_t *gw, const json_t *v, const char *field,
                           char (*list)[OSR_NAME_MAX], size_t *n, char *err, size_t errlen)
{
  if (!json_is_array(v))
    return fail(err, errlen, field, "must be an array of provider names");
  if (json_array_size(v) > OSR_POLICY_LIST_MAX) {
    snprintf(err, errlen, "%s: at most %d providers", field, OSR_POLICY_LIST_MAX);
    return OSR_EINVAL;
  }
  *n = 0;
  for (size_t i = 0; i < json_array_size(v); i++) {
    json_t *e = json_array_get(v, i);
    if (!json_is_string(e) || json_string_length(e) >= OSR_NAME_MAX)
      return fail(err, errlen, field, "must be an array of provider names");
    if (!provider_exists(gw, json_string_value(e))) {
      snprintf(err, errlen, "%s: unknown provider \"%.63s\"", field, json_string_value(e));
      return OSR_EINVAL;
    }
    snprintf(list[(*n)++], OSR_NAME_MAX, "%s", json_string_value(e));
  }
  return 0;
}

static int parse_policy(osr_gw_t *gw, const json_t *v, osr_policy_t *p, char *err, size_t errlen)
{
  static const char *const known[] = {"strategy", "allow", "deny", "maxCostPerHour",
                                      "onProviderDegraded", NULL};
  json_t *f;
  if (!json_is_object(v))
    return fail(err, errlen, "policy", "must be an object");
  if (check_known(v, "policy.", known, err, errlen) != 0)
    return OSR_EINVAL;
  if ((f = json_object_get(v, "strategy")) != NULL) {
    osr_policy_t tmp = *p;
    if (!json_is_string(f) || osr_strategy_parse(json_string_value(f), &tmp) != 0)
      return fail(err, errlen, "policy.strategy",
                  "must be cost, latency, balanced, order or pin:<provider>");
    if (tmp.strategy == OSR_STRATEGY_PIN && !provider_exists(gw, tmp.pin)) {
      snprintf(err, errlen, "policy.strategy: unknown provider \"%.63s\"", tmp.pin);
      return OSR_EINVAL;
    }
    p->strategy = tmp.strategy;
    memcpy(p->pin, tmp.pin, sizeof(p->pin));
  }
  if ((f = json_object_get(v, "allow")) != NULL &&
      parse_name_list(gw, f, "policy.allow", p->allow, &p->nallow, err, errlen) != 0)
    return OSR_EINVAL;
  if ((f = json_object_get(v, "deny")) != NULL &&
      parse_name_list(gw, f, "policy.deny", p->deny, &p->ndeny, err, errlen) != 0)
    return OSR_EINVAL;
  if ((f = json_object_get(v, "maxCostPerHour")) != NULL) {
    if (!json_is_number(f) || json_number_value(f) < 0 || json_number_value(f) > 1e9)
      return fail(err, errlen, "policy.maxCostPerHour", "must be a number >= 0");
    p->max_cost_per_hour = json_number_value(f);
  }
  if ((f = json_object_get(v, "onProviderDegraded")) != NULL) {
    const char *s = json_is_string(f) ? json_string_value(f) : "";
    if (strcmp(s, "fail") != 0 && strcmp(s, "migrate") != 0)
      return fail(err, errlen, "policy.onProviderDegraded", "must be fail or migrate");
    p->on_degraded_migrate = strcmp(s, "migrate") == 0;
  }
  return 0;
}

int osr__sbx_req_parse(osr_gw_t *gw, const json_t *body, osr__sbx_req_t *out, char *err,
                       size_t errlen)
{
  static const char *const known[] = {"template",           "capabilities", "policy",
                                      "timeoutSeconds",     "idleTimeoutSeconds",
                                      "env",                "metadata",     NULL};
  const osr_gw_config_t *cfg = gw->cfg;
  uint64_t n;
  json_t *f;

  memset(out, 0, sizeof(*out));
  /* The operator's default policy is the base; the request overrides the
   * strategy, budget and its own allow/deny lists. The default policy's
   * allow/deny lists stay in force as tenant-level lists (osr__sbx_place). */
  out->policy = cfg->default_policy;
  out->policy.nallow = 0;
  out->policy.ndeny = 0;
  out->timeout_s = cfg->default_timeout_s ? cfg->default_timeout_s : 300;
  if (cfg->max_timeout_s && out->timeout_s > cfg->max_timeout_s)
    out->timeout_s = cfg->max_timeout_s;
  if (body == NULL)
    return 0;
  if (!json_is_object(body)) {
    snprintf(err, errlen, "the body must be a JSON object");
    return OSR_EINVAL;
  }
  if (check_known(body, "", known, err, errlen) != 0)
    goto bad;

  if ((f = json_object_get(body, "template")) != NULL) {
    if (!json_is_string(f) || !name_ok(json_string_value(f), sizeof(out->template_id), "._:/-")) {
      snprintf(err, errlen, "template: must be 1..127 characters [A-Za-z0-9._:/-]");
      goto bad;
    }
    snprintf(out->template_id, sizeof(out->template_id), "%s", json_string_value(f));
  }
  if ((f = json_object_get(body, "capabilities")) != NULL &&
      parse_caps(gw, f, &out->caps, err, errlen) != 0)
    goto bad;
  if ((f = json_object_get(body, "policy")) != NULL &&
      parse_policy(gw, f, &out->policy, err, errlen) != 0)
    goto bad;
  uint64_t maxt = cfg->max_timeout_s ? cfg->max_timeout_s : 86400;
  if ((f = json_object_get(body, "timeoutSeconds")) != NULL) {
    if (get_uint(f, "timeoutSeconds", 1, maxt, &n, err, errlen) != 0)
      goto bad;
    out->timeout_s = (uint32_t)n;
  }
  if ((f = json_object_get(body, "idleTimeoutSeconds")) != NULL) {
    if (get_uint(f, "idleTimeoutSeconds", 0, maxt, &n, err, errlen) != 0)
      goto bad;
    out->idle_timeout_s = (uint32_t)n;
  }
  if ((f = json_object_get(body, "env")) != NULL &&
      parse_string_map(f, "env", &out->env, err, errlen) != 0)
    goto bad;
  if ((f = json_object_get(body, "metadata")) != NULL &&
      parse_string_map(f, "metadata", &out->metadata, err, errlen) != 0)
    goto bad;
  return 0;
bad:
  osr__sbx_req_dispose(out);
  return OSR_EINVAL;
}

void osr__sbx_req_dispose(osr__sbx_req_t *r)
{
  json_decref(r->env);
  json_decref(r->metadata);
  r->env = NULL;
  r->metadata = NULL;
}

size_t osr__sbx_place(osr_gw_t *gw, const osr__sbx_req_t *r, osr_candidate_t *out)
{
  size_t np = osr_providers_count(gw->providers);
  if (np == 0)
    return 0;
  /* The operator's default allow/deny lists bind every tenant: they are
   * passed as tenant-level lists, which a request cannot widen. */
  const osr_policy_t *dp = &gw->cfg->default_policy;
  const char *tallow[OSR_POLICY_LIST_MAX], *tdeny[OSR_POLICY_LIST_MAX];
  for (size_t i = 0; i < dp->nallow && i < OSR_POLICY_LIST_MAX; i++)
    tallow[i] = dp->allow[i];
  for (size_t i = 0; i < dp->ndeny && i < OSR_POLICY_LIST_MAX; i++)
    tdeny[i] = dp->deny[i];
  osr_placement_input_t in;
  memset(&in, 0, sizeof(in));
  in.providers = osr_providers_list(gw->providers);
  in.health = osr_providers_health_list(gw->providers);
  in.nproviders = np;
  in.caps = &r->caps;
  in.policy = &r->policy;
  in.tenant_allow = dp->nallow ? tallow : NULL;
  in.ntenant_allow = dp->nallow;
  in.tenant_deny = dp->ndeny ? tdeny : NULL;
  in.ntenant_deny = dp->ndeny;
  in.now_ms = osr_now_ms();
  in.ttl_s = r->timeout_s;
  return osr_place(&in, out);
}

/* ------------------------------------------------------------------------ */
/* Capabilities                                                              */

/* {gpu:{count,type}, snapshot, ports, minMemoryMiB, vcpus, region,
 * isolation}, in this order, as the tree this replaced serialised it. */
void osr__caps_write(osr_jw_t *w, const osr_capabilities_t *c)
{
  osr_jw_lit(w, "{\"gpu\":{\"count\":");
  osr_jw_int(w, c->gpu_count);
  osr_jw_lit(w, ",\"type\":");
  osr_jw_str(w, c->gpu_type[0] ? c->gpu_type : NULL);
  osr_jw_lit(w, "},\"snapshot\":");
  if (c->snapshot)
    osr_jw_lit(w, "true");
  else
    osr_jw_lit(w, "false");
  osr_jw_lit(w, ",\"ports\":[");
  for (size_t i = 0; i < c->nports && i < OSR_MAX_PORTS; i++) {
    if (i > 0)
      osr_jw_lit(w, ",");
    osr_jw_int(w, c->ports[i]);
  }
  osr_jw_lit(w, "],\"minMemoryMiB\":");
  osr_jw_int(w, c->min_memory_mib);
  osr_jw_lit(w, ",\"vcpus\":");
  osr_jw_int(w, c->vcpus);
  osr_jw_lit(w, ",\"region\":");
  osr_jw_str(w, c->region[0] ? c->region : NULL);
  osr_jw_lit(w, ",\"isolation\":");
  osr_jw_str(w, c->isolation != OSR_ISO_NONE ? osr_isolation_name(c->isolation) : NULL);
  osr_jw_lit(w, "}");
}

int osr__caps_cover(const osr_capabilities_t *a, const osr_capabilities_t *g, char *why,
                    size_t whylen)
{
  if (g->gpu_count < a->gpu_count) {
    snprintf(why, whylen, "granted %u GPUs, asked %u", g->gpu_count, a->gpu_count);
    return 0;
  }
  if (a->gpu_count > 0 && a->gpu_type[0] && strcmp(a->gpu_type, g->gpu_type) != 0) {
    snprintf(why, whylen, "granted GPU type \"%s\", asked \"%s\"", g->gpu_type, a->gpu_type);
    return 0;
  }
  if (a->snapshot && !g->snapshot) {
    snprintf(why, whylen, "no snapshot support granted");
    return 0;
  }
  for (size_t i = 0; i < a->nports; i++) {
    int found = 0;
    for (size_t j = 0; j < g->nports && j < OSR_MAX_PORTS; j++)
      found |= g->ports[j] == a->ports[i];
    if (!found) {
      snprintf(why, whylen, "port %u not granted", a->ports[i]);
      return 0;
    }
  }
  if (g->min_memory_mib < a->min_memory_mib) {
    snprintf(why, whylen, "granted %u MiB, asked %u", g->min_memory_mib, a->min_memory_mib);
    return 0;
  }
  if (g->vcpus < a->vcpus) {
    snprintf(why, whylen, "granted %u vCPUs, asked %u", g->vcpus, a->vcpus);
    return 0;
  }
  if (a->region[0] && strcmp(a->region, g->region) != 0) {
    snprintf(why, whylen, "granted region \"%s\", asked \"%s\"", g->region, a->region);
    return 0;
  }
  if (g->isolation < a->isolation) {
    snprintf(why, whylen, "granted isolation %s below the floor %s",
             g->isolation ? osr_isolation_name(g->isolation) : "none",
             osr_isolation_name(a->isolation));
    return 0;
  }
  return 1;
}

/* ------------------------------------------------------------------------ */
/* Cache                                                                     */

static void cache_done(int status, void *data)
{
  (void)data;
  if (status != 0 && status != OSR_EUNAVAILABLE)
    OSR_LOG_DEBUG(MOD, "redis: %s", osr__err_text(status));
}

void osr__cache_put(osr_gw_t *gw, const osr_binding_t *b)
{
  if (gw->redis == NULL)
    return;
  (void)osr_redis_put_binding(gw->redis, b, cache_done, NULL);
}

void osr__cache_invalidate(osr_gw_t *gw, const char *id)
{
  if (gw->redis == NULL)
    return;
  (void)osr_redis_invalidate(gw->redis, id, cache_done, NULL);
}

/* ------------------------------------------------------------------------ */
/* The sandbox as the API shows it                                           */

static json_t *time_or_null(int64_t ms)
{
  char buf[32];
  if (ms <= 0)
    return json_null();
  osr_jw_rfc3339(ms, buf);
  return json_string(buf);
}

/* A stored JSON document (granted capabilities, metadata, error), embedded
 * as it is: every one of them was written by json_dumps(JSON_COMPACT) in
 * this code, which is exactly what parsing and dumping it again would give.
 * Something that is not even shaped like an object is treated as the tree
 * code treated an unparsable document: absent. */
static int doc_ok(const char *s, size_t *len)
{
  if (s == NULL || s[0] != '{')
    return 0;
  *len = strlen(s);
  return s[*len - 1] == '}';
}

/* The answer up to and including "dataplaneUrl": everything before the
 * token. */
static void sandbox_write_head(osr_gw_t *gw, const osr_binding_t *b, osr_jw_t *w)
{
  const osr_gw_config_t *cfg = gw->cfg;
  size_t n;

  osr_jw_lit(w, "{\"id\":");
  osr_jw_str(w, b->id);
  osr_jw_lit(w, ",\"state\":");
  osr_jw_str(w, osr_binding_state_name(b->state));
  osr_jw_lit(w, ",\"tenant\":");
  osr_jw_str(w, b->tenant);
  osr_jw_lit(w, ",\"template\":");
  osr_jw_str(w, b->template_id[0] ? b->template_id : NULL);
  osr_jw_lit(w, ",\"binding\":{\"provider\":");
  osr_jw_str(w, b->provider[0] ? b->provider : NULL);
  osr_jw_lit(w, ",\"providerId\":");
  osr_jw_str(w, b->provider_id[0] ? b->provider_id : NULL);
  osr_jw_lit(w, ",\"region\":");
  osr_jw_str(w, b->region[0] ? b->region : NULL);
  osr_jw_lit(w, ",\"isolation\":");
  osr_jw_str(w, b->isolation != OSR_ISO_NONE ? osr_isolation_name(b->isolation) : NULL);
  osr_jw_lit(w, ",\"capabilities\":");
  if (doc_ok(b->granted_json, &n))
    osr_jw_raw(w, b->granted_json, n);
  else
    osr_jw_lit(w, "null");
  osr_jw_lit(w, ",\"attempt\":");
  osr_jw_int(w, b->attempt);
  osr_jw_lit(w, "}");

  /* The data-plane URL: the configured public URL, else the listen address. */
  osr_jw_lit(w, ",\"dataplaneUrl\":");
  if (cfg->dataplane_url != NULL) {
    osr_jw_str(w, cfg->dataplane_url);
  } else if (cfg->dataplane_listen != NULL) {
    char dp[300];
    snprintf(dp, sizeof(dp), "http://%s", cfg->dataplane_listen);
    osr_jw_str(w, dp);
  } else {
    osr_jw_lit(w, "null");
  }
}

/* ,"token":...,"tokenExpiresAt":... (tok NULL: both null). */
static void sandbox_write_token(osr_jw_t *w, const char *tok, const osr_token_claims_t *tc)
{
  if (tok == NULL) {
    osr_jw_lit(w, ",\"token\":null,\"tokenExpiresAt\":null");
    return;
  }
  osr_jw_lit(w, ",\"token\":");
  osr_jw_str(w, tok);
  osr_jw_lit(w, ",\"tokenExpiresAt\":");
  osr_jw_time(w, (int64_t)tc->exp * 1000);
}

/* Everything after the token, closing brace included. */
static void sandbox_write_tail(const osr_binding_t *b, osr_jw_t *w)
{
  size_t n;
  osr_jw_lit(w, ",\"createdAt\":");
  osr_jw_time(w, b->created_ms);
  osr_jw_lit(w, ",\"updatedAt\":");
  osr_jw_time(w, b->updated_ms);
  osr_jw_lit(w, ",\"expiresAt\":");
  osr_jw_time(w, b->expires_ms);
  osr_jw_lit(w, ",\"idleTimeoutSeconds\":");
  osr_jw_int(w, b->idle_timeout_ms / 1000);
  osr_jw_lit(w, ",\"lastActivityAt\":");
  osr_jw_time(w, b->last_activity_ms);
  osr_jw_lit(w, ",\"metadata\":");
  if (doc_ok(b->metadata_json, &n))
    osr_jw_raw(w, b->metadata_json, n);
  else
    osr_jw_lit(w, "{}");
  if (b->ended_ms > 0 || b->end_reason[0]) {
    osr_jw_lit(w, ",\"endedAt\":");
    osr_jw_time(w, b->ended_ms);
    osr_jw_lit(w, ",\"endReason\":");
    osr_jw_str(w, b->end_reason);
  }
  if (doc_ok(b->error_json, &n)) {
    osr_jw_lit(w, ",\"error\":");
    osr_jw_raw(w, b->error_json, n);
  }
  osr_jw_lit(w, "}");
}

/* The create answer's token grants everything (the creator owns the
 * sandbox); narrower ones come from POST /v1/sandboxes/{id}/tokens. */
static int wants_token(const osr_binding_t *b, int with_token)
{
  return with_token && (b->state == OSR_BINDING_RUNNING || b->state == OSR_BINDING_PAUSED);
}

static void full_token_req(osr__token_req_t *tr)
{
  memset(tr, 0, sizeof(*tr));
  tr->scopes = OSR_SCOPE_ALL;
  tr->all_ports = 1;
}

void osr__sandbox_write(osr_gw_t *gw, const osr_binding_t *b, int with_token, osr_jw_t *w)
{
  sandbox_write_head(gw, b, w);
  if (wants_token(b, with_token)) {
    osr__token_req_t tr;
    osr_token_claims_t tc;
    char tok[OSR_TOKEN_MAX + 1];
    full_token_req(&tr);
    int rv = osr__token_mint(gw, b, &tr, tok, sizeof(tok), &tc);
    if (rv != 0)
      OSR_LOG_WARN(MOD, "sandbox %s: no token: %s", b->id, osr_token_strerror(rv));
    sandbox_write_token(w, rv == 0 ? tok : NULL, &tc);
  }
  sandbox_write_tail(b, w);
}

/* Three stored documents of at most OSR__STORE_JSON_MAX (64 KiB) each, a
 * token and a few short fields. */
#define SANDBOX_JSON_MAX (256 * 1024)

json_t *osr_gw_sandbox_json(osr_gw_t *gw, const osr_binding_t *b, int with_token)
{
  osr_jw_t w;
  size_t len = 0;
  osr_jw_init(&w, SANDBOX_JSON_MAX);
  osr__sandbox_write(gw, b, with_token, &w);
  char *s = osr_jw_release(&w, &len);
  json_t *j = s != NULL ? json_loadb(s, len, 0, NULL) : NULL;
  osr_free(s);
  return j;
}

static void reply_written(osr_gw_call_t *call, int status, osr_jw_t *w)
{
  size_t len = 0;
  char *s = osr_jw_release(w, &len);
  if (s == NULL) {
    osr_gw_error(call, 500, "internal", "out of memory", NULL);
    return;
  }
  /* With a reshape hook (the E2B front door) the text is parsed into the
   * tree the hook works on. */
  osr_gw_reply_text(call, status, s, len);
}

/* An answer waiting for its token: the text before and after it, written
 * from the binding before the signing started (the binding is the
 * caller's and may be gone by the time the signature is). */
typedef struct signed_reply_s {
  osr_gw_call_t *call; /* held */
  int status;
  uint64_t queued_us; /* for the trace line */
  char id[OSR_ID_MAX];
  osr_jw_t head, tail;
} signed_reply_t;

static void signed_reply_minted(int status, const char *tok, const osr_token_claims_t *tc,
                                void *data)
{
  signed_reply_t *sr = data;
  if (status != 0)
    OSR_LOG_WARN(MOD, "sandbox %s: no token: %s", sr->id, osr_token_strerror(status));
  OSR_LOG_TRACE(MOD, "token %s: signed in %" PRIu64 " us", sr->id,
                uv_hrtime() / 1000 - sr->queued_us);
  sandbox_write_token(&sr->head, status == 0 ? tok : NULL, tc);
  size_t tlen = 0;
  char *t = osr_jw_release(&sr->tail, &tlen);
  if (t != NULL)
    osr_jw_raw(&sr->head, t, tlen);
  else
    sr->head.err = 1;
  osr_free(t);
  reply_written(sr->call, sr->status, &sr->head);
  osr_jw_dispose(&sr->head);
  osr_gw_call_release(sr->call);
  osr_free(sr);
}

void osr__sandbox_reply_signed(osr_gw_call_t *call, int status, const osr_binding_t *b,
                               const char *tok, const osr_token_claims_t *claims)
{
  osr_jw_t w;
  osr_jw_init(&w, SANDBOX_JSON_MAX);
  sandbox_write_head(call->gw, b, &w);
  sandbox_write_token(&w, tok, claims);
  sandbox_write_tail(b, &w);
  reply_written(call, status, &w);
  osr_jw_dispose(&w);
}

void osr__sandbox_reply(osr_gw_call_t *call, int status, const osr_binding_t *b, int with_token)
{
  osr_gw_t *gw = call->gw;
  osr_jw_t w;
  if (wants_token(b, with_token)) {
    signed_reply_t *sr = osr_xmalloc(sizeof(*sr));
    osr__token_req_t tr;
    full_token_req(&tr);
    sr->call = call;
    sr->status = status;
    sr->queued_us = uv_hrtime() / 1000;
    snprintf(sr->id, sizeof(sr->id), "%s", b->id);
    osr_jw_init(&sr->head, SANDBOX_JSON_MAX);
    osr_jw_init(&sr->tail, SANDBOX_JSON_MAX);
    sandbox_write_head(gw, b, &sr->head);
    sandbox_write_tail(b, &sr->tail);
    osr_gw_call_hold(call);
    int rv = osr__token_mint_async(gw, b, &tr, signed_reply_minted, sr);
    if (rv != 0)
      signed_reply_minted(rv, NULL, NULL, sr); /* answered now, token null */
    return;
  }
  osr_jw_init(&w, SANDBOX_JSON_MAX);
  osr__sandbox_write(gw, b, with_token, &w);
  reply_written(call, status, &w);
  osr_jw_dispose(&w);
}

/* ------------------------------------------------------------------------ */
/* Reading one binding: Redis, then the store                                */

typedef struct read_s {
  osr_gw_call_t *call;
  osr__read_cb cb;
  char tenant[OSR_TENANT_MAX]; /* "" = any (admin) */
  char id[OSR_ID_MAX];
} read_t;

static const char *call_tenant(const osr_gw_call_t *call)
{
  return call->auth.role == OSR_ROLE_ADMIN ? NULL : call->auth.tenant;
}

static void read_store_done(int status, const osr_binding_t *b, int created, void *data)
{
  read_t *rd = data;
  (void)created;
  rd->cb(rd->call, status, status == 0 ? b : NULL);
  osr_gw_call_release(rd->call);
  osr_free(rd);
}

static void read_from_store(read_t *rd)
{
  osr_gw_t *gw = rd->call->gw;
  int rv = gw->store == NULL ? OSR_EUNAVAILABLE
                             : osr_store_get(gw->store, rd->tenant[0] ? rd->tenant : NULL, rd->id,
                                             read_store_done, rd);
  if (rv != 0) {
    rd->cb(rd->call, rv == OSR_ECLOSED ? OSR_EUNAVAILABLE : rv, NULL);
    osr_gw_call_release(rd->call);
    osr_free(rd);
  }
}

static void read_redis_done(int status, const osr_binding_t *b, void *data)
{
  read_t *rd = data;
  /* A cached binding of another tenant is a miss for this caller: fall
   * through to the store, which applies the same rule and says 404. */
  if (status == 0 && b != NULL && (rd->tenant[0] == '\0' || strcmp(rd->tenant, b->tenant) == 0)) {
    rd->cb(rd->call, 0, b);
    osr_gw_call_release(rd->call);
    osr_free(rd);
    return;
  }
  read_from_store(rd);
}

/* See sandboxes.h. One copy for the OSR and the E2B routes, so the tenant
 * rule (another tenant's sandbox is a 404) cannot drift between them. */
void osr__read_binding(osr_gw_call_t *call, int cached_ok, osr__read_cb cb)
{
  osr_gw_t *gw = call->gw;
  read_t *rd = osr_xcalloc(1, sizeof(*rd));
  rd->call = call;
  rd->cb = cb;
  const char *t = call_tenant(call);
  snprintf(rd->tenant, sizeof(rd->tenant), "%s", t ? t : "");
  snprintf(rd->id, sizeof(rd->id), "%s", call->path_id);
  osr_gw_call_hold(call);
  if (cached_ok && gw->redis != NULL && osr_redis_is_connected(gw->redis) &&
      osr_redis_get_binding(gw->redis, rd->id, read_redis_done, rd) == 0)
    return;
  read_from_store(rd);
}

static int id_ok(const char *id)
{
  return name_ok(id, OSR_ID_MAX, "");
}

/* ------------------------------------------------------------------------ */
/* POST /v1/sandboxes and POST /v1/plan                                      */

/* Idempotency-Key: 1..255 printable ASCII characters. Returns 1 if absent
 * (out = ""), 0 if valid, -1 if invalid. */
static int idem_key(const osr_gw_call_t *call, char out[OSR_IDEM_KEY_MAX])
{
  const osr_iovec_t *v = osr_http_req_header(call->req, "idempotency-key");
  out[0] = '\0';
  if (v == NULL)
    return 1;
  if (v->len == 0 || v->len >= OSR_IDEM_KEY_MAX)
    return -1;
  for (size_t i = 0; i < v->len; i++)
    if ((unsigned char)v->base[i] < 0x21 || (unsigned char)v->base[i] > 0x7e)
      return -1;
  memcpy(out, v->base, v->len);
  out[v->len] = '\0';
  return 0;
}

void osr_gw_sandbox_create(osr_gw_call_t *call)
{
  osr_gw_t *gw = call->gw;
  char err[256], key[OSR_IDEM_KEY_MAX];
  osr__sbx_req_t r;

  if (idem_key(call, key) < 0) {
    osr_gw_error(call, 400, "invalid_request",
                 "Idempotency-Key must be 1..255 printable ASCII characters without spaces", NULL);
    return;
  }
  if (osr__sbx_req_parse(gw, call->body, &r, err, sizeof(err)) != 0) {
    osr_gw_error(call, 400, "invalid_request", err, NULL);
    return;
  }
  if (gw->store == NULL) {
    osr__sbx_req_dispose(&r);
    osr_gw_error(call, 503, "unavailable", "the binding store is not open", NULL);
    return;
  }
  osr__create_start(call, &r, key);
}

void osr_gw_plan(osr_gw_call_t *call)
{
  osr_gw_t *gw = call->gw;
  char err[256];
  osr__sbx_req_t r;
  if (osr__sbx_req_parse(gw, call->body, &r, err, sizeof(err)) != 0) {
    osr_gw_error(call, 400, "invalid_request", err, NULL);
    return;
  }
  size_t np = osr_providers_count(gw->providers);
  osr_candidate_t *c = osr_xcalloc(np ? np : 1, sizeof(*c));
  size_t ne = osr__sbx_place(gw, &r, c);
  json_t *plan = osr_plan_to_json(c, np, ne);
  osr_free(c);
  osr__sbx_req_dispose(&r);
  osr_gw_reply(call, 200, plan);
}

void osr_gw_providers_get(osr_gw_call_t *call)
{
  osr_gw_t *gw = call->gw;
  osr_gw_reply(call, 200, osr_providers_to_json(gw->providers, osr_now_ms()));
}

/* ------------------------------------------------------------------------ */
/* GET /v1/sandboxes                                                         */

#define LIST_META_MAX 16

typedef struct list_s {
  osr_gw_call_t *call;
  char tenant[OSR_TENANT_MAX];
  char cursor[256];
  char mk[LIST_META_MAX][OSR_SBX_KEY_MAX + 1];
  char mv[LIST_META_MAX][OSR_SBX_VALUE_MAX + 1];
  size_t nmeta;
} list_t;

static int add_meta(list_t *l, const char *k, size_t kn, const char *v, size_t vn)
{
  if (l->nmeta >= LIST_META_MAX)
    return -1;
  if (osr_pct_decode(k, kn, l->mk[l->nmeta], sizeof(l->mk[0])) <= 0 ||
      osr_pct_decode(v, vn, l->mv[l->nmeta], sizeof(l->mv[0])) < 0)
    return -1;
  l->nmeta++;
  return 0;
}

/* metadata filters: ?metadata=<urlencoded k=v&k2=v2> (E2B) and repeated
 * ?metadata.k=v. */
static int parse_meta_filters(const osr_gw_call_t *call, list_t *l)
{
  const osr_iovec_t *q = &call->req->query;
  size_t i = 0;
  while (i < q->len) {
    size_t j = i;
    while (j < q->len && q->base[j] != '&')
      j++;
    const char *p = q->base + i;
    size_t n = j - i;
    const char *eq = memchr(p, '=', n);
    size_t kn = eq ? (size_t)(eq - p) : n;
    if (kn > 9 && memcmp(p, "metadata.", 9) == 0) {
      if (eq == NULL || add_meta(l, p + 9, kn - 9, eq + 1, n - kn - 1) != 0)
        return -1;
    } else if (kn == 8 && memcmp(p, "metadata", 8) == 0 && eq != NULL) {
      /* One level of decoding gives "k=v&k2=v2"; each piece is decoded
       * again, as E2B's SDKs encode keys and values before joining. */
      char inner[4096];
      int in = osr_pct_decode(eq + 1, n - kn - 1, inner, sizeof(inner));
      if (in < 0)
        return -1;
      size_t a = 0;
      while (a < (size_t)in) {
        size_t b = a;
        while (b < (size_t)in && inner[b] != '&')
          b++;
        char *e2 = memchr(inner + a, '=', b - a);
        if (b > a) {
          if (e2 == NULL ||
              add_meta(l, inner + a, (size_t)(e2 - inner - a), e2 + 1, (size_t)(inner + b - e2 - 1)) != 0)
            return -1;
        }
        a = b + 1;
      }
    }
    i = j + 1;
  }
  return 0;
}

static void list_done(int status, const osr_binding_t *items, size_t n, const char *next,
                      void *data)
{
  list_t *l = data;
  osr_gw_call_t *call = l->call;
  if (status != 0) {
    osr_gw_error_from(call, status, "listing sandboxes");
  } else {
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
      json_array_append_new(arr, osr_gw_sandbox_json(call->gw, &items[i], 0));
    osr_gw_reply(call, 200, json_pack("{s:o,s:s?}", "items", arr, "nextCursor", next));
  }
  osr_gw_call_release(call);
  osr_free(l);
}

void osr_gw_sandbox_list(osr_gw_call_t *call)
{
  osr_gw_t *gw = call->gw;
  char buf[256];
  osr_store_query_t q;
  memset(&q, 0, sizeof(q));
  list_t *l = osr_xcalloc(1, sizeof(*l));
  l->call = call;

  if (call->auth.role == OSR_ROLE_ADMIN) {
    int n = osr_gw_query(call, "tenant", l->tenant, sizeof(l->tenant));
    if (n == OSR_ETOOLARGE)
      goto bad_tenant;
    q.tenant = n > 0 ? l->tenant : NULL;
  } else {
    snprintf(l->tenant, sizeof(l->tenant), "%s", call->auth.tenant);
    q.tenant = l->tenant;
  }
  int n = osr_gw_query(call, "state", buf, sizeof(buf));
  if (n == OSR_ETOOLARGE)
    goto bad_state;
  if (n > 0) {
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t != NULL; t = strtok_r(NULL, ",", &save)) {
      osr_binding_state_t s = osr_binding_state_parse(t);
      if (s == 0)
        goto bad_state;
      q.state_mask |= 1u << s;
    }
  }
  q.limit = 100;
  n = osr_gw_query(call, "limit", buf, sizeof(buf));
  if (n == OSR_ETOOLARGE || n == 0)
    goto bad_limit;
  if (n > 0) {
    char *end = NULL;
    long v = strtol(buf, &end, 10);
    if (*end != '\0' || v < 1 || v > 1000)
      goto bad_limit;
    q.limit = (size_t)v;
  }
  n = osr_gw_query(call, "cursor", l->cursor, sizeof(l->cursor));
  if (n == OSR_ETOOLARGE) {
    osr_free(l);
    osr_gw_error(call, 400, "invalid_request", "cursor: not a cursor from this API", NULL);
    return;
  }
  q.cursor = n > 0 ? l->cursor : NULL;
  if (parse_meta_filters(call, l) != 0) {
    osr_free(l);
    osr_gw_error(call, 400, "invalid_request",
                 "metadata: use metadata=<url-encoded k=v&k2=v2> or metadata.<k>=<v> (at most 16)",
                 NULL);
    return;
  }
  const char *mk[LIST_META_MAX], *mv[LIST_META_MAX];
  for (size_t i = 0; i < l->nmeta; i++) {
    mk[i] = l->mk[i];
    mv[i] = l->mv[i];
  }
  q.meta_keys = mk;
  q.meta_values = mv;
  q.nmeta = l->nmeta;

  osr_gw_call_hold(call);
  int rv = gw->store ? osr_store_list(gw->store, &q, list_done, l) : OSR_EUNAVAILABLE;
  if (rv != 0) {
    osr_gw_call_release(call);
    osr_free(l);
    osr_gw_error_from(call, rv == OSR_ECLOSED ? OSR_EUNAVAILABLE : rv, "listing sandboxes");
  }
  return;
bad_tenant:
  osr_free(l);
  osr_gw_error(call, 400, "invalid_request", "tenant: too long", NULL);
  return;
bad_state:
  osr_free(l);
  osr_gw_error(call, 400, "invalid_request",
               "state: a comma list of creating, running, paused, ended, failed, lost", NULL);
  return;
bad_limit:
  osr_free(l);
  osr_gw_error(call, 400, "invalid_request", "limit: an integer between 1 and 1000", NULL);
}

/* ------------------------------------------------------------------------ */
/* GET /v1/sandboxes/{id}                                                    */

static void get_done(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  if (status != 0)
    osr_gw_error_from(call, status, "sandbox");
  else
    osr__sandbox_reply(call, 200, b, 0);
}

static int check_id(osr_gw_call_t *call)
{
  if (id_ok(call->path_id))
    return 0;
  osr_gw_error(call, 404, "not_found", "no such sandbox", NULL);
  return -1;
}

void osr_gw_sandbox_get(osr_gw_call_t *call)
{
  if (check_id(call) == 0)
    osr__read_binding(call, 1, get_done);
}

/* ------------------------------------------------------------------------ */
/* DELETE /v1/sandboxes/{id} and POST /v1/sandboxes/{id}/timeout             */

/* State shared by kill and timeout while the provider and the store work. */
typedef struct mut_s {
  osr_gw_call_t *call;
  osr_binding_t b;
  int64_t timeout_s;
} mut_t;

static void mut_free(mut_t *m)
{
  osr_gw_call_release(m->call);
  osr_binding_dispose(&m->b);
  osr_free(m);
}

static void conflict_state(osr_gw_call_t *call, const osr_binding_t *b, const char *what)
{
  char msg[160];
  snprintf(msg, sizeof(msg), "cannot %s a sandbox in state %s", what,
           osr_binding_state_name(b->state));
  osr_gw_error(call, 409, "conflict", msg, json_pack("{s:s}", "state", osr_binding_state_name(b->state)));
}

static void kill_stored(int status, void *data)
{
  mut_t *m = data;
  osr_gw_call_t *call = m->call;
  osr_gw_t *gw = call->gw;
  if (status != 0) {
    osr_gw_error_from(call, status, "recording the kill");
  } else {
    osr__cache_invalidate(gw, m->b.id);
    osr_gw_audit(gw, &call->auth, "kill", m->b.id, "ok",
                 json_pack("{s:s,s:s}", "provider", m->b.provider, "providerId", m->b.provider_id));
    osr_gw_reply(call, 204, NULL);
  }
  mut_free(m);
}

static void kill_record(mut_t *m)
{
  osr_gw_t *gw = m->call->gw;
  int64_t now = osr_now_ms();
  m->b.state = OSR_BINDING_ENDED;
  m->b.ended_ms = now;
  m->b.updated_ms = now;
  snprintf(m->b.end_reason, sizeof(m->b.end_reason), "killed");
  int rv = osr_store_update(gw->store, &m->b, kill_stored, m);
  if (rv != 0)
    kill_stored(rv == OSR_ECLOSED ? OSR_EUNAVAILABLE : rv, m);
}

static void kill_destroyed(osr_provider_t *p, int status, void *data)
{
  mut_t *m = data;
  if (status != 0 && status != OSR_PERR_NOT_FOUND) {
    char msg[200];
    snprintf(msg, sizeof(msg), "provider %s could not destroy the sandbox: %s", p->name,
             osr_provider_err_name(status));
    osr_gw_audit(m->call->gw, &m->call->auth, "kill", m->b.id, osr_provider_err_name(status), NULL);
    osr_gw_error(m->call, 502, "provider_error", msg,
                 json_pack("{s:s,s:s}", "provider", p->name, "error", osr_provider_err_name(status)));
    mut_free(m);
    return;
  }
  kill_record(m);
}

static void kill_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  osr_gw_t *gw = call->gw;
  if (status != 0) {
    osr_gw_error_from(call, status, "sandbox");
    return;
  }
  if (b->state == OSR_BINDING_CREATING) {
    conflict_state(call, b, "kill (still being created; retry)");
    return;
  }
  if (b->state != OSR_BINDING_RUNNING && b->state != OSR_BINDING_PAUSED) {
    /* Already over: killing is idempotent. */
    osr_gw_reply(call, 204, NULL);
    return;
  }
  mut_t *m = osr_xcalloc(1, sizeof(*m));
  m->call = call;
  osr_binding_copy(&m->b, b);
  osr_gw_call_hold(call);
  osr_provider_t *p = osr_providers_find(gw->providers, b->provider, NULL);
  if (p == NULL || b->provider_id[0] == '\0') {
    /* The provider was removed from the configuration: nothing we can
     * destroy; the binding still ends so it stops counting as live. */
    OSR_LOG_WARN(MOD, "kill %s: provider \"%s\" not configured", b->id, b->provider);
    kill_record(m);
    return;
  }
  int rv = p->adapter->destroy(p, b->provider_id, kill_destroyed, m);
  if (rv != 0)
    kill_destroyed(p, rv, m);
}

void osr_gw_sandbox_delete(osr_gw_call_t *call)
{
  if (check_id(call) == 0)
    osr__read_binding(call, 0, kill_got);
}

static void timeout_stored(int status, void *data)
{
  mut_t *m = data;
  osr_gw_call_t *call = m->call;
  osr_gw_t *gw = call->gw;
  if (status != 0) {
    osr_gw_error_from(call, status, "recording the timeout");
  } else {
    osr__cache_put(gw, &m->b);
    osr_gw_audit(gw, &call->auth, "timeout", m->b.id, "ok",
                 json_pack("{s:I}", "timeoutSeconds", (json_int_t)m->timeout_s));
    osr_gw_reply(call, 200, osr_gw_sandbox_json(gw, &m->b, 0));
  }
  mut_free(m);
}

static void timeout_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  osr_gw_t *gw = call->gw;
  if (status != 0) {
    osr_gw_error_from(call, status, "sandbox");
    return;
  }
  if (b->state != OSR_BINDING_RUNNING && b->state != OSR_BINDING_PAUSED) {
    conflict_state(call, b, "change the timeout of");
    return;
  }
  mut_t *m = osr_xcalloc(1, sizeof(*m));
  m->call = call;
  osr_binding_copy(&m->b, b);
  m->timeout_s = (int64_t)json_integer_value(json_object_get(call->body, "timeoutSeconds"));
  int64_t now = osr_now_ms();
  m->b.expires_ms = now + m->timeout_s * 1000;
  m->b.updated_ms = now;
  osr_gw_call_hold(call);
  int rv = osr_store_update(gw->store, &m->b, timeout_stored, m);
  if (rv != 0)
    timeout_stored(rv == OSR_ECLOSED ? OSR_EUNAVAILABLE : rv, m);
}

void osr_gw_sandbox_timeout(osr_gw_call_t *call)
{
  static const char *const known[] = {"timeoutSeconds", NULL};
  char err[200];
  uint64_t t;
  if (check_id(call) != 0)
    return;
  if (!json_is_object(call->body)) {
    osr_gw_error(call, 400, "invalid_request", "the body must be {\"timeoutSeconds\": n}", NULL);
    return;
  }
  uint64_t maxt = call->gw->cfg->max_timeout_s ? call->gw->cfg->max_timeout_s : 86400;
  if (check_known(call->body, "", known, err, sizeof(err)) != 0 ||
      get_uint(json_object_get(call->body, "timeoutSeconds"), "timeoutSeconds", 1, maxt, &t, err,
               sizeof(err)) != 0) {
    osr_gw_error(call, 400, "invalid_request", err, NULL);
    return;
  }
  osr__read_binding(call, 0, timeout_got);
}

/* ------------------------------------------------------------------------ */
/* POST /v1/sandboxes/{id}/tokens                                            */

typedef struct tokreq_s {
  osr__token_req_t r;
  osr_gw_call_t *call; /* held while the token is signed */
  char id[OSR_ID_MAX];
} tokreq_t;

/* {scopes: ["exec","files","ports"], ports: [n, ...] | "all", ttlSeconds}.
 * scopes defaults to all three; ports (only with the "ports" scope) to
 * "all"; ttlSeconds to tokens.ttl_seconds, at most sandbox.max_timeout_seconds
 * (the sandbox's own TTL caps the expiry anyway). */
static int parse_token_req(osr_gw_t *gw, const json_t *body, osr__token_req_t *r, char *err,
                           size_t errlen)
{
  static const char *const known[] = {"scopes", "ports", "ttlSeconds", NULL};
  static const struct {
    const char *name;
    unsigned bit;
  } names[] = {{"exec", OSR_SCOPE_EXEC}, {"files", OSR_SCOPE_FILES}, {"ports", OSR_SCOPE_PORTS}};
  json_t *v;
  memset(r, 0, sizeof(*r));
  if (body != NULL && !json_is_object(body))
    return fail(err, errlen, "body", "must be an object");
  if (body != NULL && check_known(body, "", known, err, errlen) != 0)
    return OSR_EINVAL;

  v = body != NULL ? json_object_get(body, "scopes") : NULL;
  if (v == NULL) {
    r->scopes = OSR_SCOPE_ALL;
  } else {
    if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > 3)
      return fail(err, errlen, "scopes", "a non-empty list of \"exec\", \"files\", \"ports\"");
    size_t i;
    json_t *e;
    json_array_foreach(v, i, e) {
      unsigned bit = 0;
      for (size_t k = 0; k < OSR_ARRAY_SIZE(names); k++)
        if (json_is_string(e) && strcmp(json_string_value(e), names[k].name) == 0)
          bit = names[k].bit;
      if (bit == 0)
        return fail(err, errlen, "scopes", "each one of \"exec\", \"files\", \"ports\"");
      if (r->scopes & bit)
        return fail(err, errlen, "scopes", "lists a scope twice");
      r->scopes |= bit;
    }
  }

  v = body != NULL ? json_object_get(body, "ports") : NULL;
  if (v != NULL && !(r->scopes & OSR_SCOPE_PORTS))
    return fail(err, errlen, "ports", "only with the \"ports\" scope");
  if (r->scopes & OSR_SCOPE_PORTS) {
    if (v == NULL || (json_is_string(v) && strcmp(json_string_value(v), "all") == 0)) {
      r->all_ports = 1;
    } else if (json_is_array(v) && json_array_size(v) >= 1 &&
               json_array_size(v) <= OSR_TOKEN_PORTS_MAX) {
      size_t i;
      json_t *e;
      json_array_foreach(v, i, e) {
        uint64_t port;
        if (get_uint(e, "ports[]", 1, 65535, &port, err, errlen) != 0)
          return OSR_EINVAL;
        r->ports[r->nports++] = (uint16_t)port;
      }
    } else {
      char what[96];
      snprintf(what, sizeof(what), "\"all\" or a list of 1..%d port numbers", OSR_TOKEN_PORTS_MAX);
      return fail(err, errlen, "ports", what);
    }
  }

  v = body != NULL ? json_object_get(body, "ttlSeconds") : NULL;
  if (v != NULL) {
    uint64_t maxt = gw->cfg->max_timeout_s ? gw->cfg->max_timeout_s : 86400;
    if (gw->cfg->token_ttl_s > maxt)
      maxt = gw->cfg->token_ttl_s;
    if (get_uint(v, "ttlSeconds", 1, maxt, &r->ttl_s, err, errlen) != 0)
      return OSR_EINVAL;
  }
  return 0;
}

static void token_sign_failed(osr_gw_call_t *call, int rv)
{
  char msg[160];
  snprintf(msg, sizeof(msg), "cannot sign a token: %s", osr_token_strerror(rv));
  osr_gw_error(call, 500, "internal", msg, NULL);
}

/* The signature is done (on the thread pool): answer and audit. */
static void tokens_minted(int status, const char *tok, const osr_token_claims_t *c, void *data)
{
  tokreq_t *tr = data;
  osr_gw_call_t *call = tr->call;
  osr_gw_t *gw = call->gw;
  if (status != 0) {
    token_sign_failed(call, status);
    goto out;
  }
  json_t *scopes = json_array();
  if (c->scopes & OSR_SCOPE_EXEC)
    json_array_append_new(scopes, json_string("exec"));
  if (c->scopes & OSR_SCOPE_FILES)
    json_array_append_new(scopes, json_string("files"));
  if (c->scopes & OSR_SCOPE_PORTS)
    json_array_append_new(scopes, json_string("ports"));
  json_t *ports;
  if (c->all_ports) {
    ports = json_string("all");
  } else {
    ports = json_array();
    for (size_t i = 0; i < c->nports; i++)
      json_array_append_new(ports, json_integer(c->ports[i]));
  }
  /* The audit records what was granted and the token's id, never the
   * token itself (it is a bearer credential). */
  osr_gw_audit(gw, &call->auth, "token", tr->id, "ok",
               json_pack("{s:O,s:O,s:I,s:s}", "scopes", scopes, "ports", ports, "expiresAt",
                         (json_int_t)c->exp, "tokenId", c->jti));
  osr_gw_reply(call, 201,
               json_pack("{s:s,s:o,s:o,s:o,s:s,s:s}", "token", tok, "expiresAt",
                         time_or_null(c->exp * 1000), "scopes", scopes, "ports", ports, "tokenId",
                         c->jti, "sandboxId", tr->id));
out:
  osr_gw_call_release(call);
  osr_free(tr);
}

static void tokens_got(osr_gw_call_t *call, int status, const osr_binding_t *b)
{
  osr_gw_t *gw = call->gw;
  tokreq_t *tr = call->data;
  call->data = NULL;
  if (status != 0) {
    osr_gw_error_from(call, status, "sandbox");
    goto out;
  }
  if (b->state != OSR_BINDING_RUNNING && b->state != OSR_BINDING_PAUSED) {
    conflict_state(call, b, "issue a token for");
    goto out;
  }
  tr->call = call;
  snprintf(tr->id, sizeof(tr->id), "%s", b->id);
  osr_gw_call_hold(call);
  int rv = osr__token_mint_async(gw, b, &tr->r, tokens_minted, tr);
  if (rv == 0)
    return; /* tokens_minted answers, releases and frees */
  osr_gw_call_release(call); /* the read's hold keeps the call alive */
  if (rv == OSR_ETOKEN_EXPIRED)
    osr_gw_error(call, 409, "conflict", "the sandbox's timeout has passed",
                 json_pack("{s:s}", "state", osr_binding_state_name(b->state)));
  else
    token_sign_failed(call, rv);
out:
  osr_free(tr);
}

void osr_gw_sandbox_tokens(osr_gw_call_t *call)
{
  char err[200];
  if (check_id(call) != 0)
    return;
  tokreq_t *tr = osr_xcalloc(1, sizeof(*tr));
  if (parse_token_req(call->gw, call->body, &tr->r, err, sizeof(err)) != 0) {
    osr_free(tr);
    osr_gw_error(call, 400, "invalid_request", err, NULL);
    return;
  }
  if (call->gw->keyring == NULL) {
    osr_free(tr);
    osr_gw_error(call, 503, "unavailable", "no signing key loaded", NULL);
    return;
  }
  /* From the store, not the cache: a token must not be minted from a
   * binding whose kill the cache has not heard of yet. */
  call->data = tr;
  osr__read_binding(call, 0, tokens_got);
}
