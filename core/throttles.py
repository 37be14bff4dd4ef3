"""Throttles for password guessing, shared by the login page, the admin's login page and
POST /api/auth/token/.

Three limits apply:
- per client address, every attempt (LOGIN_IP_RATE, default 60/min: a spray over many
  usernames). The address is REMOTE_ADDR, or with NUM_PROXIES = N trusted proxies in front,
  the N-th address from the right of X-Forwarded-For (DRF's get_ident); a client-sent
  X-Forwarded-For is never trusted by default, so a new header value is not a new bucket.
- per client address and username, failed attempts only (LOGIN_RATE, default 10/min: a guess
  at one account from one place). An attacker's failures lock out only their own address
  for that account; its owner signing in from elsewhere is not held back.
- per username whatever the address, failed attempts only (LOGIN_USERNAME_RATE, default
  100/hour): bounds guessing spread over many addresses.

Usernames are keyed as login reads them: NFKC-normalised (as Django's
AbstractBaseUser.normalize_username does, so a mathematical-monospace spelling is the same
account) and case-folded. Counts live in the default cache (Redis when CACHE_URL points at
one, so every web worker shares them).
"""

from __future__ import annotations

import hashlib
import unicodedata

from django.contrib.auth import views as auth_views
from django.contrib.auth.signals import user_login_failed
from django.dispatch import receiver
from django.shortcuts import render
from rest_framework.authtoken.views import ObtainAuthToken
from rest_framework.parsers import FormParser, MultiPartParser
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle

from .validation import JSONBodyParser


def username_key(username: object) -> str:
    """The bucket name of a username: NFKC, case-folded, stripped, at most 150 characters."""
    return unicodedata.normalize("NFKC", str(username or "")).casefold().strip()[:150]


def client_address(request) -> str:
    """REMOTE_ADDR, or the address NUM_PROXIES trusted proxies saw (BaseThrottle.get_ident)."""
    return BaseThrottle().get_ident(request)


class LoginAddressThrottle(SimpleRateThrottle):
    scope = "login_ip"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": client_address(request)}


def _submitted_username(request) -> str:
    data = getattr(request, "data", None) or request.POST
    try:
        return username_key(data.get("username"))
    except AttributeError:  # a JSON body that is not an object
        return ""


class _FailureBucket(SimpleRateThrottle):
    """Failed sign-ins in a sliding window, per key: DRF's rate parsing and cache, but only
    failures are recorded (`record`), and `wait` only looks."""

    def __init__(self, scope: str):
        self.scope = scope
        super().__init__()  # num_requests and duration from the scope's rate

    def _key(self, ident: str) -> str:
        # Hashed: a username may hold any character, and cache keys should be plain ASCII.
        return self.cache_format % {"scope": self.scope, "ident": hashlib.sha256(ident.encode()).hexdigest()}

    def _recent(self, ident: str, now: float) -> list[float]:
        return [t for t in self.cache.get(self._key(ident), []) if t > now - self.duration]

    def wait_for(self, ident: str) -> float:
        """Seconds until one more attempt is allowed (0: allowed now)."""
        now = self.timer()
        recent = self._recent(ident, now)
        return 0.0 if len(recent) < self.num_requests else max(1.0, min(recent) + self.duration - now)

    def record(self, ident: str) -> None:
        now = self.timer()
        self.cache.set(self._key(ident), [*self._recent(ident, now), now][-self.num_requests:], self.duration)


def _buckets(request, username: str) -> list[tuple[_FailureBucket, str]]:
    if not username:
        return []
    return [(_FailureBucket("login"), f"{client_address(request)}|{username}"),
            (_FailureBucket("login_username"), username)]


def login_wait(request) -> int:
    """Seconds this sign-in attempt must wait (0: go ahead). The address limit counts this
    attempt; the failure limits only look."""
    waits = []
    address = LoginAddressThrottle()
    if not address.allow_request(request, None):
        waits.append(address.wait() or 60)
    waits += [bucket.wait_for(ident) for bucket, ident in _buckets(request, _submitted_username(request))]
    wait = max(waits, default=0)
    return int(wait) + 1 if wait else 0


@receiver(user_login_failed)
def _count_failure(sender, credentials, request=None, **kwargs):
    """Every failed authentication (the login pages and the token endpoint call authenticate
    with the request) counts towards the failure limits of its address and username."""
    if request is None:
        return
    for bucket, ident in _buckets(request, username_key(credentials.get("username"))):
        bucket.record(ident)


def too_many_attempts(request, seconds: int):
    response = render(request, "429.html", {"seconds": seconds}, status=429)
    response["Retry-After"] = str(seconds)
    return response


class LoginThrottle(BaseThrottle):
    """The three limits as a DRF throttle (429 with Retry-After)."""

    def allow_request(self, request, view):
        self._wait = login_wait(request)
        return not self._wait

    def wait(self):
        return self._wait


class ThrottledObtainAuthToken(ObtainAuthToken):
    """POST /api/auth/token/ {username, password} -> {token}; 429 with Retry-After when throttled.
    A JSON body is read within the API's limits and must be an object (ObtainAuthToken names
    its own parsers, so the REST_FRAMEWORK default would not apply)."""

    throttle_classes = (LoginThrottle,)
    parser_classes = (FormParser, MultiPartParser, JSONBodyParser)


class ThrottledLoginView(auth_views.LoginView):
    """The login page; a throttled POST gets a 429 page saying when to try again."""

    def post(self, request, *args, **kwargs):
        seconds = login_wait(request)
        if seconds:
            return too_many_attempts(request, seconds)
        return super().post(request, *args, **kwargs)

    def get_default_redirect_url(self):
        """Where a login without ?next= lands: annotators (who are neither staff nor
        researchers) on their queue of campaigns, everyone else on LOGIN_REDIRECT_URL."""
        from django.urls import reverse

        from .roles import ANNOTATOR, user_roles

        roles = user_roles(self.request.user)
        if roles == {ANNOTATOR}:
            return reverse("annotation:annotate")
        return super().get_default_redirect_url()
