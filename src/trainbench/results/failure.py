"""The line of a log that says why its run failed, read backwards from the log's end."""

from __future__ import annotations

import os
import re
from pathlib import Path

from ..files import open_regular
from .parse import CHUNK_SIZE, MAX_LINE, _cut, _segments
from .status import classify_failure, failure_rank


# --- the line that says why a run failed -------------------------------------------------------

_ERROR_MARKERS = (b"Error", b"Exception", b"exception", b"error:", b"Traceback", b"Killed",
                  b"out of memory", b"CANCELLED", b"Watchdog caught", b"NCCL error",
                  b"Segmentation fault", b"SIGSEGV", b"SIGKILL", b"NODE FAILURE",
                  b"TIME LIMIT", b"No space left", b"timed out", b"Timeout", b"exitcode",
                  b"Signal ", b"NODE_FAIL", b"Node failure")
# `RuntimeError: ...`, `srun: error: ...`, `torch.OutOfMemoryError: ...`: the line that says
# what went wrong, preferred over `Traceback (most recent call last):` and the like.
_STRONG_ERROR = re.compile(
    r"\b\w*(?:Error|Exception)\b:|\berror:|out of memory|CANCELLED|\bKilled\b")
# The last bytes of a failed log hold its cause; a cause is looked for this far back.
_CAUSE_WINDOW = 32 * 2**20


def find_failure(path: str | Path, chunk_size: int = CHUNK_SIZE,
                 max_bytes: int | None = None) -> tuple[str | None, str | None]:
    """(failure class, line) of a log: among its last lines, the line of the most
    specific known cause (status.FAILURE_CLASSES: out of memory before the NCCL timeout
    it provokes, before the SIGABRT that follows); without one, the last error-looking
    line (an exception message preferred over a bare `Traceback`) and class None.
    max_bytes: read no further back than this from the end."""
    weak: str | None = None
    strong: str | None = None
    best: tuple[int, str, str] | None = None
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        end = size
        tail = b""
        while end > 0:
            start = max(0, end - chunk_size)
            fh.seek(start)
            buf = fh.read(end - start) + tail
            # The first (partial) line of this block is completed by the next block back.
            newline = buf.find(b"\n")
            if start > 0 and newline < 0 and len(buf) <= MAX_LINE:
                tail, end = buf, start  # no line break yet: the whole block is one partial line
                continue
            cut = newline + 1 if start > 0 else 0
            lines = []
            for seg_start, seg_end in _segments(buf, cut, len(buf), _ERROR_MARKERS):
                lines.append(_cut(buf, seg_start, seg_end).decode("utf-8", "replace").strip())
            for line in reversed(lines):
                if not line or "train_step_timing" in line:
                    continue
                line = line[:500]
                cls = classify_failure(line)
                if cls is not None:
                    rank = failure_rank(cls)
                    if best is None or rank < best[0]:
                        best = (rank, cls, line)
                elif _STRONG_ERROR.search(line):
                    strong = strong or line
                else:
                    weak = weak or line
            tail = buf[:cut]
            end = start
            if best is not None and size - end >= _CAUSE_WINDOW:
                break
            if best is None and strong is not None:
                break
            if max_bytes is not None and size - end >= max_bytes:
                break
    if best is not None:
        return best[1], best[2]
    return None, strong or weak


def find_last_error(path: str | Path, chunk_size: int = CHUNK_SIZE) -> str | None:
    """The line that says why a run failed (see find_failure)."""
    return find_failure(path, chunk_size)[1]
