"""cluster/names.py's printable: what a terminal may show of text read from a node."""

import pytest

from cluster.names import printable


@pytest.mark.parametrize("raw, shown", [
    ("runs/qa-1", "runs/qa-1"),
    ("out\x1b[2Jput", "output"),                      # clear screen
    ("\x1b]0;owned title\x07name", "name"),           # OSC window title, BEL-terminated
    ("\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"),  # OSC 8 hyperlink, ST-terminated
    ("\x1b[31mred\x1b[0m", "red"),
    ("a\nb\rc\x00d\x7fe\x9bf", "abcdef"),             # newline, CR, NUL, DEL, C1 CSI
    ("model\u202egpj.exe", "modelgpj.exe"),           # right-to-left override
    ("x\u2066y\u2069z\u200f", "xyz"),                 # isolates and a mark
    ("tab\there", "tab here"),
    ("naïve Ünïcode 字", "naïve Ünïcode 字"),         # letters stay
])
def test_printable_removes_what_a_terminal_would_act_on_and_keeps_text(raw, shown):
    assert printable(raw) == shown
