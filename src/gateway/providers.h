/*
 * The provider registry: every configured provider instance (an adapter from
 * adapters/registry.c plus its configuration), its manifest with price
 * overrides applied, and its live health (circuit breaker, latency and
 * success EWMAs, counters). Owned by the gateway (osr_gw_t.providers).
 *
 * Typical use by the create path:
 *
 *   osr_placement_input_t in = {0};
 *   in.providers = osr_providers_list(reg);
 *   in.health = osr_providers_health_list(reg);
 *   in.nproviders = osr_providers_count(reg);
 *   ... caps, policy, tenant lists, now_ms ...
 *   n = osr_place(&in, cands);
 *   for each eligible candidate c, in order:
 *     if (!osr_breaker_allow(&c->health->breaker, now)) continue;   // reserve
 *     c->provider->adapter->create(c->provider, &spec, cb, data);
 *     ... in cb: osr_provider_health_record(c->health, status, ms, now);
 *         retry the next candidate if osr_provider_err_retryable(status).
 *
 * osr_provider_health_record() feeds the breaker too (and releases a
 * half-open probe slot reserved by osr_breaker_allow()).
 *
 * Threading: loop thread only, like the adapters.
 */
#ifndef OSR_GATEWAY_PROVIDERS_H
#define OSR_GATEWAY_PROVIDERS_H

#include <jansson.h>
#include <stdint.h>
#include <uv.h>

#include "gateway/breaker.h"
#include "gateway/placement.h"
#include "osr/adapter.h"

typedef struct osr_providers_s osr_providers_t;

/** Most providers one registry holds. */
#define OSR_PROVIDERS_MAX 64

/**
 * Build the registry from `providers_config`, an array of objects
 * {name, type, ...adapter keys} (the YAML `providers:` section as JSON). For
 * each entry: look up `type` in the adapter table, call its init() (no I/O)
 * and describe(), apply `price_overrides` (object or NULL):
 *   {"<provider name>": {"vcpu_per_s": n, "gib_per_s": n, "per_create": n,
 *                        "gpu": {"<type>": per_s, ...}}}
 * and initialise health with breaker config `bc` (NULL = defaults).
 *
 * Returns 0 and *out, or OSR_EINVAL with a human message in err that names
 * the provider and the key ("provider 'e2b-eu': key 'api_key': missing").
 * On error the adapters already initialised are closed in the background
 * (their close callbacks run on the loop; the registry memory is freed
 * there), so the caller should still run the loop before uv_loop_close().
 */
int osr_providers_new(uv_loop_t *loop, const json_t *providers_config,
                      const json_t *price_overrides, const osr_breaker_config_t *bc,
                      osr_providers_t **out, char *err, size_t errlen);

/** Number of providers (configuration order is index order). */
size_t osr_providers_count(const osr_providers_t *p);

/** The i-th provider / its health (i < count). Valid until close. */
osr_provider_t *osr_providers_at(osr_providers_t *p, size_t i);
osr_provider_health_t *osr_providers_health(osr_providers_t *p, size_t i);

/** Arrays of count entries in configuration order, for osr_placement_input_t. */
osr_provider_t *const *osr_providers_list(const osr_providers_t *p);
osr_provider_health_t *const *osr_providers_health_list(const osr_providers_t *p);

/** Find a provider by configured name; sets *idx (if not NULL). NULL if none. */
osr_provider_t *osr_providers_find(osr_providers_t *p, const char *name, size_t *idx);

/**
 * GET /v1/providers body: {"providers":[{"name","type","capabilities":{...},
 * "prices":{...},"health":{"breaker","breakerOpenUntil","latencyEwmaMs",
 * "successEwma","createsOk","createsFailed","timesOpened"}}]}. New reference.
 */
json_t *osr_providers_to_json(osr_providers_t *p, int64_t now_ms);

/** The manifest part of one provider as JSON ({isolation:[...], regions,
 *  gpu:{max,types}, snapshot, pause, maxPorts, maxMemoryMiB, maxVcpus,
 *  defaultMemoryMiB, defaultVcpus, expectedCreateMs, labels}). New reference. */
json_t *osr_provider_info_to_json(const osr_provider_info_t *info);

/**
 * Close every adapter (each cancels its in-flight work: their callbacks fire
 * with OSR_ECANCELED), then free the registry and call cb(data) once, always
 * later (never from inside this call). Nothing else may be called on `p`
 * afterwards.
 */
void osr_providers_close(osr_providers_t *p, void (*cb)(void *data), void *data);

#endif
