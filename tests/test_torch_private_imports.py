"""trainbench supports torch >= 2.11 (the GPU image's) and is developed on a newer one.
torch's private modules and names move between releases, and one imported at a module's
top fails every import of that module, a one-GPU bf16 run's included: a module-level
import of a private torch name must be one seen importing on torch 2.11. Each name below
imported there (`python bench/import_all.py` on torch 2.11.0+cu130, one H200,
2026-11-27; docs/gpu-runs/2026-11-27-h200/import_all.log). A private name used by one
code path only (a CP layout, the check's PP stand-in) is imported where it is used."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "trainbench"

SEEN_ON_TORCH_2_11 = {
    "torch._inductor.config",
    "torch._subclasses.fake_tensor.FakeTensorMode",
    "torch.distributed._symmetric_memory.enable_symm_mem_for_group",
    "torch.distributed._tools.common_utils.get_untyped_storages",
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker",
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper",
    "torch.distributed.pipelining._utils",
    "torch.distributed.pipelining.schedules._batch_p2p",
    "torch.distributed.tensor._redistribute",
    "torch.distributed.tensor._sharding_prop",
    "torch.testing._internal.distributed.fake_pg.FakeStore",
    "torch.utils._python_dispatch.TorchDispatchMode",
}


def private_torch_imports(tree: ast.Module) -> list[str]:
    """The module-level imports of a torch path with a private (underscored) part."""
    found = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            found += [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "torch"]
    return [name for name in found if any(part.startswith("_") for part in name.split("."))]


def test_module_level_private_torch_imports_were_seen_on_torch_2_11():
    unseen = {}
    for path in sorted(SRC.rglob("*.py")):
        for name in private_torch_imports(ast.parse(path.read_text())):
            if name not in SEEN_ON_TORCH_2_11:
                unseen.setdefault(str(path.relative_to(SRC)), []).append(name)
    assert not unseen, ("private torch names imported at module level, not seen on torch "
                        f"2.11 (import them where they are used): {unseen}")


def test_the_scan_finds_a_private_import():
    tree = ast.parse("import os\nfrom torch.distributed.pipelining._utils import "
                     "_make_tensor_from_meta\nfrom torch import nn\n"
                     "def f():\n    from torch._x import y\n")
    assert private_torch_imports(tree) == [
        "torch.distributed.pipelining._utils._make_tensor_from_meta"]


def test_a_source_tree_reports_its_pyproject_version(tmp_path):
    """Run from a source tree (PYTHONPATH=src on a bare GPU image), trainbench has no
    installed metadata: the version comes from pyproject.toml's [project] table, not from
    another table's version key."""
    import trainbench

    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[tool.other]\nversion = "9.9"\n\n[project]\nname = "trainbench"\n'
                         'version = "0.4.2"\n\n[tool.pytest]\nversion = "1.0"\n')
    assert trainbench.pyproject_version(pyproject) == "0.4.2"
    assert trainbench.pyproject_version(tmp_path / "missing.toml") is None
    assert trainbench.pyproject_version(trainbench.PYPROJECT) == trainbench.version()
