"""Settings, all from the environment (see the configuration table in README.md).

No DATABASE_URL: SQLite (WAL) under the data dir. No REDIS_URL: the embedded Redis started by
`make run` or the test suite (its URL is read from `<data dir>/redis/redis.url`).
"""

import pathlib

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from apps.secrets.crypto import valid_key
from apps.webhooks.guard import ALLOW_SETTING, parse_networks
from gpuplatform import embedded_redis
from gpuplatform.env import env_bool, env_choice, env_float, env_int, env_list, env_str

BASE_DIR = pathlib.Path(__file__).resolve().parent.parent
DATA_DIR = pathlib.Path(env_str("GPUPLATFORM_DATA_DIR") or BASE_DIR / "var").resolve()

DEBUG = env_bool("DEBUG", False)
# GPUPLATFORM_HTTPS=1: served over HTTPS (directly or behind a TLS-terminating proxy); turns on
# the production settings below ("Production settings" in docs/operations.md).
HTTPS = env_bool("GPUPLATFORM_HTTPS", False)
SECRET_KEY = env_str("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY is required unless DEBUG=1")
    SECRET_KEY = "debug-only-insecure-key"  # noqa: S105 (only reachable with DEBUG=1)
if HTTPS and (len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5):
    # Django's own bar (check --deploy, security.W009): a short key is guessable offline from
    # any signed cookie. `make run` stores a 67-character one.
    raise ImproperlyConfigured(
        "SECRET_KEY must be at least 50 characters (5 distinct) with GPUPLATFORM_HTTPS=1"
    )
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "django_htmx",
    "django_celery_results",
    "django_otp",
    "django_otp.plugins.otp_totp",
    "axes",
    "apps.tenants",
    "apps.secrets",
    "apps.nodes",
    "apps.jobs",
    "apps.bundles",
    "apps.scheduling",
    "apps.admission",
    "apps.web",
    "apps.webhooks",
    "apps.telemetry",
]

# The browser's own (sign-in, OTP, messages, htmx) are the packages' classes
# that step aside for the agent API (gpuplatform/browser_middleware.py); the rest runs for all.
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "gpuplatform.browser_middleware.Authentication",
    "gpuplatform.browser_middleware.Otp",
    "gpuplatform.browser_middleware.Messages",
    "gpuplatform.browser_middleware.Htmx",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "gpuplatform.csp.ContentSecurityPolicyMiddleware",
    "axes.middleware.AxesMiddleware",  # last: it turns a locked-out sign-in into the 429 page
]

ROOT_URLCONF = "gpuplatform.urls"
WSGI_APPLICATION = "gpuplatform.wsgi.application"
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
            ],
        },
    },
]


# SQLite connections outlive a request, as PostgreSQL's do (dj-database-url's 60 s below): a
# new connection starts with an empty page cache, so each request read again every B-tree page
# its statements touched. A submit inserts into about 15 of them: with a connection per request
# it cost ~2x the server CPU (docs/admission.md, "Throughput"). Each thread keeps its own.
SQLITE_CONN_MAX_AGE = 600

SQLITE_OPTIONS = {
    # WAL lets the web, dispatcher and agents read while one writes; IMMEDIATE takes the write
    # lock at BEGIN so two writers queue on the busy timeout instead of failing mid-transaction.
    # The WAL is checkpointed every 10,000 pages (~40 MB) rather than SQLite's 1,000: the commit
    # that crosses the mark copies the WAL into the database and fsyncs it while still holding
    # the write lock, which at 1,000 cost every submit ~0.2 ms on average (docs/admission.md),
    # and a longer WAL copies each hot index page once for more commits.
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA wal_autocheckpoint=10000;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 30,
}


# The per-request lookups (token, submitter) as prepared statements on PostgreSQL
# (apps/admission/rows.py, `_prepared_cursor`); 0 behind a pooler that drops them between
# transactions (PgBouncer's transaction mode before 1.21's max_prepared_statements).
DB_PREPARED = env_bool("GPUPLATFORM_DB_PREPARED", True)


