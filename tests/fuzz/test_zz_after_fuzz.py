"""After every other fuzz test (pytest runs this file last): the victims are as they were, and each
completes when its owner answers it. Sets the `approvals lost` figure."""

from __future__ import annotations

import pytest

from tests.fuzz.harness import Fuzz, final_check

pytestmark = pytest.mark.integration


def test_no_pending_approval_changed_and_each_completes_for_its_owner(fuzz: Fuzz) -> None:
    final_check(fuzz)
