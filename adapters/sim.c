/*
 * The `sim` provider: a SIMULATED sandbox provider for drills, demos,
 * benchmarks and tests. It runs nothing. Its latency, capacity and failure
 * rates are configurable so that placement, failover, the circuit breaker
 * and crash recovery can be exercised without a real provider. Sim
 * sandboxes have no agent: their agent_endpoint is the placeholder
 * "sim://<provider id>".
 *
 * Two modes:
 *   in-process (default)  resources live in a table in this process and die
 *                         with it.
 *   url: http://H:P       resources live in an `osr-sim` process (which runs
 *                         this same adapter in-process behind a JSON HTTP
 *                         API), so they survive a gateway crash and can be
 *                         checked against the provider's own list.
 *
 * Config keys (all optional; see docs/adapters.md):
 *   latency_ms (20), latency_jitter_ms (0), failure_rate (0),
 *   boot_failure_rate (0), capacity (0 = unlimited), error ("unavailable"),
 *   seed, isolation (["container","gvisor"]), regions ([]), gpus
 *   ({max, types:{T: usd_per_s}}), snapshot (false), prices ({vcpu_per_s,
 *   gib_per_s, per_create}), expected_create_ms (= latency_ms), max_ports
 *   (32), max_memory_mib (65536), max_vcpus (64), url, timeout_ms (30000,
 *   url mode), offload_bytes (OSR_REST_OFFLOAD_BYTES, url mode), accept_any
 *   (false: trust the caller's isolation/region/gpu choice instead of
 *   checking it against this manifest; osr-sim sets it).
 *
 * In-process, every operation is an op with its own uv_timer. The timer is
 * how results are delivered: creates fire it after the simulated latency,
 * everything else restarts it with timeout 0, so a callback never runs
 * inside the call that started the operation and always runs exactly once.
 * In url mode every operation is a call on adapters/rest.h (one shared
 * HTTP/2 connection to osr-sim, same guarantees). close() waits for every
 * op and for the rest queue before freeing the adapter state.
 */
#include "adapters/sim.h"
#include "adapters/rest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/http.h"
#include "util/jsonw.h"
#include "util/log.h"
#include "util/mem.h"
#include "util/text.h"

#define MOD "sim"
/* Hard cap on the resource table even when `capacity` is unlimited. */
#define SIM_MAX_RESOURCES (1u << 20)
/* Largest answer accepted from osr-sim (a list of many resources). */
#define SIM_MAX_RESPONSE (64u << 20)
/* Largest page list_page() serves (osr-sim's ?limit= too). */
#define SIM_MAX_PAGE 10000
/* Largest create request body: a cap only a caller passing names of many
 * KiB could reach (the gateway's are at most a few hundred bytes). */
#define SIM_MAX_REQUEST (1u << 20)

typedef struct sim_res_s {
  osr_resource_t r;
  char tenant[OSR_NAME_MAX];
  int64_t created_ms;
} sim_res_t;

typedef struct sim_s sim_t;
typedef struct sim_op_s sim_op_t;

enum { OP_CREATE, OP_DESTROY, OP_GET, OP_LIST, OP_LIST_PAGE };

struct sim_op_s {
  sim_op_t *prev, *next; /* sim->ops: every op not yet freed */
  sim_t *sim;
  int kind;
  uv_timer_t timer;
  int delivered; /* the user callback ran */
  int finishing; /* a result is set and the timer will deliver it */
  int timer_closed;
  int status;
  char provider_id[128];
  osr_resource_t res;
  /* in-process create */
  int boot_fail;
  osr_resource_t *list;
  size_t nlist;
  /* list_page: resources numbered above `after`, at most `limit` */
  uint64_t after;
  size_t limit;
  char page_next[128]; /* "" = last page */
  union {
    osr_provider_create_cb create;
    osr_provider_done_cb done;
    osr_provider_get_cb get;
    osr_provider_list_cb list;
    osr_provider_list_page_cb list_page;
  } cb;
  void *data;
};

/* The adapter's state of one url-mode call (a rest op's user area). */
typedef struct sim_call_s {
  osr_rest_op_t *rop;
  sim_t *sim;
  int kind;
  char *req_body; /* create: osr__sim_create_body (osr_free) */
  osr_resource_t res;
  osr_resource_t *list;
  size_t nlist;
  size_t limit;   /* list_page */
  char next[128]; /* list_page: "" = last page */
  union {
    osr_provider_create_cb create;
    osr_provider_done_cb done;
    osr_provider_get_cb get;
    osr_provider_list_cb list;
    osr_provider_list_page_cb list_page;
  } cb;
  void *data;
} sim_call_t;

struct sim_s {
  osr_provider_t *p;
  /* configuration */
  double latency_ms, jitter_ms, failure_rate, boot_failure_rate, expected_ms;
  uint64_t capacity;
  int error;
  uint64_t rng;
  unsigned iso_mask;
  char regions[15][OSR_NAME_MAX];
  size_t nregions;
  char gpu_types[7][OSR_NAME_MAX];
  double gpu_prices[7];
  size_t ngpus;
  uint32_t gpu_max;
  int snapshot, accept_any;
  double price_vcpu, price_gib, price_create;
  uint32_t max_ports, max_memory, max_vcpus;
  uint64_t timeout_ms;
  size_t offload_bytes; /* url mode: answers this large are parsed off the loop */
  int url_mode;
  char addr[300];
  /* in-process table */
  sim_res_t *res;
  size_t nres, capres;
  uint64_t next_id;
  void (*on_change)(void *data);
  void *on_change_data;
  /* ops */
  sim_op_t *ops_head, *ops_tail;
  size_t nops;
  /* url mode */
  osr_rest_t *api;
  /* close */
  int closing, close_done;
  uv_timer_t close_timer;
  void (*close_cb)(osr_provider_t *p);
};

/* ---- small helpers ------------------------------------------------------ */

/* xorshift64*: tiny, fast, and reproducible from a seed, which is all a
 * failure-injection PRNG needs. */
