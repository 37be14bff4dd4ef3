from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.authtoken.views import obtain_auth_token

from leaderboard import views as leaderboard_views

from . import views

api_patterns = [
    path("auth/token/", obtain_auth_token, name="api-token"),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("", include("pipeline.api_urls")),
    path("", include("leaderboard.api_urls")),
    path("", include("annotation.api_urls")),
]

urlpatterns = [
    path("", leaderboard_views.leaderboard, name="home"),
    path("", include("leaderboard.urls")),
    path("healthz/", views.healthz, name="healthz"),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("pipeline.urls")),
    path("", include("annotation.urls")),
    path("api/", include(api_patterns)),
    path("admin/", admin.site.urls),
]