def _database() -> dict:
    url = env_str("DATABASE_URL")
    if not url:
        DATA_DIR.mkdir(
            mode=0o700, parents=True, exist_ok=True
        )  # the database lives here: never world-readable
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DATA_DIR / "db.sqlite3",
            "OPTIONS": SQLITE_OPTIONS,
            "CONN_MAX_AGE": SQLITE_CONN_MAX_AGE,
            "TEST": {"NAME": str(DATA_DIR / "test-db.sqlite3")},
        }
    try:
        config = dj_database_url.parse(url, conn_max_age=60, conn_health_checks=True)
    except ValueError as error:
        raise ImproperlyConfigured(f"DATABASE_URL is not a database URL: {error}") from None
    if not config.get("ENGINE"):
        raise ImproperlyConfigured(f"DATABASE_URL has an unknown scheme: {url.split(':', 1)[0]}")
    if config["ENGINE"] == "django.db.backends.postgresql":
        # Django's, with a health check that makes no round trip while the server sent nothing
        # (gpuplatform/postgresql/base.py).
        config["ENGINE"] = "gpuplatform.postgresql"
    if config["ENGINE"].endswith("postgresql") and DB_PREPARED:
        # Django turns psycopg's prepared statements off; only the statements run on a
        # server-binding cursor get prepared (apps/platform/db.py's `prepared_cursor`), the rest
        # are sent with client-side binding as before.
        config.setdefault("OPTIONS", {}).setdefault("prepare_threshold", 5)  # the URL's own wins
    if config["ENGINE"].endswith("sqlite3"):
        config["OPTIONS"] = SQLITE_OPTIONS
        config["CONN_MAX_AGE"] = SQLITE_CONN_MAX_AGE
        config["CONN_HEALTH_CHECKS"] = False
    return dict(config)


DATABASES = {"default": _database()}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _redis_url() -> str:
    url = env_str("REDIS_URL") or embedded_redis.discover_url(DATA_DIR / "redis")
    if not url:
        # Nothing started yet: point at the port-less default so imports work (migrate, check);
        # anything that really talks to Redis reports it as down.
        return "redis://127.0.0.1:1/0"
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise ImproperlyConfigured(
            f"REDIS_URL must start with redis://, rediss:// or unix://: {url!r}"
        )
    return url


REDIS_URL = _redis_url()


def _broker_ssl(url: str) -> dict | None:
    """rediss:// verifies the server's certificate. kombu alone would not (without `ssl_*`
    options it connects with CERT_NONE); options in the URL's query (`?ssl_ca_certs=/path/ca.pem`,
    read by kombu and redis-py alike) take precedence over this default."""
    if not url.startswith("rediss://"):
        return None
    import ssl

    return {"ssl_cert_reqs": ssl.CERT_REQUIRED}


# The URL agents are handed (apps/nodes/broker.py) when they reach Redis by another address than
# the web does (an agent on another machine): scheme, host, port and query; never credentials.
AGENT_REDIS_URL = env_str("GPUPLATFORM_AGENT_REDIS_URL")
if AGENT_REDIS_URL and not AGENT_REDIS_URL.startswith(("redis://", "rediss://")):
    raise ImproperlyConfigured(
        f"GPUPLATFORM_AGENT_REDIS_URL must start with redis:// or rediss://: {AGENT_REDIS_URL!r}"
    )

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS: list = [BASE_DIR / "static"]
# xterm.js for the job page's terminal: installed from npm at build time (`make install`,
# package.json), never committed; without it the page shows the client's command instead.
XTERM_DIR = BASE_DIR / "node_modules" / "@xterm" / "xterm"
if XTERM_DIR.is_dir():
    STATICFILES_DIRS.append(("vendor/xterm", XTERM_DIR))
