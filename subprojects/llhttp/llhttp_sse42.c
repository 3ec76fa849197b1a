/* The second copy of llhttp.c, built with -msse4.2 (its header-name and
 * header-value states then scan 16 bytes per step) under renamed external
 * names; osr_llhttp_dispatch.c picks it on CPUs that have SSE4.2. */
#include "llhttp_sse42_names.h"
#include "llhttp.c"
