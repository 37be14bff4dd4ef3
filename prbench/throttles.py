"""Throttles for password guessing, shared by the login page and POST /api/auth/token/.

Two limits apply to each attempt: per client address (LOGIN_IP_RATE, default 60/min: a
spray over many usernames) and per username whatever the address (LOGIN_RATE, default
10/min: a guess at one account). Counts live in the default cache (Redis when CACHE_URL
points at one, so every web worker shares them). DRF's SimpleRateThrottle does the counting.
"""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.shortcuts import render
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.throttling import SimpleRateThrottle


class LoginAddressThrottle(SimpleRateThrottle):
    scope = "login_ip"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


class LoginUsernameThrottle(SimpleRateThrottle):
    scope = "login"

    def get_cache_key(self, request, view):
        data = getattr(request, "data", None) or request.POST
        username = str(data.get("username") or "").strip().lower()[:150]
        if not username:
            return None  # nothing to guess at; the address limit still applies
        return self.cache_format % {"scope": self.scope, "ident": username}


THROTTLES = (LoginAddressThrottle, LoginUsernameThrottle)


class ThrottledObtainAuthToken(ObtainAuthToken):
    """POST /api/auth/token/ {username, password} -> {token}; 429 with Retry-After when throttled."""

    throttle_classes = THROTTLES


class ThrottledLoginView(auth_views.LoginView):
    """The login page; a throttled POST gets a 429 page saying when to try again."""

    def post(self, request, *args, **kwargs):
        waits = []
        for throttle in (cls() for cls in THROTTLES):
            if not throttle.allow_request(request, self):
                waits.append(throttle.wait() or 60)
        if waits:
            seconds = int(max(waits)) + 1
            response = render(request, "429.html", {"seconds": seconds}, status=429)
            response["Retry-After"] = str(seconds)
            return response
        return super().post(request, *args, **kwargs)
