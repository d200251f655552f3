"""JSON-lines logging (LOG_FORMAT=json): one object per line, with the job and attempt ids when
the log call carries them (`log.info(..., extra={"job_id": ..., "attempt_id": ...})`)."""

import json
import logging

CONTEXT = ("job_id", "attempt_id", "node", "rank")


class JsonLinesFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "at": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(
            {
                key: str(getattr(record, key))
                for key in CONTEXT
                if getattr(record, key, None) is not None
            }
        )
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line)
