"""The app's own error pages, also while DEBUG is on."""

from django.conf import settings
from django.views.defaults import page_not_found

from .views import log, outage_detail, outage_response


class AppNotFoundMiddleware:
    """With DEBUG on, Django answers an unknown URL with its technical page, which lists
    every URL pattern. The demo runs with DEBUG on, so HTML 404s are replaced by the app's
    own page there too (API 404s are JSON and pass through, and so does a page a view rendered
    to explain its own 404: it sets ``response.explained = True``)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (settings.DEBUG and response.status_code == 404
                and response.get("Content-Type", "").startswith("text/html")
                and not getattr(response, "explained", False)):
            response = page_not_found(request, exception=None)
        return response


class OutageMiddleware:
    """Outages raised by a view (database down, task queue down, a job saved but not sent) get
    a 503 with the reason, JSON on the API, also while DEBUG is on (whose technical 500 page
    would otherwise answer). Errors raised before any view reach handler500, which answers the
    same way (prbench.views.server_error)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if outage_detail(exception) is None:
            return None  # a bug: Django's handling, then handler500
        log.error("%s %s: %s", request.method, request.path, exception)
        return outage_response(request, exception)
