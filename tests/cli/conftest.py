import pytest

from tests.browser.ui_platform import ui_platform


@pytest.fixture(scope="session")
def platform(tmp_path_factory, request):
    return ui_platform(tmp_path_factory, request)
