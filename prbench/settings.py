"""prbench settings: one module, driven by environment variables.

With no environment at all the project runs locally on an SQLite file and a Celery
broker that needs no server (kombu's filesystem transport), both under var/.
DATABASE_URL switches to PostgreSQL, CELERY_BROKER_URL to Redis. Malformed values
raise ImproperlyConfigured at start-up instead of being silently ignored.
"""

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [part.strip() for part in raw.split(",") if part.strip()]


# pytest sets PYTEST_VERSION for the whole session, before Django settings load. Each test
# session gets its own var/ folder, so neither a running demo (its SQLite file and
# filesystem broker) nor another test session shares its database or its queue.
TESTING = bool(os.environ.get("PYTEST_VERSION"))
_default_var = BASE_DIR / "var" / "test" / f"session-{os.getpid()}" if TESTING else BASE_DIR / "var"
VAR_DIR = Path(env_str("PRBENCH_VAR_DIR", str(_default_var))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", True)

SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "django-insecure-local-development-key-only-for-debug-mode-0123456789"
# Placeholders copied from an example file are long and varied enough to pass Django's own
# deploy check, so they are refused by name: a guessable key signs every session.
_PLACEHOLDER_MARKERS = ("change-me", "changeme", "replace-me", "your-secret", "example", "placeholder")
if not DEBUG and any(marker in SECRET_KEY.lower() for marker in _PLACEHOLDER_MARKERS):
    raise ImproperlyConfigured("SECRET_KEY is a placeholder; generate one: python -c "
                               "'import secrets; print(secrets.token_urlsafe(50))'")

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"] if DEBUG else [])
if not DEBUG and not ALLOWED_HOSTS:
    raise ImproperlyConfigured("ALLOWED_HOSTS must be set when DEBUG is off")
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "prbench.admin_site.PrbenchAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "prbench",
    "jobs",
    "pipeline",
    "leaderboard",
    "annotation",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "core.validation.RefuseBadCharactersMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "prbench.middleware.AppNotFoundMiddleware",
    "prbench.middleware.OutageMiddleware",
]

# Content-Security-Policy (django-csp): scripts only from our own static files (no inline
# script, no eval), no framing, forms post only to us. Inline *styles* stay allowed: plotly
# and Swagger UI set styles at run time, and a style cannot run code.
from csp.constants import NONE, SELF, UNSAFE_INLINE  # noqa: E402

CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

ROOT_URLCONF = "prbench.urls"
WSGI_APPLICATION = "prbench.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "core.context_processors.roles",
                "jobs.context_processors.job_statuses",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------------
_sqlite_default = f"sqlite:///{VAR_DIR / 'prbench.sqlite3'}"
try:
    DATABASES = {"default": dj_database_url.parse(env_str("DATABASE_URL") or _sqlite_default, conn_max_age=60)}
except Exception as exc:  # dj_database_url raises a bare ValueError on unknown schemes
    raise ImproperlyConfigured(f"DATABASE_URL is malformed: {exc}") from None
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # A file, not :memory:, so a Celery worker subprocess can see the test database.
    DATABASES["default"]["TEST"] = {"NAME": str(VAR_DIR / "test-prbench.sqlite3")}
    DATABASES["default"]["OPTIONS"] = {"timeout": 30, "transaction_mode": "IMMEDIATE"}
elif DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # psycopg 3 sends the parameters apart from the SQL ($1, $2) and prepares a statement once
    # a connection has run it 5 times, so PostgreSQL stops parsing and planning the same hot
    # queries on every request: ~5 -> ~3 database CPU ms per annotation cycle
    # (benchmarks/README.md). Django leaves both off by default; off again for a pooler that
    # cannot keep prepared statements (PgBouncer before 1.21 in transaction mode).
    if env_bool("DB_PREPARED_STATEMENTS", True):
        DATABASES["default"].setdefault("OPTIONS", {}).update(server_side_binding=True, prepare_threshold=5)
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Auth ---------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "home"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

# --- Static files -------------------------------------------------------------------
STATIC_URL = "static/"

