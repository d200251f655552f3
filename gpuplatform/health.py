"""`/healthz`: 200 when the database and Redis answer, 503 otherwise; the body says which."""

from django.db import connection
from django.http import JsonResponse

from apps.scheduling.redis import client


def healthz(request):
    checks = {"database": _database_ok(), "redis": _redis_ok()}
    ok = all(checks.values())
    return JsonResponse(
        {"ok": ok, **{k: "ok" if v else "down" for k, v in checks.items()}},
        status=200 if ok else 503,
    )


def _database_ok() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:
        return False


def _redis_ok() -> bool:
    try:
        return bool(client().ping())
    except Exception:
        return False
