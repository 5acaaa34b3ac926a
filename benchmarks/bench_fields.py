"""Time contribution_field and shapley_value for n = 20 agents on one core.

Prints the best of 3 runs of each and exits non-zero if either takes more than 1 second.
Run: ``python benchmarks/bench_fields.py [n]``.
"""

from __future__ import annotations

import os

# One thread for the numerical libraries: must be set before numpy is imported.
for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMEXPR_NUM_THREADS"):
    os.environ[var] = "1"

import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

try:
    from threadpoolctl import threadpool_limits  # noqa: E402

    threadpool_limits(1)
except ImportError:
    pass

try:
    import mcpg  # noqa: F401, E402
except ImportError:  # running from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from mcpg.fields import contribution_field, random_game, shapley_value  # noqa: E402

LIMIT_S = 1.0


def best_of(fn, v, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn(v)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    if hasattr(os, "sched_setaffinity"):  # pin to one core
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    v = random_game(n, np.random.default_rng(0))
    ok = True
    for fn in (contribution_field, shapley_value):
        t = best_of(fn, v)
        ok &= t <= LIMIT_S
        print(f"{fn.__name__:<20} n={n}: {t * 1e3:8.1f} ms (best of 3, limit {LIMIT_S:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