static double rnd(sim_t *s)
{
  s->rng ^= s->rng >> 12;
  s->rng ^= s->rng << 25;
  s->rng ^= s->rng >> 27;
  return (double)((s->rng * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
}

static void notify(sim_t *s)
{
  if (s->on_change != NULL)
    s->on_change(s->on_change_data);
}

static const struct {
  const char *name;
  int code;
} errs[] = {
    {"capacity", OSR_PERR_CAPACITY},
    {"rate_limited", OSR_PERR_RATE_LIMITED},
    {"timeout", OSR_PERR_TIMEOUT},
    {"unavailable", OSR_PERR_UNAVAILABLE},
    {"auth", OSR_PERR_AUTH},
    {"invalid", OSR_PERR_INVALID},
    {"boot_failed", OSR_PERR_BOOT_FAILED},
    {"not_found", OSR_PERR_NOT_FOUND},
};

int osr__sim_err_parse(const char *name)
{
  for (size_t i = 0; i < OSR_ARRAY_SIZE(errs); i++)
    if (strcmp(errs[i].name, name) == 0)
      return errs[i].code;
  return 0;
}

static const char *state_name(osr_resource_state_t st)
{
  static const char *const n[] = {"unknown", "starting", "running", "paused", "stopped", "gone"};
  return (unsigned)st < OSR_ARRAY_SIZE(n) ? n[st] : "unknown";
}

static osr_resource_state_t state_parse(const char *s)
{
  for (int i = 0; i <= OSR_RES_GONE; i++)
    if (strcmp(state_name((osr_resource_state_t)i), s) == 0)
      return (osr_resource_state_t)i;
  return OSR_RES_UNKNOWN;
}

static void copy_str(char *dst, size_t len, const char *src)
{
  osr_str_copy(dst, len, src != NULL ? src : "");
}

/* ---- resource JSON (osr-sim wire format and state file) ------------------ */

json_t *osr__sim_resource_to_json(const osr_resource_t *r, const char *tenant, int64_t created_ms)
{
  const osr_capabilities_t *g = &r->granted;
  json_t *ports = json_array();
  for (size_t i = 0; i < g->nports && i < OSR_MAX_PORTS; i++)
    json_array_append_new(ports, json_integer(g->ports[i]));
  const char *iso = osr_isolation_name(r->isolation);
  json_t *labels = json_pack("{s:s}", OSR_LABEL_SANDBOX_ID, r->sandbox_id);
  if (tenant != NULL && tenant[0] != '\0')
    json_object_set_new(labels, OSR_LABEL_TENANT, json_string(tenant));
  return json_pack(
      "{s:s,s:s,s:s,s:o,s:s,s:s?,s:s,s:s,s:I,s:{s:I,s:I,s:{s:I,s:s},s:b,s:o}}", "id",
      r->provider_id, "sandbox_id", r->sandbox_id, "tenant", tenant != NULL ? tenant : "", "labels",
      labels, "region", r->region, "isolation", iso, "state", state_name(r->state),
      "agent_endpoint", r->agent_endpoint, "created_ms", (json_int_t)created_ms, "granted", "vcpus",
      (json_int_t)g->vcpus, "memoryMiB", (json_int_t)g->min_memory_mib, "gpu", "count",
      (json_int_t)g->gpu_count, "type", g->gpu_type, "snapshot", g->snapshot, "ports", ports);
}

/* Readers of one object member with json_unpack's validation, without its
 * format-string interpretation (~15,000 instructions per answer on the
 * loop thread). Each returns 0, or -1 when the member is there with the
 * wrong type (null included); an absent member leaves *out as it is
 * (json_unpack's "s?x") unless `required` ("s:s"). */
static int get_str(const json_t *obj, const char *key, int required, const char **out)
{
  const json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return required ? -1 : 0;
  if (!json_is_string(v))
    return -1;
  *out = json_string_value(v);
  return 0;
}

static int opt_int(const json_t *obj, const char *key, json_int_t *out)
{
  const json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return 0;
  if (!json_is_integer(v))
    return -1;
  *out = json_integer_value(v);
  return 0;
}

static int opt_bool(const json_t *obj, const char *key, int *out)
{
  const json_t *v = json_object_get(obj, key);
  if (v == NULL)
    return 0;
  if (!json_is_boolean(v))
    return -1;
  *out = json_is_true(v);
  return 0;
}

/* "granted" as the former json_unpack(granted,
 * "{s?I,s?I,s?{s?I,s?s},s?b,s?o}", vcpus, memoryMiB, gpu {count, type},
 * snapshot, ports), whose result was not checked: members are read in that
 * order and reading stops at the first one of the wrong type, keeping what
 * was read before it (as json_unpack does) and defaults for the rest. */
static void read_granted(const json_t *granted, osr_capabilities_t *g)
{
  json_int_t vcpus = 0, mem = 0, gcount = 0;
  const char *gtype = "";
  int snap = 0;
  const json_t *ports = NULL, *gpu;
  if (opt_int(granted, "vcpus", &vcpus) != 0 || opt_int(granted, "memoryMiB", &mem) != 0)
    goto out;
  gpu = json_object_get(granted, "gpu");
  if (gpu != NULL && (!json_is_object(gpu) || opt_int(gpu, "count", &gcount) != 0 ||
                      get_str(gpu, "type", 0, &gtype) != 0))
    goto out;
  if (opt_bool(granted, "snapshot", &snap) != 0)
    goto out;
  ports = json_object_get(granted, "ports");
out:
  g->vcpus = (uint32_t)vcpus;
  g->min_memory_mib = (uint32_t)mem;
  g->gpu_count = (uint32_t)gcount;
  copy_str(g->gpu_type, sizeof(g->gpu_type), gtype);
  g->snapshot = snap;
  size_t i;
  json_t *v;
  json_array_foreach(ports, i, v)
  {
    if (g->nports < OSR_MAX_PORTS && json_is_integer(v))
      g->ports[g->nports++] = (uint16_t)json_integer_value(v);
  }
}

int osr__sim_resource_from_json(const json_t *j, osr_resource_t *r, char *tenant)
{
  const char *id = NULL, *sid = NULL, *ten = "", *region = "", *iso = NULL, *state = "unknown",
             *ep = "";
  memset(r, 0, sizeof(*r));
  /* The former json_unpack(j, "{s:s,s:s,s?s,s?s,s?s,s?s,s?s,s?o}", id,
   * sandbox_id, tenant, region, isolation, state, agent_endpoint, granted):
   * the same members, types and absent-member defaults. */
  if (!json_is_object(j) || get_str(j, "id", 1, &id) != 0 ||
      get_str(j, "sandbox_id", 1, &sid) != 0 || get_str(j, "tenant", 0, &ten) != 0 ||
      get_str(j, "region", 0, &region) != 0 || get_str(j, "isolation", 0, &iso) != 0 ||
      get_str(j, "state", 0, &state) != 0 || get_str(j, "agent_endpoint", 0, &ep) != 0)
    return OSR_EINVAL;
  const json_t *granted = json_object_get(j, "granted");
  if (strlen(id) >= sizeof(r->provider_id) || strlen(sid) >= sizeof(r->sandbox_id))
    return OSR_EINVAL;
  copy_str(r->provider_id, sizeof(r->provider_id), id);
  copy_str(r->sandbox_id, sizeof(r->sandbox_id), sid);
  copy_str(r->region, sizeof(r->region), region);
  copy_str(r->agent_endpoint, sizeof(r->agent_endpoint), ep);
  r->isolation = osr_isolation_parse(iso);
  r->state = state_parse(state);
  if (tenant != NULL)
    copy_str(tenant, OSR_NAME_MAX, ten);
  osr_capabilities_t *g = &r->granted;
  if (json_is_object(granted))
    read_granted(granted, g);
  copy_str(g->region, sizeof(g->region), r->region);
  g->isolation = r->isolation;
  return 0;
}

/* ---- configuration ------------------------------------------------------- */

static int parse_strlist(const json_t *v, char (*out)[OSR_NAME_MAX], size_t max, size_t *n)
{
  size_t i;
  json_t *e;
  if (!json_is_array(v) || json_array_size(v) > max)
    return -1;
  *n = 0;
  json_array_foreach(v, i, e)
  {
    if (!json_is_string(e) || json_string_length(e) == 0 || json_string_length(e) >= OSR_NAME_MAX)
      return -1;
    copy_str(out[(*n)++], OSR_NAME_MAX, json_string_value(e));
  }
  return 0;
}

static int parse_url(sim_t *s, const char *url)
{
  const char *pfx = "http://";
  if (strncmp(url, pfx, strlen(pfx)) != 0)
    return -1;
  const char *hp = url + strlen(pfx);
  size_t n = strcspn(hp, "/");
  if (n == 0 || n >= sizeof(s->addr) || (hp[n] == '/' && hp[n + 1] != '\0'))
    return -1;
  memcpy(s->addr, hp, n);
  s->addr[n] = '\0';
  return strchr(s->addr, ':') != NULL ? 0 : -1;
}

static int parse_config(sim_t *s, const json_t *cfg, char *err, size_t errlen)
{
  const char *key;
  json_t *v;
  int have_expected = 0;

  if (cfg != NULL && !json_is_object(cfg))
    return osr_rest_cfg_err(err, errlen, "(config)", "must be an object");
  json_object_foreach((json_t *)cfg, key, v)
  {
    double d;
    if (strcmp(key, "name") == 0 || strcmp(key, "type") == 0) {
      continue;
    } else if (strcmp(key, "latency_ms") == 0) {
      if (osr_rest_num_in(v, 0, 3600e3, &s->latency_ms))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a number of milliseconds from 0 to 3600000");
    } else if (strcmp(key, "latency_jitter_ms") == 0) {
      if (osr_rest_num_in(v, 0, 3600e3, &s->jitter_ms))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a number of milliseconds from 0 to 3600000");
    } else if (strcmp(key, "failure_rate") == 0) {
      if (osr_rest_num_in(v, 0, 1, &s->failure_rate))
        return osr_rest_cfg_err(err, errlen, key, "must be a number from 0 to 1");
    } else if (strcmp(key, "boot_failure_rate") == 0) {
      if (osr_rest_num_in(v, 0, 1, &s->boot_failure_rate))
        return osr_rest_cfg_err(err, errlen, key, "must be a number from 0 to 1");
    } else if (strcmp(key, "capacity") == 0) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 ||
          json_integer_value(v) > SIM_MAX_RESOURCES)
        return osr_rest_cfg_err(err, errlen, key,
                                "must be an integer from 0 (unlimited) to 1048576");
      s->capacity = (uint64_t)json_integer_value(v);
    } else if (strcmp(key, "error") == 0) {
      int code = json_is_string(v) ? osr__sim_err_parse(json_string_value(v)) : 0;
      if (code == 0 || code == OSR_PERR_BOOT_FAILED || code == OSR_PERR_NOT_FOUND)
        return osr_rest_cfg_err(
            err, errlen, key,
            "must be one of capacity, rate_limited, timeout, unavailable, auth, invalid");
      s->error = code;
    } else if (strcmp(key, "seed") == 0) {
      if (!json_is_integer(v))
        return osr_rest_cfg_err(err, errlen, key, "must be an integer");
      s->rng = (uint64_t)json_integer_value(v);
    } else if (strcmp(key, "isolation") == 0) {
      char names[3][OSR_NAME_MAX];
      size_t n;
      if (parse_strlist(v, names, 3, &n) != 0 || n == 0)
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a non-empty list of container, gvisor, firecracker");
      s->iso_mask = 0;
      for (size_t i = 0; i < n; i++) {
        osr_isolation_t iso = osr_isolation_parse(names[i]);
        if (iso == OSR_ISO_NONE)
          return osr_rest_cfg_err(err, errlen, key,
                                  "must be a non-empty list of container, gvisor, firecracker");
        s->iso_mask |= 1u << iso;
      }
    } else if (strcmp(key, "regions") == 0) {
      if (parse_strlist(v, s->regions, OSR_ARRAY_SIZE(s->regions), &s->nregions) != 0)
        return osr_rest_cfg_err(err, errlen, key, "must be a list of at most 15 region names");
    } else if (strcmp(key, "gpus") == 0) {
      json_t *types = json_object_get(v, "types"), *max = json_object_get(v, "max");
      const char *t;
      json_t *price;
      if (!json_is_object(v) || !json_is_integer(max) || json_integer_value(max) < 0 ||
          json_integer_value(max) > 1024 || (types != NULL && !json_is_object(types)) ||
          json_object_size(types) > OSR_ARRAY_SIZE(s->gpu_types))
        return osr_rest_cfg_err(
            err, errlen, key,
            "must be {max: N, types: {TYPE: usd_per_gpu_second, ...}} (at most 7 types)");
      s->gpu_max = (uint32_t)json_integer_value(max);
      s->ngpus = 0;
      json_object_foreach(types, t, price)
      {
        if (strlen(t) == 0 || strlen(t) >= OSR_NAME_MAX || osr_rest_num_in(price, 0, 1e6, &d) != 0)
          return osr_rest_cfg_err(err, errlen, key,
                                  "each GPU type needs a non-negative price per second");
        copy_str(s->gpu_types[s->ngpus], OSR_NAME_MAX, t);
        s->gpu_prices[s->ngpus++] = d;
      }
    } else if (strcmp(key, "snapshot") == 0 || strcmp(key, "accept_any") == 0) {
      if (!json_is_boolean(v))
        return osr_rest_cfg_err(err, errlen, key, "must be true or false");
      *(strcmp(key, "snapshot") == 0 ? &s->snapshot : &s->accept_any) = json_is_true(v);
    } else if (strcmp(key, "prices") == 0) {
      const char *pk;
      json_t *pv;
      if (!json_is_object(v))
        return osr_rest_cfg_err(err, errlen, key, "must be {vcpu_per_s, gib_per_s, per_create}");
      json_object_foreach(v, pk, pv)
      {
        double *dst = strcmp(pk, "vcpu_per_s") == 0   ? &s->price_vcpu
                      : strcmp(pk, "gib_per_s") == 0  ? &s->price_gib
                      : strcmp(pk, "per_create") == 0 ? &s->price_create
                                                      : NULL;
        if (dst == NULL || osr_rest_num_in(pv, 0, 1e6, dst) != 0)
          return osr_rest_cfg_err(
              err, errlen, key,
              "must be {vcpu_per_s, gib_per_s, per_create} with non-negative USD numbers");
      }
    } else if (strcmp(key, "expected_create_ms") == 0) {
      if (osr_rest_num_in(v, 0, 3600e3, &s->expected_ms))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a number of milliseconds from 0 to 3600000");
      have_expected = 1;
    } else if (strcmp(key, "max_ports") == 0 || strcmp(key, "max_memory_mib") == 0 ||
               strcmp(key, "max_vcpus") == 0) {
      if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1 << 24)
        return osr_rest_cfg_err(err, errlen, key, "must be a non-negative integer");
      uint32_t x = (uint32_t)json_integer_value(v);
      if (key[4] == 'p')
        s->max_ports = x > OSR_MAX_PORTS ? OSR_MAX_PORTS : x;
      else if (key[4] == 'm')
        s->max_memory = x;
      else
        s->max_vcpus = x;
    } else if (strcmp(key, "url") == 0) {
      if (!json_is_string(v) || parse_url(s, json_string_value(v)) != 0)
        return osr_rest_cfg_err(err, errlen, key, "must be http://HOST:PORT (an osr-sim server)");
      s->url_mode = 1;
    } else if (strcmp(key, "timeout_ms") == 0) {
      if (osr_rest_num_in(v, 1, 3600e3, &d))
        return osr_rest_cfg_err(err, errlen, key,
                                "must be a number of milliseconds from 1 to 3600000");
      s->timeout_ms = (uint64_t)d;
    } else if (strcmp(key, "offload_bytes") == 0) {
      if (osr_rest_num_in(v, 0, SIM_MAX_RESPONSE, &d))
        return osr_rest_cfg_err(err, errlen, key, "must be a number of bytes from 0 to 67108864");
      s->offload_bytes = (size_t)d;
    } else {
      return osr_rest_cfg_err(err, errlen, key,
                              "unknown key for a sim provider (see docs/adapters.md)");
    }
  }
  if (!have_expected)
    s->expected_ms = s->latency_ms;
  return 0;
}

