"""The ground floor: what every app of prbench shares and that knows no app.

Roles and the permission classes built on them, request and body validation, the throttles,
upload limits, CSV/JSONL exports, the OpenAPI schema conventions, the template context of
roles, and the base of model-running management commands. Nothing here imports `prbench`
(the top: settings, URLs, the Celery app, seed_demo) or any app; every app may import it
(import contract "ground-floor" in .importlinter)."""
