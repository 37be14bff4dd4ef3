from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.templatetags.static import static
from django.urls import include, path
from django.utils.functional import lazy
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from leaderboard import views as leaderboard_views

from . import views
from core.throttles import ThrottledLoginView, ThrottledObtainAuthToken

api_patterns = [
    path("auth/token/", ThrottledObtainAuthToken.as_view(), name="api-token"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    # The split view serves Swagger UI's start-up script as a file, so it runs under our CSP.
    path("docs/", SpectacularSwaggerSplitView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("pipeline.api_urls")),
    path("", include("leaderboard.api_urls")),
    path("", include("annotation.api_urls")),
    path("", include("jobs.api_urls")),
]

urlpatterns = [
    path("", leaderboard_views.leaderboard, name="home"),
    path("", include("leaderboard.urls")),
    path("healthz/", views.healthz, name="healthz"),
    # Pages without the icon link (the admin) make browsers ask for /favicon.ico. The hashed
    # name is looked up per request (lazily): at import, before collectstatic, the manifest is
    # missing, and every management command that runs the system checks imports this URLconf.
    path("favicon.ico", RedirectView.as_view(url=lazy(static, str)("img/favicon.svg"), permanent=True)),
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("pipeline.urls")),
    path("", include("annotation.urls")),
    path("", include("jobs.urls")),
    path("api/", include(api_patterns)),
    path("admin/", admin.site.urls),
]

handler400 = "prbench.views.bad_request"
handler404 = "prbench.views.not_found"
handler500 = "prbench.views.server_error"
