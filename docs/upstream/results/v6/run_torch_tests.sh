#!/bin/bash
# torch's test_fake_tensor.py at 6ed5926, unpatched vs the proposed series, per release; then with the test patches.
set -u
U=/work/wt-rfc/docs/upstream
T=/tmp/rfc44/t
mkdir -p $T/junit
rm -rf $T/pt-stock $T/pt-patched
mkdir -p $T/pt-stock/test && cp /tmp/up6/pt-stock/test/test_fake_tensor.py $T/pt-stock/test/
cp -r $T/pt-stock $T/pt-patched && (cd $T/pt-patched && for p in $U/tests/000*.patch; do patch -s -p1 --fuzz=0 < $p || exit 1; done)
declare -A PY=([2.13.0]=/work/main/.venv/bin/python [2.14.1]=/tmp/rfc44/v214/bin/python [2.15.0]=/tmp/rfc44/v215/bin/python)
declare -A DIR=([2.13.0]=$U [2.14.1]=$U/torch-2.14.1 [2.15.0]=$U/torch-2.15.0)
FILES="torch/_subclasses/fake_tensor.py torch/_library/__init__.py torch/_library/custom_ops.py torch/library.py torch/ao/quantization/fx/_decomposed.py"
for R in ${RELEASES:-2.13.0 2.14.1 2.15.0}; do
  py=${PY[$R]}; SP=$($py -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  tree=$T/tree-$R; rm -rf $tree; mkdir -p $tree; cp -al $SP/torch $tree/torch
  for f in $FILES; do rm -f $tree/$f; cp $SP/$f $tree/$f; done
  (cd $tree && for p in ${DIR[$R]}/000*.patch; do patch -p1 --fuzz=0 < $p | grep -iE "offset|fuzz|fail" && exit 1; done; true) || { echo "apply failed $R"; exit 1; }
  for side in unpatched series; do
    pp=""; [ $side = series ] && pp=$tree
    for tf in stock patched; do
      extra=""; 
      ( cd $T/pt-$tf && PYTHONPATH=$pp PYTHONDONTWRITEBYTECODE=1 timeout 3000 $py -m pytest -q -p no:cacheprovider test/test_fake_tensor.py --junitxml=$T/junit/$R-$side-$tf.xml > $T/junit/$R-$side-$tf.log 2>&1 )
      echo "$R $side $tf: $(tail -1 $T/junit/$R-$side-$tf.log)"
    done
  done
done
echo TESTS-DONE
