/*
 * llhttp's generated parser has SSE4.2 paths (16 bytes per step through
 * header names and values) that are compiled in only with -msse4.2. This
 * subproject builds llhttp.c twice, generic and with -msse4.2, and sends
 * every llhttp_execute() to the SSE4.2 copy when the CPU has it (chosen
 * once, at load). Both copies are the same generated state machine and
 * accept exactly the same bytes; fuzz/fuzz_http1.c runs every input
 * through both and compares.
 */
#ifndef OSR_LLHTTP_DISPATCH_H
#define OSR_LLHTTP_DISPATCH_H

/** Whether llhttp_execute runs the SSE4.2 copy (1) or the generic one (0). */
int osr_llhttp_simd(void);

/**
 * Tests and fuzzing: run the SSE4.2 copy (on = 1) or the generic one (0)
 * from now on, on every thread. Returns the previous choice, or -1 (nothing
 * changed) for on = 1 on a CPU without SSE4.2. Not for use while another
 * thread parses.
 */
int osr_llhttp_simd_select(int on);

#endif
