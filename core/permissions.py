from rest_framework.permissions import BasePermission

from .roles import ANNOTATOR, RESEARCHER, has_role


class IsResearcher(BasePermission):
    """Members of the researcher group, and staff."""

    message = "This needs the researcher role."

    def has_permission(self, request, view):
        return has_role(request.user, RESEARCHER)


class IsAnnotator(BasePermission):
    message = "This needs the annotator role."

    def has_permission(self, request, view):
        return has_role(request.user, ANNOTATOR)
