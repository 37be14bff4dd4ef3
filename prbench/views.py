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
