from .roles import user_roles


def roles(request):
    """Expose the user's roles to templates (navigation shows what the user may use)."""
    return {"roles": user_roles(request.user)}