STATIC_ROOT = DATA_DIR / "staticfiles"
MEDIA_ROOT = DATA_DIR / "storage"
STORAGES = {
    # Logs and artifacts go through the storage API: S3 is a settings change.
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
LOGIN_URL = "/login/"
LOGIN_REDIRECT_URL = "/"

# Sign-in throttling (django-axes; "Sign-in throttling" in docs/operations.md): both login
# pages, counted per username and, separately, per client address. The LOGIN_FAILURE_LIMIT-th
# wrong password within the cool-off is refused (429 with Retry-After), and so is every attempt,
# right or wrong, until the cool-off has passed since the last failure. API tokens never go
# through authenticate(), so no API call is locked out by a username.
AUTHENTICATION_BACKENDS = [
    "apps.web.signin.ThrottleBackend",  # axes' check, skipped where there is no request
    "django.contrib.auth.backends.ModelBackend",
]
LOGIN_FAILURE_LIMIT = env_int("GPUPLATFORM_LOGIN_FAILURE_LIMIT", 6, minimum=2)
LOGIN_COOLOFF_SECONDS = env_int("GPUPLATFORM_LOGIN_COOLOFF_SECONDS", 300, minimum=1)
# Proxies (comma-separated addresses) whose X-Forwarded-For names the client; from anyone else
# the client is REMOTE_ADDR, so a forged header cannot dodge the per-address count.
TRUSTED_PROXIES = env_list("GPUPLATFORM_TRUSTED_PROXIES", [])
AXES_FAILURE_LIMIT = LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = "apps.web.signin.cool_off"
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]  # each on its own: either one locks
AXES_CLIENT_IP_CALLABLE = "apps.web.signin.client_ip"
AXES_LOCKOUT_CALLABLE = "apps.web.signin.lockout_response"
AXES_RESET_ON_SUCCESS = False  # failures age out with the cool-off; a sign-in does not wipe them
AXES_VERBOSE = False

# A second factor for staff (django-otp, TOTP): with it on, the admin wants a verified device
# (`manage.py enrol_totp USERNAME` prints the secret), and its login page asks for the code.
STAFF_REQUIRE_2FA = env_bool("GPUPLATFORM_STAFF_REQUIRE_2FA", False)
OTP_TOTP_ISSUER = "gpuplatform"

# Content-Security-Policy (gpuplatform/csp.py): everything from this origin, no inline script
# or style, no eval; htmx is served from django-htmx's static files. The browser tests fail on
# any violation the pages report.
CONTENT_SECURITY_POLICY = {
    "default-src": ["'self'"],
    "script-src": ["'self'"],
    "style-src": ["'self'"],
    "img-src": ["'self'", "data:"],
    "object-src": ["'none'"],
    "base-uri": ["'self'"],
    "form-action": ["'self'"],
    "frame-ancestors": ["'none'"],
}

# Production over HTTPS (GPUPLATFORM_HTTPS=1): `check --deploy` is clean with it and DEBUG=0.
if HTTPS:
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]  # load balancers probe over plain HTTP
    SECURE_HSTS_SECONDS = env_int("GPUPLATFORM_HSTS_SECONDS", 365 * 24 * 3600, minimum=3600)
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("GPUPLATFORM_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = env_bool("GPUPLATFORM_HSTS_PRELOAD", True)
    if TRUSTED_PROXIES or env_bool("GPUPLATFORM_BEHIND_PROXY", False):
        # The TLS-terminating proxy sets this header (and drops any the client sent).
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# Tenant secrets' encryption keys (apps/secrets/crypto.py, docs/secrets.md): comma-separated
# Fernet keys, the first encrypts and all decrypt (rotation: `manage.py rotate_secrets`). None:
# one key derived from SECRET_KEY, for development; production sets its own.
SECRET_ENCRYPTION_KEYS = env_list("GPUPLATFORM_SECRET_KEYS", [])
if not all(valid_key(key) for key in SECRET_ENCRYPTION_KEYS):
    raise ImproperlyConfigured(
        "GPUPLATFORM_SECRET_KEYS must be comma-separated Fernet keys (32 bytes, URL-safe base64)"
    )

# /metrics: with a token set, scrapers send `Authorization: Bearer <token>` (401 otherwise).
METRICS_TOKEN = env_str("GPUPLATFORM_METRICS_TOKEN") or None

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.tenants.auth.TokenAuthentication",  # DRF's, its lookup one statement written once
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "apps.jobs.api_errors.exception_handler",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "gpuplatform API",
    "VERSION": "1.0.0",
    "DESCRIPTION": "Submit GPU jobs, follow them, fetch their results.",
    # The public API only, with its error answers, enums and the submit body's one-of
    # (gpuplatform/openapi.py): client generators and fuzzers read this document.
    "PREPROCESSING_HOOKS": ["gpuplatform.openapi.public_only"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "gpuplatform.openapi.honest_document",
    ],
}

