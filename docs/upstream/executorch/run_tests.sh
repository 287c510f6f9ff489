#!/usr/bin/env bash
# run_tests.sh: builds a patched and an unpatched copy of the installed ExecuTorch 1.5.1 and runs
#   (1) the tests 0001-declare-backend-ops-cacheable.patch adds to ExecuTorch's suite
#       (exir/tests/test_fake_tensor_cacheable_ops.py, backends/arm/test/misc/test_tosa_fake_tensor_cache.py),
#       with torch carrying the series and with the installed (unpatched) torch; and
#   (2) a fixed subset of ExecuTorch's Arm TOSA op tests (ARM_TESTS below: every parameter of each listed
#       test function), unpatched torch + unpatched ExecuTorch against the series + patched ExecuTorch,
#       each run to the end (no time cap), compared test by test from the two junit XML files.
#
# Usage (from anywhere; WORK, PY and, for unit/arm/all, TORCH_TREE are required):
#   export WORK=<scratch dir> PY=<venv>/bin/python TORCH_TREE=<dir holding torch/ with the series>
#   docs/upstream/executorch/run_tests.sh build   # trees only
#   docs/upstream/executorch/run_tests.sh unit    # (1), both ways
#   docs/upstream/executorch/run_tests.sh arm     # (2), both runs in parallel
#   docs/upstream/executorch/run_tests.sh all     # build, unit, arm
#
# Environment:
#   TORCH_TREE  a directory holding torch/ with the series applied (put first on PYTHONPATH), e.g. a
#               hardlinked copy of site-packages/torch with the patched fake_tensor.py. Required.
#   WORK        where the trees, the side directory and the results go. Required (no default).
#   PY          the interpreter with torch 2.13 and ExecuTorch 1.5.1 installed. Required (no
#               default). Nothing is installed into it or written in its
#               site-packages: the ExecuTorch copies are `cp -al` (hardlinks) of the installed package,
#               and every file the patch modifies is replaced by a real copy before patching.
#   ARM_SERIAL  set to 1 to run the two Arm runs one after the other instead of in parallel.
#   ARM_RUNS    which Arm runs to (re)do, default "stock series"; e.g. ARM_RUNS=series with another
#               TORCH_TREE reruns only the patched side and compares it with the stock XML already in
#               results/ (the stock run does not depend on TORCH_TREE).
#
# Layout under WORK:
#   unpatched/executorch  hardlinked copy of the installed package (the "without" ExecuTorch)
#   patched/executorch    the same with the patch applied (patch -p1 --fuzz=0, checked for no offsets)
#   deps/                 pandas, pytz, tzdata, python-dateutil, six (pip --target; devtools.inspector,
#                         which the Arm tester imports, needs pandas; the venv has none)
#   results/              junit XML, logs, summaries
#
# Each run prints which copies of executorch and torch it imports. The Arm tests are run from
# <tree>/executorch/backends/arm/test (its conftest.py, TEST_SEED=0 as its default), PYTHONPATH=<tree>
# [:TORCH_TREE]:deps, so test ids (ops/test_x.py::test_y[param]) are the same in both runs.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# PATCH and UNIT_TESTS may be overridden, e.g. for the alternative's patch:
#   PATCH=docs/upstream/alternative-policy/executorch/0001-exportpass-fake-tensor-cache-policy.patch
#   UNIT_TESTS="exir/tests/test_fake_tensor_cache.py backends/arm/test/misc/test_tosa_fake_tensor_cache.py"
PATCH=${PATCH:-$HERE/0001-declare-backend-ops-cacheable.patch}
: "${WORK:?set WORK to the directory for the trees, deps and results}"
: "${PY:?set PY to the python of the venv with torch 2.13.0 and ExecuTorch 1.5.1}"
[ -x "$PY" ] || { echo "PY=$PY is not an executable" >&2; exit 2; }
SP=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
RES=$WORK/results
DEPS=$WORK/deps

UNIT_TESTS=${UNIT_TESTS:-"exir/tests/test_fake_tensor_cacheable_ops.py backends/arm/test/misc/test_tosa_fake_tensor_cache.py"}
# The Arm subset: 11 files of backends/arm/test/ops/, 18 test functions, 125 tests (ExecuTorch 1.5.1).
ARM_TESTS="
ops/test_add.py::test_add_tensor_tosa_FP
ops/test_add.py::test_add_tensor_tosa_INT
ops/test_add.py::test_add_conv_residual_tosa_INT
ops/test_conv_combos.py::test_convolution_2d_tosa_INT_relu6
ops/test_conv_combos.py::test_convolution_2d_tosa_INT_batchnorm_relu6
ops/test_conv_combos.py::test_convolution_2d_tosa_INT_avgpool2d
ops/test_linear.py::test_linear_tosa_INT
ops/test_mul.py::test_mul_tensor_tosa_INT
ops/test_relu.py::test_relu_tosa_FP
ops/test_relu.py::test_relu_tosa_INT
ops/test_relu.py::test_relu_tosa_INT_conv_folding
ops/test_mm.py::test_mm_tosa_FP
ops/test_mm.py::test_mm_tosa_INT
ops/test_softmax.py::test_softmax_tosa_INT
ops/test_cat.py::test_cat_tosa_INT
ops/test_sigmoid.py::test_sigmoid_tosa_INT
ops/test_hardtanh.py::test_hardtanh_tosa_INT
ops/test_batch_norm.py::test_native_batch_norm_legit_no_training_tosa_INT_conv
"

