/* data_pack.c: documents into windows (data_pack.h). Best fit decreasing: after a seeded
 * shuffle (so that documents of equal length are not always together), a stable counting
 * sort puts the longest documents first; each goes into the open window with the least room
 * that still holds it, found through a segment tree over the room left (0 .. T1) whose
 * leaves count the windows with that room; a document that fits nowhere opens a window.
 * O(documents x log T1) time, a few words per document. */
#include "data_pack.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Length of document i as packed (cut to T1). */
static size_t doc_len(const struct data_source *src, size_t i, int T1) {
  const uint64_t l = src->doc[i + 1] - src->doc[i];
  return l > (uint64_t)T1 ? (size_t)T1 : (size_t)l;
}

/* The windows with each amount of room left: a counting segment tree over 0 .. n-1 and a
 * stack of windows per amount. */
struct rooms {
  size_t n, size; /* amounts 0 .. n-1; leaves from `size` */
  size_t *cnt;    /* 2 * size: windows under each node */
  int64_t *head;  /* n: a window with this room, or -1 */
  int64_t *next;  /* per window: the next one with the same room */
};

static void rooms_push(struct rooms *r, size_t room, int64_t win) {
  r->next[win] = r->head[room];
  r->head[room] = win;
  for (size_t k = r->size + room; k >= 1; k /= 2)
    r->cnt[k]++;
}

static int64_t rooms_pop(struct rooms *r, size_t room) {
  const int64_t win = r->head[room];
  r->head[room] = r->next[win];
  for (size_t k = r->size + room; k >= 1; k /= 2)
    r->cnt[k]--;
  return win;
}

/* The least room >= need that a window has under node k (amounts lo .. hi), or -1. */
static int64_t rooms_fit_at(const struct rooms *r, size_t k, size_t lo, size_t hi, size_t need) {
  if (r->cnt[k] == 0 || hi < need) return -1;
  if (lo == hi) return (int64_t)lo;
  const size_t mid = lo + (hi - lo) / 2;
  const int64_t left = rooms_fit_at(r, 2 * k, lo, mid, need);
  return left >= 0 ? left : rooms_fit_at(r, 2 * k + 1, mid + 1, hi, need);
}

/* The least room >= need that some window has, or -1. */
static int64_t rooms_fit(const struct rooms *r, size_t need) {
  return rooms_fit_at(r, 1, 0, r->size - 1, need);
}

