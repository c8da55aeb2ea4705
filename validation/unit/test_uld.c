/* test_uld.c [DIR] (validation/unit/test_uld.sh; DIR written by validation/ref/uld_ref.py):
 * the cross-tokenizer distillation math of src/uld.h.
 * Without DIR, its own cases: the alignment's remainder and cut on small offsets, groups of
 * several samples appended to one list; the stable order of tied values (the sorted L1's
 * gradient goes to tied entries in index order); the merge's scalar factors, their clamp at
 * 1e-8 in the merged vector and in the other rows' gradients (GOLD's tolerances cannot see a
 * factor of 1e-8); bad settings refused.
 * With DIR, against TRL's own GOLD (ULDLoss):
 *  - uld_align equals _align_by_byte_offsets (after GOLD's drop of pairs with an empty side)
 *    on 400 random non-decreasing offset pairs, with and without the remainder (cut);
 *  - uld_vocab_match on two tokenizer.json files equals ULDLoss's vocabulary mapping;
 *  - the loss of ULDLoss.__call__ within 1e-5 relative and the gradient w.r.t. the student's
 *    logits within 1e-5 of its largest entry, plain and hybrid, from GOLD's own
 *    probabilities; then the same from uld_softmax's probabilities (each within 1e-6 relative
 *    of torch's, 1e-37 absolute). */
#include <check.h>
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_run.h"
#include "tokenizer.h"
#include "uld.h"

static const char *dir;

static FILE *open_ref(const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "r");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  return f;
}

static long get_int(FILE *f) {
  long v;
  ck_assert_msg(fscanf(f, "%ld", &v) == 1, "bad reference file");
  return v;
}

static double get_num(FILE *f) {
  double v;
  ck_assert_msg(fscanf(f, "%lf", &v) == 1, "bad reference file");
  return v;
}

static int32_t *get_ints(FILE *f, size_t n) {
  int32_t *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = (int32_t)get_int(f);
  return x;
}

static float *get_floats(FILE *f, size_t n) {
  float *x = malloc((n ? n : 1) * sizeof *x);
  for (size_t i = 0; i < n; i++)
    x[i] = (float)get_num(f);
  return x;
}

/* --- own cases -------------------------------------------------------------------------- */

/* Group k of g has student rows s[0..ns) and teacher rows t[0..nt). */
static void group_is(const struct uld_groups *g, size_t k, const size_t *s, size_t ns,
                     const size_t *t, size_t nt) {
  ck_assert_uint_lt(k, g->n);
  ck_assert_uint_eq(g->s_off[k + 1] - g->s_off[k], ns);
  ck_assert_uint_eq(g->t_off[k + 1] - g->t_off[k], nt);
  for (size_t i = 0; i < ns; i++)
    ck_assert_uint_eq(g->s_rows[g->s_off[k] + i], s[i]);
  for (size_t i = 0; i < nt; i++)
    ck_assert_uint_eq(g->t_rows[g->t_off[k] + i], t[i]);
}

START_TEST(align_remainder_and_cut) {
  struct uld_groups g = {0};
  /* "ab|cd|e": student ends 1 2 4 5, teacher 2 3 4 6 (the teacher ran one byte on) */
  const int32_t se[] = {1, 2, 4, 5}, te[] = {2, 3, 4, 6};
  ck_assert_int_eq(uld_align(&g, se, 4, 10, te, 4, 20, 0), 3);
  group_is(&g, 0, (size_t[]){10, 11}, 2, (size_t[]){20}, 1);
  group_is(&g, 1, (size_t[]){12}, 1, (size_t[]){21, 22}, 2);
  group_is(&g, 2, (size_t[]){13}, 1, (size_t[]){23}, 1); /* the remainder */
  /* cut: no remainder; appended after the first sample's groups */
  ck_assert_int_eq(uld_align(&g, se, 4, 0, te, 4, 0, 1), 2);
  ck_assert_uint_eq(g.n, 5);
  group_is(&g, 3, (size_t[]){0, 1}, 2, (size_t[]){0}, 1);
  group_is(&g, 4, (size_t[]){2}, 1, (size_t[]){1, 2}, 2);
  /* a remainder with one side empty is dropped; so are empty inputs */
  const int32_t s2[] = {3, 3}, t2[] = {3};
  uld_groups_clear(&g);
  ck_assert_int_eq(uld_align(&g, s2, 2, 0, t2, 1, 0, 0), 1);
  group_is(&g, 0, (size_t[]){0}, 1, (size_t[]){0}, 1);
  ck_assert_int_eq(uld_align(&g, s2, 0, 0, t2, 1, 0, 0), 0);
  ck_assert_int_eq(uld_align(&g, s2, 2, 0, t2, 0, 0, 0), 0);
  ck_assert_uint_eq(g.n, 1);
  uld_groups_free(&g);
}
END_TEST

