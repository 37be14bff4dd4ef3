"""Command-line helpers shared by management commands."""

import json

from django.core.management.base import CommandError


def parse_option_pairs(pairs: list[str]) -> dict:
    """--option KEY=VALUE arguments as a dict: VALUE read as JSON when it parses, else as a string."""
    options = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise CommandError(f"--option {pair!r}: expected KEY=VALUE")
        try:
            options[key] = json.loads(raw)
        except ValueError:  # not JSON (or an integer too long to read): the plain string
            options[key] = raw
    return options
