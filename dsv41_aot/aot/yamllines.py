"""YAML whose mappings and sequences remember the line of each entry.

Every build matrix error can so name the file and line of what it refuses.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from ..errors import MatrixError


class Node(dict):
    """A mapping that remembers the line of each of its keys (1-based)."""

    line: int = 0
    lines: dict


class Seq(list):
    """A sequence that remembers the line of each of its items (1-based)."""

    line: int = 0
    lines: list


class LineLoader(yaml.SafeLoader):
    """A safe loader building Node and Seq; ``path`` names the file in its errors."""

    def __init__(self, stream, path: Path):
        super().__init__(stream)
        self.path = path

    # ``deep`` is SafeLoader's signature; values are always built deep here
    def construct_mapping(self, node, deep=False):
        out = Node(super().construct_mapping(node, deep=True))
        out.line = node.start_mark.line + 1
        out.lines = {}
        for k, _ in node.value:
            name = self.construct_object(k, deep=True)
            if name in out.lines:
                raise MatrixError(f"{self.path}:{k.start_mark.line + 1}: key {name!r} given twice in one mapping")
            out.lines[name] = k.start_mark.line + 1
        return out

    def construct_sequence(self, node, deep=False):
        out = Seq(super().construct_sequence(node, deep=True))
        out.line = node.start_mark.line + 1
        out.lines = [n.start_mark.line + 1 for n in node.value]
        return out


LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, LineLoader.construct_mapping)
LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_SEQUENCE_TAG, LineLoader.construct_sequence)


def line_of(obj, key=None) -> int:
    """The line of ``obj[key]``, else of ``obj`` itself (0: not known)."""
    if key is not None and isinstance(obj, Node) and key in obj.lines:
        return obj.lines[key]
    if key is not None and isinstance(obj, Seq) and isinstance(key, int) and key < len(obj.lines):
        return obj.lines[key]
    return getattr(obj, "line", 0)


def parse(text: str, path: Path):
    """``text``, the file at ``path``, parsed; an error names the file and line."""
    loader = LineLoader(text, path)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise MatrixError(f"{where}: not valid YAML: {getattr(e, 'problem', e)}", fix=f"fix the YAML syntax in {path}") from None
    finally:
        loader.dispose()