# Celery. Settings chosen knowingly (see docs/reliability.md): tasks are short hand-offs, the
# long-running job lives in the agent and is tracked by leases in the database, so a broker
# redelivery (visibility timeout) can at worst repeat a hand-off that the fencing token rejects.
CELERY_BROKER_URL = REDIS_URL
CELERY_BROKER_USE_SSL = _broker_ssl(REDIS_URL)
CELERY_RESULT_BACKEND = "django-db"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 4  # tasks are short hand-offs; see docs/reliability.md
CELERY_TASK_IGNORE_RESULT = True
# Celery's default: no task-sent event. Agents send no task events (their broker user may not
# publish on any channel), so a sent event showed every start and stop message in Flower as sent
# and never received (tests/broker/test_task_events.py); Flower shows the dispatcher's and
# webhooks' tasks from their receipt on. It also halves the Redis publishes of a start message.
CELERY_TASK_SEND_SENT_EVENT = False
CELERY_WORKER_SEND_TASK_EVENTS = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": env_int("GPUPLATFORM_VISIBILITY_TIMEOUT", 3600, minimum=1)
}
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_TASK_ROUTES = {"webhooks.*": {"queue": "webhooks"}}  # their own worker (Procfile `webhooks`)
CELERY_TIMEZONE = "UTC"
# Celery's own persistent scheduler without its busy wait before each tick (its docstring).
CELERY_BEAT_SCHEDULER = "gpuplatform.beat:Scheduler"

# Webhooks (apps/webhooks/guard.py): networks an operator lets receivers sit on (self-hosted
# receivers on a private network); everything not public is refused otherwise.
WEBHOOK_ALLOW_NETWORKS = parse_networks(env_str(ALLOW_SETTING))
WEBHOOK_RECEIVER_CONCURRENCY = env_int(
    "GPUPLATFORM_WEBHOOK_RECEIVER_CONCURRENCY", 2, minimum=1, maximum=100
)

