from django import template

register = template.Library()


@register.filter
def pct(value, digits: int = 1):
    """0.7594 -> '75.9'; None -> '—'."""
    if value is None:
        return "—"
    return f"{100 * float(value):.{int(digits)}f}"


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
