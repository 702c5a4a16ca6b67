"""Study storage: URLs and their secrets, the fleet's storage (heartbeats, locks, the quota), the dashboard's.

One name for every caller (``from tuner.storage import open_storage``); each
job lives in its own module: urls (what ``--storage`` names, redaction),
sqlite (the study file's checks), fleet (heartbeats, one-commit attributes),
locks, quota (a fleet's N trials), constraints (the keys Optuna and
optuna-dashboard read) and dashboard (the read-only storage it serves).
"""

from tuner.records import EARLY_STOP_ATTR
from tuner.storage.constraints import (
    CONSTRAINTS_KEY,
    METRIC_NAMES_KEY,
    NAMED_PREFIX,
    OBJECTIVE_NAME,
    named_constraints,
    set_constraint,
)
from tuner.storage.dashboard import ConstrainedBestStorage, dashboard_storage
from tuner.storage.fleet import DEFAULT_HEARTBEAT_S, MAX_RETRY, FleetStorage, open_storage, set_user_attrs
from tuner.storage.locks import storage_lock
from tuner.storage.quota import QuotaStudy, StudyFull
from tuner.storage.sqlite import prepare_sqlite, sqlite_path
from tuner.storage.urls import (
    PG_DIALECT,
    PG_SCHEMES,
    RDB_PREFIXES,
    driver_url,
    is_postgres,
    is_rdb,
    password_env,
    redact,
    scheme,
    scrub,
    secrets_of,
    storage_errors,
    storage_url,
)

__all__ = [
    "CONSTRAINTS_KEY",
    "DEFAULT_HEARTBEAT_S",
    "EARLY_STOP_ATTR",
    "MAX_RETRY",
    "METRIC_NAMES_KEY",
    "NAMED_PREFIX",
    "OBJECTIVE_NAME",
    "PG_DIALECT",
    "PG_SCHEMES",
    "RDB_PREFIXES",
    "ConstrainedBestStorage",
    "FleetStorage",
    "QuotaStudy",
    "StudyFull",
    "dashboard_storage",
    "driver_url",
    "is_postgres",
    "is_rdb",
    "named_constraints",
    "open_storage",
    "password_env",
    "prepare_sqlite",
    "redact",
    "scheme",
    "scrub",
    "secrets_of",
    "set_constraint",
    "set_user_attrs",
    "sqlite_path",
    "storage_errors",
    "storage_lock",
    "storage_url",
]
