/*
 * The provider registry (see providers.h).
 *
 * Providers are fixed for the life of the registry: their order is the
 * configuration order, which is also placement's final tie-break, so the
 * arrays handed to placement are built once.
 */
#include "gateway/providers.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "util/log.h"
#include "util/mem.h"

#define MOD "providers"

struct osr_providers_s {
  uv_loop_t *loop;
  size_t n;
  osr_provider_t *prov[OSR_PROVIDERS_MAX];
  osr_provider_health_t *health[OSR_PROVIDERS_MAX];
  /* close */
  size_t closing_left;
  void (*close_cb)(void *data);
  void *close_data;
  uv_timer_t close_timer; /* makes the final callback asynchronous */
};

/* Each provider struct carries a back-pointer to its registry so adapter
 * close callbacks (which only get the provider) can find it. */
typedef struct prov_slot_s {
  osr_provider_t p; /* first: the adapter sees &slot->p */
  osr_providers_t *reg;
  osr_provider_health_t health;
} prov_slot_t;

static int set_err(char *err, size_t errlen, const char *name, const char *fmt, ...)
  OSR_PRINTF(4, 5);
static int set_err(char *err, size_t errlen, const char *name, const char *fmt, ...)
{
  char what[200];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(what, sizeof(what), fmt, ap);
  va_end(ap);
  snprintf(err, errlen, "provider '%s': %s", name, what);
  return OSR_EINVAL;
}

/* {vcpu_per_s, gib_per_s, per_create, gpu: {type: per_s}} onto info. */
static int apply_prices(osr_provider_info_t *info, const char *name, const json_t *o, char *err,
                        size_t errlen)
{
  const char *k;
  json_t *v;
  if (!json_is_object(o))
    return set_err(err, errlen, name, "price override must be an object");
  json_object_foreach((json_t *)o, k, v)
  {
    if (strcmp(k, "gpu") == 0) {
      const char *t;
      json_t *pv;
      if (!json_is_object(v))
        return set_err(err, errlen, name, "price override key 'gpu': must be {TYPE: usd_per_s}");
      json_object_foreach(v, t, pv)
      {
        size_t i;
        for (i = 0; i < OSR_ARRAY_SIZE(info->gpu_types) && info->gpu_types[i] != NULL; i++)
          if (strcmp(info->gpu_types[i], t) == 0)
            break;
        if (i == OSR_ARRAY_SIZE(info->gpu_types) || info->gpu_types[i] == NULL)
          return set_err(err, errlen, name, "price override key 'gpu': no GPU type '%s'", t);
        if (!json_is_number(pv) || json_number_value(pv) < 0)
          return set_err(err, errlen, name,
                         "price override key 'gpu.%s': must be a non-negative number", t);
        info->gpu_price_per_s[i] = json_number_value(pv);
      }
      continue;
    }
    double *dst = strcmp(k, "vcpu_per_s") == 0   ? &info->price_vcpu_per_s
                  : strcmp(k, "gib_per_s") == 0  ? &info->price_gib_per_s
                  : strcmp(k, "per_create") == 0 ? &info->price_per_create
                                                 : NULL;
    if (dst == NULL)
      return set_err(err, errlen, name,
                     "price override key '%s': unknown (vcpu_per_s, gib_per_s, per_create, gpu)", k);
    if (!json_is_number(v) || json_number_value(v) < 0)
      return set_err(err, errlen, name, "price override key '%s': must be a non-negative number",
                     k);
    *dst = json_number_value(v);
  }
  return 0;
}

static void on_adapter_closed(osr_provider_t *p);

static void on_close_timer_closed(uv_handle_t *h)
{
  osr_providers_t *reg = h->data;
  void (*cb)(void *) = reg->close_cb;
  void *data = reg->close_data;
  osr_free(reg);
  if (cb != NULL)
    cb(data);
}

static void finish_close(osr_providers_t *reg)
{
  uv_close((uv_handle_t *)&reg->close_timer, on_close_timer_closed);
}

static void on_adapter_closed(osr_provider_t *p)
{
  prov_slot_t *slot = osr_container_of(p, prov_slot_t, p);
  osr_providers_t *reg = slot->reg;
  osr_free(slot);
  if (--reg->closing_left == 0)
    finish_close(reg);
}

void osr_providers_close(osr_providers_t *reg, void (*cb)(void *data), void *data)
{
  reg->close_cb = cb;
  reg->close_data = data;
  uv_timer_init(reg->loop, &reg->close_timer);
  reg->close_timer.data = reg;
  size_t n = reg->n;
  reg->closing_left = n;
  reg->n = 0;
  if (n == 0) {
    finish_close(reg);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    osr_provider_t *p = reg->prov[i];
    reg->prov[i] = NULL;
    reg->health[i] = NULL;
    p->adapter->close(p, on_adapter_closed);
  }
}

