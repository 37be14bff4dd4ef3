import math
import re

from django import template
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import mark_safe

register = template.Library()

# A whole word: after a space or the start; before a space, the end, or one punctuation mark that ends the text
# or precedes a space.
SUBMISSION_PATH = re.compile(r"(?<!\S)(/submissions/\d+/)(?=\s|$|[.,;:)](?:\s|$))")


@register.filter
def link_submissions(text) -> str:
    """A run's reason with the site's own submission pages as links ("... see /submissions/7/"
    -> a link to /submissions/7/); every other character escaped. Only that exact path shape
    becomes a link, so a reason can never carry another address. static/js/submission.js does
    the same when it refreshes a reason."""
    parts = SUBMISSION_PATH.split(str(text or ""))
    return mark_safe("".join(format_html('<a href="{}">{}</a>', part, part) if i % 2 else conditional_escape(part)
                             for i, part in enumerate(parts)))


@register.filter
def pct(value, digits: int = 1):
    """0.7594 -> '75.9'; None, '' (a missing variable) or anything not a finite number -> '—'."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return "—"
    return f"{100 * number:.{int(digits)}f}" if math.isfinite(number) else "—"


@register.filter
def get_item(mapping, key):
    return (mapping or {}).get(key)


@register.simple_tag(takes_context=True)
def sort_url(context, key):
    """Query string that sorts by `key`, toggling the order when already sorted by it."""
    params = context["request"].GET.copy()
    same = params.get("sort", "accuracy") == key
    params["sort"] = key
    params["order"] = "asc" if same and params.get("order", "desc") == "desc" else "desc"
    return "?" + params.urlencode()


@register.filter
def manifest_rows(manifest) -> list[tuple[str, str, bool]]:
    """A result's manifest as (key, text, block) rows for a definition list: scalars as text
    (None as "not recorded", an empty object or list as "none"), objects and lists as indented JSON (block=True, shown in a
    wrapping <pre>), so the page never scrolls sideways on a phone."""
    import json

    rows = []
    for key, value in (manifest or {}).items():
        if isinstance(value, (dict, list)) and not value:
            rows.append((key, "none", False))
        elif isinstance(value, (dict, list)):
            rows.append((key, json.dumps(value, indent=1, sort_keys=True, ensure_ascii=False, default=str), True))
        else:
            rows.append((key, "not recorded" if value is None else str(value), False))
    return rows
