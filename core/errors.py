"""Errors as the client sees them: one body shape for the API, one error page for pages.

`is_api` tells an API request (JSON errors) from a page request; `error_answer` answers an
error the app explains, `{"detail": ...}` for the API and the standalone error page otherwise."""

from __future__ import annotations

from django.http import HttpResponse, JsonResponse
from django.template import loader


def is_api(request) -> bool:
    """Whether the request is for the API, whose every error is JSON ({"detail": ...}).
    path_info: the same under a SCRIPT_NAME prefix."""
    return request.path_info.startswith("/api/")


def error_answer(request, status: int, *, title: str, detail: str):
    """An error the app explains: JSON {"detail": detail} for the API, the standalone error page
    (`title`, `detail`; no user, no menu, no database) for pages."""
    if is_api(request):
        return JsonResponse({"detail": detail}, status=status)
    return HttpResponse(loader.render_to_string("error.html", {"title": title, "detail": detail}), status=status)