int data_pack_build(struct data_pack *p, const struct data_source *src, int T1, int pack,
                    uint64_t seed, char *err, size_t errlen) {
  memset(p, 0, sizeof *p);
  p->T1 = T1;
  p->packed = pack;
  if (!src->doc || src->ndocs == 0) {
    kd_seterr(err, errlen,
              "%s: has no document index (a %s file), so data%%samples = 'documents' cannot "
              "make samples of whole documents; expected a Megatron .idx, an 'h5' file with "
              "/doc_offsets or a 'rollouts' file, or data%%samples = 'stream'",
              src->path, kd_data_format_names[src->format]);
    return KD_EXIT_INPUT;
  }
  if (src->ndocs > UINT32_MAX) {
    kd_seterr(err, errlen, "%s: %zu documents exceed the supported 2^32 - 1", src->path,
              src->ndocs);
    return KD_EXIT_INPUT;
  }
  uint32_t *order = kd_malloc(src->ndocs * sizeof *order);
  size_t n = 0;
  for (size_t i = 0; i < src->ndocs; i++) {
    const uint64_t l = src->doc[i + 1] - src->doc[i];
    if (l == 0) continue;
    order[n++] = (uint32_t)i;
    p->tok_docs += doc_len(src, i, T1);
    if (l > (uint64_t)T1) p->ntrunc++, p->tok_cut += l - (uint64_t)T1;
  }
  p->ndocs = n;
  p->off = kd_malloc((n + 1) * sizeof *p->off);
  p->ids = kd_malloc((n ? n : 1) * sizeof *p->ids);
  if (!pack) { /* one document per window, in file order */
    for (size_t i = 0; i <= n; i++)
      p->off[i] = i;
    memcpy(p->ids, order, n * sizeof *order);
    p->nwin = n;
    free(order);
    return KD_EXIT_OK;
  }
  /* seeded shuffle, then a stable counting sort by length, longest first */
  uint64_t st = seed * 0xA24BAED4963EE407ull ^ 0x9FB21C651E98DF25ull;
  for (int i = 0; i < 4; i++)
    st = kd_splitmix64(&st);
  for (size_t i = n; i > 1; i--) {
    size_t j = (size_t)(kd_uniform(&st) * (double)i);
    if (j >= i) j = i - 1;
    const uint32_t t = order[i - 1];
    order[i - 1] = order[j];
    order[j] = t;
  }
  size_t *start = kd_calloc((size_t)T1 + 2, sizeof *start);
  for (size_t i = 0; i < n; i++)
    start[(size_t)T1 - doc_len(src, order[i], T1)]++;
  for (size_t l = 0, acc = 0; l <= (size_t)T1 + 1; l++) {
    const size_t c = start[l];
    start[l] = acc;
    acc += c;
  }
  uint32_t *sorted = kd_malloc((n ? n : 1) * sizeof *sorted);
  for (size_t i = 0; i < n; i++)
    sorted[start[(size_t)T1 - doc_len(src, order[i], T1)]++] = order[i];
  free(start);
  /* best fit */
  struct rooms r = {(size_t)T1 + 1, 1, NULL, NULL, NULL};
  while (r.size < r.n)
    r.size *= 2;
  r.cnt = kd_calloc(2 * r.size, sizeof *r.cnt);
  r.head = kd_malloc(r.n * sizeof *r.head);
  for (size_t i = 0; i < r.n; i++)
    r.head[i] = -1;
  r.next = kd_malloc((n ? n : 1) * sizeof *r.next);
  int64_t *first = kd_malloc((n ? n : 1) * sizeof *first);
  int64_t *last = kd_malloc((n ? n : 1) * sizeof *last);
  int64_t *after = kd_malloc((n ? n : 1) * sizeof *after); /* next document of its window */
  size_t *room = kd_malloc((n ? n : 1) * sizeof *room);
  size_t nwin = 0;
  for (size_t i = 0; i < n; i++) {
    const size_t l = doc_len(src, sorted[i], T1);
    const int64_t fit = rooms_fit(&r, l);
    int64_t w;
    if (fit >= 0) {
      w = rooms_pop(&r, (size_t)fit);
      after[last[w]] = (int64_t)i;
    } else {
      w = (int64_t)nwin++;
      room[w] = (size_t)T1;
      first[w] = (int64_t)i;
    }
    last[w] = (int64_t)i;
    after[i] = -1;
    room[w] -= l;
    if (room[w] > 0) rooms_push(&r, room[w], w);
  }
  p->nwin = nwin;
  size_t k = 0;
  for (size_t w = 0; w < nwin; w++) {
    p->off[w] = k;
    for (int64_t i = first[w]; i >= 0; i = after[i])
      p->ids[k++] = sorted[i];
  }
  p->off[nwin] = k;
  free(r.cnt), free(r.head), free(r.next);
  free(first), free(last), free(after), free(room), free(sorted), free(order);
  return KD_EXIT_OK;
}

void data_pack_free(struct data_pack *p) {
  free(p->off);
  free(p->ids);
  memset(p, 0, sizeof *p);
}

void data_pack_window(const struct data_pack *p, const struct data_source *src, size_t w,
                      int *inputs, int *labels, int *pos, unsigned char *mbuf) {
  const size_t T = (size_t)p->T1 - 1;
  size_t t = 0; /* the window's tokens so far */
  for (size_t k = p->off[w]; k < p->off[w + 1]; k++) {
    const size_t d = p->ids[k], l = doc_len(src, d, p->T1), k0 = (size_t)src->doc[d];
    KD_CHECK(t + l <= (size_t)p->T1, "data_pack_window: window %zu overfull", w);
    /* inputs: the document's tokens that fall before the window's last token */
    const size_t nin = t + l <= T ? l : T - t;
    if (nin) data_source_tokens(src, k0, nin, inputs + t);
    /* labels: tokens 1 .. l-1 of the document for inputs 0 .. l-2 */
    const size_t nlab = l - 1 < T - t ? l - 1 : T - t;
    if (nlab) {
      data_source_tokens(src, k0 + 1, nlab, labels + t);
      if (src->mask) {
        data_source_mask(src, k0 + 1, nlab, mbuf);
        for (size_t j = 0; j < nlab; j++)
          if (!mbuf[j]) labels[t + j] = -1;
      }
    }
    if (t + l - 1 < T) labels[t + l - 1] = -1; /* the document's last token predicts nothing */
    if (pos)
      for (size_t j = 0; j < nin; j++)
        pos[t + j] = (int)j;
    t += l;
  }
  for (size_t j = t; j < T; j++) { /* padding: never counted, never computed */
    inputs[j] = 0;
    labels[j] = -1;
    if (pos) pos[j] = -1;
  }
}

size_t data_pack_tokens(const struct data_pack *p, const struct data_source *src, size_t w) {
  size_t t = 0;
  for (size_t k = p->off[w]; k < p->off[w + 1]; k++)
    t += doc_len(src, p->ids[k], p->T1);
  return t;
}
