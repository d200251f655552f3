"""LOG_FORMAT=json writes one JSON object per line carrying the job and attempt ids."""

import json
import logging

from gpuplatform.logs import JsonLinesFormatter


def test_a_log_line_is_json_with_the_job_and_attempt_ids():
    record = logging.LogRecord(
        "apps.jobs.services", logging.INFO, __file__, 1, "job %s started", ("j1",), None
    )
    record.job_id, record.attempt_id = "j1", 7
    line = json.loads(JsonLinesFormatter().format(record))
    assert line["message"] == "job j1 started"
    assert (line["job_id"], line["attempt_id"], line["level"]) == ("j1", "7", "INFO")


def test_transitions_are_logged_with_their_ids(db, caplog):
    from tests.factories import make_cast
    from tests.unit.test_dispatcher import submit

    cast = make_cast()
    with caplog.at_level(logging.INFO, logger="apps.jobs.services"):
        job = submit(cast)
        from apps.jobs import services

        services.job_cancel(job=job, actor="test")
    [record] = [r for r in caplog.records if getattr(r, "job_id", None) == job.pk]
    assert "queued -> cancelled" in record.getMessage()
