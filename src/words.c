/* words.c: lookups in the '|' word lists of words.h. */
#include "words.h"

#include <stdio.h>
#include <string.h>

const char *words_name(char *out, unsigned long outlen, const char *words, int i) {
  const char *p = words;
  for (int k = 0; k < i && p; k++) {
    p = strchr(p, '|');
    if (p) p++;
  }
  const char *e = p ? strchr(p, '|') : NULL;
  if (!p || i < 0)
    snprintf(out, outlen, "%s", "");
  else
    snprintf(out, outlen, "%.*s", e ? (int)(e - p) : (int)strlen(p), p);
  return out;
}

int words_find(const char *words, const char *word) {
  const size_t n = strlen(word);
  int i = 0;
  for (const char *p = words; p; i++) {
    const char *e = strchr(p, '|');
    const size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == n && strncmp(p, word, n) == 0) return i;
    p = e ? e + 1 : NULL;
  }
  return -1;
}
