"""compare_junit.py A.xml B.xml: per-test outcomes (classname::name) of two junit files, their counts, every difference;
exits 1 if they differ, as diff does."""

import collections
import sys
import xml.etree.ElementTree as ET

ORDER = ["passed", "xfailed", "skipped", "failed", "error"]


def outcomes(path: str) -> dict[str, str]:
    res: dict[str, str] = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        kinds = {c.tag: c for c in tc}
        if "failure" in kinds:
            out = "failed"
        elif "error" in kinds:
            out = "error"
        elif "skipped" in kinds:
            out = "xfailed" if kinds["skipped"].get("type") == "pytest.xfail" else "skipped"
        else:
            out = "passed"
        tid = f'{tc.get("classname")}::{tc.get("name")}'
        if tid not in res or ORDER.index(out) > ORDER.index(res[tid]):
            res[tid] = out
    return res


if __name__ == "__main__":
    a, b = outcomes(sys.argv[1]), outcomes(sys.argv[2])
    for label, path, res in (("A", sys.argv[1], a), ("B", sys.argv[2], b)):
        print(f"{label} {path}: {len(res)} tests,", dict(sorted(collections.Counter(res.values()).items())))
    diffs = [(t, a.get(t, "missing"), b.get(t, "missing")) for t in sorted(set(a) | set(b)) if a.get(t) != b.get(t)]
    print(f"{len(diffs)} differences (A -> B)")
    for t, x, y in diffs:
        print(f"  {t}: {x} -> {y}")
    sys.exit(1 if diffs else 0)
