"""Final-answer extraction shared by the verifiers.

The paper's appendix "Prompt Templates" fixes one answer format per task family:
``\\boxed{}`` for mathematics and multiple choice, ``<answer> </answer>`` tags for
open QA and Countdown, and one Python code block for MBPP ("Answer extraction
follows the same task-family contract as scoring"). Every extractor here takes the
*last* answer in the response, so a model may think aloud, revise, and end with its
final answer.

All three scanners are linear in the response length (no regular expression that
can backtrack quadratically on adversarial text such as thousands of unclosed
``\\boxed{`` or code fences).
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("boxed", "fbox")
_ANSWER_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)
_PY_LANGS = frozenset({"", "python", "py", "python3", "py3"})


def _box_command_at(text: str, i: int) -> int:
    """If ``text[i]`` starts ``\\boxed`` or ``\\fbox`` (not a longer name), return the index after it, else -1."""
    for name in _BOX_COMMANDS:
        end = i + 1 + len(name)
        if text.startswith(name, i + 1) and not (end < len(text) and text[end].isalpha()):
            return end
    return -1


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``; None if there is none.

    Braces nest (``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``); escaped ``\\{``/``\\}``
    do not count. "Last" is by closing position, so for ``\\boxed{\\boxed{3}}`` the outer
    box wins and its content is ``\\boxed{3}`` (the math normaliser unwraps it). A box
    that never closes (a truncated response) is ignored. The brace-less form
    ``\\boxed 5`` is accepted and yields the next whitespace-delimited token (minus a
    trailing ``$``). The content is returned verbatim (not stripped).
    """
    last: str | None = None
    # stack entries: content start index for an open box, -1 for a plain group
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            if i + 1 < n and text[i + 1] in "{}":
                i += 2  # an escaped brace never opens or closes a group
                continue
            after = _box_command_at(text, i)
            if after < 0:
                i += 1
                continue
            j = after
            while j < n and text[j] in " \t":
                j += 1
            if j < n and text[j] == "{":
                stack.append(j + 1)
                i = j + 1
            elif j > after and j < n:
                k = j
                while k < n and not text[k].isspace() and text[k] != "$":
                    k += 1
                last = text[j:k]
                i = k
            else:
                i = after
            continue
        if c == "{":
            stack.append(-1)
        elif c == "}" and stack:
            start = stack.pop()
            if start >= 0:
                last = text[start:i]
        i += 1
    return last


def last_answer_block(text: str) -> str | None:
    """Content of the last closed ``<answer>...</answer>`` block (tags case-insensitive), or None.

    The block is the last closing tag and the nearest opening tag before it, so
    ``<answer> a <answer> b </answer>`` yields ``" b "``. Returned verbatim.
    """
    closes = list(_ANSWER_CLOSE.finditer(text))
    if not closes:
        return None
    close = closes[-1]
    opens = [m for m in _ANSWER_OPEN.finditer(text, 0, close.start())]
    if not opens:
        return None
    return text[opens[-1].end():close.start()]


def code_blocks(text: str) -> list[tuple[str, str]]:
    """All closed Markdown code fences in order, as ``(language, code)``.

    Fences pair up in order (1st opens, 2nd closes, ...) as Markdown renders them;
    the language is the info string after the opening fence, lower-cased; the code
    is everything after the opening fence's line up to the closing fence. An odd
    final fence (a truncated response) opens a block that never closes and is
    dropped.
    """
    fences: list[int] = []
    start = 0
    while True:
        k = text.find("```", start)
        if k < 0:
            break
        fences.append(k)
        start = k + 3
        while start < len(text) and text[start] == "`":  # ```` counts as one fence
            start += 1
    blocks: list[tuple[str, str]] = []
    for a, b in zip(fences[0::2], fences[1::2]):
        body_start = a + 3
        newline = text.find("\n", body_start, b)
        if newline < 0:  # ```inline``` on one line: no info string
            blocks.append(("", text[body_start:b]))
            continue
        info = text[body_start:newline].strip().strip("`").lower()
        lang = info.split()[0] if info else ""
        blocks.append((lang, text[newline + 1:b]))
    return blocks


def last_python_block(text: str) -> str | None:
    """Code of the last fenced block labelled python/py/python3 or unlabelled; None if none."""
    for lang, code in reversed(code_blocks(text)):
        if lang in _PY_LANGS:
            return code
    return None


def strip_latex_wrappers(s: str, commands: tuple[str, ...] = ("text", "textbf", "mathrm", "mathbf",
                                                             "textrm", "mbox", "boxed", "fbox")) -> str:
    """Replace every ``\\cmd{X}`` for ``cmd`` in ``commands`` by ``X`` (nested braces respected).

    Repeats until nothing changes, so ``\\text{\\textbf{B}}`` -> ``B``. An unclosed
    ``\\cmd{`` is left as it is.
    """
    pattern = re.compile(r"\\(" + "|".join(map(re.escape, commands)) + r")(?![A-Za-z])\s*\{")
    while True:
        m = pattern.search(s)
        changed = False
        while m is not None:
            depth, j = 1, m.end()
            while j < len(s) and depth:
                if s[j] == "\\" and j + 1 < len(s) and s[j + 1] in "{}":
                    j += 2
                    continue
                depth += {"{": 1, "}": -1}.get(s[j], 0)
                j += 1
            if depth == 0:
                s = s[:m.start()] + s[m.end():j - 1] + s[j:]
                changed = True
                m = pattern.search(s, m.start())
            else:
                m = pattern.search(s, m.end())
        if not changed:
            return s
