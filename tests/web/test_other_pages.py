"""The API root links to the API, not to the pages; the pages have a favicon of our own; the
submit form links the guides it names and has fields for max runtime, env and an array."""

import re

from django.contrib.staticfiles import finders
from django.test import Client

from apps.jobs.models import Job, JobArray
from tests.web.test_pages import FORM, submit


def test_the_api_root_links_to_the_api_endpoints(as_user):
    response = as_user("bob").get("/api/v1/")
    assert response.status_code == 200
    links = response.json()
    assert {"jobs", "nodes", "bundles", "secrets", "arrays"} <= set(links)
    for name, url in links.items():
        assert url.startswith("http://testserver/api/v1/"), (name, url)


def test_the_pages_have_a_favicon_of_their_own(browser_as):
    page = browser_as("bob").get("/").content.decode()
    link = re.search(r'<link rel="icon" href="([^"]+)" type="image/svg\+xml">', page)
    assert link and link.group(1).startswith("/static/") and link.group(1).endswith(".svg")
    path = finders.find("favicon.svg")
    assert path and open(path).read().lstrip().startswith("<svg")  # ours, in static/
    assert "http" not in open(path).read().replace("http://www.w3.org/2000/svg", "")
    answer = Client().get("/favicon.ico")
    assert answer.status_code == 301 and answer["Location"].endswith("favicon.svg")


def test_the_submit_form_links_the_guides_it_names(browser_as):
    bob = browser_as("bob")
    page = bob.get("/jobs/new/").content.decode()
    for name in ("pipelines", "own-code", "arrays"):
        assert f'<a href="/docs/{name}/">docs/{name}.md</a>' in page, name
        guide = bob.get(f"/docs/{name}/")
        assert guide.status_code == 200 and b'<pre class="doc"' in guide.content, name
    assert bob.get("/docs/no-such-guide/").status_code == 404
    assert bob.get("/docs/..%2Fsettings/").status_code == 404
    assert Client().get("/docs/arrays/").status_code == 302  # sign in first


def test_the_form_has_fields_for_max_runtime_env_and_array(browser_as):
    page = browser_as("bob").get("/jobs/new/").content.decode()
    for name in ("max_runtime_seconds", "env", "array"):
        assert f'name="{name}"' in page, name


def test_max_runtime_from_the_form_reaches_the_job(browser_as):
    assert submit(browser_as("bob"), max_runtime_seconds="1234").status_code == 302
    assert Job.objects.get().max_runtime_seconds == 1234


def test_a_bad_max_runtime_is_named_on_the_form(browser_as):
    response = submit(browser_as("bob"), max_runtime_seconds="0")
    assert response.status_code == 400 and not Job.objects.exists()
    page = response.content.decode()
    assert page.index("greater than or equal to 1") > page.index('name="max_runtime_seconds"')


def test_env_lines_from_the_form_reach_a_command_job(browser_as):
    form = {"command": "python train.py", "env": "LR=3e-4\r\n\r\nMODE=a=b\r\n", "gpus": "1"}
    response = browser_as("bob").post("/jobs/new/", {**FORM, **form})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Job.objects.get().env == {"LR": "3e-4", "MODE": "a=b"}


def test_a_bad_env_line_is_named_on_the_form(browser_as):
    bob = browser_as("bob")
    response = bob.post("/jobs/new/", {**FORM, "command": "python x.py", "env": "LR 3"})
    assert response.status_code == 400 and "line 1: write NAME=value" in response.content.decode()
    response = bob.post("/jobs/new/", {**FORM, "command": "python x.py", "env": "1BAD=x"})
    assert response.status_code == 400 and "env.1BAD" in response.content.decode()
    assert not Job.objects.exists()


def test_an_array_from_the_form_is_one_array_and_its_page(browser_as):
    response = submit(browser_as("bob"), array="0-9%2")
    assert response.status_code == 302
    array = JobArray.objects.get()
    assert array.size == 10 and array.throttle == 2
    assert response["Location"] == f"/arrays/{array.pk}/"


def test_a_bad_array_is_named_on_the_form(browser_as):
    response = submit(browser_as("bob"), array="9-0")
    assert response.status_code == 400 and not JobArray.objects.exists()
    page = response.content.decode()
    errors = re.findall(
        r'<ul class="errorlist">(.*?)</ul>', page[page.index('name="array"') :], re.S
    )
    assert errors, "no error next to the array field"