static int call_work(osr_rest_op_t *rop, int st, const char *body, size_t len);
static void call_answer(osr_rest_op_t *rop, int st, const char *body, size_t len);
static void call_deliver(osr_rest_op_t *rop, int status);
static void call_release(osr_rest_op_t *rop);

static int sim_init(osr_provider_t *p, const json_t *config, char *err, size_t errlen)
{
  sim_t *s = osr_xcalloc(1, sizeof(*s));
  s->p = p;
  s->latency_ms = 20;
  s->error = OSR_PERR_UNAVAILABLE;
  s->rng = 0;
  s->iso_mask = (1u << OSR_ISO_CONTAINER) | (1u << OSR_ISO_GVISOR);
  /* Plausible small-VM prices (USD): ~$0.05 per vCPU-hour, ~$0.016 per
   * GiB-hour. Override with `prices` or the gateway's price_overrides. */
  s->price_vcpu = 0.000014;
  s->price_gib = 0.0000045;
  s->max_ports = OSR_MAX_PORTS;
  s->max_memory = 65536;
  s->max_vcpus = 64;
  s->timeout_ms = 30000;
  s->offload_bytes = OSR_REST_OFFLOAD_BYTES;
  s->next_id = 1;
  int rv = parse_config(s, config, err, errlen);
  if (rv != 0) {
    osr_free(s);
    return rv;
  }
  if (s->rng == 0) /* unseeded: vary between runs */
    s->rng = uv_hrtime() ^ ((uint64_t)(uintptr_t)s << 17);
  /* xorshift's one forbidden state. */
  if (s->rng == 0)
    s->rng = 0x9E3779B97F4A7C15ULL;
  if (s->url_mode) {
    osr_rest_config_t rc = {
        .name = p->name,
        .addr = s->addr,
        /* HTTP/2 with prior knowledge: one connection carries every
         * concurrent request, where HTTP/1.1 would queue them behind each
         * other. No per-call deadline: the connection's idle timeout. */
        .shared_h2 = 1,
        .connect_timeout_ms = s->timeout_ms < 5000 ? s->timeout_ms : 5000,
        .idle_timeout_ms = s->timeout_ms,
        .max_response = SIM_MAX_RESPONSE,
        .user_size = sizeof(sim_call_t),
        .on_answer = call_answer,
        .on_work = call_work,
        .work_min_bytes = s->offload_bytes,
        .on_deliver = call_deliver,
        .on_release = call_release,
    };
    s->api = osr_rest_new(p->loop, &rc, s);
  }
  p->impl = s;
  return 0;
}

