#!/bin/sh
# Every program the shell scripts of the tests, the quickstart and CI call is on a minimal
# Debian 12 once deps/debian.txt is installed: its Debian package (dpkg -S of the path
# `command -v` finds, through links and /bin = /usr/bin) is Essential, or in
# deps/debian.txt, or pulled in by one there (Depends, Pre-Depends). A new test that calls
# pgrep, xxd or bc fails here, on any Debian machine, and not only on a minimal one.
#
# The scripts: the tests of Makefile.am's TESTS (validation/*/test_*.sh), validation/*.sh,
# validation/cuemu/cu2cpp, input/quickstart/*.sh, .ci/run, bootstrap, and every script of
# the tree they name (jobs/slurm.sh, validation/scale/scale.sh, ...). A program is a word
# in command position (line start, after ; & | && || ( $( ` ! and the keywords, after
# VAR=value and after exec, nice, timeout, env, xargs, nohup, sudo); quoted text,
# here-documents (namelists, Python) and words with $ are not read. Not programs: shell
# keywords and builtins, functions the scripts define, and what the build makes (the
# *_PROGRAMS and *_SCRIPTS of Makefile.am, run by their path). A program not installed here
# has no package to look up: a note, and a failure under CI (where the list is installed).
set -eu
: "${KD_SRCDIR:?}"
cd "$KD_SRCDIR"
list=deps/debian.txt
say() { echo "FAIL: $*" >&2; }
command -v dpkg-query > /dev/null 2>&1 || {
  echo "SKIP: not a Debian system (no dpkg-query): the packages cannot be looked up"
  exit 77
}
[ -f "$list" ] || { say "$list: no such file"; exit 1; }

# Programs a script may call that need not be installed, and why.
given="apt-get sudo nvcc sbatch srun scontrol qsub qstat"
# apt-get, sudo: what installs the list (bootstrap --deps, .ci/run; sudo only when not root)
# nvcc: the CUDA toolkit, optional (.ci/run builds the CUDA backend only where it is)
# sbatch srun scontrol qsub qstat: the batch system of jobs/*.sh (test_jobs.sh puts
#   stand-ins for them on PATH)

# --- the scripts: the entry points, then every script of the tree one of them names ----
scripts=$(ls validation/lint/test_*.sh validation/mpi/test_*.sh validation/e2e/test_*.sh \
  validation/faults/test_*.sh validation/*.sh validation/cuemu/cu2cpp input/quickstart/*.sh \
  .ci/run bootstrap)
is_script() { [ -f "$1" ] && head -n 1 "$1" | grep -qE '^#! */bin/(ba)?sh'; }
todo=$scripts
while [ -n "$todo" ]; do
  # shellcheck disable=SC2086
  named=$(grep -ohE '(jobs|validation|input|tools|\.ci)/[A-Za-z0-9_./-]+' $todo 2> /dev/null |
    sed 's/[.]*$//' | sort -u)
  todo=""
  for f in $named; do
    case " $(echo $scripts) " in *" $f "*) continue ;; esac
    if is_script "$f"; then scripts="$scripts
$f"; todo="$todo $f"; fi
  done
done

