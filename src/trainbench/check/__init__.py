"""`trainbench check`: build chosen ranks of a real-size plan under a fake process group.

`cli.py` (no torch) turns options into a plan and a list of ranks; `build.py` (torch) runs
the engine's own Trainer.build_model for each rank on the meta device and counts what the
rank holds. Nothing is materialised, so the 405B's ranks build on a laptop.
"""