static void sim_describe(osr_provider_t *p, osr_provider_info_t *info)
{
  sim_t *s = p->impl;
  memset(info, 0, sizeof(*info));
  info->isolation_mask = s->iso_mask;
  info->gpu_max = s->gpu_max;
  for (size_t i = 0; i < s->ngpus; i++) {
    info->gpu_types[i] = s->gpu_types[i];
    info->gpu_price_per_s[i] = s->gpu_prices[i];
  }
  info->snapshot = s->snapshot;
  info->pause = 0;
  info->max_ports = s->max_ports;
  info->max_memory_mib = s->max_memory;
  info->max_vcpus = s->max_vcpus;
  info->default_memory_mib = 512;
  info->default_vcpus = 1;
  for (size_t i = 0; i < s->nregions; i++)
    info->regions[i] = s->regions[i];
  info->price_vcpu_per_s = s->price_vcpu;
  info->price_gib_per_s = s->price_gib;
  info->price_per_create = s->price_create;
  info->expected_create_ms = s->expected_ms;
  info->flags = 0;
}

/* ---- in-process resource table ------------------------------------------- */

/* N of "sim-N" (what fill_resource names), 0 for anything else. */
static uint64_t id_number(const char *id)
{
  if (strncmp(id, "sim-", 4) != 0 || id[4] < '0' || id[4] > '9')
    return 0;
  char *end;
  unsigned long long n = strtoull(id + 4, &end, 10);
  return *end == '\0' ? n : 0;
}

/* The table is in insertion order, which is ascending id number (ids come
 * from next_id, restore sorts), so a page is a binary search for the first
 * resource numbered above the cursor: a page costs O(limit + log n) and
 * never skips a resource, whatever was removed since the page before. */
