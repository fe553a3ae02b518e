"""`make bench`: every benchmarks/bench_*.py's run(), measured side by side in one process."""
from __future__ import annotations

import importlib
import pathlib
import sys
import traceback


def main() -> int:
    here = pathlib.Path(__file__).parent
    sys.path.insert(0, str(here.parent))
    failed = 0
    for path in sorted(here.glob("bench_*.py")):
        name = f"benchmarks.{path.stem}"
        print(f"\n=== {path.stem} ===", flush=True)
        try:
            importlib.import_module(name).run()
        except Exception:
            failed += 1
            traceback.print_exc()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
