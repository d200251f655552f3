"""Who may see and change which job. Another tenant's job is invisible (404, never 403)."""

from django.db.models import QuerySet

from apps.jobs.models import Job, JobArray
from apps.tenants.models import Membership, Role


def membership_of(user) -> Membership | None:
    try:
        return user.membership
    except Membership.DoesNotExist:
        return None


def visible_jobs(user) -> QuerySet[Job]:
    """Staff without a tenant see every job; everyone else only their tenant's."""
    membership = membership_of(user)
    if membership is not None:
        return Job.objects.filter(tenant_id=membership.tenant_id)
    if user.is_staff:
        return Job.objects.all()
    return Job.objects.none()


def visible_arrays(user) -> QuerySet[JobArray]:
    """Job arrays, as visible_jobs: the tenant's, or every one for staff without a tenant."""
    membership = membership_of(user)
    if membership is not None:
        return JobArray.objects.filter(tenant_id=membership.tenant_id)
    if user.is_staff:
        return JobArray.objects.all()
    return JobArray.objects.none()


def can_cancel(user, job: Job | JobArray) -> bool:
    if user.is_staff:
        return True
    membership = membership_of(user)
    if membership is None or membership.tenant_id != job.tenant_id:
        return False
    if membership.role == Role.ADMIN:
        return True
    return membership.role == Role.MEMBER and job.user_id == user.pk