static size_t page_start(const sim_t *s, uint64_t after)
{
  size_t lo = 0, hi = s->nres;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (id_number(s->res[mid].r.provider_id) <= after)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The cursor of a page: the id of its last resource. NULL/"" = the first. */
static int parse_cursor(const char *cursor, uint64_t *after)
{
  *after = 0;
  if (cursor == NULL || cursor[0] == '\0')
    return 0;
  *after = id_number(cursor);
  return *after != 0 ? 0 : OSR_EINVAL;
}

/* [*first, return) is the page after `after`; `next` gets the cursor of the
 * following one, or "" if this is the last. */
static size_t page_bounds(const sim_t *s, uint64_t after, size_t limit, size_t *first, char *next,
                          size_t nextlen)
{
  size_t i = page_start(s, after), end = s->nres - i > limit ? i + limit : s->nres;
  *first = i;
  next[0] = '\0';
  if (end < s->nres && end > i)
    copy_str(next, nextlen, s->res[end - 1].r.provider_id);
  return end;
}

static sim_res_t *find_res(sim_t *s, const char *id)
{
  /* Newest first: a create looks up the resource it has just appended, so
   * the create path stays O(1) however many resources are live. */
  for (size_t i = s->nres; i-- > 0;)
    if (strcmp(s->res[i].r.provider_id, id) == 0)
      return &s->res[i];
  return NULL;
}

static void remove_res(sim_t *s, sim_res_t *r)
{
  /* Keep insertion order (lists and state files read naturally); the table
   * is a simulation, a memmove is fine. */
  size_t i = (size_t)(r - s->res);
  memmove(&s->res[i], &s->res[i + 1], (s->nres - i - 1) * sizeof(*s->res));
  s->nres--;
}

static sim_res_t *insert_res(sim_t *s)
{
  if (s->nres == s->capres) {
    size_t nc = s->capres != 0 ? s->capres * 2 : 64;
    s->res = osr_xrealloc(s->res, nc * sizeof(*s->res));
    s->capres = nc;
  }
  sim_res_t *r = &s->res[s->nres++];
  memset(r, 0, sizeof(*r));
  return r;
}

static int cmp_res_number(const void *a, const void *b)
{
  uint64_t x = id_number(((const sim_res_t *)a)->r.provider_id);
  uint64_t y = id_number(((const sim_res_t *)b)->r.provider_id);
  return x < y ? -1 : x > y;
}

json_t *osr__sim_dump_page(osr_provider_t *p, const char *after, size_t limit, char *next,
                           size_t nextlen)
{
  sim_t *s = p->impl;
  uint64_t n;
  size_t first;
  if (parse_cursor(after, &n) != 0 || limit == 0 || limit > SIM_MAX_PAGE)
    return NULL;
  size_t end = page_bounds(s, n, limit, &first, next, nextlen);
  json_t *a = json_array();
  for (size_t i = first; i < end; i++)
    json_array_append_new(
        a, osr__sim_resource_to_json(&s->res[i].r, s->res[i].tenant, s->res[i].created_ms));
  return a;
}

json_t *osr__sim_dump(osr_provider_t *p)
{
  sim_t *s = p->impl;
  json_t *a = json_array();
  for (size_t i = 0; i < s->nres; i++)
    json_array_append_new(
        a, osr__sim_resource_to_json(&s->res[i].r, s->res[i].tenant, s->res[i].created_ms));
  return a;
}

int osr__sim_restore(osr_provider_t *p, const json_t *arr)
{
  sim_t *s = p->impl;
  size_t i;
  json_t *v;
  if (!json_is_array(arr) || json_array_size(arr) > SIM_MAX_RESOURCES)
    return OSR_EINVAL;
  json_array_foreach(arr, i, v)
  {
    osr_resource_t r;
    /* Only ids this adapter hands out: pages are ordered by their number. */
    if (osr__sim_resource_from_json(v, &r, NULL) != 0 || id_number(r.provider_id) == 0)
      return OSR_EINVAL;
  }
  json_array_foreach(arr, i, v)
  {
    sim_res_t *r = insert_res(s);
    (void)osr__sim_resource_from_json(v, &r->r, r->tenant);
    json_int_t created = 0;
    json_unpack(v, "{s?I}", "created_ms", &created);
    r->created_ms = created;
    uint64_t n = id_number(r->r.provider_id);
    if (n >= s->next_id)
      s->next_id = n + 1;
  }
  qsort(s->res, s->nres, sizeof(*s->res), cmp_res_number);
  return 0;
}

void osr__sim_set_on_change(osr_provider_t *p, void (*cb)(void *data), void *data)
{
  sim_t *s = p->impl;
  s->on_change = cb;
  s->on_change_data = data;
}

/* ---- ops ------------------------------------------------------------------ */

static void try_finish_close(sim_t *s);

static void op_free(sim_op_t *op)
{
  sim_t *s = op->sim;
  if (op->prev != NULL)
    op->prev->next = op->next;
  else
    s->ops_head = op->next;
  if (op->next != NULL)
    op->next->prev = op->prev;
  else
    s->ops_tail = op->prev;
  s->nops--;
  osr_free(op->list);
  osr_free(op);
  if (s->closing)
    try_finish_close(s);
}

static void maybe_free(sim_op_t *op)
{
  if (op->timer_closed)
    op_free(op);
}

static void on_op_timer_closed(uv_handle_t *h)
{
  sim_op_t *op = h->data;
  op->timer_closed = 1;
  maybe_free(op);
}

/* The caller's callback for an op of `kind` (both modes). */
#define DELIVER(p_, kind_, cbu_, data_, st_, res_, lst_, nl_, next_)                               \
  do {                                                                                             \
    int ok_ = (st_) == 0;                                                                          \
    switch (kind_) {                                                                               \
    case OP_CREATE:                                                                                \
      (cbu_).create((p_), (st_), ok_ ? (res_) : NULL, (data_));                                    \
      break;                                                                                       \
    case OP_GET:                                                                                   \
      (cbu_).get((p_), (st_), ok_ ? (res_) : NULL, (data_));                                       \
      break;                                                                                       \
    case OP_DESTROY:                                                                               \
      (cbu_).done((p_), (st_), (data_));                                                           \
      break;                                                                                       \
    case OP_LIST:                                                                                  \
      (cbu_).list((p_), (st_), ok_ ? (lst_) : NULL, ok_ ? (nl_) : 0, (data_));                     \
      break;                                                                                       \
    case OP_LIST_PAGE:                                                                             \
      (cbu_).list_page((p_), (st_), ok_ ? (lst_) : NULL, ok_ ? (nl_) : 0,                          \
                       ok_ && (next_)[0] != '\0' ? (next_) : NULL, (data_));                       \
      break;                                                                                       \
    }                                                                                              \
  } while (0)

/* Run the user callback once, then let the op go. */
static void deliver(sim_op_t *op)
{
  op->delivered = 1;
  DELIVER(op->sim->p, op->kind, op->cb, op->data, op->status, &op->res, op->list, op->nlist,
          op->page_next);
  uv_close((uv_handle_t *)&op->timer, on_op_timer_closed);
}

static void on_op_timer(uv_timer_t *t);

/* Set the result and deliver it on a later loop turn. */
static void op_finish(sim_op_t *op, int status)
{
  if (op->finishing || op->delivered)
    return;
  op->finishing = 1;
  op->status = status;
  uv_timer_stop(&op->timer);
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
}

static sim_op_t *op_new(sim_t *s, int kind, void *data)
{
  sim_op_t *op = osr_xcalloc(1, sizeof(*op));
  op->sim = s;
  op->kind = kind;
  op->data = data;
  uv_timer_init(s->p->loop, &op->timer);
  op->timer.data = op;
  op->prev = s->ops_tail;
  if (s->ops_tail != NULL)
    s->ops_tail->next = op;
  else
    s->ops_head = op;
  s->ops_tail = op;
  s->nops++;
  return op;
}

static void fill_resource(sim_t *s, sim_res_t *r, const osr_sandbox_spec_t *spec)
{
  osr_resource_t *res = &r->r;
  snprintf(res->provider_id, sizeof(res->provider_id), "sim-%llu",
           (unsigned long long)s->next_id++);
  copy_str(res->sandbox_id, sizeof(res->sandbox_id), spec->sandbox_id);
  copy_str(r->tenant, sizeof(r->tenant), spec->tenant);
  copy_str(res->region, sizeof(res->region), spec->region);
  res->isolation = spec->isolation;
  if (res->isolation == OSR_ISO_NONE) {
    for (int k = OSR_ISO_CONTAINER; k <= OSR_ISO_FIRECRACKER; k++) {
      if (s->iso_mask & (1u << k)) {
        res->isolation = (osr_isolation_t)k;
        break;
      }
    }
  }
  snprintf(res->agent_endpoint, sizeof(res->agent_endpoint), "sim://%s", res->provider_id);
  res->state = OSR_RES_STARTING;
  res->granted = spec->caps;
  if (res->granted.vcpus == 0)
    res->granted.vcpus = 1;
  if (res->granted.min_memory_mib == 0)
    res->granted.min_memory_mib = 512;
  copy_str(res->granted.region, sizeof(res->granted.region), res->region);
  res->granted.isolation = res->isolation;
}

static int64_t wall_ms(void)
{
  uv_timeval64_t tv;
  if (uv_gettimeofday(&tv) != 0)
    return 0;
  return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

/* An honest provider refuses what it cannot give (placement should never
 * ask, but a misconfigured manifest must not turn into a silent downgrade). */
static int spec_unsupported(sim_t *s, const osr_sandbox_spec_t *spec)
{
  if (s->accept_any)
    return 0;
  if (spec->isolation != OSR_ISO_NONE && !(s->iso_mask & (1u << spec->isolation)))
    return 1;
  if (spec->isolation < spec->caps.isolation)
    return 1;
  if (spec->region != NULL && spec->region[0] != '\0') {
    size_t i;
    for (i = 0; i < s->nregions; i++)
      if (strcmp(s->regions[i], spec->region) == 0)
        break;
    if (i == s->nregions)
      return 1;
  }
  if (spec->caps.gpu_count > s->gpu_max || (spec->caps.snapshot && !s->snapshot) ||
      spec->caps.nports > s->max_ports)
    return 1;
  return 0;
}

static void on_create_latency(sim_op_t *op)
{
  sim_t *s = op->sim;
  if (op->status == 0) {
    sim_res_t *r = find_res(s, op->provider_id);
    if (r == NULL) {
      /* Destroyed while it was starting: it never became ready. */
      op->status = OSR_PERR_BOOT_FAILED;
    } else if (op->boot_fail) {
      /* Accepted, then never ready: destroy the half-created resource, as
       * the adapter contract requires. */
      remove_res(s, r);
      op->status = OSR_PERR_BOOT_FAILED;
      notify(s);
    } else {
      r->r.state = OSR_RES_RUNNING;
      op->res = r->r;
      notify(s);
    }
  }
  deliver(op);
}

static void run_local(sim_op_t *op)
{
  sim_t *s = op->sim;
  /* Only the ops on one resource look it up (a scan of the table: a list
   * page must not cost O(resources)). */
  sim_res_t *r =
      op->kind == OP_DESTROY || op->kind == OP_GET ? find_res(s, op->provider_id) : NULL;
  switch (op->kind) {
  case OP_DESTROY:
    if (r == NULL) {
      op->status = OSR_PERR_NOT_FOUND;
    } else {
      remove_res(s, r);
      notify(s);
    }
    break;
  case OP_GET:
    if (r == NULL)
      op->status = OSR_PERR_NOT_FOUND;
    else
      op->res = r->r;
    break;
  case OP_LIST:
    if (s->nres > 0) {
      op->list = osr_try_malloc(s->nres * sizeof(*op->list));
      if (op->list == NULL) {
        op->status = OSR_ENOMEM;
        break;
      }
      for (size_t i = 0; i < s->nres; i++)
        op->list[i] = s->res[i].r;
      op->nlist = s->nres;
    }
    break;
  case OP_LIST_PAGE: {
    size_t first,
        end = page_bounds(s, op->after, op->limit, &first, op->page_next, sizeof(op->page_next));
    if (end > first) {
      op->list = osr_try_malloc((end - first) * sizeof(*op->list));
      if (op->list == NULL) {
        op->status = OSR_ENOMEM;
        break;
      }
      for (size_t i = first; i < end; i++)
        op->list[i - first] = s->res[i].r;
      op->nlist = end - first;
    }
    break;
  }
  }
}

static void on_op_timer(uv_timer_t *t)
{
  sim_op_t *op = t->data;
  if (op->finishing) {
    deliver(op);
    return;
  }
  if (op->kind == OP_CREATE)
    on_create_latency(op);
  else {
    run_local(op);
    deliver(op);
  }
}

/* ---- url mode: the osr-sim HTTP API ---------------------------------------- */

static int map_http_error(int http_status, const char *name)
{
  int code = name != NULL ? osr__sim_err_parse(name) : 0;
  if (code != 0)
    return code;
  return osr_rest_map_status(http_status);
}

/* Ids go into a URL path: accept only what a sim id can contain. */
static int id_ok(const char *id)
{
  size_t n = strlen(id);
  if (n == 0 || n >= 128)
    return 0;
  for (size_t i = 0; i < n; i++) {
    char ch = id[i];
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '-' || ch == '_' || ch == '.'))
      return 0;
  }
  return 1;
}

