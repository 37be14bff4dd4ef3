"""The admin site, with two changes: a signed-in user who is not staff gets the app's 403
page instead of the admin's login form (which reads as "wrong password" to them), and its
login is throttled like the site's (core.throttles). Every model admin's JSON fields are read
by core.validation.BoundedJSONField (nesting and number size bounded, as on the API)."""

from functools import update_wrapper

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models.base import ModelBase

from core.validation import BoundedJSONField

NOT_STAFF = "The admin is for staff; your account is not a staff account."


class PrbenchAdminSite(admin.AdminSite):
    site_header = "prbench administration"
    site_title = "prbench admin"
    index_title = "Benchmarks, campaigns, submissions and jobs"

    def register(self, model_or_iterable, admin_class=None, **options):
        super().register(model_or_iterable, admin_class, **options)
        for model in [model_or_iterable] if isinstance(model_or_iterable, ModelBase) else model_or_iterable:
            self._registry[model].formfield_overrides.setdefault(models.JSONField, {})["form_class"] = BoundedJSONField

    def admin_view(self, view, cacheable=False):
        inner = super().admin_view(view, cacheable)

        def wrapper(request, *args, **kwargs):
            if request.user.is_authenticated and not self.has_permission(request):
                raise PermissionDenied(NOT_STAFF)
            return inner(request, *args, **kwargs)

        return update_wrapper(wrapper, view)

    def login(self, request, extra_context=None):
        if request.user.is_authenticated and not self.has_permission(request):
            raise PermissionDenied(NOT_STAFF)
        if request.method == "POST":  # the same password-guessing limits as the site's login
            from core.throttles import login_wait, too_many_attempts

            seconds = login_wait(request)
            if seconds:
                return too_many_attempts(request, seconds)
        return super().login(request, extra_context)


class PrbenchAdminConfig(AdminConfig):
    default_site = "prbench.admin_site.PrbenchAdminSite"