int osr_providers_new(uv_loop_t *loop, const json_t *providers_config,
                      const json_t *price_overrides, const osr_breaker_config_t *bc,
                      osr_providers_t **out, char *err, size_t errlen)
{
  osr_providers_t *reg = osr_xcalloc(1, sizeof(*reg));
  reg->loop = loop;
  int rv = 0;
  size_t i;
  json_t *e;

  if (!json_is_array(providers_config) || json_array_size(providers_config) == 0) {
    snprintf(err, errlen, "providers: must be a non-empty list of {name, type, ...}");
    rv = OSR_EINVAL;
    goto out;
  }
  if (json_array_size(providers_config) > OSR_PROVIDERS_MAX) {
    snprintf(err, errlen, "providers: at most %d providers", OSR_PROVIDERS_MAX);
    rv = OSR_EINVAL;
    goto out;
  }
  if (price_overrides != NULL && !json_is_null(price_overrides) &&
      !json_is_object(price_overrides)) {
    snprintf(err, errlen, "price_overrides: must be an object keyed by provider name");
    rv = OSR_EINVAL;
    goto out;
  }

  json_array_foreach(providers_config, i, e)
  {
    const char *name = json_string_value(json_object_get(e, "name"));
    const char *type = json_string_value(json_object_get(e, "type"));
    char label[32];
    snprintf(label, sizeof(label), "#%zu", i + 1);
    if (!json_is_object(e)) {
      rv = set_err(err, errlen, label, "must be an object {name, type, ...}");
      goto out;
    }
    if (name == NULL || name[0] == '\0' || strlen(name) >= OSR_NAME_MAX) {
      rv = set_err(err, errlen, label, "key 'name': missing or not a string of 1..63 bytes");
      goto out;
    }
    for (size_t k = 0; k < reg->n; k++) {
      if (strcmp(reg->prov[k]->name, name) == 0) {
        rv = set_err(err, errlen, name, "key 'name': '%s' is configured twice", name);
        goto out;
      }
    }
    if (type == NULL) {
      rv = set_err(err, errlen, name, "key 'type': missing");
      goto out;
    }
    const osr_adapter_t *ad = osr_adapter_find(type);
    if (ad == NULL) {
      const char *types[16];
      size_t nt = osr_adapter_types(types, OSR_ARRAY_SIZE(types));
      char known[200] = "";
      size_t off = 0;
      for (size_t k = 0; k < nt && k < OSR_ARRAY_SIZE(types); k++) {
        int w = snprintf(known + off, sizeof(known) - off, "%s%s", k ? ", " : "", types[k]);
        if (w < 0 || (size_t)w >= sizeof(known) - off)
          break;
        off += (size_t)w;
      }
      char what[300];
      snprintf(what, sizeof(what), "key 'type': unknown provider type '%s' (built in: %s)", type,
               known);
      snprintf(err, errlen, "provider '%s': %s", name, what);
      rv = OSR_EINVAL;
      goto out;
    }
    if (ad->version != OSR_ADAPTER_VERSION) {
      rv = set_err(err, errlen, name, "adapter '%s' was built for another adapter API version",
                   type);
      goto out;
    }
    prov_slot_t *slot = osr_xcalloc(1, sizeof(*slot));
    slot->reg = reg;
    osr_provider_t *p = &slot->p;
    p->adapter = ad;
    p->loop = loop;
    snprintf(p->name, sizeof(p->name), "%s", name);
    char aerr[256] = "";
    rv = ad->init(p, e, aerr, sizeof(aerr));
    if (rv != 0) {
      snprintf(err, errlen, "provider '%s': %s", name, aerr[0] ? aerr : "invalid configuration");
      osr_free(slot);
      rv = OSR_EINVAL;
      goto out;
    }
    /* From here the adapter owns state: the slot is released by close. */
    reg->prov[reg->n] = p;
    reg->health[reg->n] = &slot->health;
    reg->n++;
    ad->describe(p, &p->info);
    json_t *ov = price_overrides != NULL ? json_object_get(price_overrides, name) : NULL;
    if (ov != NULL && (rv = apply_prices(&p->info, name, ov, err, errlen)) != 0)
      goto out;
    osr_provider_health_init(&slot->health, &p->info, bc);
  }
  if (price_overrides != NULL && json_is_object(price_overrides)) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)price_overrides, k, v)
    {
      if (osr_providers_find(reg, k, NULL) == NULL) {
        snprintf(err, errlen, "price_overrides: no provider named '%s'", k);
        rv = OSR_EINVAL;
        goto out;
      }
    }
  }

out:
  if (rv != 0) {
    /* Adapters may own loop handles after init: close them the normal way
     * (in the background) rather than leak or free under them. */
    osr_providers_close(reg, NULL, NULL);
    return rv;
  }
  OSR_LOG_DEBUG(MOD, "%zu provider(s) configured", reg->n);
  *out = reg;
  return 0;
}