START_TEST(ties_stable_and_merge) {
  struct uld u;
  struct uld_work w;
  ck_assert_int_eq(uld_init(&u, 4, 4, 1.0f), 0);
  ck_assert_int_eq(uld_work_init(&w, &u), 0);
  /* student uniform (all tied), teacher 0.4 0.3 0.2 0.1: ranks go to the ties in index order,
   * so d(L1)/d(p) = -1 -1 +1 +1 and dz = p (g - sum g p) = 0.25 g */
  const float ps[] = {0.25f, 0.25f, 0.25f, 0.25f}, pt[] = {0.4f, 0.3f, 0.2f, 0.1f};
  const int32_t ids[] = {0};
  const size_t r0[] = {0};
  float dz[4] = {0};
  const double l = uld_group(dz, &w, &u, ps, ids, r0, 1, pt, ids, r0, 1, 1.0f);
  ck_assert_double_eq_tol(l, 0.4, 1e-6);
  const float want[] = {-0.25f, -0.25f, 0.25f, 0.25f};
  for (int v = 0; v < 4; v++)
    ck_assert_float_eq_tol(dz[v], want[v], 1e-7f);

  /* a split student token: rows 0 and 1 merge to p0 * p1[ids[1]]; p1[ids[1]] = 0.5 */
  const float ps2[] = {0.7f, 0.1f, 0.1f, 0.1f, 0.2f, 0.5f, 0.2f, 0.1f};
  const int32_t ids2[] = {3, 1};
  const size_t r2[] = {0, 1};
  const float pt2[] = {0.1f, 0.1f, 0.3f, 0.5f};
  float dz2[8] = {0};
  /* merged 0.35 .05 .05 .05 against .5 .3 .1 .1: L1 = .15 + .25 + .05 + .05 */
  ck_assert_double_eq_tol(uld_group(dz2, &w, &u, ps2, ids2, r2, 2, pt2, ids, r0, 1, 2.0f), 0.5,
                          1e-6);
  /* g = -1 -1 -1 -1 on the merged vector: D = -1; row 0: 2 * 0.5 * p0 (g + 1) = 0; row 1:
   * a = 2 * D * 1 = -2 through p1[1]: dz1 = a p1 (e_1 - p1[1]) */
  for (int v = 0; v < 4; v++)
    ck_assert_float_eq_tol(dz2[v], 0.0f, 1e-7f);
  const float want1[] = {0.2f, -0.5f, 0.2f, 0.1f};
  for (int v = 0; v < 4; v++)
    ck_assert_float_eq_tol(dz2[4 + v], want1[v], 1e-6f);
  /* clamped: p1[ids[1]] below 1e-8 gives a factor 1e-8 and row 1 no gradient */
  const float ps3[] = {0.7f, 0.1f, 0.1f, 0.1f, 0.5f, 1e-9f, 0.5f, 0.0f};
  float dz3[8] = {0};
  uld_group(dz3, &w, &u, ps3, ids2, r2, 2, pt2, ids, r0, 1, 1.0f);
  for (int v = 0; v < 4; v++)
    ck_assert_float_eq(dz3[4 + v], 0.0f);
  ck_assert_float_eq(w.ms[0], 0.7f * 1e-8f);
  /* three rows, the last clamped: row 1's gradient goes through the clamped factor 1e-8 (all
   * signs -1, D = -1: a = -1e-8, dz1 = a p1 (e_1 - p1[1])), the last row gets none */
  const float ps4[] = {0.7f, 0.1f, 0.1f, 0.1f, 0.2f, 0.5f, 0.2f, 0.1f, 0.5f, 1e-9f, 0.5f, 0.0f};
  const int32_t ids4[] = {3, 1, 1};
  const size_t r4[] = {0, 1, 2};
  float dz4[12] = {0};
  uld_group(dz4, &w, &u, ps4, ids4, r4, 3, pt2, ids, r0, 1, 1.0f);
  ck_assert_float_eq(w.ms[0], 0.7f * (0.5f * 1e-8f));
  const float want4[] = {1e-9f, -2.5e-9f, 1e-9f, 5e-10f};
  for (int v = 0; v < 4; v++) {
    ck_assert_float_eq_tol(dz4[v], 0.0f, 1e-15f);
    ck_assert_float_eq_tol(dz4[4 + v], want4[v], 1e-6f * fabsf(want4[v]));
    ck_assert_float_eq(dz4[8 + v], 0.0f);
  }
  uld_work_free(&w);

  /* settings refused */
  const int32_t t_ids[] = {0, 0}, s_ids[] = {1, 2}, bad[] = {4};
  ck_assert_int_eq(uld_set_hybrid(&u, t_ids, s_ids, 2, 0.5, 1, 0, 0), -1); /* teacher twice */
  ck_assert_int_eq(uld_set_hybrid(&u, bad, s_ids, 1, 0.5, 1, 0, 0), -1);   /* id >= Vt */
  ck_assert_int_eq(uld_set_hybrid(&u, t_ids, bad, 1, 0.5, 1, 0, 0), -1);   /* id >= Vs */
  ck_assert_int_eq(uld_set_hybrid(&u, t_ids, s_ids, 1, 1.5, 1, 0, 0), -1); /* beta */
  ck_assert_int_eq(u.hybrid, 0);
  ck_assert_int_eq(uld_set_hybrid(&u, t_ids, s_ids, 1, 0.5, 1, 0, 0), 0);
  ck_assert_uint_eq(u.nsu, 3);
  ck_assert_uint_eq(u.ntu, 3);
  ck_assert_double_eq(u.wm, 0.25);
  ck_assert_double_eq(u.wu, 0.75);
  uld_free(&u);
  ck_assert_int_eq(uld_init(&u, 0, 4, 1.0f), -1);
  ck_assert_int_eq(uld_init(&u, 4, 4, 0.0f), -1);
}
END_TEST

