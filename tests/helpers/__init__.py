"""Code the tests share, imported as ``tests.helpers.<module>``; a few modules are also scripts that
tests start by path (``SCRIPTS / "delay_relay.py"``)."""

from pathlib import Path

SCRIPTS = Path(__file__).resolve().parent
