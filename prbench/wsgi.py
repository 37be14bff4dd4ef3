import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "prbench.settings")
application = get_wsgi_application()


def _require_collected_static() -> None:
    """With hashed static names (DEBUG off) every page needs collectstatic's manifest; without
    it each page would answer 500. Refuse to start instead, saying what to run."""
    from django.conf import settings
    from django.contrib.staticfiles.storage import ManifestFilesMixin, staticfiles_storage
    from django.core.exceptions import ImproperlyConfigured

    if isinstance(staticfiles_storage, ManifestFilesMixin) and not staticfiles_storage.exists(
            staticfiles_storage.manifest_name):
        raise ImproperlyConfigured(
            f"static files are not collected: {settings.STATIC_ROOT / staticfiles_storage.manifest_name} is missing; "
            "run `python manage.py collectstatic --noinput` before starting the server (DEBUG is off)")


_require_collected_static()

from prbench.warmup import warm_up  # noqa: E402

warm_up()