def _package_dir(name: str, *parts: str) -> Path:
    """A folder inside an installed package, found without importing the package."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ImproperlyConfigured(f"package {name!r} is not installed (pip install -r requirements.txt)")
    return Path(list(spec.submodule_search_locations)[0], *parts)


# plotly.js comes from the pinned plotly package, served as static/vendor/plotly/plotly.min.js.
STATICFILES_DIRS = [BASE_DIR / "static", ("vendor/plotly", _package_dir("plotly", "package_data"))]
STATIC_ROOT = VAR_DIR / "staticfiles"
STATIC_ROOT.mkdir(exist_ok=True)  # whitenoise warns on every request when it is missing
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if DEBUG or TESTING
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}
MEDIA_ROOT = VAR_DIR / "media"

# --- Folders for models and data ------------------------------------------------------
# Submitted reward models must resolve to a path inside MODELS_ROOT.
MODELS_ROOT = Path(env_str("MODELS_ROOT", str(VAR_DIR / "models"))).resolve()
DATA_ROOT = Path(env_str("DATA_ROOT", str(VAR_DIR / "data"))).resolve()
# What checking one model folder may cost (prblib.modelcheck): entries at any depth, and
# seconds listing them; past either the folder is refused (400) and the rest is never read.
MODEL_MAX_FILES = env_int("MODEL_MAX_FILES", 5000, minimum=1)
MODEL_CHECK_SECONDS = env_int("MODEL_CHECK_SECONDS", 10, minimum=1)

# --- Evaluation runs ------------------------------------------------------------------------
RM_DEVICE = env_str("RM_DEVICE", "cpu")  # "cuda" on GPU workers
if RM_DEVICE not in {"cpu", "cuda"}:
    raise ImproperlyConfigured(f"RM_DEVICE={RM_DEVICE!r} must be cpu or cuda")
SUBMISSIONS_PER_HOUR = env_int("SUBMISSIONS_PER_HOUR", 10, minimum=1)
# Uploaded files (scores files) are refused past this size while they stream in.
MAX_UPLOAD_BYTES = env_int("MAX_UPLOAD_MB", 50, minimum=1) * (1 << 20)
FILE_UPLOAD_HANDLERS = [
    "core.uploads.SizeLimitUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
# Recovery periods (docs/architecture.md, "Jobs"). A running job (evaluation, build, sampling,
# Best-of-N, PPO) touches its heartbeat every RUN_HEARTBEAT_SECONDS from a thread of its own;
# after RUN_STALE_SECONDS without one its worker is presumed dead and the job is re-queued (at
# most RUN_MAX_ATTEMPTS claims). A QUEUED job that no worker claimed within RUN_RESEND_SECONDS of
# its message being sent gets its message sent again (the broker may have lost it). The sweep
# runs every RUN_SWEEP_SECONDS (beat) and whenever a worker starts, so a dead worker's job is
# picked up again within RUN_STALE_SECONDS + RUN_SWEEP_SECONDS (80 s with the defaults).
RUN_HEARTBEAT_SECONDS = env_int("RUN_HEARTBEAT_SECONDS", 10, minimum=1)
RUN_STALE_SECONDS = env_int("RUN_STALE_SECONDS", 60, minimum=2)
RUN_SWEEP_SECONDS = env_int("RUN_SWEEP_SECONDS", 20, minimum=1)
RUN_RESEND_SECONDS = env_int("RUN_RESEND_SECONDS", 300, minimum=1)
RUN_MAX_ATTEMPTS = env_int("RUN_MAX_ATTEMPTS", 3, minimum=1)
# Pairs scored between two progress updates (and the most work a killed worker loses).
RUN_CHUNK_PAIRS = env_int("RUN_CHUNK_PAIRS", 64, minimum=1)
if RUN_STALE_SECONDS <= RUN_HEARTBEAT_SECONDS:
    raise ImproperlyConfigured("RUN_STALE_SECONDS must be greater than RUN_HEARTBEAT_SECONDS")
ALLOW_HUB_MODELS = env_bool("ALLOW_HUB_MODELS", False)

# --- Security (production) ------------------------------------------------------------
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", True)
    SECURE_REDIRECT_EXEMPT = [r"^healthz/$"]  # probed over plain HTTP inside the network
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31536000, minimum=0)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", True)
    if env_bool("BEHIND_TLS_PROXY", False):
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Cache (login throttles) ---------------------------------------------------------
# CACHE_URL=redis://host:6379/1 shares counts between web workers; the default is per process.
_cache_url = env_str("CACHE_URL")
if _cache_url and not _cache_url.startswith(("redis://", "rediss://")):
    raise ImproperlyConfigured(f"CACHE_URL={_cache_url!r} must be a redis:// URL")
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": _cache_url}
          if _cache_url else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

# --- REST framework -------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # JSON bodies are read within core.validation's limits (nesting, number size; an object).
    "DEFAULT_PARSER_CLASSES": ["core.validation.JSONBodyParser", "rest_framework.parsers.FormParser",
                               "rest_framework.parsers.MultiPartParser"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "core.schema.AutoSchema",
    # Password guessing: POST /api/auth/token/, the login page and the admin's share these
    # rates (core.throttles): failures per address and username, failures per username,
    # every attempt per address.
    "DEFAULT_THROTTLE_RATES": {"login": env_str("LOGIN_RATE", "10/min"),
                               "login_username": env_str("LOGIN_USERNAME_RATE", "100/hour"),
                               "login_ip": env_str("LOGIN_IP_RATE", "60/min")},
    # Trusted reverse proxies in front of the app: 0 (the default) reads the client address from
    # the connection alone and never from a client-sent X-Forwarded-For; N reads the N-th
    # address from the right of X-Forwarded-For (set it to the proxies you run, e.g. 1 behind
    # one nginx).
    "NUM_PROXIES": env_int("NUM_PROXIES", 0, minimum=0),
}
SPECTACULAR_SETTINGS = {
    "TITLE": "prbench API",
    "DESCRIPTION": "Personalized RewardBench: benchmarks, reward-model submissions, leaderboard and annotation.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Request bodies get components of their own (`SubmissionCreateRequest`, `AuthTokenRequest`):
    # read-only fields are not asked for, and a field that refuses a blank value says so.
    "COMPONENT_SPLIT_REQUEST": True,
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums",
                             "core.schema.document_error_responses"],
    "ENUM_NAME_OVERRIDES": {"EvaluationSettingEnum": "leaderboard.models.Setting",
                            "DomainEnum": "pipeline.models.Domain",
                            "OutcomeKindEnum": "leaderboard.models.OutcomeKind",
                            "RewardModelKindEnum": "leaderboard.models.Kind"},
}

# --- Celery ---------------------------------------------------------------------------
# Read by prbench/celery.py through config_from_object(namespace="CELERY").
# kombu's filesystem transport needs no host; naming one keeps kombu from warning "No hostname was
# supplied" at every start, which made a healthy `make demo` look broken.
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL") or "filesystem://localhost/"
if CELERY_BROKER_URL.split("://", 1)[0] not in {"filesystem", "redis", "rediss", "amqp", "pyamqp", "memory"}:
    raise ImproperlyConfigured(f"CELERY_BROKER_URL={CELERY_BROKER_URL!r} has an unsupported scheme")
if CELERY_BROKER_URL.startswith("filesystem://"):
    _broker_dir = VAR_DIR / "broker"
    for _sub in ("queue", "processed", "control"):
        (_broker_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "queue"),
        "data_folder_out": str(_broker_dir / "queue"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),  # kombu's default is ./control in the cwd
        "store_processed": False,
    }
else:
    # Redis redelivers unacknowledged messages after this many seconds; our own
    # heartbeat sweep recovers dead runs much sooner, so this is only a backstop.
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT", 3600, minimum=60)}
# Sending a task while the broker is down fails within about two seconds (the job is saved
# QUEUED and the sweep sends it later), instead of holding the web request for kombu's defaults.
CELERY_BROKER_CONNECTION_TIMEOUT = 2
CELERY_TASK_PUBLISH_RETRY_POLICY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.25,
                                    "interval_max": 0.5}
# Results live in our own tables; Celery's result backend is not used.
CELERY_TASK_IGNORE_RESULT = True
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = "default"
# Model work is named "gpu.<app>.<action>" and goes to the queue only GPU workers consume.
CELERY_TASK_ROUTES = {"gpu.*": {"queue": "gpu"}}
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SOFT_TIME_LIMIT = env_int("CELERY_TASK_SOFT_TIME_LIMIT", 6 * 3600, minimum=1)
CELERY_TASK_TIME_LIMIT = env_int("CELERY_TASK_TIME_LIMIT", 6 * 3600 + 300, minimum=1)
if CELERY_TASK_TIME_LIMIT <= CELERY_TASK_SOFT_TIME_LIMIT:
    raise ImproperlyConfigured("CELERY_TASK_TIME_LIMIT must be greater than CELERY_TASK_SOFT_TIME_LIMIT")
# The longest wait an LLM endpoint may direct (429/503 with Retry-After, retry-after-ms or an
# HTTP-date) that is honoured; a longer one fails the request as rate-limited at once.
LLM_MAX_RETRY_WAIT = env_int("LLM_MAX_RETRY_WAIT", 120, minimum=0)
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULE = {
    "recover-stale-jobs": {"task": "jobs.recover_stale", "schedule": float(RUN_SWEEP_SECONDS)},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
# Run tasks inline when explicitly asked (never by default: tests use a real worker).
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
