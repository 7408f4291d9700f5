"""The marker of where a rank is in user code (securevfl.usercall), which its
watchdog reads to stop a run whose user code blocks (tests/e2e/test_user_code_ends.py)."""

from __future__ import annotations

import time

from securevfl.defenses.base import Defense
from securevfl.models import build_top
from securevfl.usercall import current, is_user_code, stuck_for, user_call
from tests.support.user_plugin import SelfRegistered


def test_the_user_code_marker_nests_and_says_how_long() -> None:
    assert current() is None
    with user_call("factory 'm:f'"):
        outer = current()
        assert outer is not None and outer[0] == "factory 'm:f'"
        with user_call("defense 'd', hook 'embed'"):
            assert current() is not None and current()[0] == "defense 'd', hook 'embed'"  # type: ignore[index]
            assert stuck_for(60) is None
            what, waited = stuck_for(5, now=time.monotonic() + 6) or ("", 0.0)
            assert what == "defense 'd', hook 'embed'" and 6 <= waited < 7
        assert current() == outer
    assert current() is None and stuck_for(0) is None


def test_user_code_is_code_outside_securevfl() -> None:
    assert not is_user_code(build_top) and not is_user_code(Defense)
    assert is_user_code(SelfRegistered) and is_user_code(test_user_code_is_code_outside_securevfl)
