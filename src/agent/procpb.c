/*
 * process.Process protobuf binary codec (see procpb.h).
 */
#include "agent/procpb.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- wire level ------------------------------------------------------------ */

static int get_varint(osr_pb_rd_t *r, uint64_t *out)
{
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (r->p >= r->end)
      return OSR_EPROTO;
    uint8_t c = *r->p++;
    v |= (uint64_t)(c & 0x7f) << shift;
    if ((c & 0x80) == 0) {
      *out = v;
      return 0;
    }
  }
  return OSR_EPROTO; /* more than 10 bytes */
}

int osr_pb_next(osr_pb_rd_t *r, osr_pb_field_t *f)
{
  if (r->p >= r->end)
    return 0;
  uint64_t key;
  if (get_varint(r, &key) != 0)
    return OSR_EPROTO;
  f->num = (uint32_t)(key >> 3);
  f->wt = (int)(key & 7);
  f->v = 0;
  f->bytes = osr_iov(NULL, 0);
  if ((key >> 3) == 0 || (key >> 3) > 0x1fffffffu)
    return OSR_EPROTO;
  switch (f->wt) {
  case OSR_PB_VARINT:
    return get_varint(r, &f->v) == 0 ? 1 : OSR_EPROTO;
  case OSR_PB_I64:
  case OSR_PB_I32: {
    size_t n = f->wt == OSR_PB_I64 ? 8 : 4;
    if ((size_t)(r->end - r->p) < n)
      return OSR_EPROTO;
    for (size_t i = 0; i < n; i++)
      f->v |= (uint64_t)r->p[i] << (8 * i);
    r->p += n;
    return 1;
  }
  case OSR_PB_LEN: {
    uint64_t n;
    if (get_varint(r, &n) != 0 || n > (uint64_t)(r->end - r->p))
      return OSR_EPROTO;
    f->bytes = osr_iov((const char *)r->p, (size_t)n);
    r->p += n;
    return 1;
  }
  default:
    return OSR_EPROTO; /* groups (3, 4) are not in this schema; 6, 7 do not exist */
  }
}

size_t osr_pb_put_varint(uint8_t *out, uint64_t v)
{
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = (uint8_t)(v | 0x80);
    v >>= 7;
  }
  out[n++] = (uint8_t)v;
  return n;
}

static size_t varint_len(uint64_t v)
{
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    n++;
  }
  return n;
}

static int put_key(osr_buf_t *b, uint32_t num, int wt)
{
  uint8_t t[10];
  return osr_buf_append(b, t, osr_pb_put_varint(t, (uint64_t)num << 3 | (uint64_t)wt));
}

static int put_uint(osr_buf_t *b, uint32_t num, uint64_t v)
{
  uint8_t t[10];
  int rv = put_key(b, num, OSR_PB_VARINT);
  return rv != 0 ? rv : osr_buf_append(b, t, osr_pb_put_varint(t, v));
}

static int put_bytes(osr_buf_t *b, uint32_t num, const void *p, size_t n)
{
  uint8_t t[10];
  int rv = put_key(b, num, OSR_PB_LEN);
  if (rv == 0)
    rv = osr_buf_append(b, t, osr_pb_put_varint(t, n));
  if (rv == 0 && n > 0)
    rv = osr_buf_append(b, p, n);
  return rv;
}

static int put_str(osr_buf_t *b, uint32_t num, const char *s)
{
  return put_bytes(b, num, s, strlen(s));
}

/* A nested message: `sub` (already encoded) as field `num` of b. */
static int put_sub(osr_buf_t *b, uint32_t num, const osr_buf_t *sub)
{
  return put_bytes(b, num, sub->len > 0 ? osr_buf_data(sub) : "", sub->len);
}

/* ---- events ------------------------------------------------------------------ */

const uint8_t osr_pb_keepalive[4] = {0x0a, 0x02, 0x22, 0x00};

