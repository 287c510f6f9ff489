"""Two threads make declared-op misses (a fresh shape each call) under per-thread contexts; counts bypasses and wrong shapes.

    PYTHONPATH=<dir holding torch/ with 0001-0004 applied> python docs/upstream/results/v6/threadcount.py

Run on the series and on the mutant whose count of context reads is shared by the threads (results/v6/mutants.py,
"context-read count shared by threads"): the mutant adds "nested op read a cache context" bypasses, never a wrong shape.
"""

import sys
import threading

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

lib = torch.library.Library("thrmut", "DEF")
lib.define("f(Tensor x) -> Tensor")
local = threading.local()


@torch.library.register_fake("thrmut::f", lib=lib)
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0] + getattr(local, "extra", 0),))


torch.library.register_fake_cacheable("thrmut::f", lib=lib)
torch.library.register_fake_cache_context("thrmut", lambda: getattr(local, "extra", 0), lib=lib)
wrong: list[tuple[int, int, torch.Size]] = []


def run(extra: int, base: int) -> None:
    local.extra = extra
    with FakeTensorMode():
        for i in range(1, 301):
            y = torch.ops.thrmut.f(torch.empty(base + i))
            if y.shape[0] != base + i + extra:
                wrong.append((extra, i, y.shape))


def main() -> None:
    print("fake_cache:", torch._library.fake_cache.__file__)
    sys.setswitchinterval(1e-6)
    FakeTensorMode.cache_clear()
    threads = [threading.Thread(target=run, args=(extra, base)) for extra, base in ((0, 0), (5, 1000))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = FakeTensorMode.cache_info()
    print("wrong shapes:", len(wrong), "misses:", info.misses, "bypasses:", dict(info.bypasses))


if __name__ == "__main__":
    main()