/* --- against GOLD ------------------------------------------------------------------------- */

START_TEST(align_gold) {
  FILE *f = open_ref("align.txt");
  const long n = get_int(f);
  struct uld_groups g = {0}, all = {0};
  size_t row = 0, checked = 0;
  for (long c = 0; c < n; c++) {
    const size_t ns = (size_t)get_int(f), nt = (size_t)get_int(f);
    const int cut = (int)get_int(f);
    int32_t *se = get_ints(f, ns), *te = get_ints(f, nt);
    const size_t ng = (size_t)get_int(f);
    uld_groups_clear(&g);
    ck_assert_int_eq(uld_align(&g, se, ns, 0, te, nt, 0, cut), (int64_t)ng);
    const size_t a0 = all.n; /* the same appended to one list, rows offset */
    ck_assert_int_eq(uld_align(&all, se, ns, row, te, nt, row + 1, cut), (int64_t)ng);
    for (size_t k = 0; k < ng; k++) {
      size_t s[64], t[64], sr[64], tr[64];
      const size_t ls = (size_t)get_int(f);
      for (size_t i = 0; i < ls; i++)
        s[i] = (size_t)get_int(f), sr[i] = s[i] + row;
      const size_t lt = (size_t)get_int(f);
      for (size_t i = 0; i < lt; i++)
        t[i] = (size_t)get_int(f), tr[i] = t[i] + row + 1;
      group_is(&g, k, s, ls, t, lt);
      group_is(&all, a0 + k, sr, ls, tr, lt);
      checked++;
    }
    row += ns + nt;
    free(se), free(te);
  }
  fclose(f);
  ck_assert_uint_gt(checked, 1000);
  uld_groups_free(&g), uld_groups_free(&all);
}
END_TEST

