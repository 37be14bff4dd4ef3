"""The import contracts in .importlinter: data flows pipeline -> annotation -> leaderboard
with the job lifecycle below them and the ground floor (`core`) below that; `core` imports
no app; the model library `prblib` stays plain Python; no module of an app (nor a
sub-package of prblib) is part of an import circle; management commands and admin actions
reach work through services (never tasks); and the leaderboard reaches the pipeline's
Django side through pipeline.services (its one door) plus pipeline.models and pipeline.domains."""

from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent


def test_the_import_contracts_are_kept(monkeypatch, capsys):
    monkeypatch.chdir(ROOT)
    exit_code = lint_imports(config_filename=str(ROOT / ".importlinter"), no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert exit_code == 0, out
    assert "Contracts: 6 kept, 0 broken." in out
    assert "core (the ground floor) imports no app" in out
    assert "prblib (the model library) is plain Python" in out
    assert "The leaderboard uses the pipeline through pipeline.services" in out
