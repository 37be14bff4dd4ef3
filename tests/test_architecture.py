"""The import contracts in .importlinter: data flows pipeline -> annotation -> leaderboard
with the job lifecycle below them, pipeline.ml stays plain Python, no module of an app is
part of an import circle, and management commands and admin actions reach work through
services (never tasks)."""

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    exit_code = lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert exit_code == 0, out
    assert "Contracts: 4 kept, 0 broken." in out
