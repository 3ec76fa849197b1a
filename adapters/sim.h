/*
 * Private helpers of the `sim` adapter shared with the osr-sim server
 * (src/sim/osr_sim.c), which runs an in-process sim provider behind an HTTP
 * API so that its resources outlive a gateway process. Not part of the
 * adapter API: nothing but osr-sim and the sim tests should use these.
 */
#ifndef OSR_ADAPTERS_SIM_H
#define OSR_ADAPTERS_SIM_H

#include <jansson.h>

#include "osr/adapter.h"

extern const osr_adapter_t osr_adapter_sim;

/** A resource as JSON (the osr-sim wire format, also the state file's):
 *  {"id","sandbox_id","tenant","labels":{...},"region","isolation","state",
 *   "agent_endpoint","created_ms","granted":{...}}. New reference. */
json_t *osr__sim_resource_to_json(const osr_resource_t *r, const char *tenant,
                                  int64_t created_ms);

/** Parse the JSON above into `r` (tenant optional, OSR_NAME_MAX bytes).
 *  Returns 0 or OSR_EINVAL. */
int osr__sim_resource_from_json(const json_t *j, osr_resource_t *r, char *tenant);

/** Url mode: the body of POST /v1/resources for `spec` (sandbox_id set),
 *  compact JSON, NUL-terminated, its length in `*len`; free with osr_free.
 *  Byte for byte what json_pack + json_dumps(JSON_COMPACT) of the same
 *  object gave. NULL if out of memory or longer than 1 MiB. */
char *osr__sim_create_body(const osr_sandbox_spec_t *spec, size_t *len);

/** In-process mode only: every resource, as an array of the JSON above (new
 *  reference). */
json_t *osr__sim_dump(osr_provider_t *p);
/** One page of the dump: the resources after the one named `after` (NULL or
 * "" = from the first), at most `limit` (1..10000); `next` gets the cursor of
 * the following page, "" if this is the last. NULL if `after` is not a sim
 * id or `limit` is 0. */
json_t *osr__sim_dump_page(osr_provider_t *p, const char *after, size_t limit, char *next,
                           size_t nextlen);

/** In-process mode only: insert resources from such an array (a state file)
 *  as they are. Returns 0 or OSR_EINVAL (nothing inserted). */
int osr__sim_restore(osr_provider_t *p, const json_t *arr);

/** In-process mode only: cb(data) after every change of the resource table
 *  (insert, state change, removal), synchronously. */
void osr__sim_set_on_change(osr_provider_t *p, void (*cb)(void *data), void *data);

/** "capacity" -> OSR_PERR_CAPACITY etc. (osr_provider_err_name's names);
 *  0 if unknown. */
int osr__sim_err_parse(const char *name);

#endif
