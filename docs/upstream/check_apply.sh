#!/usr/bin/env bash
# check_apply.sh PY [SERIES_DIR]: applies the op-level series (this directory, or SERIES_DIR, e.g.
# torch-2.14.1/), in order, to copies of the files it touches from the installed torch (PY's
# site-packages), and the test patches (tests/) to test/test_fake_tensor.py at 6ed5926 if TEST_FILE
# points to a copy; fails on any offset or fuzz. Prints the numstat of each patch.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PY=${1:?usage: check_apply.sh PY [SERIES_DIR]}
SERIES=$(cd "${2:-$HERE}" && pwd)
SP=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
for p in "$SERIES"/000*.patch; do
  for f in $(sed -n 's|^+++ b/\([^\t]*\).*|\1|p' "$p"); do
    [ -e "$TMP/$f" ] || { mkdir -p "$TMP/$(dirname "$f")"; [ -e "$SP/$f" ] && cp "$SP/$f" "$TMP/$f" || true; }
  done
done
for p in "$SERIES"/000*.patch; do
  out=$(cd "$TMP" && patch -p1 --fuzz=0 --no-backup-if-mismatch < "$p")
  if grep -qiE 'offset|fuzz|fail' <<<"$out"; then echo "$out"; echo "$(basename "$p"): not exact" >&2; exit 1; fi
  echo "$(basename "$p"): applies exactly; $(cd "$TMP" && git apply --numstat "$p" 2>/dev/null | awk '{a+=$1; d+=$2} END {print "+" a " -" d}')"
  (cd "$TMP" && git apply --numstat "$p" | sed 's/^/    /')
done
"$PY" -m py_compile $(find "$TMP" -name '*.py')
if [ -n "${TEST_FILE:-}" ]; then
  mkdir -p "$TMP/pt/test"; cp "$TEST_FILE" "$TMP/pt/test/test_fake_tensor.py"
  for p in "$HERE"/tests/000*.patch; do
    out=$(cd "$TMP/pt" && patch -p1 --fuzz=0 --no-backup-if-mismatch < "$p")
    if grep -qiE 'offset|fuzz|fail' <<<"$out"; then echo "$out"; echo "tests/$(basename "$p"): not exact" >&2; exit 1; fi
    echo "tests/$(basename "$p"): applies exactly"
  done
fi
