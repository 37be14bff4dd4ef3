from django.urls import path
from rest_framework.routers import SimpleRouter

from . import api

router = SimpleRouter()
router.register("benchmarks", api.BenchmarkViewSet, basename="benchmark")
router.register("builds", api.BuildViewSet, basename="build")

urlpatterns = router.urls + [
    path("benchmarks/<str:benchmark_name>/items/", api.BenchmarkItemViewSet.as_view({"get": "list"}),
         name="benchmark-items"),
]
