"""The beat's scheduler (CELERY_BEAT_SCHEDULER): Celery's own persistent one, without its busy
wait before each due entry."""

from celery.beat import PersistentScheduler


class Scheduler(PersistentScheduler):
    """Celery's `adjust` takes a 10 ms drift off every wait, so within 10 ms of an entry's due
    time the wait is zero or less and the beat's loop (celery.beat.Service.start) calls `tick`
    again at once, without sleeping: a spin of up to 10 ms before every message it sends. At the
    tests' and benches' ticks (about 3.6 messages a second) that was 36 ms of the dispatcher's
    CPU every second, more than its own passes over an idle cluster. A wait shorter than the
    drift is slept whole; the entry is sent on the next tick, at most a few milliseconds late."""

    def adjust(self, n, drift=-0.010):
        adjusted = super().adjust(n, drift)
        if n and n > 0 and not adjusted > 0:
            return n
        return adjusted
