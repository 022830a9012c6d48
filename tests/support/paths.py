"""Where things are in the checkout, for tests at any depth under tests/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
