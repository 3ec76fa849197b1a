/*
 * Streaming multipart/form-data parser (see multipart.h).
 *
 * The delimiter is "\r\n--" + boundary. Its only CR is its first byte and
 * a boundary may not contain CR or LF (RFC 2046 bchars), so after a
 * mismatch the match can only restart at a CR: the naive restart below is
 * exact, no KMP table needed. Bytes of a partial match that then failed are
 * known to be the delimiter's own prefix, so they are emitted from the
 * parser's copy and never need buffering.
 */
#include "agent/multipart.h"

#include <string.h>
#include <strings.h>

enum {
  S_PRE,   /* before the first delimiter (preamble) */
  S_AFTER, /* delimiter matched: "--" or padding + CRLF follows */
  S_AFTER_DASH,
  S_AFTER_LWS,
  S_AFTER_CR,
  S_HEADERS,
  S_BODY,
  S_DONE,
};

static int is_bchar(unsigned char c)
{
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
    return 1;
  return c != 0 && strchr("'()+_,-./:=? ", c) != NULL;
}

int osr_mp_init(osr_mp_t *mp, const char *ct, size_t ct_len, const osr_mp_events_t *ev, void *data)
{
  memset(mp, 0, sizeof(*mp));
  mp->_ev = ev;
  mp->data = data;
  static const char mt[] = "multipart/form-data";
  if (ct_len < sizeof(mt) - 1 || strncasecmp(ct, mt, sizeof(mt) - 1) != 0)
    return OSR_EINVAL;
  /* Find the boundary parameter (case-insensitive name, optional quotes). */
  size_t i = sizeof(mt) - 1;
  while (i < ct_len) {
    while (i < ct_len && (ct[i] == ';' || ct[i] == ' ' || ct[i] == '\t'))
      i++;
    size_t ns = i;
    while (i < ct_len && ct[i] != '=' && ct[i] != ';')
      i++;
    size_t nlen = i - ns;
    if (i >= ct_len || ct[i] != '=')
      continue;
    i++;
    char val[OSR_MP_MAX_BOUNDARY + 1];
    size_t vlen = 0;
    if (i < ct_len && ct[i] == '"') {
      i++;
      while (i < ct_len && ct[i] != '"') {
        if (vlen >= OSR_MP_MAX_BOUNDARY)
          return OSR_EINVAL;
        val[vlen++] = ct[i++];
      }
      if (i >= ct_len)
        return OSR_EINVAL;
      i++;
    } else {
      while (i < ct_len && ct[i] != ';' && ct[i] != ' ' && ct[i] != '\t') {
        if (vlen >= OSR_MP_MAX_BOUNDARY)
          return OSR_EINVAL;
        val[vlen++] = ct[i++];
      }
    }
    if (nlen == 8 && strncasecmp(ct + ns, "boundary", 8) == 0) {
      if (vlen == 0)
        return OSR_EINVAL;
      for (size_t k = 0; k < vlen; k++)
        if (!is_bchar((unsigned char)val[k]))
          return OSR_EINVAL;
      memcpy(mp->_delim, "\r\n--", 4);
      memcpy(mp->_delim + 4, val, vlen);
      mp->_dlen = 4 + vlen;
      mp->_delim[mp->_dlen] = '\0';
      mp->_state = S_PRE;
      mp->_match = 2; /* the body start counts as the delimiter's CRLF */
      return 0;
    }
  }
  return OSR_EINVAL;
}

/* Extract parameter `pname` of a Content-Disposition value into out
 * (quoted-string unescaped). */
static void disp_param(const char *v, size_t vlen, const char *pname, char *out, size_t outsz)
{
  size_t plen = strlen(pname);
  out[0] = '\0';
  size_t i = 0;
  while (i < vlen) {
    while (i < vlen && v[i] != ';')
      i++;
    if (i >= vlen)
      return;
    i++;
    while (i < vlen && (v[i] == ' ' || v[i] == '\t'))
      i++;
    if (i + plen + 1 > vlen || strncasecmp(v + i, pname, plen) != 0 || v[i + plen] != '=')
      continue;
    i += plen + 1;
    size_t o = 0;
    if (i < vlen && v[i] == '"') {
      i++;
      while (i < vlen && v[i] != '"') {
        if (v[i] == '\\' && i + 1 < vlen)
          i++;
        if (o + 1 < outsz)
          out[o++] = v[i];
        i++;
      }
    } else {
      while (i < vlen && v[i] != ';' && v[i] != ' ' && v[i] != '\t') {
        if (o + 1 < outsz)
          out[o++] = v[i];
        i++;
      }
    }
    out[o] = '\0';
    return;
  }
}

