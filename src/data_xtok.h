/* data_xtok.h: the teacher's side of a documents dataset whose teacher has another tokenizer
 * (loss%kind = 'uld'; kdprep --teacher-tokenizer; doc/format.md, "Token data"). Beside the
 * student's Megatron dataset PREFIX lie the teacher's tokens PREFIX_teacher (with its loss
 * mask PREFIX_teacher_mask when the student has one) and both sides' answer offsets,
 * PREFIX_offsets and PREFIX_teacher_offsets: one int32 per token, the byte where the token
 * ends in its document's answer text (-1: a token that does not count). Both tokenizations
 * share that byte coordinate; the loss aligns them where their ends agree (uld.h).
 *
 * A window of the student's packing (data_pack.h) holds the same documents on the teacher's
 * side, back to back in windows of T1t tokens (every one a row of the teacher's forward),
 * each restarting its positions at 0; a document that does not fit is cut there. */
#ifndef KD_DATA_XTOK_H
#define KD_DATA_XTOK_H

#include <stddef.h>
#include <stdint.h>

#include "data_source.h"

struct kd_data;

/* The teacher's files of one file of a blend. */
struct data_xtok {
  struct data_source t;    /* PREFIX_teacher: the teacher's tokens (and mask) */
  struct data_source soff; /* PREFIX_offsets: the student's answer offsets (int32) */
  struct data_source toff; /* PREFIX_teacher_offsets: the teacher's */
};

/* The answer tokens of the documents of a micro-batch, in the order the windows hold them:
 * document i's student tokens are s_row[s_first[i] .. s_first[i+1]-1] (rows b * T + t of the
 * micro-batch), their end offsets s_end[...], the teacher's likewise (rows b * Tt + t); cut[i]:
 * a side lost tokens of the document to its window's end, so its tail has no partner. GOLD's
 * defaults: each side's last answer token (the end of sequence) of a document that was not
 * cut is left out. */
struct xtok_docs {
  size_t ndocs, cap_docs, ns, cap_s, nt, cap_t;
  size_t *s_first, *t_first; /* ndocs + 1 */
  unsigned char *cut;        /* ndocs */
  unsigned char *answer;     /* ndocs: the document has a student answer token in the rows (the
                                documents the loss's mean counts: data_count_answer_docs) */
  int *t_start, *t_lead;     /* ndocs: the row of its first teacher token; the teacher tokens
                                before its first answer token (its prompt) */
  int *buf;                  /* scratch: a document's offsets */
  size_t cap_buf;
  int *s_row, *t_row;     /* ns, nt */
  int32_t *s_end, *t_end; /* ns, nt */
};

/* Open the teacher's files of every file of d (a documents dataset of Megatron files) and
 * fix the teacher's window: seq_len_t tokens, or (0) the most the windows' documents need
 * (each window's teacher tokens, at most 2 (seq_len + 1)), or with `room` (on-policy text
 * is re-encoded into the windows) that bound itself. KD_EXIT_INPUT with a message
 * naming the file when one is missing, foreign, of other document counts or lengths, or
 * holds an id outside [0, teacher_vocab). Sets d->xtok and d->Tt. Not collective. */
int data_use_teacher(struct kd_data *d, int teacher_vocab, int seq_len_t, int room, char *err,
                     size_t errlen);

/* The teacher's side of global samples g0 .. g0 + mb - 1 (as data_batch_pos gives the
 * student's): inputs and pos (mb * Tt each; padding: token 0, position -1), and the answer
 * tokens of their documents into *docs (reset first). */
void data_batch_teacher(struct kd_data *d, int64_t g0, int mb, int *inputs, int *pos,
                        struct xtok_docs *docs);

/* Sample j of a micro-batch, global sample g, as data_batch_teacher gives it: its teacher
 * tokens and positions into inputs and pos (Tt each: the sample's own), its documents'
 * answer tokens appended to *docs (rows of sample j). */
void data_teacher_window(struct kd_data *d, int64_t g, int j, int *inputs, int *pos,
                         struct xtok_docs *docs);

/* Empty docs / append one document: its ns student answer tokens (rows s_row, ends s_end) and
 * nt teacher ones; cut: a side lost tokens to its window (the alignment's tail is dropped). */
void xtok_docs_reset(struct xtok_docs *docs);
void xtok_docs_add(struct xtok_docs *docs, const int *s_row, const int32_t *s_end, size_t ns,
                   const int *t_row, const int32_t *t_end, size_t nt, int cut, int answer,
                   int t_start, int t_lead);

/* Documents of global samples g0 .. g0 + n - 1 with at least one student answer token: the
 * mean of the cross-tokenizer loss is over them. Every rank computes it alone. */
int64_t data_count_answer_docs(struct kd_data *d, int64_t g0, int64_t n);

/* Close what data_use_teacher opened (before data_close of d). */
void data_drop_teacher(struct kd_data *d);

void data_xtok_close(struct data_xtok *x);
void xtok_docs_free(struct xtok_docs *docs);

#endif
