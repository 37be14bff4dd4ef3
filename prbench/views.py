def healthz(request):
    """Liveness for load balancers and compose healthchecks: the database answers."""
    from django.db import connection
    from django.http import JsonResponse

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def not_found(request, exception=None):
    """404 for any path: the API's clients get JSON like every other API error
    ({"detail": "Not found."}); pages get the site's 404 page."""
    from django.http import JsonResponse
    from django.views.defaults import page_not_found

    if request.path_info.startswith("/api/"):  # path_info: the same under a SCRIPT_NAME prefix
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)


def outage_response(request, exc: BaseException | None):
    """The answer to an error the server did not handle: 503 with a reason while a service
    it needs is down (the database; the task queue, after a job was saved but not sent), 500
    otherwise. JSON ({"detail": ...}) for the API, the standalone error page for pages; with
    Retry-After on a 503. Never a traceback."""
    from django.db import DatabaseError
    from django.http import HttpResponse, JsonResponse
    from django.template import loader
    from kombu.exceptions import OperationalError as BrokerError

    from jobs.services import JobNotSent

    status, title = 503, "Temporarily unavailable"
    if isinstance(exc, JobNotSent):
        detail = str(exc)
    elif isinstance(exc, DatabaseError):
        detail = "The database is unavailable right now; nothing was changed. Try again in a minute."
    elif isinstance(exc, (BrokerError, ConnectionError)):
        detail = "The task queue is unreachable right now. Try again in a minute."
    else:
        status, title, detail = 500, "Server error", "Something went wrong on our side; it has been logged."
    if request.path_info.startswith("/api/"):
        response = JsonResponse({"detail": detail}, status=status)
    else:
        response = HttpResponse(loader.render_to_string("error.html", {"title": title, "detail": detail}),
                                status=status)
    if status == 503:
        response["Retry-After"] = "60"
    return response


def server_error(request):
    """handler500: called while the exception is being handled (also for one raised in a
    middleware, before any view), so sys.exc_info() names it."""
    import sys

    return outage_response(request, sys.exc_info()[1])
