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
