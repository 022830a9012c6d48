"""The product type-checks (mypy over svcproxy/, frontend/ and backends/): a call of the
wrong shape, as an after-sync step taking two arguments where the runner passes three
(which raised after every sync and was only logged), is caught before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ["svcproxy", "frontend", "backends"]
CONFIG = """[mypy]
follow_imports = silent
ignore_missing_imports = True
[mypy-svcproxy.v1.*]
ignore_errors = True
"""


def mypy(tmp_path: Path, *paths: str) -> list[str]:
    config = tmp_path / "mypy.ini"
    config.write_text(CONFIG)
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(config), "--cache-dir",
         str(tmp_path / "cache"), *paths], cwd=ROOT, capture_output=True, text=True,
        timeout=300)
    return [line for line in done.stdout.splitlines() if ": error:" in line]


def test_the_product_type_checks(tmp_path: Path) -> None:
    assert mypy(tmp_path, *CHECKED) == []


def test_a_step_of_the_wrong_shape_is_caught(tmp_path: Path) -> None:
    misuse = tmp_path / "misuse.py"
    misuse.write_text("from svcproxy.sdk.runner import AfterSync\n"
                      "steps: list[AfterSync] = [lambda old, new: None]\n")
    errors = mypy(tmp_path, str(misuse))
    assert errors and all("misuse.py:2: error" in e for e in errors), errors
    assert any("[list-item]" in e for e in errors), errors
