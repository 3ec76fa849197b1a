/*
 * Prometheus text exposition (format 0.0.4) helpers shared by the gateway's
 * and the data plane's GET /metrics (gateway/metrics.c, dataplane/dp_metrics.c).
 *
 * Both renderers write many "HELP + TYPE + one sample" blocks; these helpers
 * write them. Each takes the status of the previous step and does nothing
 * when it is not 0, so a renderer chains calls (rv = osr_prom_...(out, rv, ...))
 * and checks once at the end. Names are given in full (with the osr_ prefix).
 * The output buffer's cap bounds the whole page (STYLE 13): an append past
 * it returns the osr_buf error, which then flows through the chain.
 */
#ifndef OSR_UTIL_PROM_H
#define OSR_UTIL_PROM_H

#include <stdint.h>

#include "util/buf.h"

/** "# HELP <name> <help>\n# TYPE <name> <type>\n". */
int osr_prom_family(osr_buf_t *out, int rv, const char *name, const char *type, const char *help);

/** "<name> <v>\n": one sample without labels. */
int osr_prom_u64(osr_buf_t *out, int rv, const char *name, uint64_t v);

/** A family with exactly one unlabelled sample: osr_prom_family + osr_prom_u64. */
int osr_prom_single(osr_buf_t *out, int rv, const char *name, const char *type, const char *help,
                    uint64_t v);

/** A label value, escaped as the format requires (backslash, double quote,
 *  newline); the caller writes the quotes around it. */
int osr_prom_label(osr_buf_t *out, int rv, const char *v);

#endif
