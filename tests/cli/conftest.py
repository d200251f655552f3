import pytest

from tests.browser.ui_platform import stop_after_last_user, ui_platform


@pytest.fixture(scope="session")
def platform(tmp_path_factory, request):
    return ui_platform(tmp_path_factory, request)


def pytest_runtest_teardown(item, nextitem):
    stop_after_last_user(item, nextitem)
