#!/bin/sh
# summary.sh TEST...: after make check (run in the build directory), how many of the
# given tests ran, passed, failed and skipped, read from their .trs results, and for
# each skipped test the reason it printed ("SKIP: reason" in its .log). Exit 1 when a
# result is missing or a test failed, and under CI (the variable CI set) when one skipped.
n=0 pass=0 fail=0 skip=0 reasons=""
for t in "$@"; do
  b=${t%.sh}
  r=$(sed -n 's/^:test-result: *//p' "$b.trs" 2> /dev/null | head -n 1)
  n=$((n + 1))
  case $r in
  PASS | XFAIL) pass=$((pass + 1)) ;;
  SKIP)
    skip=$((skip + 1))
    why=$(sed -n 's/^SKIP: *//p' "$b.log" 2> /dev/null | tail -n 1)
    reasons="$reasons  skipped $t: ${why:-no reason printed (see $b.log)}
" ;;
  *)
    fail=$((fail + 1))
    reasons="$reasons  failed $t: ${r:-no result} (see $b.log)
" ;;
  esac
done
echo "== test summary: $n ran, $pass passed, $fail failed, $skip skipped"
printf '%s' "$reasons"
[ "$fail" -eq 0 ] || exit 1
if [ "$skip" -gt 0 ] && [ -n "${CI:-}" ]; then
  echo "== CI is set: every test must run, $skip skipped"
  exit 1
fi
exit 0