static int parse_headers(osr_mp_t *mp)
{
  mp->_name[0] = '\0';
  mp->_filename[0] = '\0';
  const char *h = mp->_hdr, *end = mp->_hdr + mp->_hlen;
  while (h < end) {
    const char *eol = memchr(h, '\r', (size_t)(end - h));
    if (eol == NULL)
      eol = end;
    const char *colon = memchr(h, ':', (size_t)(eol - h));
    if (colon != NULL && (size_t)(colon - h) == 19 &&
        strncasecmp(h, "content-disposition", 19) == 0) {
      const char *v = colon + 1;
      while (v < eol && (*v == ' ' || *v == '\t'))
        v++;
      disp_param(v, (size_t)(eol - v), "name", mp->_name, sizeof(mp->_name));
      disp_param(v, (size_t)(eol - v), "filename", mp->_filename, sizeof(mp->_filename));
    }
    h = eol + 2;
  }
  mp->_in_part = 1;
  return mp->_ev->on_part != NULL ? mp->_ev->on_part(mp, mp->_name, mp->_filename) : 0;
}

long osr_mp_feed(osr_mp_t *mp, const char *data, size_t len)
{
  size_t i = 0;
  while (i < len) {
    unsigned char c = (unsigned char)data[i];
    switch (mp->_state) {
    case S_PRE:
      if (c == (unsigned char)mp->_delim[mp->_match]) {
        mp->_match++;
        i++;
        if (mp->_match == mp->_dlen) {
          mp->_match = 0;
          mp->_state = S_AFTER;
        }
      } else if (mp->_match != 0) {
        mp->_match = 0; /* re-examine c from the start */
      } else {
        i++;
      }
      break;

    case S_AFTER:
      i++;
      if (c == '-')
        mp->_state = S_AFTER_DASH;
      else if (c == '\r')
        mp->_state = S_AFTER_CR;
      else if (c == ' ' || c == '\t')
        mp->_state = S_AFTER_LWS;
      else
        return OSR_EHTTP;
      break;
    case S_AFTER_DASH:
      i++;
      if (c != '-')
        return OSR_EHTTP;
      mp->_state = S_DONE;
      mp->done = 1;
      break;
    case S_AFTER_LWS:
      i++;
      if (c == '\r')
        mp->_state = S_AFTER_CR;
      else if (c != ' ' && c != '\t')
        return OSR_EHTTP;
      break;
    case S_AFTER_CR:
      i++;
      if (c != '\n')
        return OSR_EHTTP;
      mp->_state = S_HEADERS;
      mp->_hlen = 0;
      break;

    case S_HEADERS: {
      if (mp->_hlen >= OSR_MP_MAX_HEADER)
        return OSR_ETOOLARGE;
      mp->_hdr[mp->_hlen++] = (char)c;
      i++;
      int end = (mp->_hlen == 2 && memcmp(mp->_hdr, "\r\n", 2) == 0) ||
                (mp->_hlen >= 4 && memcmp(mp->_hdr + mp->_hlen - 4, "\r\n\r\n", 4) == 0);
      if (!end)
        break;
      mp->_hdr[mp->_hlen] = '\0';
      mp->_state = S_BODY;
      mp->_match = 0;
      if (parse_headers(mp))
        return (long)i;
      break;
    }

    case S_BODY: {
      if (mp->_match == 0) {
        /* Fast path: everything up to the next CR is part data. */
        size_t span = len - i;
        if (span > OSR_MP_MAX_SPAN)
          span = OSR_MP_MAX_SPAN;
        const char *cr = memchr(data + i, '\r', span);
        size_t n = cr != NULL ? (size_t)(cr - (data + i)) : span;
        if (n > 0) {
          i += n;
          if (mp->_ev->on_data != NULL && mp->_ev->on_data(mp, data + i - n, n))
            return (long)i;
          break;
        }
        /* data[i] is a CR: a delimiter may start here. */
        mp->_match = 1;
        i++;
        break;
      }
      if (c == (unsigned char)mp->_delim[mp->_match]) {
        mp->_match++;
        i++;
        if (mp->_match == mp->_dlen) {
          mp->_match = 0;
          mp->_state = S_AFTER;
          mp->_in_part = 0;
          if (mp->_ev->on_part_end != NULL && mp->_ev->on_part_end(mp))
            return (long)i;
        }
        break;
      }
      /* Mismatch: the matched prefix was data after all. c is examined
       * again with an empty match. */
      size_t m = mp->_match;
      mp->_match = 0;
      if (mp->_ev->on_data != NULL && mp->_ev->on_data(mp, mp->_delim, m))
        return (long)i;
      break;
    }

    case S_DONE:
    default:
      return (long)len; /* epilogue: ignored */
    }
  }
  return (long)i;
}
