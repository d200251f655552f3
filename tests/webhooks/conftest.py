from tests.web.conftest import (  # noqa: F401 (the same cast and clients)
    as_user,
    browser_as,
    cast,
    fresh_buckets,
)
