/*
 * base64url without padding (RFC 4648 section 5, as JWS uses it): the
 * alphabet A-Z a-z 0-9 '-' '_', no '=' and no line breaks. Used for binding
 * tokens, which travel in URLs, headers and cookies.
 *
 * Both directions write into caller memory with an explicit capacity and
 * never allocate. The decoder is strict: only the url-safe alphabet, no
 * padding, no whitespace, a length that is not 1 mod 4, and zero bits in the
 * unused low bits of the last character (so every byte string has exactly
 * one accepted encoding).
 */
#ifndef OSR_UTIL_BASE64_H
#define OSR_UTIL_BASE64_H

#include <stddef.h>

#include "osr/common.h"

/** Characters needed to encode `n` bytes (no NUL counted). */
#define OSR_B64URL_ENC_LEN(n) (((n) / 3) * 4 + ((n) % 3 == 0 ? 0 : (n) % 3 + 1))
/** Most bytes `n` characters can decode to (exact for valid input). */
#define OSR_B64URL_DEC_MAX(n) (((n) / 4) * 3 + ((n) % 4 == 0 ? 0 : (n) % 4 - 1))

/**
 * Encode `len` bytes of `in` into `out` (capacity `outlen`, which must leave
 * room for a NUL terminator). Returns the number of characters written (the
 * NUL excluded) or OSR_E2BIG if `out` is too small (then `out` holds an
 * empty string when outlen > 0).
 */
int osr_b64url_encode(const void *in, size_t len, char *out, size_t outlen);

/**
 * Decode `len` characters of `in` into `out` (capacity `outlen`). Returns the
 * number of bytes written, OSR_EINVAL for anything but canonical unpadded
 * base64url, or OSR_E2BIG if `out` is too small. `out` may be written to
 * even on error.
 */
int osr_b64url_decode(const char *in, size_t len, void *out, size_t outlen);

#endif
