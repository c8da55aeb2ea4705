/* agree.c: all-ranks agreement on a yes/no verdict (agree.h). */
#include "agree.h"

int agree_all(int ok, MPI_Comm comm) {
  int all = 0;
  ok = ok != 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, comm);
  return all;
}
