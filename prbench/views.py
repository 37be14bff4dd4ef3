from django.shortcuts import render

from pipeline.models import Benchmark


def home(request):
    """Front page. The leaderboard takes this place once evaluations exist (leaderboard app)."""
    benchmarks = Benchmark.objects.all()[:20]
    return render(request, "home.html", {"benchmarks": benchmarks})


def healthz(request):
    """Liveness for load balancers and compose healthchecks: the database answers."""
    from django.db import connection
    from django.http import JsonResponse

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    return JsonResponse({"status": "ok"})
