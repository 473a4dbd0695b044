"""Reading the files a user hands trainbench, with bounds checked before anything expands.

- Only regular files are read. A FIFO or a character device never ends (or blocks until a
  writer comes), a socket cannot be read, a directory is not a file: each is refused with
  what it is (NotRegularFile), and it is opened without blocking so that refusing it
  cannot hang either.
- Text files (the cluster config, sweep files, plan/run/exit.json) are read up to a size
  that no real one approaches; a larger file is refused, not loaded.
- YAML is loaded by a SafeLoader that counts the nodes its aliases expand to before it
  builds anything: a "billion laughs" document (anchors of lists of aliases of lists) is
  a few hundred bytes on disk and billions of nodes in memory.
- `brief` shows a value in a message without ever taking the repr of something large.

No torch, no rich: the CLI's start-up imports this.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import BinaryIO

import yaml

MAX_TEXT_BYTES = 4 * 2**20
"""The largest cluster config or sweep file read (real ones are a few KB)."""
MAX_RECORD_BYTES = 64 * 2**20
"""The largest JSON record of a run read (plan.json, run.json, exit.json: KB to a few MB
at thousands of ranks)."""
MAX_YAML_NODES = 20_000
"""Values a YAML document may hold, as written and once its aliases are expanded (a sweep
of a hundred tasks with every option spelled out holds a few thousand)."""

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISDIR, "a directory"))


class NotRegularFile(OSError):
    """A path that is not a regular file; its message says what it is instead."""

    def __init__(self, path: str | Path, kind: str):
        super().__init__(errno.EINVAL, f"{kind}, not a regular file", str(path))
        self.kind = kind

    def __str__(self) -> str:
        return f"{self.filename} is {self.kind}, not a regular file"


class TooLarge(OSError):
    """A text file larger than the bound its reader sets."""

    def __init__(self, path: str | Path, size: int, limit: int):
        super().__init__(errno.EFBIG, f"larger than {limit // 2**20} MiB", str(path))
        self.size, self.limit = size, limit

    def __str__(self) -> str:
        return (f"{self.filename} is {self.size / 2**20:.0f} MiB, larger than the "
                f"{self.limit // 2**20} MiB any such file holds")


def file_kind(mode: int) -> str:
    for test, kind in _KINDS:
        if test(mode):
            return kind
    return "a special file"


def open_regular(path: str | Path) -> BinaryIO:
    """The file opened for binary reading, or NotRegularFile (a FIFO, device, socket or
    directory) or the OSError of the open. Opening never blocks: a FIFO without a writer
    is opened non-blocking, seen to be a FIFO and closed."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing)
            raise NotRegularFile(path, "a socket") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(path, file_kind(mode))
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def is_regular(path: str | Path) -> bool:
    """True for a regular file (a symlink to one counts), without opening it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def read_bounded(path: str | Path, limit: int = MAX_TEXT_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes; NotRegularFile, TooLarge or
    the OSError of the read otherwise."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        if size > limit:
            raise TooLarge(path, size, limit)
        data = fh.read(limit + 1)
    if len(data) > limit:  # grew while being read
        raise TooLarge(path, len(data), limit)
    return data


def tail_lines(path: str | Path, count: int, max_bytes: int = 64 * 2**10) -> list[str]:
    """The last `count` lines among the file's last `max_bytes` bytes, decoded with
    replacement; a file of any size (or one line of gigabytes) costs max_bytes."""
    with open_regular(path) as fh:
        size = os.fstat(fh.fileno()).st_size
        fh.seek(max(0, size - max_bytes))
        data = fh.read(max_bytes)
    lines = data.decode("utf-8", "replace").splitlines()
    if size > max_bytes and lines:
        lines = lines[1:]  # the first one started before the bytes read
    return lines[-count:]


def describe_read_error(err: OSError) -> str:
    """Why a file could not be read, in a few words (no errno number, no repr)."""
    if isinstance(err, (NotRegularFile, TooLarge)):
        return str(err)
    what = err.strerror or type(err).__name__
    return f"cannot read {err.filename}: {what}" if err.filename else f"cannot read it: {what}"


# --- YAML with its expansion bounded -------------------------------------------------------------

class YAMLBoundError(ValueError):
    """A YAML document too large once expanded, recursive, or nested too deeply."""


def load_yaml(text: str, max_nodes: int = MAX_YAML_NODES):
    """yaml.safe_load of text, refusing (YAMLBoundError) a document whose aliases expand to
    more than max_nodes nodes or refer to themselves, before anything is constructed. The
    expanded size of each node is counted once (aliases share their node), so the count
    itself costs time linear in the document as written. yaml.YAMLError passes through."""
    loader = _counting_loader()(text)
    loader.node_budget = max_nodes
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLBoundError("nested too deeply") from None
        if node is None:
            return None
        _check_expansion(node, max_nodes)
        try:
            return loader.construct_document(node)
        except RecursionError:
            raise YAMLBoundError("nested too deeply") from None
        except (ValueError, OverflowError):  # int() refuses an integer of 5,000 digits
            raise YAMLBoundError("a value is beyond what a number can hold (an integer of "
                                 "thousands of digits?)") from None
    finally:
        loader.dispose()


_LOADER = None


def _counting_loader():
    """A SafeLoader that stops composing past its node budget: the nodes as written are
    bounded while they are read, their expansion by aliases before anything is built."""
    global _LOADER
    if _LOADER is None:
        class CountingLoader(yaml.SafeLoader):
            node_budget = MAX_YAML_NODES
            composed = 0

            def compose_node(self, parent, index):
                self.composed += 1
                if self.composed > self.node_budget:
                    raise YAMLBoundError(f"it holds more than {self.node_budget:,} values")
                return super().compose_node(parent, index)

        _LOADER = CountingLoader
    return _LOADER


def _check_expansion(root, max_nodes: int) -> None:
    """YAMLBoundError when the node graph, its aliases expanded, holds more than max_nodes
    nodes or a cycle. Iterative: a deep document cannot exhaust the stack here."""
    size: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[object, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            total = 1 + sum(size[id(child)] for child in _children(node, yaml))
            if total > max_nodes:
                raise YAMLBoundError(f"its aliases expand it to more than {max_nodes:,} "
                                     "values (a YAML alias bomb?)")
            size[key] = total
            continue
        if key in size:
            continue
        if key in on_path:
            raise YAMLBoundError("an alias refers to the collection that holds it")
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node, yaml):
            if id(child) in on_path:
                raise YAMLBoundError("an alias refers to the collection that holds it")
            if id(child) not in size:
                stack.append((child, False))


def _children(node, yaml) -> list:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


# --- values in messages ---------------------------------------------------------------------------

def brief(value, limit: int = 60) -> str:
    """A value as a message shows it: a scalar's repr cut to `limit` characters, a
    collection by its type and length (its items are never formatted)."""
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key(s)"
    if isinstance(value, (list, tuple, set)):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1} digits"
    text = repr(value) if isinstance(value, (str, int, float, bool, type(None))) \
        else f"a {type(value).__name__}"
    return text if len(text) <= limit else text[:limit - 3] + "..."