static int decode_start(osr_iovec_t m, osr_pe_t *ev)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    if (f.num == 1 || f.num == OSR_PB_FIELD_OUTPUT_OFFSET) {
      if (f.wt != OSR_PB_VARINT)
        return OSR_EPROTO;
      if (f.num == 1) {
        ev->pid = (uint32_t)f.v;
      } else {
        ev->has_offset = 1;
        ev->output_offset = f.v;
      }
    }
  }
  return rv;
}

static int decode_data(osr_iovec_t m, osr_pe_t *ev)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    if (f.num >= 1 && f.num <= 3) {
      if (f.wt != OSR_PB_LEN)
        return OSR_EPROTO;
      ev->stream = (int)f.num; /* a oneof: the last one wins */
      ev->data = f.bytes;
    }
  }
  return rv;
}

static int decode_end(osr_iovec_t m, osr_pe_t *ev)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    if (f.num == 1 || f.num == 2) {
      if (f.wt != OSR_PB_VARINT)
        return OSR_EPROTO;
      if (f.num == 1) /* sint32: zigzag, truncated to 32 bits as protobuf does */
        ev->exit_code = (int32_t)((uint32_t)(f.v >> 1) ^ (uint32_t)-(int64_t)(f.v & 1));
      else
        ev->exited = f.v != 0;
    } else if (f.num == 3 || f.num == 4) {
      if (f.wt != OSR_PB_LEN)
        return OSR_EPROTO;
      if (f.num == 3) {
        ev->status = f.bytes;
      } else {
        ev->has_error = 1;
        ev->error = f.bytes;
      }
    }
  }
  return rv;
}

/* ProcessEvent: a oneof of four messages. Repeated occurrences of the same
 * member merge (proto semantics); a different member replaces. */
static int decode_event(osr_iovec_t m, osr_pe_t *ev)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    if (f.num < 1 || f.num > 4)
      continue;
    if (f.wt != OSR_PB_LEN)
      return OSR_EPROTO;
    int kind = f.num == 1 ? OSR_PE_START : f.num == 2 ? OSR_PE_DATA : f.num == 3 ? OSR_PE_END
                                                                                  : OSR_PE_KEEPALIVE;
    if (ev->kind != kind) {
      memset(ev, 0, sizeof(*ev));
      ev->kind = kind;
    }
    int r2 = 0;
    if (kind == OSR_PE_START)
      r2 = decode_start(f.bytes, ev);
    else if (kind == OSR_PE_DATA)
      r2 = decode_data(f.bytes, ev);
    else if (kind == OSR_PE_END)
      r2 = decode_end(f.bytes, ev);
    if (r2 != 0)
      return r2;
  }
  return rv;
}

int osr_pe_decode(const void *msg, size_t len, osr_pe_t *ev)
{
  memset(ev, 0, sizeof(*ev));
  osr_pb_rd_t r = {msg, (const uint8_t *)msg + len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    if (f.num != 1)
      continue;
    if (f.wt != OSR_PB_LEN)
      return OSR_EPROTO;
    int r2 = decode_event(f.bytes, ev);
    if (r2 != 0)
      return r2;
  }
  return rv;
}

size_t osr_pb_data_header(uint8_t out[OSR_PB_DATA_HDR_MAX], int stream, size_t n)
{
  /* Response{event(1): ProcessEvent{data(2): DataEvent{<stream>: bytes}}}:
   * the three lengths are known up front, so the header is written in one
   * pass and the output follows it unchanged. */
  size_t data_len = 1 + varint_len(n) + n;
  size_t ev_len = 1 + varint_len(data_len) + data_len;
  size_t o = 0;
  out[o++] = 0x0a; /* field 1, LEN */
  o += osr_pb_put_varint(out + o, ev_len);
  out[o++] = 0x12; /* field 2, LEN */
  o += osr_pb_put_varint(out + o, data_len);
  out[o++] = (uint8_t)((unsigned)stream << 3 | OSR_PB_LEN);
  o += osr_pb_put_varint(out + o, n);
  return o;
}