/* A page's "next": absent or null on the last page, else an id. */
static int read_page_next(const json_t *j, sim_call_t *c)
{
  const json_t *v = json_object_get(j, "next");
  c->next[0] = '\0';
  if (v == NULL || json_is_null(v))
    return 1;
  if (!json_is_string(v) || !id_ok(json_string_value(v)))
    return 0;
  copy_str(c->next, sizeof(c->next), json_string_value(v));
  return 1;
}

/* What osr-sim's answer means for the call: its result, with the
 * resource or the list page in the call's state. Touches nothing else, so
 * it runs on the thread pool for a large answer (rest.h on_work). */
static int call_work(osr_rest_op_t *rop, int st, const char *body, size_t len)
{
  sim_call_t *c = osr_rest_user(rop);
  json_error_t jerr;
  json_t *j = body != NULL ? json_loadb(body, len, 0, &jerr) : NULL;
  int status = 0;

  if (st < 200 || st > 299) {
    const char *name = NULL;
    if (j != NULL)
      json_unpack(j, "{s:s}", "error", &name);
    status = map_http_error(st, name);
  } else if (c->kind == OP_CREATE || c->kind == OP_GET) {
    if (j == NULL || osr__sim_resource_from_json(j, &c->res, NULL) != 0)
      status = OSR_PERR_UNAVAILABLE; /* osr-sim answered nonsense */
  } else if (c->kind == OP_LIST || c->kind == OP_LIST_PAGE) {
    json_t *arr = j != NULL ? json_object_get(j, "resources") : NULL;
    size_t n = json_array_size(arr);
    if (!json_is_array(arr) ||
        (c->kind == OP_LIST_PAGE && (n > c->limit || !read_page_next(j, c)))) {
      status = OSR_PERR_UNAVAILABLE;
    } else if (n > 0) {
      c->list = osr_try_malloc(n * sizeof(*c->list));
      if (c->list == NULL) {
        status = OSR_ENOMEM;
      } else {
        for (size_t i = 0; i < n && status == 0; i++)
          if (osr__sim_resource_from_json(json_array_get(arr, i), &c->list[i], NULL) != 0)
            status = OSR_PERR_UNAVAILABLE;
        c->nlist = n;
      }
    }
  }
  json_decref(j);
  return status;
}

