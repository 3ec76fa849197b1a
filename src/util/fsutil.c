#include "util/fsutil.h"

#include <errno.h>
#include <stdio.h>
#include <sys/stat.h>

#include "osr/common.h"

int osr_mkdir_p(const char *dir, mode_t mode)
{
  char path[4096];
  struct stat st;

  if (snprintf(path, sizeof(path), "%s", dir) >= (int)sizeof(path))
    return OSR_E2BIG;
  for (char *p = path + 1; *p != '\0'; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(path, mode) != 0 && errno != EEXIST)
      return -errno;
    *p = '/';
  }
  if (mkdir(path, mode) != 0 && errno != EEXIST)
    return -errno;
  if (stat(path, &st) != 0)
    return -errno;
  return S_ISDIR(st.st_mode) ? 0 : OSR_EINVAL;
}
