"""A small scanner for the C that TVM's CUDA codegen prints: matching brackets and splitting a block
into its top-level statements (string and char literals skipped). Used by the source patches."""

from __future__ import annotations

import re


def _skip_literal(code: str, i: int) -> int:
    """The index after the string or char literal starting at ``code[i]``."""
    quote, i = code[i], i + 1
    while i < len(code) and code[i] != quote:
        i += 2 if code[i] == "\\" else 1
    return i + 1


def _close(code: str, i: int) -> int:
    """The index of the bracket closing the one at ``code[i]`` (string and char literals skipped)."""
    pairs = {"(": ")", "{": "}", "[": "]"}
    stack = []
    while i < len(code):
        c = code[i]
        if c in "\"'":
            i = _skip_literal(code, i)
            continue
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")}]":
            if not stack or stack.pop() != c:
                raise ValueError("unbalanced brackets")
            if not stack:
                return i
        i += 1
    raise ValueError("unbalanced brackets")


def _statements(code: str) -> list[str]:
    """The top-level C statements of a block body: ``for``/``if``/``while`` with their bodies (and
    ``else`` branches), ``{...}`` blocks, and statements ending in ``;``."""
    out, i = [], 0
    while True:
        while i < len(code) and code[i].isspace():
            i += 1
        if i >= len(code):
            return out
        start = i
        m = re.match(r"(for|if|while)\s*\(", code[i:])
        if m or code[i] == "{":
            while True:
                if m:
                    i = _close(code, i + m.end() - 1) + 1
                    while code[i].isspace():
                        i += 1
                    if code[i] != "{":  # a braceless body: one statement
                        i = code.index(";", i) + 1
                    else:
                        i = _close(code, i) + 1
                else:
                    i = _close(code, i) + 1
                e = re.match(r"\s*else\b\s*", code[i:])
                if not (m and m.group(1) == "if" and e):
                    break
                i += e.end()
                m = re.match(r"(if)\s*\(", code[i:])
                if not m and code[i] != "{":
                    raise ValueError("unsupported else branch")
        else:
            while code[i] != ";":
                i = _close(code, i) + 1 if code[i] in "([{" else _skip_literal(code, i) if code[i] in "\"'" else i + 1
            i += 1
        out.append(code[start:i])