# Platform knobs.
HEARTBEAT_SECONDS = env_float("GPUPLATFORM_HEARTBEAT_SECONDS", 2.0, minimum=0.1, maximum=300)
NODE_LOST_AFTER_HEARTBEATS = env_int("GPUPLATFORM_NODE_LOST_AFTER", 3, minimum=2, maximum=100)
DISPATCH_TICK_SECONDS = env_float(
    "GPUPLATFORM_DISPATCH_TICK_SECONDS", 2.0, minimum=0.1, maximum=300
)
RECONCILE_TICK_SECONDS = env_float(
    "GPUPLATFORM_RECONCILE_TICK_SECONDS", 2.0, minimum=0.1, maximum=300
)
STARTING_TIMEOUT_SECONDS = env_float("GPUPLATFORM_STARTING_TIMEOUT", 60.0, minimum=1)
KILL_GRACE_SECONDS = env_float("GPUPLATFORM_KILL_GRACE_SECONDS", 5.0, minimum=0)
MAX_RUNTIME_LIMIT_SECONDS = env_int("GPUPLATFORM_MAX_RUNTIME_LIMIT", 7 * 24 * 3600, minimum=1)
DRAIN_DEADLINE_SECONDS = env_int("GPUPLATFORM_DRAIN_DEADLINE_SECONDS", 600, minimum=0)
PRIORITY_BOOST_SECONDS = env_int("GPUPLATFORM_PRIORITY_BOOST_SECONDS", 3600, minimum=0)
# Job arrays (docs/arrays.md): the most tasks one array may have, and how many of an array's
# tasks the dispatcher keeps as queued rows beyond what the free GPUs could start (the rest wait
# as virtual tasks, listed and counted as queued without a row).
MAX_ARRAY_TASKS = env_int("GPUPLATFORM_MAX_ARRAY_TASKS", 100_000, minimum=1, maximum=10_000_000)
ARRAY_QUEUED_TASKS = env_int("GPUPLATFORM_ARRAY_QUEUED_TASKS", 8, minimum=1, maximum=100_000)
MAX_ATTEMPTS = env_int("GPUPLATFORM_MAX_ATTEMPTS", 5, minimum=1)
# A retried job waits base x 2^(n-1) seconds before its n-th retry, at most the max
# (docs/reliability.md): a flapping node or agent is not hammered by the same jobs.
RETRY_BACKOFF_SECONDS = env_float("GPUPLATFORM_RETRY_BACKOFF_SECONDS", 5.0, minimum=0)
RETRY_BACKOFF_MAX_SECONDS = env_float("GPUPLATFORM_RETRY_BACKOFF_MAX", 300.0, minimum=0)
# Admission (docs/admission.md): which tiers keep submitting while Redis is down (the others
# get 503), each user's share of its tenant's submit rate, and the result cache's default TTL.
RATE_LIMIT_FAIL_OPEN_TIERS = env_list(
    "GPUPLATFORM_RATE_LIMIT_FAIL_OPEN_TIERS", ["enterprise", "pro"]
)
USER_SUBMIT_SHARE = env_float("GPUPLATFORM_USER_SUBMIT_SHARE", 1.0, minimum=0.01, maximum=1)
# Seconds a web process spends a lease of its tenants' submit tokens before it gives the unspent
# ones back to Redis (apps/admission/leases.py); 0: every submit takes its token from Redis.
RATE_LIMIT_LEASE_SECONDS = env_float(
    "GPUPLATFORM_RATE_LIMIT_LEASE_SECONDS", 1.0, minimum=0, maximum=1
)
RESULT_CACHE_TTL_SECONDS = env_int("GPUPLATFORM_RESULT_CACHE_TTL", 24 * 3600, minimum=0)
# The agent API (docs/architecture.md, "Agent API"): the most a member may upload as its log, one
# artifact or one checkpoint (413 past it), and the web's URL as agents started here reach it.
AGENT_LOG_MAX_BYTES = env_int("GPUPLATFORM_LOG_MAX_BYTES", 64 << 20, minimum=1)
AGENT_ARTIFACT_MAX_BYTES = env_int("GPUPLATFORM_ARTIFACT_MAX_BYTES", 1 << 30, minimum=1)
AGENT_CHECKPOINT_MAX_BYTES = env_int("GPUPLATFORM_CHECKPOINT_MAX_BYTES", 4 << 30, minimum=1)
# Code bundles (docs/own-code.md): one no job in a live state uses and none used for this many
# days is deleted, row and file (`manage.py expire_bundles`, and the beat's "expire-bundles").
BUNDLE_RETENTION_DAYS = env_int("GPUPLATFORM_BUNDLE_RETENTION_DAYS", 7, minimum=0)
BUNDLE_EXPIRE_TICK_SECONDS = env_int("GPUPLATFORM_BUNDLE_EXPIRE_TICK", 3600, minimum=60)
# OCI images as a job's root (docs/images.md): the registries (hosts, or host:port) a submit's
# `image` may name; none by default (every image is a 400 naming `image`).
IMAGE_REGISTRIES = env_list("GPUPLATFORM_IMAGE_REGISTRIES", [])