/* Wrap `inner` as ProcessEvent member `member`, then as Response.event. */
static int put_event(osr_buf_t *b, uint32_t member, const osr_buf_t *inner)
{
  osr_buf_t ev;
  osr_buf_init(&ev, inner->len + 16);
  int rv = put_sub(&ev, member, inner);
  if (rv == 0)
    rv = put_sub(b, 1, &ev);
  osr_buf_dispose(&ev);
  return rv;
}

int osr_pb_put_start(osr_buf_t *b, uint32_t pid, int has_offset, uint64_t offset)
{
  osr_buf_t s;
  osr_buf_init(&s, 32);
  int rv = pid != 0 ? put_uint(&s, 1, pid) : 0;
  if (rv == 0 && has_offset)
    rv = put_uint(&s, OSR_PB_FIELD_OUTPUT_OFFSET, offset);
  if (rv == 0)
    rv = put_event(b, 1, &s);
  osr_buf_dispose(&s);
  return rv;
}

int osr_pb_put_end(osr_buf_t *b, int32_t exit_code, int exited, const char *status,
                   const char *error)
{
  osr_buf_t s;
  osr_buf_init(&s, 1024);
  int rv = 0;
  if (exit_code != 0) /* proto3: defaults are not written */
    rv = put_uint(&s, 1, (uint64_t)(((uint32_t)exit_code << 1) ^ (uint32_t)(exit_code >> 31)));
  if (rv == 0 && exited)
    rv = put_uint(&s, 2, 1);
  if (rv == 0 && status != NULL && status[0] != '\0')
    rv = put_str(&s, 3, status);
  if (rv == 0 && error != NULL)
    rv = put_str(&s, 4, error);
  if (rv == 0)
    rv = put_event(b, 3, &s);
  osr_buf_dispose(&s);
  return rv;
}

/* ---- requests ------------------------------------------------------------------ */

/* A string field as a JSON string, or NULL if it is not UTF-8 (jansson
 * validates) or not a LEN field. */
static json_t *str_of(const osr_pb_field_t *f)
{
  if (f->wt != OSR_PB_LEN)
    return NULL;
  return json_stringn(f->bytes.len > 0 ? f->bytes.base : "", f->bytes.len);
}

/* Fetch (or create) the object member `key` of o, for merging repeated
 * occurrences of a message field. */
static json_t *obj_member(json_t *o, const char *key)
{
  json_t *x = json_object_get(o, key);
  if (json_is_object(x))
    return x;
  x = json_object();
  json_object_set_new(o, key, x);
  return x;
}

static int set_str(json_t *o, const char *key, const osr_pb_field_t *f)
{
  json_t *s = str_of(f);
  if (s == NULL)
    return -1;
  json_object_set_new(o, key, s);
  return 0;
}

static int set_uint(json_t *o, const char *key, const osr_pb_field_t *f)
{
  if (f->wt != OSR_PB_VARINT)
    return -1;
  json_object_set_new(o, key, json_integer((json_int_t)(uint32_t)f->v));
  return 0;
}

static int dec_env_entry(json_t *envs, osr_iovec_t m)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  json_t *k = NULL, *v = NULL;
  int rv, bad = 0;
  while (!bad && (rv = osr_pb_next(&r, &f)) == 1) {
    if (f.num == 1 || f.num == 2) {
      json_t *s = str_of(&f);
      if (s == NULL)
        bad = 1;
      json_t **slot = f.num == 1 ? &k : &v;
      json_decref(*slot);
      *slot = s;
    }
  }
  if (!bad && rv == 0 && json_object_size(envs) < OSR_PB_MAX_ITEMS) {
    /* A missing key or value is the empty string (proto3 map entries). */
    const char *key = k != NULL ? json_string_value(k) : "";
    json_object_set_new(envs, key, v != NULL ? json_incref(v) : json_string(""));
  } else {
    bad = 1;
  }
  json_decref(k);
  json_decref(v);
  return bad ? -1 : 0;
}