# --- the words in command position: "script line word", and the functions defined -----
# shellcheck disable=SC2086
calls=$(awk -f - $scripts <<'AWK'
function push(k) {
  wordsave[depth] = word; cmdsave[depth] = cmd; qsave[depth] = q; skipsave[depth] = skip
  depth++; kind[depth] = k; word = ""; q = ""; cmd = 1; skip = 0; redir = 0
}
function pop(   k) {
  k = kind[depth]; depth--
  word = k == "p" ? "" : wordsave[depth] "$"; cmd = k == "p" ? 0 : cmdsave[depth]
  q = qsave[depth]; skip = skipsave[depth]
}
function flush_word() {
  if (word != "") {
    handle(word, wline)
    word = ""
  }
}
# a word at the top level of a command: in command position (cmd) it names a program
function handle(w, ln,   name) {
  if (redir) { redir = 0; return }
  if (pat[depth]) {                     # a case pattern: words up to ")"
    if (w == "esac") { pat[depth] = 0; casen[depth]--; cmd = 0 }
    return
  }
  if (w == "in" && waitin[depth]) { waitin[depth] = 0; pat[depth] = 1; return }
  if (skip > 0) {                       # options and operands of a prefix command
    if (w ~ /^-/ || (skipeq && w ~ /^[A-Za-z_][A-Za-z0-9_]*=/)) {
      if (w ~ skiparg) skip = 2; return
    }
    if (skip == 2) { skip = 1; return }
    if (skipn > 0) { skipn--; return }
    skip = 0; cmd = 1
  }
  if (!cmd) return
  if (w ~ /^[A-Za-z_][A-Za-z0-9_]*\+?=/) return     # VAR=value: still a command next
  cmd = 0
  if (w ~ /^(if|then|else|elif|do|while|until|!|\{|time)$/) { cmd = 1; return }
  if (w == "case") { casen[depth]++; waitin[depth] = 1; return }
  if (w ~ /^(fi|done|esac|\}|for|in|function)$/) return
  if (w == "command") { pendcommand = 1; cmd = 1; return }
  if (pendcommand) { pendcommand = 0; if (w ~ /^-[vV]$/) return }
  if (w ~ /^(exec|nohup|setsid|sudo|nice|timeout|env|xargs|stdbuf)$/) {
    skip = 1; skipn = (w == "timeout"); skipeq = (w == "env")
    skiparg = w == "nice" ? "^-n$" : w == "timeout" ? "^-[sk]$" : \
      w == "xargs" ? "^-[nIPLdsE]$" : w == "sudo" ? "^-[ugCDhpT]$" : "^$"
    print FILENAME, ln, w
    return
  }
  if (w ~ /[$`"']/) return              # not known before the script runs
  nextfunc = w; nextfuncline = ln
  print FILENAME, ln, w
}
FNR == 1 {
  depth = 0; cmd = 1; word = ""; hd = ""; nhd = 0; q = ""; skip = 0; redir = 0
  pendcommand = 0; delete pat; delete waitin; delete casen
}
{
  line = $0
  if (nhd > 0) {                        # inside a here-document
    t = line; if (hdtab[1]) sub(/^\t+/, "", t)
    if (t == hdw[1]) { for (i = 1; i < nhd; i++) { hdw[i] = hdw[i + 1]; hdtab[i] = hdtab[i + 1] } nhd-- }
    next
  }
  n = length(line)
  if (line ~ /^[ \t]*[A-Za-z_][A-Za-z0-9_-]*[ \t]*\(\)/) {     # a function definition
    f = line; sub(/^[ \t]*/, "", f); sub(/[ \t]*\(.*/, "", f); print "-", "-", "func", f
  }
  for (i = 1; i <= n; i++) {
    c = substr(line, i, 1)
    if (q == "'") { if (c == "'") q = ""; continue }
    if (q == "\"") {
      if (c == "\\") { i++; continue }
      if (c == "\"") { q = ""; continue }
      if (c == "$" && substr(line, i + 1, 1) == "(" && substr(line, i + 2, 1) != "(") { push("s"); i++ }
      else if (c == "`") push("b")
      continue
    }
    if (c == "\\") { if (i == n) { cont = 1 } else if (word == "") { wline = FNR; word = "\\" } i++; continue }
    if (c == "#" && word == "") break
    if (c == "'" || c == "\"") {
      if (word == "") wline = FNR
      word = word c; q = c
      continue
    }
    if (c == "$" && substr(line, i + 1, 2) == "((") {           # arithmetic: skip it
      p = 0; for (j = i + 1; j <= n; j++) { d = substr(line, j, 1); if (d == "(") p++; else if (d == ")" && --p == 0) break }
      if (word == "") wline = FNR; word = word "$"; i = j; continue
    }
    if (c == "$" && substr(line, i + 1, 1) == "(") {
      if (word == "") wline = FNR
      push("s"); i++; continue
    }
    if (c == "$" && substr(line, i + 1, 1) == "{") {
      p = 0; for (j = i + 1; j <= n; j++) { d = substr(line, j, 1); if (d == "{") p++; else if (d == "}" && --p == 0) break }
      if (word == "") wline = FNR; word = word "$"; i = j; continue
    }
    if (c == "`") {
      if (kind[depth] == "b") { flush_word(); pop(); continue }
      if (word == "") wline = FNR
      push("b"); continue
    }
    if (c == " " || c == "\t") { flush_word(); continue }
    if (c == ";") {
      flush_word(); if (substr(line, i + 1, 1) == ";" || substr(line, i + 1, 1) == "&") {
        i++; if (casen[depth] > 0) pat[depth] = 1
      }
      cmd = 1; skip = 0; continue
    }
    if (c == "&" || c == "|") {
      if (word ~ /^[0-9]*[<>]$/) { word = ""; redir = 1; continue }  # 2>&1, >&2
      flush_word(); if (substr(line, i + 1, 1) == c) i++
      cmd = 1; skip = 0; continue
    }
    if (c == "<" || c == ">") {
      if (c == "<" && substr(line, i + 1, 1) == "<" && substr(line, i + 2, 1) != "<") {
        flush_word(); i += 2; tab = 0
        if (substr(line, i, 1) == "-") { tab = 1; i++ }
        while (substr(line, i, 1) == " ") i++
        w = ""; for (; i <= n; i++) { d = substr(line, i, 1); if (d ~ /[ \t;&|<>)]/) break; if (d != "'" && d != "\"" && d != "\\") w = w d }
        i--; nhd++; hdw[nhd] = w; hdtab[nhd] = tab; continue
      }
      if (word ~ /^[0-9]+$/) word = ""
      flush_word()
      if (substr(line, i + 1, 1) == "(") { i++; push("p"); continue }  # <(...), >(...)
      while (substr(line, i + 1, 1) ~ /[<>&|]/) i++
      if (substr(line, i + 1, 1) ~ /[0-9-]/ && substr(line, i, 1) == "&") { i++; continue }
      redir = 1; continue
    }
    if (c == "(" && word ~ /^[A-Za-z_][A-Za-z0-9_]*\+?=$/) {        # arr=(...): words
      p = 0; for (j = i; j <= n; j++) { d = substr(line, j, 1); if (d == "(") p++; else if (d == ")" && --p == 0) break }
      word = word "$"; i = j; continue
    }
    if (c == "(") {
      flush_word()
      if (substr(line, i + 1, 1) == ")") { i++; cmd = 0; continue }  # name() {
      if (pat[depth]) continue
      push("p"); continue
    }
    if (c == ")") {
      flush_word()
      if (pat[depth]) { pat[depth] = 0; cmd = 1; continue }
      if (depth > 0) pop(); else cmd = 0
      continue
    }
    if (word == "") wline = FNR
    word = word c
  }
  if (q == "") {
    flush_word()
    if (!cont) { cmd = 1; skip = 0 }
  }
  cont = 0
}
AWK
)

