/* Unit tests for address parsing (net/addr.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <string.h>

#include "net/addr.h"

static void test_valid(void **state)
{
  (void)state;
  osr_addr_t a;
  struct sockaddr_storage ss;
  assert_int_equal(osr_addr_parse("127.0.0.1:8080", &a), 0);
  assert_string_equal(a.host, "127.0.0.1");
  assert_int_equal(a.port, 8080);
  assert_int_equal(osr_addr_to_sockaddr(&a, &ss), 0);
  assert_int_equal(ss.ss_family, AF_INET);

  assert_int_equal(osr_addr_parse("[::1]:443", &a), 0);
  assert_string_equal(a.host, "::1");
  assert_int_equal(a.port, 443);
  assert_int_equal(osr_addr_to_sockaddr(&a, &ss), 0);
  assert_int_equal(ss.ss_family, AF_INET6);

  assert_int_equal(osr_addr_parse("example.com:0", &a), 0);
  assert_string_equal(a.host, "example.com");
  assert_int_equal(osr_addr_to_sockaddr(&a, &ss), OSR_EINVAL); /* needs DNS */

  assert_int_equal(osr_addr_parse("unix:/run/osr.sock", &a), 0);
  assert_true(a.is_unix);
  assert_string_equal(a.path, "/run/osr.sock");
}

static void test_invalid(void **state)
{
  (void)state;
  osr_addr_t a;
  const char *bad[] = {"", ":80", "127.0.0.1", "127.0.0.1:", "127.0.0.1:65536", "1.2.3.4:8a",
                       "::1:80", "[::1]80", "[::1", "unix:", "host:-1", "[]:80"};
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
    assert_int_equal(osr_addr_parse(bad[i], &a), OSR_EINVAL);

  char longhost[400];
  memset(longhost, 'a', 300);
  strcpy(longhost + 300, ":80");
  assert_int_equal(osr_addr_parse(longhost, &a), OSR_EINVAL);
  char longpath[200] = "unix:";
  memset(longpath + 5, 'p', 150);
  longpath[155] = '\0';
  assert_int_equal(osr_addr_parse(longpath, &a), OSR_EINVAL);
}

int main(void)
{
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_valid),
      cmocka_unit_test(test_invalid),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