static int dec_config(json_t *o, osr_iovec_t m)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    int bad = 0;
    if (f.num == 1) {
      bad = set_str(o, "cmd", &f);
    } else if (f.num == 2) {
      json_t *args = json_object_get(o, "args");
      if (args == NULL) {
        args = json_array();
        json_object_set_new(o, "args", args);
      }
      json_t *s = str_of(&f);
      if (s == NULL || json_array_size(args) >= OSR_PB_MAX_ITEMS) {
        json_decref(s);
        bad = 1;
      } else {
        json_array_append_new(args, s);
      }
    } else if (f.num == 3) {
      bad = f.wt != OSR_PB_LEN || dec_env_entry(obj_member(o, "envs"), f.bytes) != 0;
    } else if (f.num == 4) {
      bad = set_str(o, "cwd", &f);
    }
    if (bad)
      return -1;
  }
  return rv == 0 ? 0 : -1;
}

static int dec_selector(json_t *o, osr_iovec_t m)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    int bad = 0;
    /* A oneof: setting one member clears the other. */
    if (f.num == 1) {
      json_object_del(o, "tag");
      bad = set_uint(o, "pid", &f);
    } else if (f.num == 2) {
      json_object_del(o, "pid");
      bad = set_str(o, "tag", &f);
    }
    if (bad)
      return -1;
  }
  return rv == 0 ? 0 : -1;
}

static int dec_pty(json_t *o, osr_iovec_t m)
{
  osr_pb_rd_t r = {(const uint8_t *)m.base, (const uint8_t *)m.base + m.len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    if (f.num != 1)
      continue;
    if (f.wt != OSR_PB_LEN)
      return -1;
    json_t *size = obj_member(o, "size");
    osr_pb_rd_t r2 = {(const uint8_t *)f.bytes.base, (const uint8_t *)f.bytes.base + f.bytes.len};
    osr_pb_field_t g;
    int rv2;
    while ((rv2 = osr_pb_next(&r2, &g)) == 1)
      if ((g.num == 1 || g.num == 2) && set_uint(size, g.num == 1 ? "cols" : "rows", &g) != 0)
        return -1;
    if (rv2 != 0)
      return -1;
  }
  return rv == 0 ? 0 : -1;
}

json_t *osr_pb_request_to_json(const void *msg, size_t len, int is_connect)
{
  json_t *o = json_object();
  osr_pb_rd_t r = {msg, (const uint8_t *)msg + len};
  osr_pb_field_t f;
  int rv;
  while ((rv = osr_pb_next(&r, &f)) == 1) {
    int bad = 0;
    if (f.num == 1) {
      bad = f.wt != OSR_PB_LEN ||
            (is_connect ? dec_selector(obj_member(o, "process"), f.bytes)
                        : dec_config(obj_member(o, "process"), f.bytes)) != 0;
    } else if (is_connect && f.num == OSR_PB_FIELD_OUTPUT_OFFSET) {
      char num[24];
      bad = f.wt != OSR_PB_VARINT;
      snprintf(num, sizeof(num), "%llu", (unsigned long long)f.v);
      if (!bad)
        json_object_set_new(o, "outputOffset", json_string(num));
    } else if (!is_connect && f.num == 2) {
      bad = f.wt != OSR_PB_LEN || dec_pty(obj_member(o, "pty"), f.bytes) != 0;
    } else if (!is_connect && f.num == 3) {
      bad = set_str(o, "tag", &f);
    } else if (!is_connect && f.num == 4) {
      bad = f.wt != OSR_PB_VARINT;
      if (!bad)
        json_object_set_new(o, "stdin", json_boolean(f.v != 0));
    }
    if (bad) {
      rv = -1;
      break;
    }
  }
  if (rv != 0) {
    json_decref(o);
    return NULL;
  }
  return o;
}

/* ---- request encoding ---------------------------------------------------------- */

static int enc_str(osr_buf_t *b, uint32_t num, json_t *v)
{
  if (v == NULL)
    return 0;
  if (!json_is_string(v))
    return OSR_EINVAL;
  return put_bytes(b, num, json_string_value(v), json_string_length(v));
}

static int enc_u32(osr_buf_t *b, uint32_t num, json_t *v)
{
  if (v == NULL)
    return 0;
  if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > UINT32_MAX)
    return OSR_EINVAL;
  return json_integer_value(v) != 0 ? put_uint(b, num, (uint64_t)json_integer_value(v)) : 0;
}

