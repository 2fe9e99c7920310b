"""The `eyas` command itself: fast help without torch, version, usage errors."""

from __future__ import annotations

import subprocess
import sys

from eyas import __version__


def test_help_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from eyas.cli import app\n"
        "for args in (['--help'], ['prepare', '--help']):\n"
        "    result = CliRunner().invoke(app, args)\n"
        "    assert result.exit_code == 0, result.output\n"
        "heavy = sorted(m for m in ('torch', 'transformers', 'pyarrow', 'datasets') if m in sys.modules)\n"
        "print(','.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == ""


def test_version(run_cli) -> None:
    result = run_cli("--version")
    assert result.code == 0 and result.out.strip() == f"eyas {__version__}"


def test_unknown_command_is_a_usage_error(run_cli) -> None:
    assert run_cli("frobnicate").code == 2
