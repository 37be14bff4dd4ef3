"""Roles are Django groups; staff administer everything."""

from django.contrib.auth.models import AnonymousUser, User

ANNOTATOR = "annotator"
RESEARCHER = "researcher"
ROLE_GROUPS = (ANNOTATOR, RESEARCHER)


def user_roles(user: User | AnonymousUser) -> frozenset[str]:
    if not user.is_authenticated:
        return frozenset()
    cached = getattr(user, "_prbench_roles", None)
    if cached is None:
        cached = frozenset(user.groups.filter(name__in=ROLE_GROUPS).values_list("name", flat=True))
        if user.is_staff:
            cached |= {"staff"}
        user._prbench_roles = cached
    return cached


def has_role(user: User | AnonymousUser, role: str) -> bool:
    """True for members of the group, and for staff (who may do everything)."""
    return user.is_authenticated and (user.is_staff or role in user_roles(user))


def role_required(role: str, message: str):
    """View decorator: anonymous users go to the login page; signed-in users without the
    role (staff have every role) get a 403 page that says `message`."""
    from functools import wraps

    from django.contrib.auth.decorators import login_required
    from django.core.exceptions import PermissionDenied

    def decorator(view):
        @wraps(view)
        @login_required
        def wrapper(request, *args, **kwargs):
            if not has_role(request.user, role):
                raise PermissionDenied(message)
            return view(request, *args, **kwargs)

        return wrapper

    return decorator


def staff_required(view):
    """View decorator for staff pages: anonymous users go to the app's login page; signed-in
    users who are not staff get the app's 403 page (never the admin's login form)."""
    return role_required("staff", "This page is for staff.")(view)