static int enc_config(osr_buf_t *b, json_t *p)
{
  int rv = enc_str(b, 1, json_object_get(p, "cmd"));
  json_t *args = json_object_get(p, "args"), *x;
  size_t i;
  if (rv == 0 && args != NULL && !json_is_array(args))
    rv = OSR_EINVAL;
  json_array_foreach(args, i, x)
  {
    if (rv == 0)
      rv = json_is_string(x) ? enc_str(b, 2, x) : OSR_EINVAL;
  }
  json_t *envs = json_object_get(p, "envs");
  if (rv == 0 && envs != NULL && !json_is_object(envs))
    rv = OSR_EINVAL;
  const char *k;
  json_object_foreach(envs, k, x)
  {
    if (rv != 0)
      break;
    if (!json_is_string(x)) {
      rv = OSR_EINVAL;
      break;
    }
    osr_buf_t e;
    osr_buf_init(&e, strlen(k) + json_string_length(x) + 32);
    rv = put_str(&e, 1, k);
    if (rv == 0)
      rv = enc_str(&e, 2, x);
    if (rv == 0)
      rv = put_sub(b, 3, &e);
    osr_buf_dispose(&e);
  }
  if (rv == 0)
    rv = enc_str(b, 4, json_object_get(p, "cwd"));
  return rv;
}

int osr_pb_request_from_json(osr_buf_t *b, json_t *j, int is_connect)
{
  if (!json_is_object(j))
    return OSR_EINVAL;
  json_t *p = json_object_get(j, "process");
  int rv = 0;
  if (p != NULL) {
    if (!json_is_object(p))
      return OSR_EINVAL;
    osr_buf_t s;
    osr_buf_init(&s, b->max);
    if (is_connect) {
      rv = enc_u32(&s, 1, json_object_get(p, "pid"));
      if (rv == 0)
        rv = enc_str(&s, 2, json_object_get(p, "tag"));
    } else {
      rv = enc_config(&s, p);
    }
    if (rv == 0)
      rv = put_sub(b, 1, &s);
    osr_buf_dispose(&s);
  }
  if (rv != 0)
    return rv;
  if (is_connect) {
    json_t *off = json_object_get(j, "outputOffset");
    if (off == NULL)
      return 0;
    uint64_t v = 0;
    if (json_is_integer(off) && json_integer_value(off) >= 0) {
      v = (uint64_t)json_integer_value(off);
    } else if (json_is_string(off)) {
      char *end = NULL;
      const char *s = json_string_value(off);
      v = strtoull(s, &end, 10);
      if (*s < '0' || *s > '9' || *end != '\0')
        return OSR_EINVAL;
    } else {
      return OSR_EINVAL;
    }
    return put_uint(b, OSR_PB_FIELD_OUTPUT_OFFSET, v);
  }
  json_t *pty = json_object_get(j, "pty");
  if (pty != NULL) {
    json_t *size = json_object_get(pty, "size");
    if (!json_is_object(pty) || (size != NULL && !json_is_object(size)))
      return OSR_EINVAL;
    osr_buf_t sz, pt;
    osr_buf_init(&sz, 64);
    osr_buf_init(&pt, 64);
    rv = enc_u32(&sz, 1, json_object_get(size, "cols"));
    if (rv == 0)
      rv = enc_u32(&sz, 2, json_object_get(size, "rows"));
    if (rv == 0 && size != NULL)
      rv = put_sub(&pt, 1, &sz);
    if (rv == 0)
      rv = put_sub(b, 2, &pt);
    osr_buf_dispose(&sz);
    osr_buf_dispose(&pt);
    if (rv != 0)
      return rv;
  }
  rv = enc_str(b, 3, json_object_get(j, "tag"));
  json_t *in = json_object_get(j, "stdin");
  if (rv == 0 && in != NULL) {
    if (!json_is_boolean(in))
      return OSR_EINVAL;
    rv = put_uint(b, 4, json_is_true(in)); /* optional: written even when false */
  }
  return rv;
}
