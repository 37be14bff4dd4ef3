import logging
import sys

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.db import DatabaseError, connection
from django.http import JsonResponse
from django.views.defaults import bad_request as django_bad_request
from django.views.defaults import page_not_found
from kombu.exceptions import OperationalError as BrokerError

from core.errors import error_answer, is_api
from jobs.services import JobNotSent

log = logging.getLogger("prbench.outage")


def healthz(request):
    """Liveness for load balancers and compose healthchecks: the database answers."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def not_found(request, exception=None):
    """404 for any path: the API's clients get JSON like every other API error
    ({"detail": "Not found."}); pages get the site's 404 page."""
    if is_api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)


# Django's SuspiciousOperation messages are written for the log and may name server paths; only
# these are the client's own doing and say nothing of the server, so the API repeats them.
_TOLD_AS_IS = (RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent)


def bad_request(request, exception=None):
    """handler400 (a SuspiciousOperation or BadRequest Django answers itself: a body past
    DATA_UPLOAD_MAX_MEMORY_SIZE, too many fields or files, a Host not in ALLOWED_HOSTS): JSON
    with one line for the API, Django's 400 page for pages."""
    if not is_api(request):
        if isinstance(exception, TooManyFieldsSent):  # e.g. thousands of pairs ticked on a benchmark's health page
            return error_answer(request, 400, title="Too many form fields", detail=(
                f"The form sent more than {settings.DATA_UPLOAD_MAX_NUMBER_FIELDS} fields, more than the server "
                "reads from one request. To open a re-annotation campaign on that many pairs, choose a flag on the "
                "benchmark's health page instead of ticking each pair, or tick fewer pairs."))
        return django_bad_request(request, exception)
    if isinstance(exception, _TOLD_AS_IS):
        detail = f"Bad request: {exception}"
    elif isinstance(exception, DisallowedHost):
        detail = "Bad request: the Host header names a site this server does not serve (ALLOWED_HOSTS)."
    else:
        detail = "Bad request: the request is malformed."
    return JsonResponse({"detail": detail}, status=400)


def outage_detail(exc: BaseException | None) -> str | None:
    """What to tell the client when `exc` means a service the server needs is down (the
    database; the task queue, including a job saved but not sent); None for any other error."""
    if isinstance(exc, JobNotSent):
        return str(exc)
    if isinstance(exc, DatabaseError):
        return "The database is unavailable right now; nothing was changed. Try again in a minute."
    if isinstance(exc, BrokerError):
        return "The task queue is unreachable right now. Try again in a minute."
    return None


def outage_response(request, exc: BaseException | None):
    """The answer to an error the server did not handle: 503 with `outage_detail` while a
    service it needs is down, 500 otherwise. JSON ({"detail": ...}) for the API, the
    standalone error page for pages; Retry-After on a 503. Never a traceback."""
    detail = outage_detail(exc)
    if detail is not None:
        status, title = 503, "Temporarily unavailable"
    else:
        status, title, detail = 500, "Server error", "Something went wrong on our side; it has been logged."
    response = error_answer(request, status, title=title, detail=detail)
    if status == 503:
        response["Retry-After"] = "60"
    return response


def server_error(request):
    """handler500: called while the exception is being handled (also for one raised in a
    middleware, before any view), so sys.exc_info() names it."""
    return outage_response(request, sys.exc_info()[1])
