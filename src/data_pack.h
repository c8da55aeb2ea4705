/* data_pack.h: the windows of a documents dataset (data%samples = 'documents'). Each
 * window of seq_len + 1 tokens holds whole documents of the file's document index
 * (data_source.doc), packed several to a window (data%pack) or one each; a document
 * longer than a window is cut to its first seq_len + 1 tokens. Inside a window every
 * document restarts its positions at 0 and sees only its own tokens (struct kd_attn's
 * pos); the label of a document's last token is not the next document's first. The
 * packing is a function of the file and the seed only (doc/user-guide.md, "Documents"). */
#ifndef KD_DATA_PACK_H
#define KD_DATA_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "data_source.h"

struct data_pack {
  size_t nwin;       /* windows */
  size_t *off;       /* nwin + 1: window w holds the documents ids[off[w] .. off[w+1]-1] */
  uint32_t *ids;     /* document numbers, in the order they lie in their window */
  int T1;            /* tokens per window: seq_len + 1 */
  int packed;        /* several documents per window (pack = 1) */
  size_t ndocs;      /* documents packed (the index's non-empty ones) */
  size_t ntrunc;     /* of them, longer than a window (cut) */
  uint64_t tok_docs; /* tokens of the packed documents as cut */
  uint64_t tok_cut;  /* tokens dropped by the cuts */
};

/* Pack the documents of src (which has a document index) into windows of T1 tokens: one
 * document per window in file order (pack = 0), or several (pack = 1): the documents in a
 * seeded shuffle, stably sorted longest first, each into the fullest window it still fits
 * (best fit decreasing), windows in the order they were opened. KD_EXIT_INPUT with a
 * message in err when the file has no document index, or more documents than 2^32 - 1. */
int data_pack_build(struct data_pack *p, const struct data_source *src, int T1, int pack,
                    uint64_t seed, char *err, size_t errlen);
void data_pack_free(struct data_pack *p);

/* Window w of src into inputs, labels and pos (T1 - 1 each; pos may be NULL): the
 * documents back to back, then padding (token 0, label -1, position -1); label t is
 * token t + 1 when it belongs to the same document and counts (mask), else -1; pos t is
 * t's position in its document. mbuf: T1 bytes of scratch. */
void data_pack_window(const struct data_pack *p, const struct data_source *src, size_t w,
                      int *inputs, int *labels, int *pos, unsigned char *mbuf);

/* Tokens of window w that are not padding (its documents as cut). */
size_t data_pack_tokens(const struct data_pack *p, const struct data_source *src, size_t w);

/* Documents in window w. */
static inline size_t data_pack_docs(const struct data_pack *p, size_t w) {
  return p->off[w + 1] - p->off[w];
}

#endif