# GPU telemetry (docs/telemetry.md): how often agents sample (sent with their register answer),
# what reads idle, how long a job's series are kept after it ends, and how many seconds one
# "minute" of the tiers' idle settings lasts (60; tests shorten it).
GPU_SAMPLE_SECONDS = env_float("GPUPLATFORM_GPU_SAMPLE_SECONDS", 10.0, minimum=0.1, maximum=3600)
GPU_IDLE_UTIL = env_float("GPUPLATFORM_GPU_IDLE_UTIL", 1.0, minimum=0.0, maximum=100.0)
TELEMETRY_RETENTION_DAYS = env_int("GPUPLATFORM_TELEMETRY_RETENTION_DAYS", 30, minimum=0)
GPU_IDLE_MINUTE_SECONDS = env_float("GPUPLATFORM_GPU_IDLE_MINUTE_SECONDS", 60.0, minimum=0.01)
# Jobs that may run arbitrary commands go on an isolation "none" node only where the operator
# opted the node in (Node.allow_unisolated_commands), or everywhere with this (`make run`).
TRUST_UNISOLATED_NODES = env_bool("GPUPLATFORM_TRUST_UNISOLATED_NODES", False)
# Open event streams (GET /api/v1/jobs/{id}/events/) per API token (or web session) and per
# tenant, across every web process (apps/jobs/stream_slots.py); over either: 429.
MAX_STREAMS_PER_TOKEN = env_int("GPUPLATFORM_MAX_STREAMS_PER_TOKEN", 20, minimum=1)
MAX_STREAMS_PER_TENANT = env_int("GPUPLATFORM_MAX_STREAMS_PER_TENANT", 200, minimum=1)
# Interactive sessions (docs/interactive.md): open shells, execs and forwarded connections per
# user and per tenant (429 with Retry-After over them); support staff may attach to a tenant's
# job only where the operator allows it (and then every session of theirs is audited).
MAX_SESSIONS_PER_USER = env_int("GPUPLATFORM_MAX_SESSIONS_PER_USER", 20, minimum=1)
MAX_SESSIONS_PER_TENANT = env_int("GPUPLATFORM_MAX_SESSIONS_PER_TENANT", 200, minimum=1)
STAFF_CAN_ATTACH = env_bool("GPUPLATFORM_STAFF_CAN_ATTACH", False)
# API tokens (apps/tenants/tokens.py): days a new one lasts (0: never expires), and days the
# tokens carried over from DRF's clear-text table keep working after the upgrade.
TOKEN_EXPIRY_DAYS = env_int("GPUPLATFORM_TOKEN_DAYS", 90, minimum=0)
MIGRATED_TOKEN_DAYS = env_int("GPUPLATFORM_MIGRATED_TOKEN_DAYS", 30, minimum=1)
# Seconds a web process keeps an authenticated token, or a node credential, without reading it
# again (0: no cache; apps/tenants/token_cache.py, apps/nodes/credentials.py). Revocations reach
# every process through Redis at once; this is the most a revoked token or credential lives on
# in a process while that channel is down.
TOKEN_CACHE_SECONDS = env_float("GPUPLATFORM_TOKEN_CACHE_SECONDS", 30.0, minimum=0, maximum=60)
FLOWER_PORT = env_int("FLOWER_PORT", 5555, minimum=1, maximum=65535)
PORT = env_int("PORT", 8000, minimum=1, maximum=65535)
PLATFORM_URL = (
    env_str("GPUPLATFORM_URL") or f"http://127.0.0.1:{PORT}"
)  # for the agents the autoscaler starts
# Seconds between the autoscaler's looks at the queue and the pools (docs/autoscaling.md).
AUTOSCALE_TICK_SECONDS = env_float(
    "GPUPLATFORM_AUTOSCALE_TICK_SECONDS", 10.0, minimum=0.5, maximum=3600
)
AUTOSCALE_PROVIDER = env_choice("GPUPLATFORM_AUTOSCALE_PROVIDER", "local", ["local"])
# fair: levels, weighted fair share, aging, backfill, preemption (docs/scheduling.md);
# level-fifo: tier level then submit time; fifo; slurm: our rendering of Slurm's multifactor.
SCHEDULING_POLICY = env_choice(
    "GPUPLATFORM_POLICY", "fair", ["fair", "fair-reclaim", "level-fifo", "fifo", "slurm"]
)

LOG_FORMAT = env_choice("LOG_FORMAT", "plain", ["plain", "json"])  # json: one object per line
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "gpuplatform.logs.JsonLinesFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.db.backends": {"level": "WARNING"}},
}
