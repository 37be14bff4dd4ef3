"""Command-line helpers shared by management commands."""

from django.core.management.base import CommandError

from pipeline.services import OptionsError, option_pairs


def parse_option_pairs(pairs: list[str]) -> dict:
    """--option KEY=VALUE arguments as a dict (`pipeline.services.option_pairs`); CommandError for a malformed one."""
    try:
        return option_pairs(pairs)
    except OptionsError as exc:
        raise CommandError(f"--option {exc}") from None