/* osr-sim answered (rest.h on_answer: a small answer, on the loop). */
static void call_answer(osr_rest_op_t *rop, int st, const char *body, size_t len)
{
  osr_rest_finish(rop, call_work(rop, st, body, len));
}

static void call_deliver(osr_rest_op_t *rop, int status)
{
  sim_call_t *c = osr_rest_user(rop);
  DELIVER(c->sim->p, c->kind, c->cb, c->data, status, &c->res, c->list, c->nlist, c->next);
}

static void call_release(osr_rest_op_t *rop)
{
  sim_call_t *c = osr_rest_user(rop);
  osr_free(c->req_body);
  c->req_body = NULL;
  osr_free(c->list);
}

static sim_call_t *call_new(sim_t *s, int kind, void *data)
{
  osr_rest_op_t *rop = osr_rest_op_new(s->api, kind);
  sim_call_t *c = osr_rest_user(rop);
  c->rop = rop;
  c->sim = s;
  c->kind = kind;
  c->data = data;
  return c;
}

/* ---- adapter operations ------------------------------------------------------ */

/* The create request osr-sim reads (POST /v1/resources), written straight
 * into one buffer: building it with json_pack and serialising it with
 * json_dumps cost ~77,000 instructions of the loop thread per create. The
 * bytes (keys, order, escaping) are exactly what
 *   json_pack("{s:s,s:s,s:s,s:s?,s:s,s:I,s:o,s:{s:s,s:s}}", sandbox_id,
 *             tenant, template, isolation, region, timeout_s,
 *             caps {vcpus, memoryMiB, gpu {count, type}, snapshot, ports},
 *             labels {OSR_LABEL_SANDBOX_ID, OSR_LABEL_TENANT})
 * dumped with JSON_COMPACT gave (tests/unit/adapters/test_sim.c checks). */
static void write_caps(osr_jw_t *w, const osr_capabilities_t *c)
{
  osr_jw_lit(w, "{\"vcpus\":");
  osr_jw_int(w, c->vcpus);
  osr_jw_lit(w, ",\"memoryMiB\":");
  osr_jw_int(w, c->min_memory_mib);
  osr_jw_lit(w, ",\"gpu\":{\"count\":");
  osr_jw_int(w, c->gpu_count);
  osr_jw_lit(w, ",\"type\":");
  osr_jw_str(w, c->gpu_type);
  osr_jw_lit(w, "},\"snapshot\":");
  osr_jw_bool(w, c->snapshot);
  osr_jw_lit(w, ",\"ports\":[");
  for (size_t i = 0; i < c->nports && i < OSR_MAX_PORTS; i++) {
    if (i > 0)
      osr_jw_lit(w, ",");
    osr_jw_int(w, c->ports[i]);
  }
  osr_jw_lit(w, "]}");
}

char *osr__sim_create_body(const osr_sandbox_spec_t *spec, size_t *len)
{
  const char *tenant = spec->tenant != NULL ? spec->tenant : "";
  osr_jw_t w;
  osr_jw_init(&w, SIM_MAX_REQUEST);
  osr_jw_lit(&w, "{\"sandbox_id\":");
  osr_jw_str(&w, spec->sandbox_id);
  osr_jw_lit(&w, ",\"tenant\":");
  osr_jw_str(&w, tenant);
  osr_jw_lit(&w, ",\"template\":");
  osr_jw_str(&w, spec->template_id != NULL ? spec->template_id : "");
  osr_jw_lit(&w, ",\"isolation\":");
  osr_jw_str(&w, osr_isolation_name(spec->isolation)); /* NULL: null */
  osr_jw_lit(&w, ",\"region\":");
  osr_jw_str(&w, spec->region != NULL ? spec->region : "");
  osr_jw_lit(&w, ",\"timeout_s\":");
  osr_jw_int(&w, spec->timeout_s);
  osr_jw_lit(&w, ",\"caps\":");
  write_caps(&w, &spec->caps);
  osr_jw_lit(&w, ",\"labels\":{\"" OSR_LABEL_SANDBOX_ID "\":");
  osr_jw_str(&w, spec->sandbox_id);
  osr_jw_lit(&w, ",\"" OSR_LABEL_TENANT "\":");
  osr_jw_str(&w, tenant);
  osr_jw_lit(&w, "}}");
  return osr_jw_release(&w, len);
}

