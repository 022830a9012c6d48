"""The grpcurl binary the test extra installs."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

GRPCURL = shutil.which("grpcurl") or str(Path(sys.executable).parent / "grpcurl")
