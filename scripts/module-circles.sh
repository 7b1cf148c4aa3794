#!/usr/bin/env bash
# Import circles and upward imports between the top-level modules of a
# crate's src/ (default cloud-registry/src): for every file, the
# `crate::X` paths it names outside comments, grouped by the file's
# top-level module. Prints "circle: a <-> b" for two modules that name
# each other, and "upward: core -> feature" for a core module (auth, db,
# error, extract, ids, storage, http_server, fdlimit) naming any other.
# Prints nothing when there is neither.
set -euo pipefail
src="${1:-cloud-registry/src}"
core=" auth db error extract ids storage http_server fdlimit "
cd "$src"
edges=$(for f in $(find . -name '*.rs' ! -path './bin/*' ! -name main.rs ! -name lib.rs); do
  m=$(echo "$f" | sed -E 's#^\./##; s#/.*##; s#\.rs$##')
  grep -vE '^\s*//' "$f" | grep -ohE 'crate::[a-z_]+' | sed 's/crate:://' | sort -u | sed "s/^/$m /" || true
done | awk '$1 != $2' | sort -u)
echo "$edges" | awk 'NF == 2 { e[$1" "$2] = 1 } END { for (k in e) { split(k, p, " "); if ((p[2]" "p[1]) in e && p[1] < p[2]) print "circle: " p[1] " <-> " p[2] } }'
echo "$edges" | while read -r a b; do
  [ -n "${a:-}" ] || continue
  case "$core" in *" $a "*) case "$core" in *" $b "*) ;; *) echo "upward: $a -> $b";; esac;; esac
done