static int sim_create(osr_provider_t *p, const osr_sandbox_spec_t *spec, osr_provider_create_cb cb,
                      void *data)
{
  sim_t *s = p->impl;
  if (s->closing)
    return OSR_ECLOSED;
  if (spec == NULL || cb == NULL || spec->sandbox_id == NULL || spec->sandbox_id[0] == '\0' ||
      strlen(spec->sandbox_id) >= OSR_NAME_MAX)
    return OSR_EINVAL;
  if (s->url_mode) {
    sim_call_t *c = call_new(s, OP_CREATE, data);
    c->cb.create = cb;
    size_t len;
    c->req_body = osr__sim_create_body(spec, &len);
    if (c->req_body == NULL) {
      osr_rest_finish(c->rop, OSR_ENOMEM);
      return 0;
    }
    osr_rest_send(c->rop, "POST", "/v1/resources", c->req_body);
    return 0;
  }
  sim_op_t *op = op_new(s, OP_CREATE, data);
  op->cb.create = cb;

  /* Every create draws the same numbers in the same order, so a seeded
   * run is reproducible whatever the outcomes. */
  double r_fail = rnd(s), r_boot = rnd(s), r_jit = rnd(s);
  double lat = s->latency_ms + (r_jit * 2 - 1) * s->jitter_ms;
  if (lat < 0)
    lat = 0;
  if (r_fail < s->failure_rate) {
    op->status = s->error;
  } else if (spec_unsupported(s, spec)) {
    op->status = OSR_PERR_INVALID;
  } else if ((s->capacity != 0 && s->nres >= s->capacity) || s->nres >= SIM_MAX_RESOURCES) {
    op->status = OSR_PERR_CAPACITY;
  } else {
    /* The resource exists (labelled, "starting") from the moment the
     * provider accepted the create, as with real providers: a gateway that
     * crashes now finds it in list(). */
    sim_res_t *r = insert_res(s);
    fill_resource(s, r, spec);
    r->created_ms = wall_ms();
    copy_str(op->provider_id, sizeof(op->provider_id), r->r.provider_id);
    op->boot_fail = r_boot < s->boot_failure_rate;
    notify(s);
  }
  uv_timer_start(&op->timer, on_op_timer, (uint64_t)llround(lat), 0);
  return 0;
}

static int start_simple(osr_provider_t *p, int kind, const char *provider_id, void *cb, void *data)
{
  sim_t *s = p->impl;
  if (s->closing)
    return OSR_ECLOSED;
  if (cb == NULL || (kind != OP_LIST && provider_id == NULL))
    return OSR_EINVAL;
  if (s->url_mode) {
    sim_call_t *c = call_new(s, kind, data);
    if (kind == OP_DESTROY)
      c->cb.done = (osr_provider_done_cb)cb;
    else if (kind == OP_GET)
      c->cb.get = (osr_provider_get_cb)cb;
    else
      c->cb.list = (osr_provider_list_cb)cb;
    if (kind != OP_LIST && !id_ok(provider_id)) {
      osr_rest_finish(c->rop, OSR_PERR_NOT_FOUND); /* no such id can exist */
      return 0;
    }
    char target[200];
    if (kind == OP_LIST)
      snprintf(target, sizeof(target), "/v1/resources?label=%s", OSR_LABEL_SANDBOX_ID);
    else
      snprintf(target, sizeof(target), "/v1/resources/%s", provider_id);
    osr_rest_send(c->rop, kind == OP_DESTROY ? "DELETE" : "GET", target, NULL);
    return 0;
  }
  sim_op_t *op = op_new(s, kind, data);
  switch (kind) {
  case OP_DESTROY:
    op->cb.done = (osr_provider_done_cb)cb;
    break;
  case OP_GET:
    op->cb.get = (osr_provider_get_cb)cb;
    break;
  default:
    op->cb.list = (osr_provider_list_cb)cb;
    break;
  }
  if (provider_id != NULL)
    copy_str(op->provider_id, sizeof(op->provider_id), provider_id);
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
  return 0;
}

static int sim_destroy(osr_provider_t *p, const char *id, osr_provider_done_cb cb, void *data)
{
  return start_simple(p, OP_DESTROY, id, (void *)cb, data);
}

static int sim_get(osr_provider_t *p, const char *id, osr_provider_get_cb cb, void *data)
{
  return start_simple(p, OP_GET, id, (void *)cb, data);
}

static int sim_list(osr_provider_t *p, osr_provider_list_cb cb, void *data)
{
  return start_simple(p, OP_LIST, NULL, (void *)cb, data);
}

/* Pages run on the same paths as the other operations: a timer turn in
 * process, GET /v1/resources?...&after=&limit= on osr-sim. */
static int sim_list_page(osr_provider_t *p, const char *cursor, size_t limit,
                         osr_provider_list_page_cb cb, void *data)
{
  sim_t *s = p->impl;
  uint64_t after;
  if (s->closing)
    return OSR_ECLOSED;
  if (cb == NULL || limit == 0 || limit > SIM_MAX_PAGE || parse_cursor(cursor, &after) != 0)
    return OSR_EINVAL;
  if (s->url_mode) {
    sim_call_t *c = call_new(s, OP_LIST_PAGE, data);
    c->cb.list_page = cb;
    c->limit = limit;
    char target[300];
    snprintf(target, sizeof(target), "/v1/resources?label=%s&limit=%zu%s%s", OSR_LABEL_SANDBOX_ID,
             limit, after != 0 ? "&after=" : "", after != 0 ? cursor : "");
    osr_rest_send(c->rop, "GET", target, NULL);
    return 0;
  }
  sim_op_t *op = op_new(s, OP_LIST_PAGE, data);
  op->cb.list_page = cb;
  op->after = after;
  op->limit = limit;
  uv_timer_start(&op->timer, on_op_timer, 0, 0);
  return 0;
}

/* ---- close -------------------------------------------------------------------- */

static void on_close_timer_closed(uv_handle_t *h)
{
  sim_t *s = h->data;
  osr_provider_t *p = s->p;
  void (*cb)(osr_provider_t *) = s->close_cb;
  osr_free(s->res);
  osr_free(s);
  p->impl = NULL;
  if (cb != NULL)
    cb(p);
}

static void on_api_closed(void *owner)
{
  sim_t *s = owner;
  s->api = NULL;
  try_finish_close(s);
}

static void try_finish_close(sim_t *s)
{
  if (s->close_done || s->nops > 0 || s->api != NULL)
    return;
  s->close_done = 1;
  /* Closing a handle always completes on a later loop turn, so the close
   * callback never runs inside sim_close(). */
  uv_close((uv_handle_t *)&s->close_timer, on_close_timer_closed);
}

static void sim_close(osr_provider_t *p, void (*cb)(osr_provider_t *p))
{
  sim_t *s = p->impl;
  if (s->closing)
    return;
  s->closing = 1;
  s->close_cb = cb;
  uv_timer_init(p->loop, &s->close_timer);
  s->close_timer.data = s;
  for (sim_op_t *op = s->ops_head; op != NULL; op = op->next)
    op_finish(op, OSR_ECANCELED);
  if (s->api != NULL)
    osr_rest_close(s->api, on_api_closed); /* its calls end OSR_ECANCELED */
  try_finish_close(s);
}

const osr_adapter_t osr_adapter_sim = {
    .version = OSR_ADAPTER_VERSION,
    .type = "sim",
    .init = sim_init,
    .describe = sim_describe,
    .create = sim_create,
    .destroy = sim_destroy,
    .get = sim_get,
    .list = sim_list,
    .pause = NULL,
    .resume = NULL,
    .close = sim_close,
    .list_page = sim_list_page,
};
