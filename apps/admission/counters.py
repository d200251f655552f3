"""Shared counters in the database (every web process sees them; /metrics can read them)."""

from django.db import IntegrityError, transaction
from django.db.models import F

from apps.admission.models import AdmissionCounter


def bump(name: str, by: int = 1) -> None:
    if AdmissionCounter.objects.filter(name=name).update(value=F("value") + by):
        return
    try:
        with transaction.atomic():
            AdmissionCounter.objects.create(name=name, value=by)
    except IntegrityError:  # another process created it first
        AdmissionCounter.objects.filter(name=name).update(value=F("value") + by)


def counters() -> dict[str, int]:
    return dict(AdmissionCounter.objects.values_list("name", "value"))
