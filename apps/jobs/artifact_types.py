"""What an artifact's download says it is: a Content-Type from a fixed table of its name's suffix,
`application/octet-stream` for any other name. A fixed table, not a guess from the machine's
mime types (Django's FileResponse), so the OpenAPI document lists every type a download may have
(MEDIA_TYPES, the view's extend_schema in apps/jobs/api.py), and no job can have its result
served as HTML or script: those are octet streams, and every download is an attachment."""

from __future__ import annotations

from pathlib import PurePosixPath

DEFAULT = "application/octet-stream"
BY_SUFFIX = {
    ".json": "application/json",
    ".txt": "text/plain",
    ".log": "text/plain",
    ".csv": "text/csv",
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gz": "application/gzip",
    ".tgz": "application/gzip",
    ".zip": "application/zip",
    ".tar": "application/x-tar",
}
MEDIA_TYPES = (DEFAULT, *sorted(set(BY_SUFFIX.values())))


def content_type(name: str) -> str:
    return BY_SUFFIX.get(PurePosixPath(name).suffix.lower(), DEFAULT)
