"""Import every trainbench module and print each that fails: the first check on a GPU
image whose torch is older than the one trainbench is developed on (a private torch
name imported at a module's top fails every import of that module).

    PYTHONPATH=src python bench/import_all.py
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import trainbench


def main() -> int:
    failed = total = 0
    for module in pkgutil.walk_packages(trainbench.__path__, "trainbench."):
        total += 1
        try:
            importlib.import_module(module.name)
        except Exception as err:  # noqa: BLE001 - report each module, go on
            failed += 1
            print(f"import failed: {module.name}: {type(err).__name__}: {err}")
    print(f"{total} trainbench modules, {failed} failed to import")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
