def healthz(request):
    """Liveness for load balancers and compose healthchecks: the database answers."""
    from django.db import connection
    from django.http import JsonResponse

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
