"""The docs site's reference pages are generated from the code (scripts/docs_reference.py):
these fail when a setting, a command option or an endpoint changed and its page was not redone."""

import pytest

from scripts import docs_reference


@pytest.mark.django_db
@pytest.mark.parametrize("page", sorted(docs_reference.GENERATORS))
def test_the_reference_page_is_current(page):
    written = (docs_reference.PAGES / page).read_text()
    assert written == docs_reference.GENERATORS[page](), (
        f"docs/reference/{page} is stale: run `python -m scripts.docs_reference` and commit it"
    )


def test_every_setting_the_platform_reads_is_listed():
    page = (docs_reference.PAGES / "settings.md").read_text()
    for name in ("DATABASE_URL", "REDIS_URL", "GPUPLATFORM_POLICY", "GPUPLATFORM_DATA_DIR"):
        assert f"`{name}`" in page
