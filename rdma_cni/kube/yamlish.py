"""Reading kubeconfig files without a YAML library.

kubeconfigs are written by kubectl, kubeadm and cloud consoles in one narrow YAML shape: block
mappings, block sequences of mappings, plain or quoted scalars, comments. This reader handles that
shape (and JSON, which is valid YAML) and refuses anything else with the line number, so a kubeconfig
it cannot read is a clear config error rather than a wrong server or a missing token.

    >>> load("a:\\n  - name: x\\n    v: 'y'\\n")
    {'a': [{'name': 'x', 'v': 'y'}]}
"""

from __future__ import annotations

import json
from typing import Any


class YamlError(ValueError):
    """The text is outside the YAML subset this reader understands."""


def load(text: str) -> Any:
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            return json.loads(text)
        except ValueError as exc:
            raise YamlError(f"invalid JSON: {exc}") from exc
    lines = _significant_lines(text)
    if not lines:
        return None
    value, pos = _parse_block(lines, 0, lines[0][1])
    if pos != len(lines):
        raise YamlError(f"line {lines[pos][0]}: unexpected indentation")
    return value


_Line = tuple[int, int, str]  # (line number, indent, content without indent)


def _significant_lines(text: str) -> list[_Line]:
    out: list[_Line] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlError(f"line {number}: tabs are not allowed for indentation")
        content = _strip_comment(raw).rstrip()
        if not content.strip() or content.strip() in ("---", "..."):
            continue
        indent = len(content) - len(content.lstrip(" "))
        out.append((number, indent, content.strip()))
    return out


def _strip_comment(line: str) -> str:
    quote = ""
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = ""
        elif ch in "'\"" and (i == 0 or line[i - 1] in " :-[{,"):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] == " "):
            return line[:i]
    return line


def _parse_block(lines: list[_Line], pos: int, indent: int) -> tuple[Any, int]:
    if lines[pos][2].startswith("- ") or lines[pos][2] == "-":
        return _parse_sequence(lines, pos, indent)
    return _parse_mapping(lines, pos, indent)


def _parse_sequence(lines: list[_Line], pos: int, indent: int) -> tuple[list[Any], int]:
    items: list[Any] = []
    while (
        pos < len(lines)
        and lines[pos][1] == indent
        and (lines[pos][2] == "-" or lines[pos][2].startswith("- "))
    ):
        number, _, content = lines[pos]
        rest = content[1:].lstrip()
        if not rest:
            pos += 1
            if pos < len(lines) and lines[pos][1] > indent:
                value, pos = _parse_block(lines, pos, lines[pos][1])
            else:
                value = None
            items.append(value)
            continue
        # "- key: value" opens a mapping whose further keys are indented to where "key" starts.
        inner_indent = indent + (len(content) - len(rest))
        lines[pos] = (number, inner_indent, rest)
        if _split_key(rest) is None:
            items.append(_scalar(rest, number))
            pos += 1
        else:
            value, pos = _parse_mapping(lines, pos, inner_indent)
            items.append(value)
    return items, pos


def _parse_mapping(lines: list[_Line], pos: int, indent: int) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    while pos < len(lines) and lines[pos][1] == indent:
        number, _, content = lines[pos]
        split = _split_key(content)
        if split is None:
            raise YamlError(f"line {number}: expected 'key: value', got {content[:40]!r}")
        key, rest = split
        pos += 1
        if rest:
            out[key] = _scalar(rest, number)
        elif pos < len(lines) and (
            lines[pos][1] > indent or (lines[pos][1] == indent and lines[pos][2].startswith("- "))
        ):
            out[key], pos = _parse_block(lines, pos, lines[pos][1])
        else:
            out[key] = None
    if pos < len(lines) and lines[pos][1] > indent:
        raise YamlError(f"line {lines[pos][0]}: unexpected indentation")
    return out, pos


def _split_key(content: str) -> tuple[str, str] | None:
    if content[0] in "'\"":
        end = content.find(content[0], 1)
        if end < 0 or not content[end + 1 :].startswith(":"):
            return None
        return content[1:end], content[end + 2 :].strip()
    idx = content.find(": ")
    if idx < 0:
        if content.endswith(":"):
            return content[:-1], ""
        return None
    return content[:idx], content[idx + 2 :].strip()


def _scalar(text: str, number: int) -> Any:
    if text[0] in "|>":
        raise YamlError(f"line {number}: block scalars ('|', '>') are not supported; use a quoted string")
    if text[0] in "[{":
        try:
            return json.loads(text)
        except ValueError as exc:
            raise YamlError(f"line {number}: only JSON-compatible flow collections are supported") from exc
    if text[0] == '"':
        try:
            value: str = json.loads(text)
        except ValueError as exc:
            raise YamlError(f"line {number}: bad double-quoted string") from exc
        return value
    if text[0] == "'":
        if len(text) < 2 or text[-1] != "'":
            raise YamlError(f"line {number}: unterminated single-quoted string")
        return text[1:-1].replace("''", "'")
    if text in ("null", "~"):
        return None
    if text in ("true", "True"):
        return True
    if text in ("false", "False"):
        return False
    try:
        return int(text)
    except ValueError:
        return text
