"""No absolute server path in what a researcher reads (issue 33, fault 7, hostile review): the
roots as configured and as resolved (a symlinked MODELS_ROOT), the interpreter's site-packages
and prefix, in job failure reasons, log tails and submission refusals."""

import os
import site
import sys
import sysconfig

import pytest

from jobs.services import redact_server_paths
from leaderboard import services
from tests.leaderboard.test_submissions import sample  # noqa: F401 (a fixture)


@pytest.fixture
def linked_roots(settings, tmp_path, monkeypatch):
    """MODELS_ROOT configured as a symlink (/.../srv/models -> /.../disk/models), the way
    deployments mount a volume; DATA_ROOT likewise; the environment names the link."""
    disk, srv = tmp_path / "disk", tmp_path / "srv"
    for name in ("models", "data"):
        (disk / name).mkdir(parents=True)
    srv.mkdir()
    (srv / "models").symlink_to(disk / "models")
    (srv / "data").symlink_to(disk / "data")
    settings.MODELS_ROOT, settings.DATA_ROOT = srv / "models", srv / "data"
    monkeypatch.setenv("MODELS_ROOT", str(srv / "models"))
    return disk, srv


def test_every_form_of_every_root_is_named(linked_roots):
    disk, srv = linked_roots
    packages = site.getsitepackages()[0]
    text = (f"cannot open {disk}/models/alice-rm/config.json (via {srv}/models/alice-rm); "
            f"prototypes {disk}/data/p.json; "
            f'File "{packages}/transformers/modeling_utils.py", line 12; '
            f'File "{sysconfig.get_paths()["stdlib"]}/json/decoder.py", line 3; '
            f"interpreter {sys.prefix}/bin/python")
    assert redact_server_paths(text) == (
        "cannot open <models>/alice-rm/config.json (via <models>/alice-rm); prototypes <data>/p.json; "
        'File "<site-packages>/transformers/modeling_utils.py", line 12; '
        'File "<python>/json/decoder.py", line 3; interpreter <python>/bin/python')
    assert os.sep + "tmp" not in redact_server_paths(f"{disk}/models/x")


@pytest.mark.django_db
def test_a_refusal_never_spells_out_the_resolved_models_root(linked_roots, researcher, sample):  # noqa: F811
    disk, _ = linked_roots
    request = services.SubmissionRequest(display_name="rm", benchmark="sample", kind="scalar",
                                         settings=("no_profile",), model_path=f"{disk}/models/rm")  # no such folder
    with pytest.raises(services.SubmissionRefused) as caught:
        services.submission_create(user=researcher, request=request)
    everything = str(caught.value) + repr(caught.value.errors)
    assert str(disk) not in everything
    assert str(caught.value) == "model folder <models>/rm does not exist or is not a folder"
