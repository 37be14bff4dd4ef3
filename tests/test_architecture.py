"""The import contracts in .importlinter: data flows pipeline -> annotation -> leaderboard
with the job lifecycle below them, pipeline.ml stays plain Python, no module of an app is
part of an import circle, management commands and admin actions reach work through
services (never tasks), and the leaderboard reaches the pipeline through pipeline.services
(its one door) plus pipeline.models and pipeline.domains."""

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    exit_code = lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert exit_code == 0, out
    assert "Contracts: 5 kept, 0 broken." in out
    assert "The leaderboard uses the pipeline through pipeline.services" in out
