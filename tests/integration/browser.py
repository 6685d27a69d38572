"""What the browser tests share: numbered full-page screenshots kept as test artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any


class Screenshots:
    """Takes numbered full-page screenshots of a Playwright page into ``folder`` (created).

    ``shot(page, "name")`` writes ``folder/NN-name.png`` (NN from 01) and appends its path to
    :attr:`paths`, which the tests print at the end.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.paths: list[str] = []
        folder.mkdir(parents=True, exist_ok=True)

    def __call__(self, page: Any, name: str) -> None:
        path = self.folder / f"{len(self.paths) + 1:02d}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        self.paths.append(str(path))
