"""The beat's `bundles.expire` (apps/scheduling/schedule.py): unreferenced bundles past their
retention are deleted, row and file. `manage.py expire_bundles` does the same without Celery."""

from celery import shared_task

from apps.bundles.services import expire
from apps.platform.names import Task


@shared_task(name=Task.EXPIRE_BUNDLES, ignore_result=True)
def expire_bundles() -> int:
    return len(expire())
