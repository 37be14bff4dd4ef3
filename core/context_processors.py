from .roles import ANNOTATOR, RESEARCHER, has_role, user_roles


def roles(request):
    """Expose the user's roles to templates (navigation shows what the user may open)."""
    return {"roles": user_roles(request.user), "can_research": has_role(request.user, RESEARCHER),
            "can_annotate": has_role(request.user, ANNOTATOR)}