static struct tokenizer *load_tok(const char *name) {
  char path[4096], err[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  struct tokenizer *t = tokenizer_load_file(path, err, sizeof err);
  ck_assert_msg(t != NULL, "%s: %s", path, err);
  return t;
}

START_TEST(vocab_match_gold) {
  struct tokenizer *tt = load_tok("teacher.json"), *ts = load_tok("student.json");
  int32_t *t_ids, *s_ids;
  size_t n;
  ck_assert_int_eq(uld_vocab_match(&t_ids, &s_ids, &n, tt, ts), 0);
  FILE *f = open_ref("match.txt");
  ck_assert_uint_eq(n, (size_t)get_int(f));
  for (size_t k = 0; k < n; k++) {
    ck_assert_int_eq(t_ids[k], get_int(f));
    ck_assert_int_eq(s_ids[k], get_int(f));
  }
  fclose(f);
  /* an added token of both vocabularies is matched, one of the teacher's alone is not */
  size_t len;
  const int32_t think = tokenizer_token_id(tt, "<think>", 7);
  int found = 0;
  for (size_t k = 0; k < n; k++)
    found |= t_ids[k] == think && s_ids[k] == tokenizer_token_id(ts, "<think>", 7);
  ck_assert(found);
  const char *s = tokenizer_token_str(tt, tokenizer_token_id(tt, "<pad>", 5), &len);
  ck_assert(s && len == 5 && !memcmp(s, "<pad>", 5));
  ck_assert_int_lt(tokenizer_token_id(ts, "<pad>", 5), 0);
  ck_assert_ptr_null(tokenizer_token_str(tt, (int32_t)tokenizer_vocab_size(tt), &len));
  free(t_ids), free(s_ids);
  tokenizer_free(tt), tokenizer_free(ts);
}
END_TEST

/* One case of loss.txt. */
struct lcase {
  long B, Ss, St, Vs, Vt, hybrid, adaptive;
  double Ts, Tt, wm, wu, beta, dw, loss;
  long (*span)[4];    /* (B) s_start s_size t_start t_size */
  int32_t **se, **te; /* (B) end offsets of the answer rows */
  int32_t *ids_s, *ids_t;
  float *zs, *zt, *ps, *pt, *dzs;
};

static void read_case(FILE *f, struct lcase *c) {
  c->B = get_int(f), c->Ss = get_int(f), c->St = get_int(f);
  c->Vs = get_int(f), c->Vt = get_int(f);
  c->Ts = get_num(f), c->Tt = get_num(f);
  c->hybrid = get_int(f), c->adaptive = get_int(f);
  c->wm = get_num(f), c->wu = get_num(f), c->beta = get_num(f), c->dw = get_num(f);
  c->span = malloc((size_t)c->B * sizeof *c->span);
  c->se = malloc((size_t)c->B * sizeof *c->se), c->te = malloc((size_t)c->B * sizeof *c->te);
  for (long i = 0; i < c->B; i++) {
    for (int k = 0; k < 4; k++)
      c->span[i][k] = get_int(f);
    c->se[i] = get_ints(f, (size_t)c->span[i][1]);
    c->te[i] = get_ints(f, (size_t)c->span[i][3]);
  }
  const size_t rs = (size_t)c->B * c->Ss, rt = (size_t)c->B * c->St;
  c->ids_s = get_ints(f, rs), c->ids_t = get_ints(f, rt);
  c->zs = get_floats(f, rs * c->Vs), c->zt = get_floats(f, rt * c->Vt);
  c->ps = get_floats(f, rs * c->Vs), c->pt = get_floats(f, rt * c->Vt);
  c->loss = get_num(f);
  c->dzs = get_floats(f, rs * c->Vs);
}

static void free_case(struct lcase *c) {
  for (long i = 0; i < c->B; i++)
    free(c->se[i]), free(c->te[i]);
  free(c->span), free(c->se), free(c->te), free(c->ids_s), free(c->ids_t);
  free(c->zs), free(c->zt), free(c->ps), free(c->pt), free(c->dzs);
}

/* GOLD's batch loss of case c from probabilities ps, pt; its gradient into dz (zeroed). */
static double batch_loss(float *dz, const struct lcase *c, const struct uld *u, const float *ps,
                         const float *pt) {
  struct uld_work w;
  struct uld_groups g = {0};
  ck_assert_int_eq(uld_work_init(&w, u), 0);
  memset(dz, 0, (size_t)c->B * c->Ss * c->Vs * sizeof *dz);
  double loss = 0;
  const float scale = (float)(c->dw / (double)c->B);
  for (long i = 0; i < c->B; i++) {
    const size_t g0 = g.n;
    ck_assert_int_ge(uld_align(&g, c->se[i], (size_t)c->span[i][1],
                               (size_t)(i * c->Ss + c->span[i][0]), c->te[i], (size_t)c->span[i][3],
                               (size_t)(i * c->St + c->span[i][2]), 0),
                     0);
    loss += uld_sample(dz, &w, u, &g, g0, g.n, ps, c->ids_s, pt, c->ids_t, scale);
  }
  uld_work_free(&w), uld_groups_free(&g);
  return c->dw * loss / (double)c->B;
}

static void compare(const struct lcase *c, int k, const char *what, double loss, const float *dz) {
  const size_t n = (size_t)c->B * c->Ss * c->Vs;
  double gmax = 0, dmax = 0;
  for (size_t i = 0; i < n; i++)
    gmax = fmax(gmax, fabs(c->dzs[i]));
  for (size_t i = 0; i < n; i++)
    dmax = fmax(dmax, fabs((double)dz[i] - c->dzs[i]));
  printf("case %d (%s, %s): loss %.9g vs GOLD %.9g, gradient max |diff| %.2e (largest %.3g)\n", k,
         c->hybrid ? "hybrid" : "plain", what, loss, c->loss, dmax, gmax);
  ck_assert_msg(fabs(loss - c->loss) <= 1e-5 * fabs(c->loss), "case %d %s: loss %.9g vs %.9g", k,
                what, loss, c->loss);
  ck_assert_msg(dmax <= 1e-5 * gmax, "case %d %s: gradient off by %g", k, what, dmax);
}

START_TEST(loss_gold) {
  FILE *f = open_ref("loss.txt");
  const long n = get_int(f);
  struct tokenizer *tt = load_tok("teacher.json"), *ts = load_tok("student.json");
  int32_t *t_ids, *s_ids;
  size_t nm;
  ck_assert_int_eq(uld_vocab_match(&t_ids, &s_ids, &nm, tt, ts), 0);
  for (long k = 0; k < n; k++) {
    struct lcase c;
    read_case(f, &c);
    struct uld u;
    ck_assert_int_eq(uld_init(&u, (size_t)c.Vs, (size_t)c.Vt, (float)c.Ts), 0);
    if (c.hybrid)
      ck_assert_int_eq(uld_set_hybrid(&u, t_ids, s_ids, nm, c.beta, (int)c.adaptive, c.wm, c.wu),
                       0);
    const size_t rs = (size_t)c.B * c.Ss, rt = (size_t)c.B * c.St;
    float *dz = malloc(rs * c.Vs * sizeof *dz);
    compare(&c, (int)k, "GOLD's probabilities", batch_loss(dz, &c, &u, c.ps, c.pt), dz);

    /* uld_softmax's probabilities: torch's within 1e-6 relative at the answer rows */
    float *ps = malloc(rs * c.Vs * sizeof *ps), *pt = malloc(rt * c.Vt * sizeof *pt);
    uld_softmax(ps, c.zs, rs, (size_t)c.Vs, (float)c.Ts);
    uld_softmax(pt, c.zt, rt, (size_t)c.Vt, (float)c.Tt);
    for (long i = 0; i < c.B; i++) {
      for (int side = 0; side < 2; side++) {
        const size_t V = (size_t)(side ? c.Vt : c.Vs), S = (size_t)(side ? c.St : c.Ss);
        const float *p = side ? pt : ps, *ref = side ? c.pt : c.ps;
        const size_t r0 = (size_t)i * S + (size_t)c.span[i][2 * side];
        for (size_t e = r0 * V; e < (r0 + (size_t)c.span[i][2 * side + 1]) * V; e++)
          ck_assert_msg(fabsf(p[e] - ref[e]) <= 1e-6f * ref[e] + 1e-37f,
                        "case %ld: softmax %g vs torch %g", k, p[e], ref[e]);
      }
    }
    compare(&c, (int)k, "uld_softmax", batch_loss(dz, &c, &u, ps, pt), dz);
    free(ps), free(pt), free(dz);
    uld_free(&u);
    free_case(&c);
  }
  fclose(f);
  free(t_ids), free(s_ids);
  tokenizer_free(tt), tokenizer_free(ts);
}
END_TEST

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  if (argc > 2) {
    fprintf(stderr, "usage: test_uld [DIR] (validation/unit/test_uld.sh)\n");
    MPI_Finalize();
    return 2;
  }
  dir = argc == 2 ? argv[1] : NULL;
  Suite *s = suite_create("uld");
  TCase *tc = tcase_create("uld");
  tcase_set_timeout(tc, 120);
  if (!dir) {
    tcase_add_test(tc, align_remainder_and_cut);
    tcase_add_test(tc, ties_stable_and_merge);
  } else {
    tcase_add_test(tc, align_gold);
    tcase_add_test(tc, vocab_match_gold);
    tcase_add_test(tc, loss_gold);
  }
  suite_add_tcase(s, tc);
  const int failed = check_run(s);
  MPI_Finalize();
  return failed ? 1 : 0;
}
