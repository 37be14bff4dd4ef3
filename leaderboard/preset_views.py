"""The Supported models page (`/models/supported/`): every model preset (prblib/rewards/presets.py) and
what it sets. Public: presets are data of the platform, not of anyone's submission."""

from __future__ import annotations

from django.shortcuts import render

from prblib.rewards import presets


def supported_models(request):
    """Every model preset: the family, the released checkpoints it fits and what it sets."""
    rows = [{"preset": p, "settings": p.settings_shown()} for p in presets.PRESETS]
    return render(request, "leaderboard/supported_models.html", {"presets": rows, "rm_types": presets.RM_TYPES})
