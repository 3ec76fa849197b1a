/*
 * Corpus replay driver: without libFuzzer, each fuzz target links this main
 * and runs every file of its corpus directory (and any file given) through
 * LLVMFuzzerTestOneInput once, so the corpora run as normal tests under
 * ASan/UBSan in every build.
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

static int run_file(const char *path)
{
  FILE *f = fopen(path, "rb");
  if (f == NULL) {
    perror(path);
    return -1;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  if (n < 0 || n > 64 * 1024 * 1024) {
    fclose(f);
    return -1;
  }
  uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
  if (buf == NULL || fread(buf, 1, (size_t)n, f) != (size_t)n) {
    fclose(f);
    free(buf);
    return -1;
  }
  fclose(f);
  LLVMFuzzerTestOneInput(buf, (size_t)n);
  free(buf);
  return 0;
}

static int run_path(const char *path, unsigned *count)
{
  struct stat st;
  if (stat(path, &st) != 0) {
    perror(path);
    return -1;
  }
  if (!S_ISDIR(st.st_mode)) {
    (*count)++;
    return run_file(path);
  }
  DIR *d = opendir(path);
  if (d == NULL)
    return -1;
  struct dirent *e;
  int rv = 0;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.')
      continue;
    char sub[4096];
    snprintf(sub, sizeof(sub), "%s/%s", path, e->d_name);
    if (run_path(sub, count) != 0)
      rv = -1;
  }
  closedir(d);
  return rv;
}

int main(int argc, char **argv)
{
  unsigned count = 0;
  int rv = 0;
  if (LLVMFuzzerInitialize != NULL)
    LLVMFuzzerInitialize(&argc, &argv);
  for (int i = 1; i < argc; i++)
    if (run_path(argv[i], &count) != 0)
      rv = 1;
  /* An empty input still exercises the target once. */
  LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
  printf("replayed %u input(s)\n", count);
  if (count == 0) {
    fprintf(stderr, "no corpus inputs found\n");
    return 1;
  }
  return rv;
}
