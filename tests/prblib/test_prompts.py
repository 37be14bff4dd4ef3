"""Every fixed prompt has a name and a version, and its text is pinned per version: changing a
prompt's words without a new version fails here (bump the version, then pin the new hash)."""

import dataclasses

import pytest

from pipeline.manifest import downstream_template_versions, prompt_templates, template_versions
from prblib.prompts import TextTemplate

# sha256 of each template version's texts (TextTemplate.text_sha256). A new version gets a new line;
# a pinned line is never edited.
PINNED = {
    "pairwise-judge@v1": "acaf94dfecff2514e831d688c05ca8c0a66c13a37fbf4c25e06be651ee9b2a26",
    "pairwise-judge-release@v1": "673ae60ed69e1804bad08b38ffa27b18d1b5733e35d9e85ed9cee67fa001f542",
    "pointwise-judge@v1": "2db329ce02323e7a8f4fad66160da110470b191d3178d04c32f07c4d8177b100",
    "pgenrm-native@v1": "7722db1fcbadff09640a5d4fa73b809af563ee5e1dca44edfe9af9d36800693d",
    "pgenrm-published@v1": "faa6eaafd3a632a1fd8ba1420e66b110a31b89ec15da49257753a77cdf76d0bd",
    "rubric-judge@v1": "2626eb6e590c6b5b1de81b3c6d4db9408a9455311041a316a4d6c4f865ce61ce",
    "rubric-judge-release@v1": "55ee005488030d97465344538ac4cd7f815b670031f9d6cc10c9ca634b99c051",
    "policy@v1": "a39f86bc0a839297620bffb5c7a2a7d370dc8da29e41018667289e76f5e50eb3",
    "chosen@v1": "5b4b2b68348dfa103c39ef688c195e21489c5fc2d44685daf743d21e5df3d352",
    "avoid-generic@v1": "e4cabf1b26198c32167e0b00c6960eda1377f6efa44b0c648a3f6173457cb5d7",
    "avoid-contrary@v1": "5777a0ef242149836ad9b99c6ec1d69c412c02f8e531342ccf8be7b93708397f",
    "planner@v1": "9dc71b28a02ef80a881f5dea02e3ea495be0d1454c6cab2761176d5987240351",
    "rm-r1-judge@v1": "bde2fec8eaef0ad129110d27c760681d512a0e274f142dc122a17b194e4d7b39",
    "rm-r1-reasoning-judge@v1": "d3462020990e5053908e87c73d9ec3386acefac2ef8c224c9043c5bc3b03a5b9",
    "r3-pairwise@v1": "a530e969b5d0c3f64e5e2d082f951ed68aa0a4b1d2626c77d939683db6f196ec",
    "r3-pointwise@v1": "01784fd4dbd79ea9e475444011f3eebb164d5ec1ddbfde0d10e9ce6ec0f4da5b",
    "r3-binary@v1": "aea4630798e317ff6c08b1a329bda1908b89e6dbfd244770008973aeea17425e",
}


def unpinned_changes(templates: dict[str, TextTemplate]) -> list[str]:
    """The keys whose text differs from the pinned text of that version, or that are not pinned."""
    problems = []
    for key, template in templates.items():
        if key not in PINNED:
            problems.append(f"{key} is not pinned (add its text_sha256 {template.text_sha256})")
        elif PINNED[key] != template.text_sha256:
            problems.append(f"{key} changed its text without a new version (bump it, then pin the new hash)")
    return problems


def test_every_prompt_text_matches_the_text_pinned_for_its_version():
    templates = prompt_templates()
    assert {"pairwise-judge@v1", "pointwise-judge@v1", "pgenrm-native@v1", "pgenrm-published@v1"} <= set(templates)
    assert unpinned_changes(templates) == []


def test_a_prompt_edited_without_a_new_version_is_caught_and_a_bumped_one_asks_to_be_pinned():
    pairwise = prompt_templates()["pairwise-judge@v1"]
    edited = dataclasses.replace(pairwise, parts=(pairwise.parts[0] + " Be brief.", *pairwise.parts[1:]))
    assert unpinned_changes({edited.key: edited}) == [
        "pairwise-judge@v1 changed its text without a new version (bump it, then pin the new hash)"]
    bumped = dataclasses.replace(edited, version=2)
    assert unpinned_changes({bumped.key: bumped})[0].startswith("pairwise-judge@v2 is not pinned")


def test_each_kind_records_the_templates_it_sends(tmp_path):
    assert template_versions("pairwise") == {"judge": "pairwise-judge@v1"}
    assert template_versions("pointwise", {}) == {"judge": "pointwise-judge@v1"}
    assert template_versions("pgenrm", {"m": 2}) == {"chain": "pgenrm-native@v1"}
    assert template_versions("pgenrm", {"chain_format": "published"}) == {"chain": "pgenrm-published@v1"}
    operator = tmp_path / "authors.json"
    operator.write_text('{"system": "S {history}", "user": "U"}', encoding="utf-8")
    recorded = template_versions("pgenrm", {"chain_format": "published"}, template_file=str(operator))
    assert recorded["chain"].startswith("file:") and len(recorded["chain"]) == 5 + 64
    assert template_versions("scalar") == {} and template_versions("scores") == {}
    assert downstream_template_versions(rm_kind="pairwise") == {
        "policy": "policy@v1", "rubric_judge": "rubric-judge@v1", "rm_judge": "pairwise-judge@v1"}


@pytest.mark.parametrize("bad", [dict(name="", version=1, parts=("x",)), dict(name="a", version=0, parts=("x",)),
                                 dict(name="a", version=True, parts=("x",)), dict(name="a", version=1, parts=())])
def test_a_template_needs_a_name_a_positive_version_and_texts(bad):
    with pytest.raises(ValueError):
        TextTemplate(**bad)