size_t osr_providers_count(const osr_providers_t *p)
{
  return p->n;
}

osr_provider_t *osr_providers_at(osr_providers_t *p, size_t i)
{
  return i < p->n ? p->prov[i] : NULL;
}

osr_provider_health_t *osr_providers_health(osr_providers_t *p, size_t i)
{
  return i < p->n ? p->health[i] : NULL;
}

osr_provider_t *const *osr_providers_list(const osr_providers_t *p)
{
  return p->prov;
}

osr_provider_health_t *const *osr_providers_health_list(const osr_providers_t *p)
{
  return p->health;
}

osr_provider_t *osr_providers_find(osr_providers_t *p, const char *name, size_t *idx)
{
  for (size_t i = 0; i < p->n; i++) {
    if (strcmp(p->prov[i]->name, name) == 0) {
      if (idx != NULL)
        *idx = i;
      return p->prov[i];
    }
  }
  return NULL;
}

json_t *osr_provider_info_to_json(const osr_provider_info_t *info)
{
  json_t *iso = json_array();
  for (int k = OSR_ISO_CONTAINER; k <= OSR_ISO_FIRECRACKER; k++)
    if (info->isolation_mask & (1u << k))
      json_array_append_new(iso, json_string(osr_isolation_name((osr_isolation_t)k)));
  json_t *regions = json_array();
  for (size_t i = 0; i < OSR_ARRAY_SIZE(info->regions) && info->regions[i] != NULL; i++)
    json_array_append_new(regions, json_string(info->regions[i]));
  json_t *types = json_array();
  for (size_t i = 0; i < OSR_ARRAY_SIZE(info->gpu_types) && info->gpu_types[i] != NULL; i++)
    json_array_append_new(types, json_string(info->gpu_types[i]));
  return json_pack("{s:o,s:o,s:{s:I,s:o},s:b,s:b,s:I,s:I,s:I,s:I,s:I,s:f,s:b}", "isolation", iso,
                   "regions", regions, "gpu", "max", (json_int_t)info->gpu_max, "types", types,
                   "snapshot", info->snapshot, "pause", info->pause, "maxPorts",
                   (json_int_t)info->max_ports, "maxMemoryMiB", (json_int_t)info->max_memory_mib,
                   "maxVcpus", (json_int_t)info->max_vcpus, "defaultMemoryMiB",
                   (json_int_t)info->default_memory_mib, "defaultVcpus",
                   (json_int_t)info->default_vcpus, "expectedCreateMs", info->expected_create_ms,
                   "labels", !(info->flags & OSR_PROVIDER_F_NO_LABELS));
}

static json_t *prices_json(const osr_provider_info_t *info)
{
  json_t *gpu = json_object();
  for (size_t i = 0; i < OSR_ARRAY_SIZE(info->gpu_types) && info->gpu_types[i] != NULL; i++)
    json_object_set_new(gpu, info->gpu_types[i], json_real(info->gpu_price_per_s[i]));
  return json_pack("{s:s,s:f,s:f,s:f,s:o}", "currency", "USD", "vcpuPerSecond",
                   info->price_vcpu_per_s, "gibPerSecond", info->price_gib_per_s, "perCreate",
                   info->price_per_create, "gpuPerSecond", gpu);
}

static json_t *time_json(int64_t ms)
{
  if (ms <= 0)
    return json_null();
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  char ts[40], out[48];
  gmtime_r(&t, &tm);
  strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
  snprintf(out, sizeof(out), "%s.%03dZ", ts, (int)(ms % 1000));
  return json_string(out);
}

json_t *osr_providers_to_json(osr_providers_t *p, int64_t now_ms)
{
  json_t *arr = json_array();
  for (size_t i = 0; i < p->n; i++) {
    const osr_provider_t *pr = p->prov[i];
    const osr_provider_health_t *h = p->health[i];
    osr_breaker_state_t st = osr_breaker_state(&h->breaker, now_ms);
    json_t *health = json_pack(
      "{s:s,s:o,s:f,s:f,s:I,s:I,s:I}", "breaker", osr_breaker_state_name(st), "breakerOpenUntil",
      time_json(osr_breaker_open_until(&h->breaker, now_ms)), "latencyEwmaMs", h->latency_ewma_ms,
      "successEwma", h->success_ewma, "createsOk", (json_int_t)h->creates_ok, "createsFailed",
      (json_int_t)h->creates_failed, "timesOpened", (json_int_t)h->breaker.times_opened);
    json_array_append_new(arr, json_pack("{s:s,s:s,s:o,s:o,s:o}", "name", pr->name, "type",
                                         pr->adapter->type, "capabilities",
                                         osr_provider_info_to_json(&pr->info), "prices",
                                         prices_json(&pr->info), "health", health));
  }
  return json_pack("{s:o}", "providers", arr);
}
