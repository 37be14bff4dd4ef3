"""The app's own error pages, also while DEBUG is on."""

import logging

from django.conf import settings
from django.core.exceptions import BadRequest, SuspiciousOperation

from core.errors import is_api

from .views import bad_request, log, not_found, outage_detail, outage_response


class AppNotFoundMiddleware:
    """With DEBUG on, Django answers an unknown URL with its technical page, which lists
    every URL pattern. The demo runs with DEBUG on, so HTML 404s are replaced by the app's
    own answer there too: JSON on the API (a path no API route matches, e.g. a non-numeric id),
    the 404 page elsewhere. JSON 404s pass through, and so does a page a view rendered to
    explain its own 404: it sets ``response.explained = True``."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (settings.DEBUG and response.status_code == 404
                and response.get("Content-Type", "").startswith("text/html")
                and not getattr(response, "explained", False)):
            response = not_found(request)
        return response


class OutageMiddleware:
    """Outages raised by a view (database down, task queue down, a job saved but not sent) get
    a 503 with the reason, JSON on the API, also while DEBUG is on (whose technical 500 page
    would otherwise answer). Errors raised before any view reach handler500, which answers the
    same way (prbench.views.server_error). With DEBUG on, a malformed request a view meets (a
    SuspiciousOperation such as a body past DATA_UPLOAD_MAX_MEMORY_SIZE) is answered on the API
    as handler400 answers it with DEBUG off (prbench.views.bad_request), not with the technical
    page, and logged as Django logs it."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if settings.DEBUG and is_api(request) and isinstance(exception, (SuspiciousOperation, BadRequest)):
            if isinstance(exception, SuspiciousOperation):
                logging.getLogger(f"django.security.{type(exception).__name__}").error(
                    str(exception), exc_info=exception, extra={"status_code": 400, "request": request})
            return bad_request(request, exception)
        if outage_detail(exception) is None:
            return None  # a bug: Django's handling, then handler500
        log.error("%s %s: %s", request.method, request.path, exception)
        return outage_response(request, exception)
