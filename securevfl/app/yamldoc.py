"""YAML as securevfl reads it: protocol files, comparison files, ``--set`` and
``--grid`` values.

PyYAML's safe loader (YAML 1.1) with three refusals and one reading of YAML 1.2:

* ``1e-3``, ``1E5`` and ``2.5e3`` are numbers. YAML 1.1's float pattern wants a
  dot and a signed exponent, so PyYAML reads ``lr: 1e-3`` as the string
  ``'1e-3'``; the YAML 1.2 core schema (and every JSON parser) reads a number.
* A key repeated in one mapping is an error naming the key and its lines
  (PyYAML keeps the last value silently). A key that an explicit entry sets over
  a merged one (``<<: *base``) is YAML's override, not a repetition.
* A document whose aliases would expand to more than :data:`MAX_VALUES` values is
  refused before anything walks it: ten nested levels of nine aliases are a
  kilobyte of text that expands to 3.5 billion values (a "billion laughs" bomb),
  and the number check, the schema and the digest walk the expanded document.
* An alias inside the node it names (a recursive document) is refused: no
  protocol field is recursive, and walking it would never end.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from securevfl.errors import ConfigError

#: values (scalars, sequences and mappings) a document may expand to through its
#: aliases; a protocol file holds a few hundred, one listing a wide party's column
#: names some tens of thousands
MAX_VALUES = 1_000_000
MERGE_TAG = "tag:yaml.org,2002:merge"


class Refused(yaml.YAMLError):
    """A document securevfl does not read (see the module docstring)."""


class _Loader(yaml.SafeLoader):
    """The safe loader, plus YAML 1.2 exponent floats and a duplicate-key check."""

    def compose_mapping_node(self, anchor: Any) -> MappingNode:  # anchor: the node's name or None
        # checked as composed, before merge keys are expanded into the mapping
        node: MappingNode = super().compose_mapping_node(anchor)
        seen: dict[tuple[str, str], int] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag == MERGE_TAG:
                continue
            key = (key_node.tag, key_node.value)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise Refused(
                    f"the key '{key_node.value}' appears twice in one mapping (lines {seen[key]} and "
                    f"{line}); YAML would silently keep the last one: remove one of them"
                )
            seen[key] = line
        return node


# YAML 1.2 core schema floats with an exponent that YAML 1.1's pattern misses: no dot
# (1e-3), or an unsigned exponent (1.5e3); the 1.1 pattern still reads everything else
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9][0-9_]*)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def expanded_size(node: Node, limit: int = MAX_VALUES) -> int:
    """How many values ``node`` stands for once every alias is expanded (a node an
    alias repeats counts each time). Raises :class:`Refused` beyond ``limit`` or for
    a node that contains itself. Linear in the composed graph: each node's size is
    computed once."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(n: Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise Refused("an alias refers to a node that contains it (a recursive document)")
        open_.add(key)
        total = 1
        if isinstance(n, SequenceNode):
            total += sum(size(c) for c in n.value)
        elif isinstance(n, MappingNode):
            total += sum(size(k) + size(v) for k, v in n.value)
        if total > limit:
            raise Refused(
                f"its aliases expand it to more than {limit:,} values (an alias bomb?); "
                "a protocol file needs nothing like that"
            )
        open_.discard(key)
        sizes[key] = total
        return total

    return size(node)


def _load(text: str) -> Any:
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_yaml(text: str, *, source: str | None = None) -> Any:
    """Parse one YAML document (see the module docstring); anything unreadable is
    a :class:`ConfigError` naming ``source``."""
    try:
        return _load(text)
    except Refused as exc:
        raise ConfigError(f"not accepted as YAML: {exc}", source=source) from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"not valid YAML: {exc}", source=source) from None
    except RecursionError:
        raise ConfigError("not valid YAML: nested too deeply", source=source) from None


def parse_value(text: str, *, path: str, what: str = "override value") -> Any:
    """A ``--set`` or ``--grid`` value, read as in a protocol file; a
    :class:`ConfigError` at ``path`` if it is not valid YAML."""
    try:
        return _load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"{what} is not valid YAML: {exc}", path=path) from None