need_torch_tree() {
  : "${TORCH_TREE:?set TORCH_TREE to a directory holding torch/ with the series applied}"
  [ -f "$TORCH_TREE/torch/_subclasses/fake_tensor.py" ] || { echo "no torch/ in $TORCH_TREE" >&2; exit 2; }
}

# copy_tree OUT: OUT/executorch = hardlinked copy of the installed package.
copy_tree() {
  rm -rf "$1"; mkdir -p "$1"
  cp -al "$SP/executorch" "$1/executorch"
}

build() {
  copy_tree "$WORK/unpatched"
  copy_tree "$WORK/patched"
  local et=$WORK/patched/executorch f t
  # Break the hardlink of every file the patch writes, so that patching never writes the installed one.
  for f in $(sed -n 's|^+++ b/\([^\t]*\).*|\1|p' "$PATCH"); do
    t=$et/$f
    if [ -e "$t" ]; then cp "$t" "$t.unlink.$$"; rm -f "$t"; mv "$t.unlink.$$" "$t"; fi
    rm -f "$(dirname "$t")/__pycache__/$(basename "$t" .py)".*.pyc
  done
  local out
  out=$(patch -p1 --fuzz=0 --no-backup-if-mismatch -d "$et" < "$PATCH")
  echo "$out"
  if grep -qiE 'offset|fuzz|fail' <<<"$out"; then echo "patch did not apply exactly" >&2; exit 1; fi
  if [ ! -d "$DEPS/pandas" ] || [ ! -d "$DEPS/dateutil" ]; then
    "$PY" -m pip install -q --target "$DEPS" --no-deps "pandas==2.3.3" pytz tzdata python-dateutil six
  fi
  mkdir -p "$RES"
}

show_imports() {  # show_imports PYTHONPATH
  (cd /tmp && PYTHONPATH=$1 "$PY" -c '
import executorch.exir as e, torch._subclasses.fake_tensor as f
print("  executorch.exir:", e.__file__)
import torch
api = "(hook)" if hasattr(f.FakeTensorMode, "_cache_policy") else "(register_fake_cacheable)" if hasattr(torch.library, "register_fake_cacheable") else "(no hook)"
print("  fake_tensor    :", f.__file__, api)
' 2>/dev/null)
}

unit_run() {  # unit_run NAME PYTHONPATH
  echo "== unit tests, $1"; show_imports "$2"
  (cd "$WORK/patched/executorch" && PYTHONPATH=$2 "$PY" -m pytest -p no:cacheprovider -q -rA \
      $UNIT_TESTS --junitxml="$RES/unit-$1.xml" > "$RES/unit-$1.log" 2>&1) || true
  grep -E '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ' "$RES/unit-$1.log" | sed 's/ - .*//' || true
  tail -n 1 "$RES/unit-$1.log"
}

unit() {
  need_torch_tree
  unit_run series "$WORK/patched:$TORCH_TREE"
  unit_run unpatched-torch "$WORK/patched"
}

arm_run() {  # arm_run NAME TREE PYTHONPATH
  local start end
  start=$(date +%s)
  (cd "$2/executorch/backends/arm/test" && TEST_SEED=0 PYTHONPATH=$3 "$PY" -m pytest -p no:cacheprovider -q \
      $ARM_TESTS --junitxml="$RES/arm-$1.xml" > "$RES/arm-$1.log" 2>&1) || true
  end=$(date +%s)
  echo "$1: $((end - start)) s wall; $(tail -n 1 "$RES/arm-$1.log")" > "$RES/arm-$1.summary"
}

arm() {
  need_torch_tree
  echo "== Arm TOSA op tests, stock (unpatched torch + unpatched ExecuTorch)"; show_imports "$WORK/unpatched:$DEPS"
  echo "== Arm TOSA op tests, series ($TORCH_TREE + patched ExecuTorch)"; show_imports "$WORK/patched:$TORCH_TREE:$DEPS"
  local runs=${ARM_RUNS:-stock series} bg=
  [ "${ARM_SERIAL:-0}" = 1 ] || bg=1
  for run in $runs; do
    case $run in
      stock) set -- stock "$WORK/unpatched" "$WORK/unpatched:$DEPS" ;;
      series) set -- series "$WORK/patched" "$WORK/patched:$TORCH_TREE:$DEPS" ;;
      *) echo "unknown run $run" >&2; exit 2 ;;
    esac
    if [ -n "$bg" ]; then arm_run "$@" & else arm_run "$@"; fi
  done
  wait
  cat "$RES/arm-stock.summary" "$RES/arm-series.summary"
  compare "$RES/arm-stock.xml" "$RES/arm-series.xml"
}

compare() {  # compare A.xml B.xml: per-test outcomes, counts, every difference (exit 1 if any)
  "$PY" "$HERE/../compare_junit.py" "$1" "$2"
}

case "${1:-all}" in
  build) build ;;
  unit) unit ;;
  arm) arm ;;
  all) build; unit; arm ;;
  *) echo "usage: $0 build|unit|arm|all" >&2; exit 2 ;;
esac
