"""Fakes shared by the operator unit tests."""

from __future__ import annotations

from typing import Any


class FakeTI:
    """A task instance that keeps what ``xcom_push`` gets in ``pushed`` (``{key: value}``)."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value