funcs=$(echo "$calls" | awk '$1 == "-" && $3 == "func" { print $4 }' | sort -u)
built=$(sed -n 's/^[a-z_]*_\(PROGRAMS\|SCRIPTS\) *+*= *//p' Makefile.am | tr ' \\' '\n\n' |
  sed -n 's|.*/||p' | sort -u)
# bash builtins and keywords dash does not know (command -v knows the rest)
bashonly="source declare typeset local mapfile readarray shopt let disown pushd popd dirs [[ ]] select coproc"
names=$(echo "$calls" | awk '$1 != "-" { print $3 }' | sort -u)
prog=""
for w in $names; do
  case $w in */*) continue ;; esac # a path: the tree's, or made by the script
  case " $given $bashonly " in *" $w "*) continue ;; esac
  echo "$funcs" | grep -qxF -- "$w" && continue
  echo "$built" | grep -qxF -- "$w" && continue
  p=$(command -v -- "$w" 2> /dev/null || true)
  case $p in /*) prog="$prog $w=$p" ;; "") prog="$prog $w=" ;; esac # else: a builtin or keyword
done

# --- the packages: every installed one with Essential, its Depends, Pre-Depends, Provides -
db=$(dpkg-query -W -f='${db:Status-Abbrev}|${Package}|${Essential}|${Provides}|${Pre-Depends}, ${Depends}\n')
# the closure of the list: what apt installs with it (an alternative a | b: each installed one)
ok=$(sed -e 's/#.*//' "$list" | tr -s ' \t' '\n\n' | sed '/^$/d' | awk -F'|' -v db="$db" '
  BEGIN {
    n = split(db, rows, "\n")
    for (r = 1; r <= n; r++) {
      split(rows[r], f, "|"); if (f[1] !~ /^ii/) continue
      inst[f[2]] = 1; dep[f[2]] = f[5]; if (f[3] == "yes") print f[2]
      m = split(f[4], pv, ","); for (k = 1; k <= m; k++) { v = pv[k]; sub(/^ +/, "", v); sub(/[ (:].*/, "", v); if (v != "") prov[v] = prov[v] " " f[2] }
    }
  }
  { queue[++qn] = $1 }
  END {
    for (h = 1; h <= qn; h++) {
      p = queue[h]; if (seen[p]++) continue
      if (!(p in inst)) { m = split(prov[p], pp, " "); for (k = 1; k <= m; k++) queue[++qn] = pp[k]; continue }
      print p
      m = split(dep[p], alts, /[,|]/)
      for (k = 1; k <= m; k++) { v = alts[k]; sub(/^ +/, "", v); sub(/[ (:].*/, "", v); if (v != "") queue[++qn] = v }
    }
  }' | sort -u)
inlist=$(sed -e 's/#.*//' "$list" | tr -s ' \t' '\n\n' | sed '/^$/d')
for p in $inlist; do
  echo "$db" | grep -q "^ii[^|]*|$p|" || echo "note: $list: $p is not installed here (./bootstrap --deps installs it)"
done

# --- each program's package: dpkg -S of the path, its link target, their /usr twins ----
cands=""
for pw in $prog; do
  w=${pw%%=*} p=${pw#*=}
  [ -n "$p" ] || continue
  r=$(readlink -f "$p" 2> /dev/null || echo "$p")
  for x in "$p" "$r" /usr/bin/"$w" /bin/"$w" /usr/sbin/"$w" /sbin/"$w"; do
    case $x in
    /usr/bin/* | /usr/sbin/* | /usr/lib/*) cands="$cands $x ${x#/usr}" ;;
    /bin/* | /sbin/* | /lib/*) cands="$cands $x /usr$x" ;;
    *) cands="$cands $x" ;;
    esac
  done
done
# shellcheck disable=SC2086
owners=$(dpkg-query -S $cands 2> /dev/null | grep -v '^diversion by' || true)
owner() { # PATH: the packages that ship it, comma-separated
  echo "$owners" | awk -v p="$1" '{ i = index($0, ": "); if (substr($0, i + 2) == p) { s = substr($0, 1, i - 1); gsub(/:[a-z0-9]+/, "", s); print s; exit } }'
}
bad=0 seen=""
where() { echo "$calls" | awk -v w="$1" '$1 != "-" && $3 == w && !seen[$1 ":" $2]++ { printf "%s%s:%s", sep, $1, $2; sep = ", " }'; }
for pw in $prog; do
  w=${pw%%=*} p=${pw#*=}
  if [ -z "$p" ]; then # no package to look up: an error where the list is installed (CI)
    if [ -n "${CI:-}" ]; then
      say "$(where "$w"): calls '$w', which is not installed (no package of $list has it)"
      bad=1
    else
      echo "note: $(where "$w"): calls '$w', which is not installed here: not checked (CI fails)"
    fi
    continue
  fi
  r=$(readlink -f "$p" 2> /dev/null || echo "$p")
  pk=""
  # then the system's own where PATH finds another first (pyenv, /usr/local)
  for x in "$p" "${p#/usr}" "/usr$p" "$r" "${r#/usr}" "/usr$r" /usr/bin/"$w" /bin/"$w" \
    /usr/sbin/"$w" /sbin/"$w"; do
    pk=$(owner "$x"); [ -z "$pk" ] || break
  done
  if [ -z "$pk" ]; then
    say "$(where "$w"): calls '$w' ($p), which no Debian package ships"
    bad=1; continue
  fi
  seen="$seen $w($pk)"
  good=0
  for k in $(echo "$pk" | tr ',' ' '); do
    echo "$ok" | grep -qxF "$k" && good=1
  done
  if [ $good = 0 ]; then
    say "$(where "$w"): calls '$w' ($r), from the Debian package $pk, which is neither Essential nor in $list (add it there, with why)"
    bad=1
  fi
done
nscripts=$(echo "$scripts" | wc -l)
nprog=$(echo "$prog" | wc -w)
echo "programs (package):$seen"
[ "$bad" = 0 ] || exit 1
echo "ok: $nprog programs called by $nscripts scripts, each from an Essential package or $list"
