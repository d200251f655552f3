"""The submit's pieces this pass changed, old and new way alternately in one process (h40submit's
notes): the body's check (DRF's `Serializer.to_internal_value` loop against
`JobSubmitSerializer.checked`), the 201's fields (DRF's `Serializer.to_representation` loop
against `CreatedJobSerializer.to_representation`), and the queue window's left-out ids as
psycopg dumps them (a list of UUIDs against `rows.uuid_array`'s one string; PostgreSQL only).

    python -m bench._h40submit_parts [--pairs 10] [--number 2000]

Prints, for each piece, the median of its pairs (us a call, old / new) and how many pairs the
new way was cheaper in.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

from bench._in_process import django_in_process


def per_call(fn, number: int) -> float:
    began = time.process_time()
    for _ in range(number):
        fn()
    return (time.process_time() - began) / number * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    with django_in_process() as token:
        from django.db import connection
        from django.test import Client
        from rest_framework import serializers

        from apps.admission import rows
        from apps.jobs.models import Job
        from apps.jobs.serializers import CreatedJobSerializer, JobSerializer, JobSubmitSerializer

        client = Client(HTTP_AUTHORIZATION=f"Token {token}")
        body = {"command": ["true"], "gpus": 1}
        assert (
            client.post("/api/v1/jobs/", body, content_type="application/json").status_code == 201
        )
        job = Job.objects.select_related("tenant", "user", "tier").get()
        checker = JobSubmitSerializer()
        shower = CreatedJobSerializer()
        shower.position, shower.start = 3, job.created_at
        assert checker.checked(body) == serializers.Serializer.to_internal_value(checker, body)
        assert shower.to_representation(job) == JobSerializer.to_representation(shower, job)
        pieces = {
            "body check": (lambda: serializers.Serializer.to_internal_value(checker, body),
                           lambda: checker.checked(body)),
            "201 fields": (lambda: JobSerializer.to_representation(shower, job),
                           lambda: shower.to_representation(job)),
        }  # fmt: skip
        if connection.vendor == "postgresql":
            ids = [uuid.uuid4() for _ in range(30)]

            def window(param) -> None:
                with connection.cursor() as cursor:
                    cursor.execute("SELECT cardinality(%s::uuid[])", [param])

            pieces["30 left-out ids"] = (lambda: window(ids), lambda: window(rows.uuid_array(ids)))
        for name, (old, new) in pieces.items():
            olds, news = [], []
            for n in range(args.pairs):
                order = [(olds, old), (news, new)] if n % 2 == 0 else [(news, new), (olds, old)]
                for into, fn in order:
                    into.append(per_call(fn, args.number))
            fewer = sum(b < a for a, b in zip(olds, news, strict=True))
            print(f"{name}: old {statistics.median(olds):.1f} us, new {statistics.median(news):.1f} "
                  f"us (new lower in {fewer}/{args.pairs})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
